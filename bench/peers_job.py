"""The one job bench/bench_peers.py runs under every system: model, data, optimizer, global batch and steps are
this file's, so the four systems differ only in how they run it.

    python bench/peers_job.py {torchrun,torchft,easyscale,ray} --model {cnn,transformer} --epochs E --out DIR

The data are scikit-learn's digits (shipped inside the package) with random one-pixel shifts drawn from the
global RNG, as a plain script augments; 4 shards (DistributedSampler(num_replicas=4)) of 16 samples a step. The
process leading the job appends one JSON line per completed step to DIR/steps.jsonl: time, step, processes, the
shards trained, the configuration it ran in (gen: a new one after every restart or membership change) and shard
0's loss; it writes the final state's SHA-256 to DIR/sha256. Each process writes its pid to DIR/pid.SHARD at
start (what bench_peers.py kills). Run by bench_peers.py, which starts each system as its documentation says.
"""
import argparse
import contextlib
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DistributedSampler, Subset, default_collate

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from easyscale_ext.cli.demo import Augmented, digits  # noqa: E402
from easyscale_ext.runtime.digest import state_sha256  # noqa: E402

SHARDS, BATCH, SEED = 4, 16, 0  # data-parallel workers of the job and each one's micro-batch
STEPS_PER_EPOCH = len(digits()[0]) // (SHARDS * BATCH)  # 22


class Transformer(nn.Module):
    """A small encoder over the image's 8 rows as tokens (LayerNorm, dropout, attention)."""

    def __init__(self, dim=32):
        super().__init__()
        self.embed, self.position = nn.Linear(8, dim), nn.Parameter(torch.zeros(8, dim))
        layer = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.1, batch_first=True)
        self.encoder, self.head = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Linear(dim, 10)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x.squeeze(1)) + self.position).mean(1))


def build(name):
    """The model and its optimizer, from the same seed on every process and system."""
    from easyscale_ext.cli.demo import model as cnn

    torch.manual_seed(SEED)
    if name == "cnn":  # the demo's conv net: BatchNorm, dropout
        net = cnn()
        return net, torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9)
    net = Transformer()
    return net, torch.optim.AdamW(net.parameters(), lr=1e-3)


def dataset():
    """The digits' training set, cut to whole steps (every system then has the same steps, none partial)."""
    return Augmented(Subset(digits()[0], range(STEPS_PER_EPOCH * SHARDS * BATCH)))


def micro_batch(data, shard, step):
    """Shard `shard`'s micro-batch of (0-based) step `step`: torch's DistributedSampler over 4 shards, epochs
    of STEPS_PER_EPOCH steps; indexed by step so that a job resumed at any step reads on where it stopped."""
    epoch, i = divmod(step, STEPS_PER_EPOCH)
    sampler = DistributedSampler(data, num_replicas=SHARDS, rank=shard, shuffle=True, seed=SEED)
    sampler.set_epoch(epoch)
    return default_collate([data[j] for j in list(sampler)[i * BATCH:(i + 1) * BATCH]])


class StepLog:
    def __init__(self, out):
        self.file = open(os.path.join(out, "steps.jsonl"), "a")

    def write(self, step, procs, shards, gen, loss, lead=True):
        self.file.write(json.dumps(dict(t=time.time(), step=step, procs=procs, shards=shards, gen=gen, loss=loss,
                                        lead=lead)) + "\n")
        self.file.flush()


class DeferredStepLog(StepLog):
    """EasyScale's step log: a step is complete when the next one starts (its optimizer step and the boundary after
    it are done), so its record is written then. One started again after a lost process was never completed, and
    one logged is not logged again when the step after it is started again. A step this process did not finish,
    because a process was lost in its exchange, was finished by a survivor whose state the recovery took: it ran in
    the configuration of the step before it, and its loss is not known here."""

    def __init__(self, out):
        super().__init__(out)
        self.done, self.logged = None, 0

    def finished(self, **record):
        """This process ran the step `record` describes (write's arguments)."""
        self.done = record

    def starting(self, number):
        """On the lead: step `number` starts, so the one before it is complete."""
        if self.done is not None and self.logged < number - 1:
            if self.done["step"] < number - 1:
                self.done.update(step=number - 1, loss=None)
            self.write(**self.done)
            self.logged = self.done["step"]


def write_pid(out, shard):
    with open(os.path.join(out, f"pid.{shard}"), "w") as f:
        f.write(str(os.getpid()))


def finish(out, model, optimizer):
    with open(os.path.join(out, "sha256"), "w") as f:
        f.write(state_sha256(model, optimizer))


def torchrun_job(args):
    """torch DDP under torchrun's elastic agent: rank 0 checkpoints every --ckpt-every steps and every restart
    resumes from the newest checkpoint (torch.distributed.elastic's "train script" recipe). The group forms
    through easyscale_ext.elastic.init_process_group (a store prefix per restart attempt): with torch 2.14's
    plain init_process_group("gloo"), the restarted workers read the killed attempt's gloo addresses from the
    agent's store and fail to connect (measured here), so torchrun's restarts could not be measured at all."""
    from easyscale_ext.elastic import init_process_group

    init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    write_pid(args.out, rank)
    model, optimizer = build(args.model)
    ddp = nn.parallel.DistributedDataParallel(model)
    path, start = os.path.join(args.out, "checkpoint.pt"), 0
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    data, log, gen = dataset(), StepLog(args.out), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    for step in range(start, args.steps):
        x, y = micro_batch(data, rank, step)
        loss = F.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            log.write(step + 1, world, list(range(SHARDS)), gen, loss.item())
            if (step + 1) % args.ckpt_every == 0:  # written whole, then renamed: a kill never leaves half a file
                torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(), step=step + 1),
                           path + ".tmp")
                os.replace(path + ".tmp", path)
    if rank == 0:
        finish(args.out, model, optimizer)
    dist.destroy_process_group()
    os._exit(0)  # torch 2.14's DDP can abort at interpreter shutdown (README, pytorch/pytorch#190489)


def torchft_job(args):
    """torchft: one replica group per process (REPLICA_GROUP_ID, each under a torchrun of its own that restarts
    it), its Manager, DDP and Optimizer wrappers and ProcessGroupGloo as torchft's train_ddp.py sets them up; a
    process that comes back heals from a live replica. Group 0 also checkpoints model, optimizer and the
    manager's step to disk every --ckpt-every steps, as train_ddp.py tells its users to, for when no live
    replica is left to heal from."""
    import torchft

    group = int(os.environ["REPLICA_GROUP_ID"])
    model, optimizer = build(args.model)

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    manager = torchft.Manager(pg=torchft.ProcessGroupGloo(timeout=timedelta(seconds=5)), min_replica_size=1,
                              load_state_dict=load_state_dict,
                              state_dict=lambda: dict(model=model.state_dict(), optim=optimizer.state_dict()),
                              replica_id=f"peers_{group}", timeout=timedelta(seconds=30), hostname="127.0.0.1")
    path = os.path.join(args.out, "checkpoint.pt")
    if os.path.exists(path):
        state = torch.load(path)
        load_state_dict(state)
        manager.load_state_dict(state["torchft"])
    ddp, ft_optimizer = torchft.DistributedDataParallel(manager, model), torchft.Optimizer(manager, optimizer)
    write_pid(args.out, group)
    # Harness, not torchft: the first quorum waits until every group's manager runs, so that all start together.
    while not all(os.path.exists(os.path.join(args.out, f"pid.{g}")) for g in range(SHARDS)):
        time.sleep(0.05)
    data, log = dataset(), StepLog(args.out)
    while manager.current_step() < args.steps:
        step = manager.current_step()
        x, y = micro_batch(data, group, step)
        ft_optimizer.zero_grad()  # starts the quorum
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        participating, procs = manager.is_participating(), manager.num_participants()
        ft_optimizer.step()  # steps the optimizer only if every replica committed
        if manager.current_step() > step:
            # torchft has no public accessor of the quorum's id: a new quorum is a new configuration
            log.write(step + 1, procs, [group] if participating else [], manager._quorum_id, loss.item(),
                      lead=group == 0)
            if group == 0 and (step + 1) % args.ckpt_every == 0:
                torch.save(dict(model=model.state_dict(), optim=optimizer.state_dict(), torchft=manager.state_dict()),
                           path + ".tmp")
                os.replace(path + ".tmp", path)
    if group == 0:
        finish(args.out, model, optimizer)
    manager.shutdown(wait=False)
    os._exit(0)


def easyscale_job(args):
    """EasyScaleDDP under `easyscale run`: ElasticMember.run is the whole loop (README, examples/train_elastic.py),
    4 virtual workers whatever the processes, a checkpoint every --ckpt-every steps."""
    import easyscale_ext as es

    member = es.ElasticMember()
    model, optimizer = build(args.model)
    ddp = es.EasyScaleDDP(model, virtual_world_size=SHARDS)
    write_pid(args.out, ddp.rank)
    loader = ddp.data_loader(dataset(), batch_size=BATCH, shuffle=True, seed=SEED)
    checkpointer = es.Checkpointer(os.path.join(args.out, "checkpoints"), ddp, optimizer)
    log = DeferredStepLog(args.out)

    def train_step(step):
        if ddp.rank == 0:
            log.starting(step.number)
        losses = []
        for x, y in ddp.workers(step.batches):
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            losses.append(loss.item())
        log.finished(step=step.number, procs=dist.get_world_size(), shards=list(range(SHARDS)),
                     gen=member.generation, loss=losses[0] if ddp.local_ranks[0] == 0 else None)

    final = member.run(train_step, ddp, optimizer, loader, args.steps // STEPS_PER_EPOCH, checkpointer=checkpointer,
                       checkpoint_every=args.ckpt_every)
    if final is not None and ddp.rank == 0:
        log.write(**log.done)
        finish(args.out, model, optimizer)
    member.close()


def ray_loop(config):
    """Ray Train's worker loop (TorchTrainer, Train V2): prepare_model, a checkpoint every ckpt_every steps through
    ray.train.report, and a restarted worker group resumes from ray.train.get_checkpoint(). The 4 shards of
    the global batch are spread over however many workers the elastic group has (accumulated under no_sync)."""
    import tempfile

    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    rank, world, out = ctx.get_world_rank(), ctx.get_world_size(), config["out"]
    model, optimizer = build(config["model"])
    start, checkpoint = 0, ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    ddp = ray.train.torch.prepare_model(model)
    mine = [s for s in range(SHARDS) if s % world == rank]
    for shard in mine:
        write_pid(out, shard)
    data, log = dataset(), StepLog(out)
    for step in range(start, config["steps"]):
        optimizer.zero_grad()
        for i, shard in enumerate(mine):
            x, y = micro_batch(data, shard, step)
            with ddp.no_sync() if i < len(mine) - 1 else contextlib.nullcontext():
                loss = F.cross_entropy(ddp(x), y)
                (loss * world / SHARDS).backward()  # DDP averages over `world`: the mean over the 4 shards
            if shard == 0:
                first_loss = loss.item()
        optimizer.step()
        if rank == 0:
            log.write(step + 1, world, list(range(SHARDS)), os.getpid(), first_loss)
        if (step + 1) % config["ckpt_every"] == 0 or step + 1 == config["steps"]:
            with tempfile.TemporaryDirectory() as folder:
                if rank == 0:
                    torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(), step=step + 1),
                               os.path.join(folder, "state.pt"))
                ray.train.report({"step": step + 1}, checkpoint=ray.train.Checkpoint.from_directory(folder)
                                 if rank == 0 else None)
    if rank == 0:
        finish(out, model, optimizer)


def ray_job(args):
    """The driver: a Ray cluster of two nodes of 2 slots on this machine (on loopback: easyscale_ext.cluster.local),
    TorchTrainer with elastic ScalingConfig(num_workers=(2, 4)) and FailureConfig(max_failures=3), Train V2.
    --resize A,B removes a node once step A is done (its workers die: 4 -> 2) and adds one back once step B is
    (2 -> 4 at the elastic policy's next look, every elastic_resize_monitor_interval_s: --monitor-s)."""
    import threading

    os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), *sys.path])
    from easyscale_ext.cluster import SLOT
    from easyscale_ext.cluster.local import LocalCluster

    cluster = LocalCluster(nodes=2, slots=2, cpus_per_node=2)
    import peers_job  # the workers import the loop from this module (PYTHONPATH above)
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    def resize(at_steps):
        for at, act, what in zip(at_steps, (lambda: cluster.remove_node(1), lambda: cluster.add_node(2)),
                                 ("shrink", "grow")):
            while not steps_done(args.out, at):
                time.sleep(0.05)
            event(args.out, what)
            act()

    if args.resize:
        threading.Thread(target=resize, args=([int(s) for s in args.resize.split(",")],), daemon=True).start()
    TorchTrainer(peers_job.ray_loop, torch_config=TorchConfig(backend="gloo"),
                 train_loop_config=dict(model=args.model, steps=args.steps, ckpt_every=args.ckpt_every, out=args.out),
                 scaling_config=ScalingConfig(num_workers=(2, SHARDS), resources_per_worker={"CPU": 1, SLOT: 1},
                                              elastic_resize_monitor_interval_s=args.monitor_s),
                 run_config=RunConfig(name="peers", storage_path=os.path.join(args.out, "ray"),
                                      failure_config=FailureConfig(max_failures=3))).fit()
    cluster.shutdown()


def steps_done(out, step):
    """Whether the job has completed step `step` (its step log says so). The log is read while the job appends to
    it: a line without its newline is still being written and is left for the next look."""
    path = os.path.join(out, "steps.jsonl")
    if not os.path.exists(path):
        return False
    with open(path) as f:
        return any(json.loads(line)["step"] >= step for line in f if line.endswith("\n") and line.strip())


def event(out, what):
    """Note when an event (a kill, a resize request) happened, for bench_peers.py's reading of the step log."""
    with open(os.path.join(out, "events.jsonl"), "a") as f:
        f.write(json.dumps(dict(t=time.time(), what=what)) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("system", choices=["torchrun", "torchft", "easyscale", "ray"])
    ap.add_argument("--model", choices=["cnn", "transformer"], default="cnn")
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--out", required=True)
    ap.add_argument("--resize", default="", metavar="A,B", help="ray: shrink 4 -> 2 after step A, grow after B")
    ap.add_argument("--monitor-s", type=float, default=60.0, help="ray: elastic_resize_monitor_interval_s")
    args = ap.parse_args()
    args.steps = args.epochs * STEPS_PER_EPOCH
    torch.set_num_threads(1)
    {"torchrun": torchrun_job, "torchft": torchft_job, "easyscale": easyscale_job, "ray": ray_job}[args.system](args)


if __name__ == "__main__":
    main()

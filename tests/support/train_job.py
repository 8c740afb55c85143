"""One training job for the determinism tests, run as a process per rank.

Modes:
  easyscale  EasyScaleDDP with N virtual workers over the launched processes
  ddp        torch DistributedDataParallel, one rank per process (gloo)
  plain      single-process training without any wrapper
  reference  single process, pure PyTorch: loops over virtual ranks 0..N-1 with
             plain autograd and the canonical tree written out in torch ops
Rank 0 writes a SHA-256 over parameters, buffers and optimizer state to --out.
"""
import argparse
import atexit
import contextlib
import copy
import faulthandler
import hashlib
import json
import os
import random
import signal
import sys
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from easyscale_ext import determinism  # noqa: E402
from easyscale_ext.runtime.loader import SeededSamples  # noqa: E402  (defines the per-sample seeds)


class Images(Dataset):
    """Small synthetic images with labels; random flip and noise as augmentation."""

    def __init__(self, n, augment=True):
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 1, 12, 12, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)
        self.augment = augment

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i]
        if self.augment:
            if torch.rand(()) < 0.5:
                x = x.flip(-1)
            x = x + 0.1 * torch.randn_like(x) + 0.01 * np.random.randn() + 0.01 * random.random()
        return x, self.y[i], i


class Tokens(Dataset):
    def __init__(self, n, length=10, vocab=50):
        g = torch.Generator().manual_seed(99)
        self.x = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.x[i].roll(-1), i


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.2),
                                  nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.AvgPool2d(6), nn.Flatten(), nn.Linear(32, 4))  # AvgPool2d: deterministic on CUDA

    def forward(self, x):
        return self.body(x)


class TinyTransformer(nn.Module):
    def __init__(self, vocab=50, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.block = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.1, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        return self.head(self.block(self.embed(x)))


class Branchy(nn.Module):
    """A data-dependent branch (some virtual workers use `extra`, some steps none) and a layer no
    worker uses: with find_unused_parameters, as in DDP, an unused parameter keeps grad None."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(144, 16), nn.ReLU())
        self.extra = nn.Linear(16, 16)
        self.never = nn.Linear(16, 4)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = self.body(x)
        if x.sum() > 0:
            h = h + self.extra(h)
        return self.head(h)


class AugmentedImages(Dataset):
    """Small RGB images through torchvision's random augmentation (RandomResizedCrop, RandomHorizontalFlip), as
    an ImageNet loader applies it: drawn from the global RNG in __getitem__, in DataLoader workers or not."""

    def __init__(self, n):
        from torchvision.transforms import v2

        g = torch.Generator().manual_seed(4321)
        self.x = torch.rand(n, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)
        self.augment = v2.Compose([v2.RandomResizedCrop(24, antialias=True), v2.RandomHorizontalFlip()])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.augment(self.x[i]), self.y[i], i


class Digits(Dataset):
    """The demo's data: scikit-learn's handwritten digits through its random shifts of up to one pixel."""

    def __init__(self, n):
        from easyscale_ext.cli.demo import Augmented, digits

        self.base = Augmented(digits()[0])
        if n > len(self.base):
            raise ValueError(f"the digits hold {len(self.base)} training images, fewer than the {n} asked for")
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return (*self.base[i], i)


class HFBert(nn.Module):
    """A transformers BERT built from a small config (random weights: nothing downloaded), dropout and attention
    as in any BERT, predicting each token's successor."""

    def __init__(self, vocab=50):
        super().__init__()
        from transformers import BertConfig, BertForMaskedLM

        self.bert = BertForMaskedLM(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=2, intermediate_size=64,
                                               max_position_embeddings=16))

    def forward(self, x):
        return self.bert(input_ids=x).logits


def build(name, device, samples):
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    if name == "resnet18":  # torchvision's: BatchNorm and in-place ReLU
        from torchvision.models import resnet18

        model = resnet18(num_classes=4).to(device)
        return model, AugmentedImages(samples), torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if name == "bert":
        model = HFBert().to(device)
        return model, Tokens(samples), torch.optim.AdamW(model.parameters(), lr=1e-3)
    if name == "digits":  # the demo's model and data
        from easyscale_ext.cli import demo

        model = demo.model().to(device)
        return model, Digits(samples), torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    if name == "cnn":
        model = ConvNet().to(device)
        return model, Images(samples), torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if name == "branchy":  # AdamW's weight decay would move a parameter that got a zero gradient
        model = Branchy().to(device)
        return model, Images(samples), torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    model = TinyTransformer().to(device)
    return model, Tokens(samples), torch.optim.Adam(model.parameters(), lr=1e-3)


SEED = 7  # the job seed: shuffling and per-sample augmentation


DEVICE = torch.device("cpu")
AUTOCAST = None  # --amp's dtype: forward passes run under torch.autocast
SCALER = torch.amp.GradScaler("cpu", enabled=False)  # --amp fp16's loss scaling; disabled it changes nothing


def loss_of(model, batch):
    x, y = (t.to(DEVICE) for t in batch[:2])
    with torch.autocast(DEVICE.type, dtype=AUTOCAST, enabled=AUTOCAST is not None):
        out = model(x)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def backward(loss):
    SCALER.scale(loss).backward()


def optimizer_step(opt):
    SCALER.step(opt)  # skipped where the (reduced) gradients hold an inf or a NaN
    SCALER.update()
    opt.zero_grad()


def state_entries(model, opt):
    """(name, bytes) of the model's state, then of the optimizer's: what the state hash covers, in its order."""
    ours = [(name, t.detach().contiguous().cpu().numpy().tobytes()) for name, t in model.state_dict().items()]
    theirs = [(f"{pid}.{k}", v.cpu().numpy().tobytes() if torch.is_tensor(v) else repr(v).encode())
              for pid, st in sorted(opt.state_dict()["state"].items()) for k, v in sorted(st.items())]
    return ours, theirs


def state_hash(model, opt):
    h = hashlib.sha256()
    ours, theirs = state_entries(model, opt)
    for name, data in ours:
        h.update(name.encode())
        h.update(data)
    if SCALER.is_enabled():
        h.update(repr(SCALER.get_scale()).encode())
    for name, data in theirs:
        h.update(name.encode())
        h.update(data)
    return h.hexdigest()


def tree_sum(xs):
    """The canonical association, written out in torch ops."""
    if len(xs) == 1:
        return xs[0]
    p = 1
    while p * 2 < len(xs):
        p *= 2
    return tree_sum(xs[:p]) + tree_sum(xs[p:])


class KeyedSampler(DistributedSampler):
    """DistributedSampler yielding (index, epoch, rank) keys for SeededSamples."""

    def __iter__(self):
        return ((i, self.epoch, self.rank) for i in super().__iter__())


def run_loop(args, model, data, opt, replicas, rank):
    """The plain DDP training loop, with torch's DataLoader (it draws a base seed from the global RNG
    at every pass) over a DistributedSampler share."""
    sampler = KeyedSampler(range(len(data)), num_replicas=replicas, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    micro = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            micro += 1
            sync = micro % args.accumulate == 0
            with contextlib.nullcontext() if sync else model.no_sync():
                backward(loss_of(model, batch))
            if sync:
                optimizer_step(opt)


def batches_for(data, n, v, epoch, batch_size, step):
    sampler = DistributedSampler(range(len(data)), num_replicas=n, rank=v, shuffle=True, seed=SEED)
    sampler.set_epoch(epoch)
    idx = list(sampler)[step * batch_size:(step + 1) * batch_size]
    return default_collate([data[(i, epoch, v)] for i in idx])


def run_reference(args, model, data, opt):
    n = args.n

    def capture():
        cuda = torch.cuda.get_rng_state() if DEVICE.type == "cuda" else None
        return torch.get_rng_state(), random.getstate(), np.random.get_state(), cuda

    states = [capture()] * n
    pending = [[None] * len(list(model.parameters())) for _ in range(n)]  # gradients kept under no_sync
    micro = 0
    for epoch in range(args.epochs):
        for v in range(n):  # each rank's DataLoader draws its base seed from the rank's stream
            torch.set_rng_state(states[v][0])
            torch.empty((), dtype=torch.int64).random_()
            states[v] = (torch.get_rng_state(),) + states[v][1:]
        for step in range(args.steps):
            micro += 1
            start_buffers = copy.deepcopy(list(model.buffers()))
            buffers0 = None
            for v in range(n):
                torch.set_rng_state(states[v][0])
                random.setstate(states[v][1])
                np.random.set_state(states[v][2])
                if states[v][3] is not None:
                    torch.cuda.set_rng_state(states[v][3])
                with torch.no_grad():
                    for b, s in zip(model.buffers(), start_buffers):
                        b.copy_(s)
                for p, g in zip(model.parameters(), pending[v]):
                    p.grad = g
                backward(loss_of(model, batches_for(data, n, v, epoch, args.batch, step)))
                pending[v] = [p.grad for p in model.parameters()]
                states[v] = capture()
                if v == 0:
                    buffers0 = copy.deepcopy(list(model.buffers()))
            with torch.no_grad():
                for b, s in zip(model.buffers(), buffers0):
                    b.copy_(s)
            if micro % args.accumulate:
                continue  # no_sync: nothing reduced, no optimizer step
            for i, p in enumerate(model.parameters()):
                scale = torch.tensor(1.0 / n, dtype=torch.float32, device=DEVICE)
                if all(g[i] is None for g in pending):
                    p.grad = None  # no worker used it
                    continue
                p.grad = tree_sum([(g[i] if g[i] is not None else torch.zeros_like(p)) * scale for g in pending])
            pending = [[None] * len(pending[0]) for _ in range(n)]
            optimizer_step(opt)


def run_easyscale(args, model, data, opt):
    """EasyScaleDDP, optionally checkpointing, resuming, elastic (in-place scaling) or killed on purpose."""

    import easyscale_ext as es
    from easyscale_ext.elastic import Checkpointer, Position

    member = None
    if args.elastic:
        from easyscale_ext.elastic import ElasticMember
        from easyscale_ext.elastic import Balancer
        # without --balance, $EASYSCALE_BALANCE decides (the cluster sets it for a D2 job)
        member = ElasticMember(balance=Balancer(interval=1, threshold=0.15, patience=2) if args.balance else None,
                               liveness_s=args.liveness)
        if args.log_events:
            def record(event):
                with open(args.log_events, "a") as f:
                    sizes = " ".join(str(hi - lo) for lo, hi in event.ranges)
                    f.write(f"{event.step} {event.old_procs} {event.new_procs} {sizes}\n")
            member.on_scale(record)
        if args.log_faults:
            atexit.register(lambda: fault_log(f"exit {member.id} {time.time():.6f}"))  # the device is free
            member.on_scale(lambda event: fault_log(f"event {member.id} {event.step} {event.old_procs} "
                                                    f"{event.new_procs} {time.time():.6f}"))

    def fault_log(line):
        if args.log_faults:
            with open(args.log_faults, "a") as f:
                f.write(line + "\n")

    def signal_self(sig, where, step):
        """Signal this process as a cluster manager (SIGTERM) or a crash (SIGKILL) would, logged first."""
        fault_log(f"signal {member.id} {sig.name} {where} {step} {time.time():.6f}")
        os.kill(os.getpid(), sig)
    ranges = None
    if args.ranges:
        bounds = [int(x) for x in args.ranges.split(",")]
        ranges = (bounds[args.rank], bounds[args.rank + 1])
    n = args.n + 1 if (args.mismatch_n and args.rank == 1) else args.n
    freezer = None
    if args.freeze:  # a tight threshold, so layers freeze within the test's steps
        from easyscale_ext.runtime.freeze import GradientNormFreezer
        freezer = GradientNormFreezer(layers=getattr(model, "body", None), window=1, threshold=args.freeze)
    if args.whole_bytes >= 0:
        from easyscale_ext.runtime import reducer
        reducer.WHOLE_BYTES = args.whole_bytes
    ddp = es.EasyScaleDDP(model, virtual_world_size=n, virtual_ranks=ranges, determinism_level=args.level,
                          num_threads=args.threads, broadcast_buffers=bool(args.broadcast_buffers),
                          find_unused_parameters=args.model == "branchy", freezer=freezer,
                          bucket_cap_mb=args.bucket_cap_mb or None)
    if args.implicit:  # one virtual worker per process: the unchanged DDP loop
        run_loop(args, ddp, data, opt, args.procs, args.rank)
        return True
    loader = ddp.data_loader(data, batch_size=args.batch, shuffle=True, seed=SEED, num_workers=args.num_workers)
    # An LR scheduler whose count the in-place path must carry to joiners.
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if args.scheduler else None
    ckpt = Checkpointer(args.ckpt_dir, ddp, opt, sched, keep=args.ckpt_keep) if args.ckpt_dir else None
    kills = {w: (int(at), where) for w, at, where in (item.split(":") for item in args.kill9_at.split(",") if item)}
    position = Position()
    if ckpt is not None and args.resume and not (member is not None and member.joining):
        position = ckpt.resume()
        if position.step:
            print(f"resumed at step {position.step}", flush=True)
    if member is not None and kills.get(member.id, (0, ""))[1] in ("ready", "ready-term"):
        def kill_when_ready():  # a joiner killed (or asked to leave) once it has registered
            from easyscale_ext.elastic import STORE_ENV, connect
            store = connect(os.environ[STORE_ENV])  # a connection of its own
            while not store.registered(member.id):
                time.sleep(0.01)
            signal_self(signal.SIGKILL if kills[member.id][1] == "ready" else signal.SIGTERM, "ready", 0)
        threading.Thread(target=kill_when_ready, daemon=True).start()
    if member is not None and kills.get(member.id) == (0, "start-term"):  # SIGTERM while it prepared
        signal_self(signal.SIGTERM, "start", 0)
    if member is not None:
        position = member.start(ddp, opt, sched if args.join_scheduler else None, position)
    loader.reassign(ddp.local_ranks)  # a joiner's share, or a checkpoint's uneven split
    schedule = dict(tuple(int(x) for x in item.split(":")) for item in args.schedule.split(",") if item)
    sigterms = {w: int(at) for w, at in (item.split(":") for item in args.sigterm_at.split(",") if item)}
    log = open(args.log_samples, "a") if args.log_samples else None
    times = open(args.log_times, "a") if args.log_times else None

    def killed_here(step, where):
        if member is not None and where == "mid" and args.raise_at == f"{member.id}:{step}":
            raise RuntimeError("gloo-style config value invalid: a bug in the training code")  # not a lost peer
        if member is not None and kills.get(member.id) == (step, where):
            signal_self(signal.SIGKILL, where, step)  # as a crash or an OOM kill does
        if member is not None and where == "mid" and kills.get(member.id) == (step, "stop"):
            signal_self(signal.SIGSTOP, "stop", step)  # as a lost machine: its connections stay open

    def die(*_):
        signal_self(signal.SIGKILL, kills[member.id][1], kills[member.id][0])

    def arm(step):
        """Kill this process inside the checkpoint write (rank 0 writes; the others export their contexts to
        it) or inside a scale event (every member exports its contexts), if asked for this step."""
        if member is None or kills.get(member.id, (0, ""))[0] != step:
            return
        where = kills[member.id][1]
        if where == "ckpt" and ddp.rank == 0:
            torch.save = die
        elif where in ("ckpt", "scale"):
            ddp.export_contexts = die

    def train(position):
        step = position.step
        for epoch in range(position.epoch, args.epochs):
            loader.set_epoch(epoch, position.step_in_epoch if epoch == position.epoch else 0)
            for step_batches in loader:
                for v, (_, _, ids) in step_batches:
                    if log:
                        log.write(f"{epoch} {loader.next_step - 1} {v} {' '.join(map(str, ids.tolist()))}\n")
                        log.flush()
                sync = (step + 1) % args.accumulate == 0
                with contextlib.nullcontext() if sync else ddp.no_sync():
                    for batch in ddp.workers(step_batches):
                        backward(loss_of(ddp, batch))
                        killed_here(step + 1, "mid")
                if sync:
                    optimizer_step(opt)
                    if sched is not None:
                        sched.step()
                step += 1
                if not (args.sleep_until and os.path.exists(args.sleep_until)):
                    time.sleep(args.step_sleep)  # device time, emulated: it changes no bit
                here = Position(step, epoch, loader.next_step)
                if times:
                    times.write(f"{os.environ.get('EASYSCALE_WORKER_ID', ddp.rank)} {step} {time.time():.6f} "
                                f"{len(ddp.local_ranks)} {ddp.seconds_per_worker() or float('nan'):.6f}\n")
                    times.flush()
                if args.kill_at == step and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" \
                        and ddp.rank == args.procs - 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                arm(step)
                if ckpt is not None and step % args.ckpt_every == 0:
                    ckpt.save(here)
                if member is not None:
                    killed_here(step, "boundary")
                    if sigterms.get(member.id) == step:  # a real signal, mid-run, as a cluster manager sends
                        signal_self(signal.SIGTERM, "boundary", step)
                        if args.sigterm_twice:  # an impatient one: the second terminates at once
                            signal_self(signal.SIGTERM, "boundary", step)
                    if step in schedule and ddp.rank == 0:
                        member.store.set_target(schedule[step])
                    if step == args.split_at and ddp.rank == 0:
                        member.store.request_split([int(k) for k in args.split.split(",")])
                    if not member.step_boundary(ddp, opt, sched, here, block=bool(args.block), checkpointer=ckpt):
                        return False
                    loader.reassign(ddp.local_ranks)
                if step == args.stop_after:
                    log_freezing(args, ddp)
                    return True
        log_freezing(args, ddp)
        if args.log_balance and member is not None and ddp.rank == 0:  # rank 0's Balancer decided
            with open(args.log_balance, "w") as f:
                f.write(f"{member.balancer.evaluations} {len(member.balancer.log)}\n")
        return True

    while True:
        try:
            return train(position)
        except Exception as error:  # a lost process: the survivors go on in place
            if member is None:
                raise
            position = member.recover(error, ddp, opt, sched, loader)


def log_freezing(args, ddp):
    if args.log_freeze and ddp.rank == 0:
        with open(args.log_freeze, "a") as f:  # the decisions, then the elements each process exchanges
            f.writelines(f"{d.step} {d.layers}\n" for d in ddp.freezer.log)
            f.write(f"exchanged {sum(b.numel for b in ddp.reducer.buckets)}\n")


def run_ddp(args, model, data, opt):
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[DEVICE] if DEVICE.type == "cuda" else None,
                                              broadcast_buffers=bool(args.broadcast_buffers),
                                              find_unused_parameters=args.model == "branchy")
    run_loop(args, ddp, data, opt, args.procs, args.rank)


def run_plain(args, model, data, opt):
    run_loop(args, model, data, opt, 1, 0)


def main():
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where a hung test's processes are: kill -USR1
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["easyscale", "ddp", "plain", "reference"], required=True)
    ap.add_argument("--model", choices=["cnn", "transformer", "branchy", "resnet18", "bert", "digits"], default="cnn")
    ap.add_argument("--virtual-workers", dest="n", type=int, default=4)  # not --n: torchrun would take it
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--fork", type=int, default=0, help="run as rank 0 and fork ranks 1..procs-1 from it: the "
                    "processes share one interpreter start and torch import (the test launcher's, where every rank "
                    "has the same environment)")
    ap.add_argument("--ranges", default="")
    ap.add_argument("--init", default="")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--level", default="D0")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="", help="the group's backend (default: nccl on CUDA, else gloo); gloo "
                    "runs several processes on one GPU, which NCCL refuses")
    ap.add_argument("--broadcast-buffers", type=int, default=1)
    ap.add_argument("--split-at", type=int, default=0, help="rank 0 requests --split at this step")
    ap.add_argument("--split", default="", help="virtual workers per process, e.g. 6,3,3")
    ap.add_argument("--balance", type=int, default=0, help="rebalance virtual workers by measured speed")
    ap.add_argument("--freeze", type=float, default=0.0, help="freeze layers at this gradient-norm change")
    ap.add_argument("--log-freeze", default="", help="append rank 0's freezing log and exchanged elements")
    ap.add_argument("--scheduler", type=int, default=0, help="step a StepLR after every optimizer step")
    ap.add_argument("--join-scheduler", type=int, default=1, help="0: joiners pass no scheduler (an error case)")
    ap.add_argument("--accumulate", type=int, default=1, help="reduce every this many steps (no_sync between)")
    ap.add_argument("--implicit", type=int, default=0, help="EasyScaleDDP in an unchanged DDP loop (P == N)")
    ap.add_argument("--torchrun", type=int, default=0, help="take rank and world size from torchrun")
    ap.add_argument("--raise-at", default="", help="WORKER:STEP: a training-code error there")
    ap.add_argument("--elastic", type=int, default=0, help="run under easyscale_ext.launcher (in-place scaling)")
    ap.add_argument("--schedule", default="", help="step:procs,... scale requests made by rank 0")
    ap.add_argument("--ckpt-dir", default="")
    ap.add_argument("--ckpt-every", type=int, default=1)
    ap.add_argument("--ckpt-keep", type=int, default=3)
    ap.add_argument("--resume", type=int, default=0)
    ap.add_argument("--bucket-cap-mb", type=float, default=0.0, help="EasyScaleDDP's bucket_cap_mb (0: default)")
    ap.add_argument("--whole-bytes", type=int, default=-1, help="reducer.WHOLE_BYTES (0: every bucket in chunks)")
    ap.add_argument("--stop-after", type=int, default=0, help="end after this many global steps")
    ap.add_argument("--kill-at", type=int, default=0, help="SIGKILL the last rank at this step (first attempt)")
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds added to every step")
    ap.add_argument("--sleep-until", default="", help="FILE: --step-sleep only until FILE exists (a test that has "
                    "seen the events it waited for lets the job's remaining steps run at full speed)")
    ap.add_argument("--log-balance", default="", help="FILE: rank 0's balancer evaluations and rebalances")
    ap.add_argument("--buffers-out", default="", help="PREFIX: each process writes its buffers' hash to PREFIX.RANK")
    ap.add_argument("--sigterm-twice", type=int, default=0, help="send --sigterm-at's signal twice")
    ap.add_argument("--sigterm-at", default="", help="WORKER:STEP,...: that process SIGTERMs itself at that step")
    ap.add_argument("--liveness", type=float, default=5.0, help="ElasticMember's liveness_s (its default)")
    ap.add_argument("--kill9-at", default="", help="WORKER:STEP:WHERE,...: that process SIGKILLs itself in that "
                    "step after its first worker's backward (WHERE=mid), at its step boundary (boundary), in the checkpoint "
                    "write (ckpt), in a scale event (scale), or a joiner once it has registered as ready (ready; ready-term "
                    "sends SIGTERM instead); stop: SIGSTOP where mid would kill")
    ap.add_argument("--block", type=int, default=1, help="scale requests wait for joiners (else stop-free)")
    ap.add_argument("--log-times", default="",
                    help="append 'worker step unix-time local-workers seconds-per-worker' at each step end")
    ap.add_argument("--log-faults", default="", help="append signals sent, departures and scale events, timed")
    ap.add_argument("--log-events", default="", help="append 'step old new' for every scale event seen")
    ap.add_argument("--log-samples", default="", help="append 'epoch step vrank ids' lines here")
    ap.add_argument("--mismatch-n", type=int, default=0, help="rank 1 passes N+1 (an error case)")
    ap.add_argument("--sync-bn", type=int, default=0, help="convert BatchNorm to SyncBatchNorm (an error case)")
    ap.add_argument("--tensor-hashes", default="", help="FILE: rank 0 writes each state tensor's SHA-256 here")
    ap.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none",
                    help="forward under torch.autocast at this dtype; fp16 also scales the loss (GradScaler)")
    args = ap.parse_args()
    children = fork_ranks(args) if args.fork else []
    train(args)  # an error leaves at once, as a rank of its own process would: the others see its group close
    failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    if failed:
        sys.exit(f"forked ranks failed (pids {failed})")
    if args.mode == "ddp":  # torch DDP keeps its gloo group alive into interpreter shutdown, where it
        sys.stdout.flush()  # can abort the process (pytorch/pytorch#190489): leave without a shutdown
        os._exit(0)


def fork_ranks(args) -> list:
    """Fork ranks 1..procs-1 before any torch op (no thread or kernel state yet to inherit); returns the children's
    pids in rank 0 and [] in a child, whose args now name its rank."""
    sys.stdout.flush()
    children = []
    for rank in range(1, args.procs):
        pid = os.fork()
        if pid == 0:
            args.rank = rank
            return []
        children.append(pid)
    return children


def train(args):
    torch.set_num_threads(args.threads)  # conv weight gradients change bits with the thread count
    if args.level != "D0" and args.mode != "easyscale":  # EasyScaleDDP applies its level itself
        # D2's floor: the level the environment caps kernels at (an emulated older machine's, where it is one).
        isa = determinism.native_isa() if args.level == "D2" else None
        determinism.apply(args.level, args.threads, args.device.startswith("cuda"), isa)
    if args.torchrun:
        args.rank, args.procs = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        args.init = "env://"
    global DEVICE, AUTOCAST, SCALER
    DEVICE = torch.device(args.device)
    AUTOCAST = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]
    SCALER = torch.amp.GradScaler(DEVICE.type, enabled=args.amp == "fp16")
    if DEVICE.type == "cuda":
        torch.cuda.manual_seed_all(0)
    if args.torchrun:
        from easyscale_ext.elastic import init_process_group
        init_process_group("gloo")
    elif args.procs > 1 and not args.elastic:
        backend = args.backend or ("nccl" if DEVICE.type == "cuda" else "gloo")
        dist.init_process_group(backend, init_method=args.init, rank=args.rank, world_size=args.procs)
    model, data, opt = build(args.model, DEVICE, args.steps * args.batch * args.n)  # exactly `steps` per epoch
    if args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if args.mode != "easyscale" or args.implicit:  # EasyScaleDDP's loader seeds samples itself
        data = SeededSamples(data, SEED)
    finished = globals()["run_" + args.mode](args, model, data, opt) is not False
    if args.elastic:
        rank = dist.get_rank() if finished else -1
    else:
        rank = args.rank
    if finished and rank == 0:
        with open(args.out, "w") as f:
            f.write(state_hash(model, opt))
    if finished and rank == 0 and args.tensor_hashes:  # where two hashes differ, which tensor differs first
        with open(args.tensor_hashes, "w") as f:
            json.dump([[name, hashlib.sha256(data).hexdigest()] for name, data in sum(state_entries(model, opt), [])], f)
    if finished and args.buffers_out:  # every process's own buffers (BatchNorm's running statistics)
        with open(f"{args.buffers_out}.{rank}", "w") as f:
            f.write(hashlib.sha256(b"".join(b.detach().cpu().numpy().tobytes() for b in model.buffers())).hexdigest())
    if finished and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

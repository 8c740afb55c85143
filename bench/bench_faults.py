"""Fault injection for in-place elastic jobs: random trials over
{SIGTERM, kill -9} x {member, rank 0, joiner} x {mid-step, scale event, checkpoint write}.

Each trial runs tests/support/train_job.py under the launcher (3 processes, N = 4 virtual workers, a
CNN with BatchNorm, 6 steps, a checkpoint every step, a scale event at the trial's step) and
signals one process where the trial says; the final state must equal the fixed single-process
reference bitwise. Kill points: "mid-step" = after that process's first backward of the step;
"scale event" = inside the event's context export; "checkpoint write" = inside rank 0's
torch.save (the other processes: when they send it their contexts); a joiner is always signalled
once it has registered (its scale event pending). SIGTERM is delivered at the step boundary or
inside the scale event / checkpoint write's step and takes effect at the next boundary.

Reported: trials bitwise equal; time from SIGTERM to the process's exit (its device free, p50 /
max); time from a kill -9 to training again (the survivors' new generation, p50 / max); steps
redone (the step in progress at the death minus the step the survivors continued from).
`--accumulate K`: gradient accumulation (no_sync() on all but every K-th step), against the fixed run with
it; a death then goes back to the last synced step and the accumulation is redone.
`--kinds SIGSTOP`: a lost machine instead (a member or rank 0 stops mid-step with its connections open:
no collective fails before the group's timeout; the others' heartbeat threads cut the group).

    .venv/bin/python bench/bench_faults.py [--trials 20] [--seed 0] [--liveness 2] [--kinds SIGTERM,kill -9]
                                           [--accumulate 1]
    .venv/bin/python bench/bench_faults.py --cost 40   # replication's cost per step (demo model, 2 processes)
"""
import argparse
import os
import random
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from support.jobs import run_elastic, run_job  # noqa: E402

STEPS = 6  # 3 steps per epoch, 2 epochs


def trial(rng: random.Random, liveness: float, tmp: str, kinds, accumulate: int):
    kind, who, where = rng.choice(kinds), rng.choice(["member", "rank 0", "joiner"]), \
        rng.choice(["mid-step", "scale event", "checkpoint write"])
    if kind == "SIGSTOP":
        who, where = ("rank 0" if who == "rank 0" else "member"), "mid-step"
    at = rng.randint(2, STEPS - 1)
    worker = {"member": f"w{rng.randint(1, 2)}", "rank 0": "w0", "joiner": "w3"}[who]
    schedule = f"{at}:4" if who == "joiner" else (f"{at}:2" if where == "scale event" else "")
    if kind == "SIGSTOP":
        options = dict(kill9_at=f"{worker}:{at}:stop")
    elif kind == "kill -9" and who != "joiner":
        point = {"mid-step": "mid", "scale event": "scale", "checkpoint write": "ckpt"}[where]
        if where == "scale event" and worker == "w2":
            worker = "w1"  # a scale-in to 2 processes lets w2 go: kill one that stays
        options = dict(kill9_at=f"{worker}:{at}:{point}")
    elif who == "joiner":
        options = dict(kill9_at=f"{worker}:0:{'ready' if kind == 'kill -9' else 'ready-term'}")
    else:
        options = dict(sigterm_at=f"{worker}:{at}")
    faults = os.path.join(tmp, "faults")
    started = time.perf_counter()
    try:
        digest = run_elastic(3, schedule, n=4, liveness=liveness, ckpt_dir=os.path.join(tmp, "ckpt"),
                             log_faults=faults, accumulate=accumulate, **options)
        error = None
    except Exception as e:  # recorded as a failed trial
        digest, error = None, str(e).splitlines()[0]
    rows = [line.split() for line in open(faults).read().splitlines()] if os.path.exists(faults) else []
    sent = next(((r[1], float(r[5]), int(r[4])) for r in rows if r[0] == "signal"), None)
    out = dict(kind=kind, who=who, where=where, at=at, digest=digest, error=error,
               seconds=time.perf_counter() - started)
    if sent is not None:
        target, when, step = sent
        if kind == "SIGTERM":
            gone = [float(r[2]) for r in rows if r[0] == "exit" and r[1] == target]
            out["to_free"] = gone[0] - when if gone else None
        else:
            after = [(float(r[5]), int(r[2])) for r in rows
                     if r[0] == "event" and int(r[4]) < int(r[3]) and float(r[5]) > when]
            if after:
                recovered_at, from_step = min(after)
                out["to_training"] = recovered_at - when
                out["redone"] = max(step - from_step, 0)
    return out


def _cost_worker(rank: int, address: str, steps: int, out) -> None:
    import torch
    import torch.nn.functional as F

    import easyscale_ext as es
    from easyscale_ext.cli import demo
    from easyscale_ext.elastic import ElasticMember

    torch.set_num_threads(1)
    member = ElasticMember(address, f"w{rank}")
    torch.manual_seed(0)
    net = demo.model()
    ddp = es.EasyScaleDDP(net, virtual_world_size=4)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02, momentum=0.9)
    loader = ddp.data_loader(demo.Augmented(demo.digits()[0]), batch_size=demo.BATCH, seed=0)
    member.start(ddp, opt, None)
    replicate = ddp.on_step_contexts
    times = {True: [], False: []}
    done, total = 0, 2 * steps + 4
    while done < total:
        for step_batches in loader:
            on = done % 2 == 0  # the same on every process: interleaved with and without
            ddp.on_step_contexts = replicate if on else None
            start = time.perf_counter()
            for x, y in ddp.workers(step_batches):
                F.cross_entropy(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
            if done >= 4:  # warm-up
                times[on].append(time.perf_counter() - start)
            done += 1
            if done == total:
                break
    calls = []
    for _ in range(20):
        start = time.perf_counter()
        replicate(ddp.export_contexts())
        calls.append(time.perf_counter() - start)
    if rank == 0:
        out.put((statistics.median(times[True]), statistics.median(times[False]), statistics.median(calls),
                 sum(len(c) for c in ddp.export_contexts().values())))


def replication_cost(steps: int) -> None:
    """The demo's model and data, N = 4 on 2 processes (gloo, one intra-op thread each): step time with each
    process's contexts replicated into the job store (loopback) at every step against without, interleaved."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store.set("gen/0/members", '["w0", "w1"]')
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_cost_worker, args=(f"127.0.0.1:{store.port}", steps, out), nprocs=2)
    with_, without, call, size = out.get()
    print(f"demo model, N = 4 on 2 processes, median of {steps} interleaved steps each: step {without * 1e3:.1f} ms "
          f"without, {with_ * 1e3:.1f} ms with replication ({(with_ / without - 1) * 100:+.1f} %); one replication "
          f"{call * 1e3:.2f} ms for {size / 1e3:.1f} kB of contexts ({call / without * 100:.2f} % of a step)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--liveness", type=float, default=2.0, help="ElasticMember's liveness_s")
    ap.add_argument("--kinds", default="SIGTERM,kill -9", help="signals drawn from: SIGTERM, kill -9, SIGSTOP")
    ap.add_argument("--accumulate", type=int, default=1, help="reduce every this many steps (no_sync between)")
    ap.add_argument("--cost", type=int, default=0, metavar="STEPS",
                    help="instead: the replication's cost per step on the demo's model, over STEPS steps each way")
    args = ap.parse_args()
    if args.cost:
        return replication_cost(args.cost)
    reference = run_job("reference", n=4, accumulate=args.accumulate)
    rng = random.Random(args.seed)
    results = []
    for i in range(args.trials):
        with tempfile.TemporaryDirectory() as tmp:
            r = trial(rng, args.liveness, tmp, args.kinds.split(","), args.accumulate)
        r["bitwise"] = r["digest"] == reference
        results.append(r)
        extra = " ".join(f"{k}={r[k]:.2f}" if isinstance(r[k], float) else f"{k}={r[k]}"
                         for k in ("to_free", "to_training", "redone") if r.get(k) is not None)
        print(f"{i + 1:2d}. {r['kind']:7s} {r['who']:6s} {r['where']:16s} step {r['at']}: "
              f"{'bitwise equal' if r['bitwise'] else 'FAILED ' + str(r['error'])} ({r['seconds']:.1f} s) {extra}",
              flush=True)

    def summary(key):
        values = [r[key] for r in results if r.get(key) is not None]
        return (f"p50 {statistics.median(values):.2f} / max {max(values):.2f} s over {len(values)}"
                if values else "none")
    redone = [r["redone"] for r in results if r.get("redone") is not None]
    print(f"\n{sum(r['bitwise'] for r in results)} of {len(results)} trials bitwise equal to the fixed run")
    print(f"SIGTERM to the device free: {summary('to_free')}")
    print(f"kill -9 or SIGSTOP to training again (liveness_s {args.liveness}): {summary('to_training')}")
    print(f"steps redone: {dict(sorted((k, redone.count(k)) for k in set(redone)))}")


if __name__ == "__main__":
    main()

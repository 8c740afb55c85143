"""The cluster scheduler's memory as jobs come and go: its resident set, the length of every container it keeps per
job (Scheduler.footprint) and its rounds' seconds, after each wave of jobs that were submitted and ended. A scheduler
that runs for months must hold what its live jobs need, not what every job it has seen left behind.

The real scheduler actor on a real local Ray cluster (loopback), with its SQLite job table and its policy, in two
parts:
- `--queued` jobs (default 10,000) submitted and cancelled while queued, in waves of --wave, with every slot
  reserved so that none starts: each goes through admission, the rounds' job models and the policy's view, and
  leaves. A started job costs a supervisor process that imports torch (seconds of this machine's two cores), so
  10,000 of them would take hours;
- `--finished` real jobs (default 100; bench/cluster_job.py, 2 steps of an EasyScaleDDP job of 4 virtual workers on
  one process) run to the end, in waves of 20: these also go through the supervisors, the records taking their
  measured progress and the policy's per-job state of running jobs.

    python bench/bench_memory.py                        # 10,000 queued and 100 finished jobs, elastic-goodput
    python bench/bench_memory.py --policy sia --queued 2000 --finished 40 --json memory.json
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SLOTS = 2
FINISHED_WAVE = 20


def sample(ray, scheduler, jobs: int) -> dict:
    """The scheduler's footprint after `jobs` ended (and a round after, for the policy's view), with the median of
    its last 20 rounds' seconds."""
    time.sleep(1.0)
    footprint = ray.get(scheduler.footprint.remote())
    rounds = ray.get(scheduler.round_seconds.remote())[-20:]
    return {"jobs": jobs, "rss_mb": footprint["rss"] / 2 ** 20, "sizes": footprint["sizes"],
            "round_ms": 1000 * statistics.median(rounds) if rounds else None}


def queued(ray, scheduler, argv, env, count: int, wave: int) -> list:
    """Submit and cancel `count` jobs, `wave` at a time, with every slot reserved; a sample each 1,000 (and first)."""
    ray.get(scheduler.reserve.remote(SLOTS))
    samples = [sample(ray, scheduler, 0)]
    for done in range(0, count, wave):
        ids = ray.get([scheduler.submit.remote(argv, 4, 1, 1, f"q{done + i}", env, "imagenet")
                       for i in range(min(wave, count - done))])
        time.sleep(0.6)  # a round sees them (round 0.5 s): their models and the policy's view are built
        ray.get([scheduler.cancel.remote(job) for job in ids])
        ended = done + len(ids)
        if ended % 1000 == 0 or ended == count:
            samples.append(sample(ray, scheduler, ended))
            print(f"  {ended} queued jobs ended: RSS {samples[-1]['rss_mb']:.1f} MB, "
                  f"round {samples[-1]['round_ms']:.1f} ms", flush=True)
    ray.get(scheduler.unreserve.remote())
    return samples


def finished(ray, scheduler, argv_of, env, count: int) -> list:
    """Run `count` real jobs to the end, FINISHED_WAVE at a time; a sample after each wave."""
    samples = [sample(ray, scheduler, 0)]
    for done in range(0, count, FINISHED_WAVE):
        ids = ray.get([scheduler.submit.remote(argv_of(done + i), 4, 1, 1, f"f{done + i}", env, "imagenet")
                       for i in range(min(FINISHED_WAVE, count - done))])
        deadline = time.monotonic() + 60 * FINISHED_WAVE
        while ray.get(scheduler.status.remote(None, 0)):  # live jobs, and none of those that ended
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs {ids} did not end within {60 * FINISHED_WAVE} s")
            time.sleep(1.0)
        states = [ray.get(scheduler.status.remote(job))[0]["state"] for job in ids]
        if set(states) != {"finished"}:
            raise RuntimeError(f"every job should finish: {dict(zip(ids, states))} (logs in the state folder)")
        samples.append(sample(ray, scheduler, done + len(ids)))
        print(f"  {done + len(ids)} jobs finished: RSS {samples[-1]['rss_mb']:.1f} MB", flush=True)
    return samples


def table(title: str, samples: list) -> str:
    """Markdown: RSS and every container that is not empty at some sample, per sample."""
    names = sorted({n for s in samples for n, v in s["sizes"].items() if v})
    lines = [f"**{title}**", "", "| jobs ended | RSS (MB) | round (ms) | " + " | ".join(names) + " |",
             "|---:|---:|---:|" + "---:|" * len(names)]
    for s in samples:
        round_ms = "" if s["round_ms"] is None else f"{s['round_ms']:.1f}"
        lines.append(f"| {s['jobs']} | {s['rss_mb']:.1f} | {round_ms} | "
                     + " | ".join(str(s["sizes"].get(n, 0)) for n in names) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="elastic-goodput")
    parser.add_argument("--queued", type=int, default=10000, help="jobs submitted and cancelled while queued")
    parser.add_argument("--wave", type=int, default=100, help="queued jobs submitted at once")
    parser.add_argument("--finished", type=int, default=100, help="real jobs run to the end")
    parser.add_argument("--json", help="write the samples here")
    args = parser.parse_args()

    from easyscale_ext.cluster.local import LocalCluster

    local = LocalCluster(nodes=1, slots=SLOTS)  # first: it keeps Ray on loopback, before Ray loads
    import ray

    from easyscale_ext.cluster.scheduler import launch

    work = tempfile.mkdtemp(prefix="bench_memory_")
    job = os.path.join(HERE, "cluster_job.py")
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        scheduler = launch(os.path.join(work, "state"), args.policy, 0.5)
        start = time.time()
        results = {"policy": args.policy}
        print(f"{args.queued} jobs submitted and cancelled while queued ({args.policy}):", flush=True)
        results["queued"] = queued(ray, scheduler, [job, "imagenet", "2", os.devnull, "0"], env, args.queued,
                                   args.wave)
        print(f"{args.finished} jobs run to the end:", flush=True)
        results["finished"] = finished(
            ray, scheduler, lambda i: [job, "imagenet", "2", os.path.join(work, f"steps{i}.log"), "0"], env,
            args.finished)
        results["seconds"] = time.time() - start
    finally:
        local.shutdown()
    print()
    print(table(f"{args.queued} jobs submitted and cancelled while queued", results["queued"]))
    print()
    print(table(f"{args.finished} jobs run to the end", results["finished"]))
    print(f"\n{results['seconds']:.0f} s; state in {work}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

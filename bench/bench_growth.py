"""How each policy's decision grows: CPU seconds per scheduling round against the active jobs
(10 to 10,000) and the GPUs (64 to 4,096).

Jobs are drawn in turn from Sia's eight Philly workloads (their applications and sizes), all arriving at once. The
cluster has Sia's three types in equal parts, 8 GPUs a node (T4s only, for a policy of one GPU type). The simulator
runs `--rounds` rounds, and only each `optimize` call is timed: the decision, not the simulation's bookkeeping. A
point whose slowest round passed `--cap` seconds skips that policy's larger points, which would only take longer;
the table marks them `>cap`.
It prints the median round per point, writes them as JSON, and draws a log-log plot (seconds per round against
jobs, one line per GPU count).

    python bench/bench_growth.py [--jobs 10 100 1000 10000] [--gpus 64 512 4096] [--rounds 3] [--cap 30]
                                 [--policies fifo,tiresias,...] [--json growth.json] [--plot growth.png]
    python bench/bench_growth.py --philly all [--budget 600] [--plot philly.png] [--json philly.json]
                                 # the whole Philly trace on 300 x 8 GPUs, CPU seconds against simulated days, for
                                 # every policy but YARN-CS (WHOLE_TRACE; or those named: --philly fifo,sia,...)
    python bench/bench_growth.py --philly pollux --pollux-nodes needed   # Pollux searching only the nodes it needs
    python bench/bench_growth.py --philly sia,elastic-goodput --exact-options 10000  # the exact integer program
    python bench/bench_growth.py --philly sia --days 33   # the jobs of the first 33 days only, run to the end

The whole trace records each job's duration and GPUs only: the policies that model applications run it with an
application drawn per job by its GPU-hours (workload.with_applications), on Sia's three types in equal parts
(T4s only, for a policy of one type). A run stops at `--budget` CPU seconds; it then says how far it got and what
the whole trace would take at its rate so far. Each policy runs in a process of its own, forked once the trace is
loaded: its peak resident memory (the simulator's and the policy's, trace included) is its own, and so is its resident
memory after the busiest day (the most active jobs) against the end, which per-job state never pruned would grow. Its
plot: each policy's CPU seconds against the simulated days.
With `--days D` only the jobs that arrive in the trace's first D days run (a policy's decisions at this scale compared
with an option's): each run that finishes reports its average and p99 JCT and makespan as well.
"""
import argparse
import itertools
import json
import multiprocessing
import os
import resource
import signal
import statistics
import time
from dataclasses import replace

import numpy as np

from easyscale_ext.sched.models.application import STAND_INS, Applications
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.traces import data_dir
from easyscale_ext.sched.models.workload import load_workload, with_applications, with_stand_ins
from easyscale_ext.sched.policies import POLICIES, RUNNABLE, ElasticGoodputPolicy, PolluxPolicy, SiaPolicy
from easyscale_ext.sched.policies.pollux import NODES
from easyscale_ext.sched.policies.sia import AT_SCALE_GPUS, EXACT_OPTIONS
from easyscale_ext.sched.simulator import simulate, validate

MADE = dict(RUNNABLE)  # name -> the function of the seed that makes the policy (changed by --pollux-nodes and
# --exact-options)

TYPES = ("t4", "a100", "2080ti")  # Sia's cluster's
# --philly all: every policy a user picks but YARN-CS, which runs one job at a time: Philly's jobs back to back last
# 12,505 days (34 years of 60 s rounds)
WHOLE_TRACE = [name for name in POLICIES if name != "yarn-cs"]


class Enough(Exception):
    """Raised out of the simulation once the rounds asked for are timed."""


def _timeout(*_):
    raise TimeoutError


def resident() -> int:
    """This process's resident memory now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Timed:
    """`policy`, its optimize() calls timed (CPU seconds), with the time, the active jobs and the process's CPU
    clock at each, and its resident memory at the first of each simulated day; the simulation ends after `rounds`
    of them (None: it runs on)."""

    def __init__(self, policy, rounds=None):
        self.policy, self.rounds = policy, rounds
        self.seconds, self.times, self.active, self.clock = [], [], [], []
        self.memory = {}  # simulated day -> resident bytes at its first round

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def optimize(self, now, jobs, cluster, allocations):
        begin = time.process_time()
        decided = self.policy.optimize(now, jobs, cluster, allocations)
        self.seconds.append(time.process_time() - begin)
        self.times.append(now)
        self.active.append(len(jobs))
        self.clock.append(begin)
        day = int(now // 86400)
        if day not in self.memory:
            self.memory[day] = resident()
        if len(self.seconds) == self.rounds:
            raise Enough
        return decided


def cluster_of(gpus: int, types=TYPES) -> Cluster:
    nodes = gpus // 8
    share = [nodes // len(types) + (i < nodes % len(types)) for i in range(len(types))]
    return Cluster.parse(",".join(f"{k}x8:{t}" for k, t in zip(share, types) if k))


def cluster_for(name: str, specs, gpus: int) -> tuple:
    """The cluster of `gpus` that policy `name` runs `specs` on: Sia's types, else T4s only; and whether T4s only.
    A ValueError where the policy cannot run them at all."""
    try:
        cluster = cluster_of(gpus)
        validate(specs, MADE[name](0), cluster)
        return cluster, False
    except ValueError:  # a policy of one GPU type: all T4s
        cluster = cluster_of(gpus, TYPES[:1])
        validate(specs, MADE[name](0), cluster)
        return cluster, True


def whole_trace(names, data, apps, budget: float, round_s: float = 60.0, trace=None, days=None, seed=0) -> list:
    """Each policy, made with `seed`, on Philly's whole trace (or `trace`; its first `days` days' jobs), 300 x 8
    GPUs, stopped at `budget` CPU seconds (SIGPROF): a markdown row each, printed, and per policy its figures and its
    CPU seconds at each simulated day; the JCTs of the runs that finished, in a table after."""
    trace = trace or load_workload(data / "pollux" / "traces" / "philly.csv")
    drawn = with_applications(trace, apps)  # drawn over the whole trace: the first days' jobs are the same
    if days is not None:
        first = trace[0].arrival
        trace, drawn = ([s for s in specs if s.arrival < days * 86400] for specs in (trace, drawn))
        if not trace:
            raise SystemExit(f"--days {days:g}: no job arrives that early; the trace's first arrives on day "
                             f"{first / 86400:.2f}")
    span = trace[-1].arrival
    print("| policy | rounds | simulated | CPU s | of which deciding | active jobs, mean / most | CPU s a round, last "
          "1,000 | whole trace, CPU s | peak RSS, MB | RSS after the busiest day / at the end, MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    fork = multiprocessing.get_context("fork")
    for name in names:
        specs = drawn if MADE[name](0).profiled else trace
        reader, writer = fork.Pipe(duplex=False)
        child = fork.Process(target=lambda: writer.send(_whole_run(name, specs, apps, budget, round_s, span, seed)))
        child.start()
        writer.close()
        try:
            results.append(reader.recv())
        except EOFError:  # it printed why
            raise SystemExit(f"{name}'s run of the trace failed") from None
        child.join()
    done = [r for r in results if r["finished"]]
    if done:
        print("\n| policy | jobs | avg JCT s | p99 JCT s | makespan s |\n|---|---:|---:|---:|---:|")
        for r in done:
            print(f"| {r['policy']} | {r['jobs']} | {r['avg_jct']:.2f} | {r['p99_jct']:.2f} | {r['makespan']:.0f} |")
    return results


def _whole_run(name, specs, apps, budget, round_s, span, seed) -> dict:
    """One policy's run of the whole trace (whole_trace), in the process it was forked to: its row, printed, and its
    figures."""
    cluster, t4_only = cluster_for(name, specs, 2400)
    timed = Timed(MADE[name](seed))
    begin = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, budget)
    try:
        jobs = simulate(specs, timed, cluster, apps).jobs
        finished = True
    except TimeoutError:
        jobs, finished = [], False
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    # The scheduler's exact CPU time; the timer counts tick-sampled user and system time, which on a loaded
    # machine runs up to 5 % ahead of it (measured): a run stopped at its budget may record less than it.
    cpu = time.process_time() - begin
    end = resident()
    # the kernel's high-water mark lags the pages counted per thread by a few pages: the largest of both
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, end, *timed.memory.values())
    reached = timed.times[-1] if timed.times else 0.0
    last = timed.clock[-1000:] or [begin]
    rate = (last[-1] - last[0]) / max(len(last) - 1, 1)
    # Stopped: at least the rounds to the last arrival at the rate of the last 1,000 (the load varies by day).
    whole = f"{cpu:.0f}" if finished else f">= {cpu + rate * max(span - reached, 0) / round_s:.0f}"
    busiest = int(timed.times[int(np.argmax(timed.active))] // 86400) if timed.times else 0
    after = timed.memory.get(busiest + 1, end)  # the busiest day's end: the next day's first round
    label = f"{name} (T4 only)" if t4_only else name
    active = f"{statistics.mean(timed.active or [0]):.0f} / {max(timed.active or [0])}"
    print(f"| {label} | {len(timed.seconds)} | {reached / 86400:.1f} d{'' if finished else ' (stopped)'} | "
          f"{cpu:.0f} | {sum(timed.seconds):.0f} | {active} | {rate:.3g} | {whole} | {peak / 2 ** 20:.0f} | "
          f"{after / 2 ** 20:.0f} / {end / 2 ** 20:.0f} (day {busiest}) |", flush=True)
    # the CPU seconds at the first round of each simulated day, and at the end
    days = {int(t // 86400): round(c - begin, 3) for t, c in zip(reversed(timed.times), reversed(timed.clock))}
    result = dict(policy=label, finished=finished, rounds=len(timed.seconds), days=reached / 86400, cpu=cpu,
                  deciding=sum(timed.seconds), whole=whole, peak_rss=peak, busiest_day=busiest, rss_after=after,
                  rss_end=end, rss=sorted(timed.memory.items()),
                  curve=sorted(days.items()) + [(round(reached / 86400, 3), round(cpu, 3))])
    if finished:
        jct, ends = (np.array([j[k] for j in jobs]) for k in ("jct", "completion"))
        result.update(jobs=len(jobs), avg_jct=float(jct.mean()), p99_jct=float(np.percentile(jct, 99)),
                      makespan=float(ends.max() - min(j["arrival"] for j in jobs)))
    return result


def plot_whole_trace(results, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.get_cmap("tab20").colors  # eleven policies: more than the default cycle's ten colours
    for k, r in enumerate(results):
        days, cpu = zip(*r["curve"]) if r["curve"] else ((), ())
        line, = ax.plot(days, cpu, color=colors[2 * k % 20 + 2 * k // 20], linestyle=("-", "--")[k % 2],
                        label=r["policy"] + ("" if r["finished"] else " (stopped)"))
        if not r["finished"] and days:
            ax.plot(days[-1], cpu[-1], marker="x", color=line.get_color())
    ax.axhline(600, color="grey", linestyle=":", label="10 min of CPU")
    ax.set(xlabel="simulated day of the trace", ylabel="CPU seconds", yscale="log",
           title="Philly's whole trace on 300 x 8 GPUs")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def jobs_of(count: int, pool) -> list:
    return [replace(spec, name=f"j{i}", arrival=0.0) for i, spec in zip(range(count), itertools.cycle(pool))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[10, 100, 1000, 10000])
    ap.add_argument("--gpus", type=int, nargs="+", default=[64, 512, 4096])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cap", type=float, default=30.0, help="seconds a round may take before larger points are skipped")
    ap.add_argument("--policies", default=",".join(RUNNABLE))
    ap.add_argument("--json", default="")
    ap.add_argument("--plot", default="")
    ap.add_argument("--philly", default="", help="instead: these policies (all: every one) on Philly's whole trace, "
                    "300 x 8 GPUs")
    ap.add_argument("--budget", type=float, default=600.0, help="CPU seconds a whole-trace run may take")
    ap.add_argument("--days", type=float, default=None,
                    help="with --philly: only the jobs arriving in the trace's first DAYS days, run to the end")
    ap.add_argument("--seed", type=int, default=0, help="with --philly: the seed of the policies that draw (Pollux)")
    ap.add_argument("--pollux-search", type=int, nargs=2, default=None, metavar=("POPULATION", "GENERATIONS"),
                    help="Pollux's search (PolluxPolicy(population=..., generations=...)); default the policy's")
    ap.add_argument("--pollux-nodes", default="all", choices=NODES,
                    help="the nodes Pollux's search sees each round (PolluxPolicy(nodes=...))")
    ap.add_argument("--exact-options", type=int, default=None,
                    help="Sia's and elastic-goodput's: the most configurations a round's integer program is solved "
                         "as it is; above, on its LP relaxation's terms (SiaPolicy(exact_options=...); default the "
                         f"policy's: on {AT_SCALE_GPUS:,} GPUs or more Sia's {SiaPolicy.at_scale_options:,}, "
                         f"elastic-goodput's {ElasticGoodputPolicy.at_scale_options}, else {EXACT_OPTIONS:,}; "
                         f"{EXACT_OPTIONS} on Philly's cluster: the exact program)")
    args = ap.parse_args()
    population, generations = args.pollux_search or (None, None)
    MADE["pollux"] = lambda seed: PolluxPolicy(seed=seed, nodes=args.pollux_nodes, population=population,
                                               generations=generations)
    MADE["sia"] = lambda seed: SiaPolicy(exact_options=args.exact_options)
    MADE["elastic-goodput"] = lambda seed: ElasticGoodputPolicy(exact_options=args.exact_options)
    signal.signal(signal.SIGALRM, _timeout)
    signal.signal(signal.SIGPROF, _timeout)

    data = data_dir()
    apps = Applications(data)
    if args.philly:
        names = WHOLE_TRACE if args.philly == "all" else args.philly.split(",")
        unknown = [n for n in names if n not in MADE]
        if unknown:
            ap.error(f"unknown --philly {', '.join(unknown)}: choose from all, {', '.join(RUNNABLE)}")
        results = whole_trace(names, data, apps, args.budget, days=args.days, seed=args.seed)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        if args.plot:
            plot_whole_trace(results, args.plot)
        return
    pool = [s for w in range(1, 9)
            for s in with_stand_ins(load_workload(data / "sia" / "workloads" / "philly" / f"workload-{w}.csv"),
                                    STAND_INS)[0]]
    rows = {}  # (policy, gpus, jobs) -> median seconds per round; None: over the cap, or skipped
    one_type = set()  # policies that ran on T4s only
    for name in args.policies.split(","):
        over = []  # points where a round passed the cap: every larger one is skipped
        for gpus, jobs in itertools.product(sorted(args.gpus), sorted(args.jobs)):
            if any(g <= gpus and j <= jobs for g, j in over):
                rows[name, gpus, jobs] = None
                continue
            specs = jobs_of(jobs, pool)
            try:
                cluster, t4_only = cluster_for(name, specs, gpus)
            except ValueError as e:  # a policy that cannot run these jobs
                print(f"{name}: {e}", flush=True)
                break
            if t4_only:
                one_type.add(name)
            timed = Timed(MADE[name](0), args.rounds)
            signal.alarm(int(args.cap * args.rounds * 2))  # a round far over the cap is not waited out
            try:
                simulate(specs, timed, cluster, apps)
            except (Enough, TimeoutError):
                pass
            finally:
                signal.alarm(0)
            if len(timed.seconds) < args.rounds or max(timed.seconds) > args.cap:
                over.append((gpus, jobs))
            rows[name, gpus, jobs] = statistics.median(timed.seconds) if len(timed.seconds) == args.rounds else None
            print(f"{name:>20} {gpus:>5} GPUs {jobs:>6} jobs: {timed.seconds} s", flush=True)

    points = list(itertools.product(sorted(args.gpus), sorted(args.jobs)))
    print("\n| policy | " + " | ".join(f"{j} jobs, {g} GPUs" for g, j in points) + " |")
    print("|---|" + "---:|" * len(points))
    for name in dict.fromkeys(n for n, _, _ in rows):
        cells = [rows.get((name, g, j), "-") for g, j in points]
        label = f"{name} (T4 only)" if name in one_type else name
        print(f"| {label} | " + " | ".join("-" if c == "-" else f">{args.cap:g}" if c is None else f"{c:.3g}"
                                          for c in cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(policy=n, gpus=g, jobs=j, seconds=s) for (n, g, j), s in rows.items()], f, indent=1)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names = list(dict.fromkeys(n for n, _, _ in rows))
        fig, axes = plt.subplots(1, len(args.gpus), figsize=(5 * len(args.gpus), 4), sharey=True, squeeze=False)
        for ax, gpus in zip(axes[0], sorted(args.gpus)):
            for name in names:
                done = [(j, rows[name, gpus, j]) for j in sorted(args.jobs) if rows.get((name, gpus, j))]
                if done:
                    ax.loglog(*zip(*done), marker="o", label=name)
            ax.set(title=f"{gpus} GPUs", xlabel="active jobs", ylabel="CPU seconds per round")
        axes[0][-1].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()

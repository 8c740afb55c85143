"""Cluster mode against its simulation: the same trace, two-type cluster and policies, run for real on a local Ray
cluster and in `easyscale_ext.sched.simulate`; markdown for BENCHMARKS.md.

Each job is a real EasyScaleDDP process group (bench/cluster_job.py) of 4 virtual workers, submitted at D2 (so it
may span types, and keeps its bits wherever it runs), in which every process pads its step to its application's
profiled time for its share of the virtual workers on its slot's type: this machine has no GPUs, so device time
is emulated (and the second type's node runs one instruction set lower: LocalCluster(emulate=True)). Jobs arrive
every --gap seconds. The simulation's costs come from separate calibration runs first (never from the run
compared), one per --calibration-policies, so that starts of one process and of whole jobs are both measured: a
job's first start (allocation to its first step), the in-place pause of a scale event, the joiners' preparation of
a growth (allocation to admission: the job trains as before meanwhile), a job's exit (last step to its processes'
exit: it holds its slots until then), a suspension (the decision to the slots given back) and a resume (allocation
to the first step after it), how many processes start at full speed at once (more share this machine's cores:
RuntimeCosts.parallel_starts, a start of n processes weighing n ** start_weight and a process training beside it
training_weight, all fitted with each start's full-speed cost), and the scheduler's lag from a submission to its
round's decision (RuntimeCosts.arrival_lag_s); each job's length (its steps as a share of the application's epoch) is
the simulator's slowdown, and a round starts at each arrival and at each job's end, as the scheduler does. Both
drivers run the policy as it is, held to each job's limits by the round (sched/limits.py; a job keeps its batch,
cluster.live; preemptions are suspensions), and move every job in place, as the cluster does whatever the policy's own runtime (a restart-based
policy's job moves there by joiners and leavers, not by a restart). Each real run is simulated --draws times, its
arrivals moved by up to --jitter s after the first draw (simulate_draws), and the median draw is compared: a
policy that decides on near-ties gives a spread, of which one simulation, like one real run, is a single draw.

    python bench/bench_cluster.py                                   # 7 policies x 3 runs, 16 jobs
    python bench/bench_cluster.py --policies fifo,elastic-goodput --jobs 4 --runs 1 --steps 6
    python bench/bench_cluster.py --costs costs.json --keep runs/  # keep the calibration, the runs' state and results;
                                                                    # again: only the runs not kept yet run
"""
import argparse
import contextlib
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
APPS = ("imagenet", "yolov3", "deepspeech2", "bert")
TYPES = ("t4", "a100")
POLICIES = "fifo,tiresias,pollux,sia,easyscale-homo,easyscale-heter,elastic-goodput"
VIRTUAL_WORKERS, SLOTS = 4, 4
CLUSTER = ",".join(f"1x{SLOTS}:{t}" for t in sorted(TYPES))  # as `easyscale simulate --cluster`, in the scheduler's
# node order (backend.policy_view: by type)
COSTS = ("start", "pause", "join", "exit", "suspend", "resume", "lag")  # measured: (processes, seconds, when) each
TRAINING = "train"  # also measured: (processes, seconds, when) of each stretch a job trained at one size
TIE = 0.01  # two policies whose avg JCTs are this close (relatively) in a driver are tied in its ordering
STARTS = ("start", "resume", "join")  # the costs that start processes: they share this machine's cores


def run_for_real(policy, trace, steps, scale, round_s, work, suspend_all_at=None):
    """Submit `trace` ((seconds after start, app) pairs) to a fresh scheduler; with `suspend_all_at` (seconds),
    reserve every slot then (suspending every running job) and give them back 5 s later. Returns the run's
    result (as the simulator reports one), round times, final hashes and when it reserved every slot (None if it
    did not); its folder in `work` (POLICY/) keeps its job table and step logs (measure)."""
    import ray

    from easyscale_ext.cluster.scheduler import launch
    from easyscale_ext.cluster.lifecycle import LIVE

    os.makedirs(os.path.join(work, policy), exist_ok=True)
    scheduler = launch(os.path.join(work, policy, "state"), policy, round_s)
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    begin, ids, reserved = time.time(), [], None
    pending = list(enumerate(trace))
    while True:
        while pending and time.time() - begin >= pending[0][1][0]:
            i, (_, app) = pending.pop(0)
            log = os.path.join(work, policy, f"steps{i}.log")
            argv = [os.path.join(HERE, "cluster_job.py"), app, str(steps), log, str(scale)]
            ids.append(ray.get(scheduler.submit.remote(argv, VIRTUAL_WORKERS, 1, VIRTUAL_WORKERS, f"job{i}", env, app,
                                                       None, "D2")))
        if suspend_all_at is not None and reserved is None and time.time() - begin >= suspend_all_at:
            reserved = time.time()
            ray.get(scheduler.reserve.remote(len(TYPES) * SLOTS))
        if suspend_all_at is not None and reserved is not None and time.time() - reserved >= 5:
            ray.get(scheduler.unreserve.remote())
            suspend_all_at = None
        jobs = ray.get(scheduler.status.remote())
        if not pending and all(j["state"] not in LIVE for j in jobs):
            break
        time.sleep(0.5)
    failed = [j["id"] for j in jobs if j["state"] != "finished"]
    if failed:
        raise RuntimeError(f"{policy}: jobs {failed} did not finish; logs in {work}/{policy}/state/logs")
    result = ray.get(scheduler.report.remote())
    rounds = ray.get(scheduler.round_seconds.remote())
    digests = set()
    for job in jobs:
        with open(os.path.join(job["log_dir"], "w0.log")) as f:
            digests.update(line.split()[-1] for line in f if "sha256" in line)
    ray.kill(scheduler)
    return result, rounds, digests, reserved


def measure(folder, reserved=None) -> dict:
    """The costs (COSTS and TRAINING: (processes, seconds, when) each) that a run measured, from what it left in
    `folder`: its job table (state/jobs.sqlite) and each job's step log (rows `step processes start end`).
    `reserved`: when every slot was reserved (its suspensions are timed from then)."""
    from easyscale_ext.cluster.jobtable import JobTable
    from easyscale_ext.cluster.report import run_result

    table = JobTable(os.path.join(folder, "state", "jobs.sqlite"), read_only=True)
    jobs, timeline = table.list(), table.allocations()
    result = run_result(jobs, timeline, "", "", 0.0)
    costs = {c: [] for c in (*COSTS, TRAINING)}
    t0 = min(j["submitted"] for j in jobs)
    records = {r["name"]: r for r in result.jobs}
    for i, job in enumerate(jobs):  # in submission order, as the trace's step logs
        with open(os.path.join(folder, f"steps{i}.log")) as f:
            rows = [tuple(map(float, line.split())) for line in f]
        held = sorted((s + t0, e + t0, n) for (name, s, e, n) in result.segments if name == job["id"])
        costs["start"].append((held[0][2], rows[0][2] - held[0][0], held[0][0]))
        if held[0][0] - job["submitted"] < 1.0:  # given slots in its own arrival's round: the scheduler's lag
            costs["lag"].append((0, held[0][0] - job["submitted"], job["submitted"]))
        costs["exit"].append((rows[-1][1], records[job["id"]]["completion"] + t0 - rows[-1][3], rows[-1][3]))
        for size, stretch in itertools.groupby(rows, key=lambda r: r[1]):
            stretch = list(stretch)
            costs[TRAINING].append((size, stretch[-1][3] - stretch[0][2], stretch[0][2]))
        usual = statistics.median(b[2] - a[3] for a, b in zip(rows, rows[1:]) if a[1] == b[1])
        costs["pause"] += [(0, b[2] - a[3] - usual, a[3]) for a, b in zip(rows, rows[1:])
                           if a[1] != b[1] and b[2] - a[3] < 5]
        for (_, end, before), (at, _, after) in zip(held, held[1:]):
            first = next((r for r in rows if r[2] >= at), None)
            if at - end > 0.5 and first:  # it held nothing between: a suspension, then a resume
                costs["resume"].append((after, first[2] - at, at))
                if reserved is not None and end > reserved:  # left its slots when the table last said it held none
                    left = max(t for t, name, nodes in timeline if name == job["id"] and not nodes and end <= t < at)
                    costs["suspend"].append((before, left - reserved, reserved))
            elif after > before:  # a growth in place: from the allocation to the joiners' admission
                grown = next((k for k, r in enumerate(rows) if r[1] == after and r[2] >= at), None)
                if grown:
                    costs["join"].append((after - before, rows[grown - 1][3] - at, at))
    return costs


def calibrated(measured) -> dict:
    """The simulator's costs from the calibration's events. Processes that start at once (first starts, resumes,
    joiners) share this machine with each other and with the processes training beside them
    (RuntimeCosts.parallel_starts, start_weight, training_weight): a start of n processes weighs n ** start_weight, a
    training process training_weight; each start's load is the weight starting or training beside it, averaged
    over its duration (its own included); the weights and `parallel_starts` are those that fit the starts best
    (least squares of the log), each kind of start costing its median at full speed. An exit's cost grows with
    the processes that exit (exit_weight, fitted alike); the other costs are medians."""
    import numpy as np

    starts = [(kind, n, s, at) for kind in STARTS for n, s, at in measured[kind] if s > 0]
    training = measured.get(TRAINING, [])

    def overlap(at, s, a, t):
        return max(min(at + s, a + t) - max(at, a), 0.0)

    def load(weight, beside):  # each start's (kind, seconds, load on average over its span)
        return [(kind, s, (sum(m ** weight * overlap(at, s, a, t) for _, m, t, a in starts)
                           + beside * sum(m * overlap(at, s, a, t) for m, t, a in training)) / s)
                for kind, _, s, at in starts]

    def fit(shared, parallel):
        full = {kind: statistics.median([s / max(1.0, k / parallel) for c, s, k in shared if c == kind] or [0.0])
                for kind in STARTS}
        error = sum((np.log(s) - np.log(max(full[c] * max(1.0, k / parallel), 1e-3))) ** 2 for c, s, k in shared)
        return error, full, parallel

    costs = {c: max(statistics.median(s for _, s, _ in v), 0.0) if v else 0.0 for c, v in measured.items()
             if c in COSTS}
    exits = [(max(n, 1), s) for n, s, _ in measured["exit"] if s > 0]  # n = 0: a cost file from before n was kept

    def exit_fit(weight):  # (error, one process's exit, weight): n processes take one * n ** weight
        one = statistics.median(s / n ** weight for n, s in exits)
        return sum((np.log(s) - np.log(one * n ** weight)) ** 2 for n, s in exits), one, round(float(weight), 2)

    costs["exit_weight"] = 0.0
    if exits:  # the weight that fits the exits best (least squares of the log)
        _, costs["exit"], costs["exit_weight"] = min(map(exit_fit, np.arange(0.0, 1.05, 0.05)))
    if not starts:
        return dict(costs, parallel_starts=0.0, start_weight=1.0, training_weight=0.0)
    fits = [(fit(shared, p), w, b) for w in np.arange(0.0, 1.05, 0.05) for b in np.arange(0.0, 1.05, 0.1)
            for shared in [load(w, b)] for p in np.arange(1.0, 16.25, 0.25)]
    (_, full, parallel), weight, beside = min(fits, key=lambda f: f[0][0])
    return dict(costs, **full, parallel_starts=float(parallel), start_weight=round(float(weight), 2),
                training_weight=round(float(beside), 2))


def simulate_run(policy, result, steps, scale, round_s, costs, jitter=0.0, seed=0):
    """The simulation of the real run `result`: its jobs, arriving when they did (each moved by up to `jitter`
    seconds either way, drawn with `seed`: a draw of the ensemble, see simulate_draws)."""
    from easyscale_ext.cluster import live
    from easyscale_ext.sched.models.application import Applications
    from easyscale_ext.sched.models.cluster import Cluster
    from easyscale_ext.sched.models.traces import data_dir
    from easyscale_ext.sched.policies import POLICIES as MADE
    from easyscale_ext.cluster.supervisor import TICK_S
    from easyscale_ext.sched.costs import RuntimeCosts
    from easyscale_ext.sched.simulator import SimConfig, simulate

    apps = Applications(data_dir())
    shift = random.Random(seed)
    arrivals = [max(0.0, j["arrival"] + (shift.uniform(-jitter, jitter) if jitter else 0.0)) for j in result.jobs]
    # each job as the scheduler modelled it (cluster.live: D2, so it may span types), known to last one short epoch
    specs = [replace(live.job_model(j["name"], at, VIRTUAL_WORKERS, VIRTUAL_WORKERS, apps[j["app"]],
                                    d2=True).spec, epochs=1) for j, at in zip(result.jobs, arrivals)]
    cluster = Cluster.parse(CLUSTER)
    config = SimConfig(round_s=round_s, start_s=costs["start"], restart_s=costs["resume"],
                       in_place_s=costs["pause"],
                       in_place="on",  # the cluster moves every job in place, whatever its policy's own runtime
                       slowdown={a: scale * steps / apps[a].noise.progress_at(1) for a in APPS})
    runtime = RuntimeCosts(exit_s=costs["exit"], exit_weight=costs["exit_weight"], join_s=costs["join"],
                           suspend_s=costs["suspend"], parallel_starts=costs["parallel_starts"],
                           start_weight=costs["start_weight"], training_weight=costs["training_weight"],
                           rounds_at_arrivals=True, arrival_lag_s=costs["lag"],
                           completion_poll_s=TICK_S,  # a job's end reaches the scheduler by the supervisor's look
                           reported_steps=steps)  # it learns a job runs, and its share done, from step reports
    return simulate(sorted(specs, key=lambda s: (s.arrival, s.name)), MADE[policy](0), cluster, apps, config,
                    costs=runtime)


def simulate_draws(policy, result, steps, scale, round_s, costs, draws, jitter) -> list:
    """(avg JCT, simulation) of `draws` simulations of `result`, by avg JCT: draw 0 as the jobs arrived, the others
    with arrivals moved by up to `jitter` s, as they differ between real runs of one trace. A policy whose decisions
    turn on near-ties (Sia's integer program) gives a spread of results from arrivals a fraction of a second apart;
    one simulation is one draw of it, as one real run is."""
    from easyscale_ext.sched.metrics import summarize

    sims = [simulate_run(policy, result, steps, scale, round_s, costs, jitter if k else 0.0, k) for k in range(draws)]
    return sorted(((summarize(s, len(TYPES) * SLOTS)["avg_jct"], s) for s in sims), key=lambda d: d[0])


def plot(folder, policy, result, real, simulated, sim):
    """The plots `easyscale cluster report` makes of the real run and `easyscale simulate --out` of its simulation,
    side by side in `folder` (real-POLICY-*.png, simulated-POLICY-*.png)."""
    from pathlib import Path
    from types import SimpleNamespace

    from easyscale_ext.cli.simulate import write_outputs

    cluster = SimpleNamespace(spec=CLUSTER, total_gpus=len(TYPES) * SLOTS)
    for stem, run, summary in (("real", result, real), ("simulated", simulated, sim)):
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the markdown
            write_outputs(Path(folder), stem, policy, cluster, SimpleNamespace(workload="bench_cluster", seed=0), {},
                          [policy], [(run, summary, 0.0)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--time-scale", type=float, default=4.0, help="emulated device time: this many times the "
                    "profiles' (a 4-GPU a100 step is 0.14 s, less than this CPU's own work for it)")
    ap.add_argument("--gap", type=float, default=5.0, help="seconds between arrivals")
    ap.add_argument("--round", type=float, default=5.0, help="seconds per scheduling round")
    ap.add_argument("--runs", type=int, default=3,
                    help="runs of each policy; the table gives medians (0: only the calibration, into --costs)")
    ap.add_argument("--draws", type=int, default=15, help="simulations of each real run (simulate_draws)")
    ap.add_argument("--jitter", type=float, default=0.5, help="seconds by which the draws after the first move each "
                    "arrival, at most: a job's submission time differs by about that between real runs")
    ap.add_argument("--calibration-policies", default="easyscale-heter,fifo",
                    help="the calibration runs' policies: one that grows jobs in place (1-process starts, joiners) and "
                    "one that starts whole jobs (4-process starts)")
    ap.add_argument("--costs", help="a JSON file of measured costs: read if it exists (no calibration run), else "
                    "written after the calibration run")
    ap.add_argument("--keep", help="a folder to keep the runs in (state, logs, each run's real and simulated results "
                    "as JSON and as plots) instead of a temporary one; runs kept there are simulated again, not rerun")
    args = ap.parse_args()
    from easyscale_ext.cluster.local import LocalCluster
    from easyscale_ext.sched.metrics import summarize
    from easyscale_ext.sched.simulator import Result

    cluster = LocalCluster(nodes=len(TYPES), slots=SLOTS, types=TYPES, emulate=True)
    trace = [(i * args.gap, APPS[i % len(APPS)]) for i in range(args.jobs)]
    print(f"# {args.jobs} jobs ({', '.join(APPS)} in turn, {VIRTUAL_WORKERS} virtual workers, {args.steps} steps, "
          f"D2, device time x{args.time_scale:g}), one every {args.gap:g} s, on {len(TYPES)} nodes x {SLOTS} slots "
          f"({', '.join(TYPES)}; instruction sets {cluster.isas}), rounds of {args.round:g} s. No GPU here: every "
          "process pads its step to its application's profile on its slot's type.\n")
    policies = args.policies.split(",")
    runs, digests = {p: [] for p in policies}, set()  # policy -> a row per run
    try:
        kept = contextlib.nullcontext(os.path.abspath(args.keep)) if args.keep else tempfile.TemporaryDirectory()
        with kept as work:
            if args.costs and os.path.exists(args.costs):
                with open(args.costs) as f:
                    measured = {c: [] for c in (*COSTS, TRAINING)}
                    measured.update((c, [tuple(e) for e in v]) for c, v in json.load(f).items())
            else:
                measured = {c: [] for c in (*COSTS, TRAINING)}
                for policy in args.calibration_policies.split(","):
                    folder = os.path.join(work, "calibration")
                    kept_run = os.path.join(folder, f"{policy}.json")
                    if os.path.exists(kept_run):  # a kept calibration run: measured again
                        with open(kept_run) as f:
                            saved = json.load(f)
                    else:
                        *_, hashes, reserved = run_for_real(policy, trace, args.steps, args.time_scale, args.round,
                                                            folder, suspend_all_at=args.gap * args.jobs / 2)
                        saved = {"reserved": reserved, "hashes": sorted(hashes)}
                        if args.keep:
                            with open(kept_run, "w") as f:
                                json.dump(saved, f)
                    digests |= set(saved["hashes"])
                    for c, events in measure(os.path.join(folder, policy), saved["reserved"]).items():
                        measured[c] += events
                if args.costs:
                    with open(args.costs, "w") as f:
                        json.dump(measured, f)
            costs, counts = calibrated(measured), {c: len(v) for c, v in measured.items()}
            print(f"calibration ({args.calibration_policies}): {costs} from {counts} events", file=sys.stderr)
            for run in range(args.runs):
                for policy in policies:
                    kept_run = os.path.join(work, str(run), f"{policy}.json")
                    if os.path.exists(kept_run):  # a kept run: simulated again, with these costs
                        with open(kept_run) as f:
                            saved = json.load(f)
                        result, rounds, hashes = Result(**saved["real"]), saved["rounds"], set(saved["hashes"])
                    else:
                        result, rounds, hashes, _ = run_for_real(policy, trace, args.steps, args.time_scale,
                                                                 args.round, os.path.join(work, str(run)))
                    digests |= hashes
                    real = summarize(result, len(TYPES) * SLOTS)
                    draws = simulate_draws(policy, result, args.steps, args.time_scale, args.round, costs,
                                           args.draws, args.jitter)
                    simulated = draws[len(draws) // 2][1]  # the median draw: kept and plotted
                    sim = summarize(simulated, len(TYPES) * SLOTS)
                    if args.keep:
                        with open(kept_run, "w") as f:
                            json.dump({"real": result.to_json(), "simulated": simulated.to_json(), "rounds": rounds,
                                       "hashes": sorted(hashes)}, f)
                        plot(os.path.join(work, str(run), "plots"), policy, result, real, simulated, sim)
                    runs[policy].append((real["avg_jct"], sim["avg_jct"], sim["avg_jct"] / real["avg_jct"],
                                         real["makespan"], sim["makespan"], statistics.median(rounds), max(rounds),
                                         [avg for avg, _ in draws]))
                    print(f"run {run + 1}, {policy}: sim / real {runs[policy][-1][2]:.2f}", file=sys.stderr,
                          flush=True)
    finally:
        cluster.shutdown()
    print("Calibration runs (" + args.calibration_policies + ", every slot reserved for 5 s halfway): medians, s: "
          + ", ".join(f"{c} {costs[c]:.2f} ({counts[c]} events)" for c in COSTS)
          + f" (start, resume and join at full speed; exit of one process, n of them taking n^"
          f"{costs['exit_weight']:g} times that); {costs['parallel_starts']:g} processes starting at once go at "
          f"full speed, more share the machine, a start of n processes weighing n^{costs['start_weight']:g} and "
          f"a process training beside them {costs['training_weight']:g}\n")
    if args.runs == 0:  # a calibration alone (into --costs)
        return
    print(f"Real: median of {args.runs} runs (each run's in brackets). Simulated: median of {args.draws} draws per "
          f"run, all runs' together (simulate_draws: arrivals moved by up to {args.jitter:g} s; their 10th-90th "
          "percentiles beside). sim / real: of those medians (each run's draws' median over its real one in "
          "brackets).\n")
    print("| policy | avg JCT real (s) | avg JCT simulated (s) | draws p10-p90 | sim / real | makespan real "
          "| makespan sim | round median / max (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for p, r in runs.items():
        pooled = sorted(avg for row in r for avg in row[7])
        real, mreal, msim, rmed = (statistics.median(row[k] for row in r) for k in (0, 3, 4, 5))
        rows[p] = (real, statistics.median(pooled))
        tenth = lambda q: pooled[min(len(pooled) - 1, round(q * (len(pooled) - 1)))]  # noqa: E731
        print(f"| {p} | {real:.1f} [{', '.join(f'{row[0]:.0f}' for row in r)}] | {rows[p][1]:.1f} | "
              f"{tenth(0.1):.0f}-{tenth(0.9):.0f} | {rows[p][1] / real:.2f} [{', '.join(f'{row[2]:.2f}' for row in r)}]"
              f" | {mreal:.1f} | {msim:.1f} | {rmed:.3f} / {max(row[6] for row in r):.3f} |")
    order_real = sorted(rows, key=lambda p: rows[p][0])
    order_sim = sorted(rows, key=lambda p: rows[p][1])
    # a pair the drivers order differently, where both drivers put them more than TIE apart (else a tie)
    swapped = [(a, b) for a, b in itertools.combinations(rows, 2)
               if (rows[a][0] - rows[b][0]) * (rows[a][1] - rows[b][1]) < 0]
    apart = [(a, b) for a, b in swapped if all(abs(rows[a][k] / rows[b][k] - 1) > TIE for k in (0, 1))]
    verdict = "same" if not swapped else "DIFFERENT" if apart else \
        f"same but for ties within {TIE:.0%} in one driver: " + ", ".join(f"{a} and {b}" for a, b in swapped)
    print(f"\nordering by avg JCT: real {order_real}, simulated {order_sim} ({verdict})")
    print(f"final states: {len(digests)} distinct SHA-256 over every job of every run, calibration included "
          "(1 = bitwise identical)")


if __name__ == "__main__":
    main()

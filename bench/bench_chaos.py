"""Random faults against cluster mode: jobs on a 3-node local Ray cluster (2 slots a node) under a scheduler that
Ray restarts, running each --policy in turn, while faults drawn with a seed strike every GAP seconds or so:

    kill -9        a job's process (SIGKILL)                SIGTERM     a job's process (a preemption)
    slot actor     the Ray actor of a job's slot killed     supervisor  a job's supervisor (its store's host) killed
    node           a slot node removed, another added       scheduler   the scheduler's actor killed
    reservation    a slot reserved, given back GAP/2 .. GAP seconds later

Checked: every job ends finished with its fixed-size run's SHA-256 (bits changed: 0), none is lost (still live once
no job has stepped for 10 minutes), and no job runs twice at once (every 0.25 s, the live processes of each job,
read from /proc, must all talk to one store).
Measured: for each fault, the time it cost = how long the jobs running when it struck took to get past the step
they were at, less one step of the same seed's fault-free run (a job not hit: about 0); the table gives it by
kind, beside the makespan and mean job time of both runs. Each job stands for a profiled application (the
policies that model jobs by theirs need one), drawn with the seed; preemptions, moves and reallocations are the
policy's own. With several policies, a last table gives a row per policy. Exit status 1 if a check failed.

    .venv/bin/python bench/bench_chaos.py [--policy fifo[,tiresias,...]] [--faults 30] [--jobs 6] [--seed 0]
                                          [--gap 7] [--steps 150] [--no-baseline] [--json FILE] [--work DIR]
"""
import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from support.jobs import JOB, run_job  # noqa: E402

KINDS = ("kill -9", "SIGTERM", "slot actor", "supervisor", "node", "scheduler", "reservation")
TARGETED = ("kill -9", "SIGTERM", "slot actor", "supervisor")  # one job's
NODES, SLOTS = 3, 2
STEP_SLEEP = 0.3


APPLICATIONS = ("cifar10", "imagenet", "bert", "yolov3", "deepspeech2")  # what a job stands for, to a policy


def job_specs(seed: int, jobs: int, steps: int):
    """The jobs, the same for a seed with or without faults: (virtual workers, most slots, steps per epoch)."""
    rng = random.Random(seed)
    return [(rng.choice((2, 4)), rng.choice((1, 2)), rng.randint(steps * 3 // 4, steps)) for _ in range(jobs)]


def applications(seed: int, jobs: int):
    """Each job's application, drawn apart from job_specs so that its jobs stay those of earlier runs."""
    rng = random.Random(f"applications {seed}")
    return [rng.choice(APPLICATIONS) for _ in range(jobs)]


def argv(out: str, ckpt: str, n: int, steps: int):
    return [JOB, "--mode", "easyscale", "--elastic", "1", "--out", out, "--virtual-workers", str(n),
            "--steps", str(steps), "--step-sleep", str(STEP_SLEEP), "--ckpt-dir", ckpt, "--ckpt-every", "3",
            "--resume", "1", "--block", "0"]  # as member.run: training goes on while joiners prepare


def stores_by_job(outs, fork_servers):
    """{job's --out: (the store, the pid) of each of its live processes}: from /proc for fresh interpreters (a zombie
    has no cmdline), from `fork_servers` (the nodes' NodeForkServer actors) for their children, each checked in
    /proc."""
    import ray
    from easyscale_ext.elastic.client import STORE_ENV

    def read(pid, what):
        try:
            with open(f"/proc/{pid}/{what}", "rb") as f:
                return [entry.decode() for entry in f.read().split(b"\0") if entry]
        except OSError:  # it exited meanwhile
            return []

    processes = {}  # pid -> (argv, environment)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if JOB in (argv := read(pid, "cmdline")):
            processes[pid] = argv, dict(e.split("=", 1) for e in read(pid, "environ") if "=" in e)
    for server in fork_servers:
        try:
            forked = ray.get(server.running.remote([STORE_ENV]), timeout=30)
        except ray.exceptions.RayError:  # gone with its node, and its children with their slots
            continue
        processes.update((str(pid), seen) for pid, seen in forked.items() if read(pid, "cmdline"))
    found = {}
    for pid, (argv, env) in processes.items():
        out = argv[argv.index("--out") + 1] if "--out" in argv else None
        if out in outs and STORE_ENV in env:
            found.setdefault(out, []).append((env[STORE_ENV], int(pid)))
    return found


class Chaos:
    """One run: the cluster, its scheduler, the jobs, a watcher of their progress and a fault injector."""

    def __init__(self, work: str, specs, seed: int, policy: str):
        from easyscale_ext.cluster.local import LocalCluster

        self.local = LocalCluster(nodes=NODES, slots=SLOTS)  # first: it keeps Ray on loopback, before Ray loads
        import ray

        from easyscale_ext.cluster.scheduler import launch

        self.ray, self.rng = ray, random.Random(seed + 1)
        self.scheduler = launch(os.path.join(work, "state"), policy, 0.5, max_restarts=-1)
        env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
        self.outs, self.ids = {}, []
        for i, ((n, procs, steps), app) in enumerate(zip(specs, applications(seed, len(specs)))):
            out = os.path.join(work, f"hash{i}")
            # Not self.call: a submission is not repeated (one the scheduler was slow to answer under load would be
            # queued twice); no fault strikes before the last one.
            job = ray.get(self.scheduler.submit.remote(argv(out, os.path.join(work, f"ckpt{i}"), n, steps), n, 1,
                                                       procs, f"job{i}", env, app))
            self.ids.append(job)
            self.outs[out] = job
        self.timeline = {job: [] for job in self.ids}  # job -> [(time, state, step)]
        self.twice = []  # (time, job, [(store, pid)]): a job seen running under two stores at once
        self.most_processes = 0  # the most job processes the watcher saw at once (it sees them: more than 0)
        self.faults = []
        self.done = threading.Event()
        self.watcher = threading.Thread(target=self.watch, daemon=True)
        self.t0 = time.time()  # the faults' and the jobs' times count from here
        self.watcher.start()

    def call(self, verb, *args):
        """A scheduler verb, waiting out the scheduler's restarts. A call that timed out is waited for again, never
        made again: the scheduler may still carry it out, and a reserve made twice takes two slots. One that the
        scheduler's death failed is made again: faults strike one at a time, so the scheduler is never killed
        while it carries out the injector's reserve (a timer's unreserve can be: made again, it may give a second
        slot of its node back early)."""
        deadline, pending = time.monotonic() + 120, None
        while True:
            try:
                if pending is None:
                    pending = getattr(self.scheduler, verb).remote(*args)
                return self.ray.get(pending, timeout=30)
            except self.ray.exceptions.GetTimeoutError:
                if time.monotonic() > deadline:
                    raise
            except self.ray.exceptions.RayActorError:
                if time.monotonic() > deadline:
                    raise
                pending = None
                time.sleep(0.5)

    def watch(self):
        while not self.done.is_set():
            now = time.time()
            for job in self.call("status"):
                if job["id"] not in self.timeline:
                    continue
                progress = (job["live"] or {}).get("progress") or {}
                self.timeline[job["id"]].append((now, job["state"], progress.get("step", 0),
                                                 list((job["live"] or {}).get("members", []))))
            found = stores_by_job(self.outs, self.fork_servers())
            self.most_processes = max(self.most_processes, sum(map(len, found.values())))
            for out, seen in found.items():
                if len({store for store, _ in seen}) > 1:  # which processes: to tell a lingering one's story
                    self.twice.append((now, self.outs[out], sorted(seen)))
            time.sleep(0.25)

    def fork_servers(self):
        """The fork servers of the nodes up now (none on a node that has not started a process yet)."""
        from easyscale_ext.cluster import NAMESPACE
        from easyscale_ext.cluster.worker import fork_server_name

        servers = []
        for node in self.local.node_ids():
            try:
                servers.append(self.ray.get_actor(fork_server_name(node), namespace=NAMESPACE))
            except ValueError:
                pass
        return servers

    def latest(self, job):
        return self.timeline[job][-1] if self.timeline[job] else (0, "queued", 0, [])

    def running(self):
        return [job for job in self.ids if self.latest(job)[1] == "running" and self.latest(job)[3]]

    def strike(self, kind: str):
        """Inject one fault of `kind`; returns what it hit, or None if nothing is there to hit yet."""
        ray, rng = self.ray, self.rng
        from easyscale_ext.cluster import NAMESPACE

        running = self.running()
        if kind in TARGETED:
            if not running:
                return None
            job = rng.choice(running)
            try:
                if kind == "supervisor":
                    ray.kill(ray.get_actor(f"job/{job}", namespace=NAMESPACE))
                    return job
                worker = rng.choice(self.latest(job)[3])
                actor = ray.get_actor(f"{job}/{worker}", namespace=NAMESPACE)
                if kind == "slot actor":
                    ray.kill(actor)
                else:
                    pid = ray.get(actor.pid.remote(), timeout=30)
                    os.kill(pid, signal.SIGKILL if kind == "kill -9" else signal.SIGTERM)
            except (ValueError, ray.exceptions.RayError, ProcessLookupError):  # it ended since the last look
                return None
            return f"{job}/{worker}"
        if kind == "node":
            nodes = self.local.node_ids()
            gone = rng.choice(nodes)
            self.local.remove_node(nodes.index(gone))
            added = self.local.add_node(SLOTS)  # its index, in node_ids() once it is added
            return f"node {gone[:8]} -> {self.local.node_ids()[added][:8]}"
        if kind == "scheduler":
            ray.kill(self.scheduler, no_restart=False)  # as a crash: Ray starts it again
            return "scheduler"
        hold = rng.uniform(0.5, 1.0) * self.gap
        try:
            node = self.call("reserve", 1)[0]
        except ray.exceptions.RayTaskError as e:  # every job at its minimum: refused, as it says
            return f"refused: {str(e).splitlines()[-1]}"
        timer = threading.Timer(hold, lambda: self.call("unreserve", 1, node))
        timer.start()
        self.releases.append(timer)
        return f"a slot on {node[:8]} for {hold:.0f} s"

    def inject(self, faults: int, gap: float):
        self.gap, self.releases = gap, []
        kinds = random.Random(self.rng.random()).choices(KINDS, k=faults)
        for kind in kinds:
            time.sleep(self.rng.uniform(0.5, 1.5) * gap)
            while True:
                at = time.time()
                steps = {job: self.latest(job)[2] for job in self.running()}
                hit = self.strike(kind)
                if hit is not None:
                    break
                time.sleep(1)
                if not self.watcher.is_alive():  # what it knows of the jobs would never change again
                    raise RuntimeError("the watcher of the jobs' status ended; its error is above")
                if all(self.latest(j)[1] in ("finished", "failed") for j in self.ids):
                    return
            self.faults.append(dict(kind=kind, at=at, hit=hit, steps=steps))
            print(f"{at - self.t0:7.1f} s  {kind:<12} {hit}", flush=True)
        for timer in self.releases:
            timer.join()

    def finish(self, stall: float):
        """Wait for every job to end, or until no job has stepped or changed state for `stall` seconds: a job still
        live then is lost. The jobs' statuses."""
        from easyscale_ext.cluster.lifecycle import LIVE

        seen, deadline = None, None
        while any(self.latest(j)[1] in LIVE for j in self.ids):
            now = [self.latest(j)[1:3] for j in self.ids]
            if now != seen:
                seen, deadline = now, time.monotonic() + stall
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        self.done.set()
        self.watcher.join()
        jobs = {j["id"]: j for j in self.call("status")}
        try:
            self.call("unreserve")
        finally:
            self.ray.kill(self.scheduler, no_restart=True)
            self.local.shutdown()
        return jobs


def run(work: str, specs, seed: int, faults: int, gap: float, policy: str) -> dict:
    """One run, its records by job (in submission order): status, timeline, SHA-256 written, time to its end."""
    chaos = Chaos(work, specs, seed, policy)
    if faults:
        chaos.inject(faults, gap)
    jobs = chaos.finish(stall=600)
    index = {job: i for i, job in enumerate(chaos.ids)}
    timeline = [chaos.timeline[job] for job in chaos.ids]
    ends = [next((t for t, state, _, _ in line if state in ("finished", "failed")), float("nan")) for line in timeline]
    outs = {job: out for out, job in chaos.outs.items()}
    return dict(jobs=[jobs[job] for job in chaos.ids], timeline=timeline, twice=chaos.twice,
                most_processes=chaos.most_processes,
                faults=[dict(f, steps={index[job]: step for job, step in f["steps"].items()}) for f in chaos.faults],
                sha256=[open(outs[job]).read() if os.path.exists(outs[job]) else None for job in chaos.ids],
                times=[end - chaos.t0 for end in ends])


def step_seconds(timeline) -> float:
    """A job's usual step: the median time between its progress reports' consecutive new steps."""
    firsts = {}
    for t, _, step, _ in timeline:
        firsts.setdefault(step, t)
    steps = sorted(firsts.items())
    gaps = [b[1] - a[1] for a, b in zip(steps, steps[1:]) if b[0] == a[0] + 1]
    return statistics.median(gaps) if gaps else 0.0


def fault_cost(fault, timelines, usual) -> float:
    """Seconds the jobs running when `fault` struck took to get past the step they were at, less a usual step:
    the worst of them (a job the fault did not touch: about 0)."""
    costs = []
    for i, step in fault["steps"].items():
        past = next((t for t, _, s, _ in timelines[i] if t > fault["at"] and s > step), None)
        if past is not None:
            costs.append(max(past - fault["at"] - usual[i], 0.0))
    return max(costs, default=0.0)


def report(runs: dict, specs, references) -> dict:
    """Print one policy's checks and tables; its row of the summary."""
    chaos = runs["chaos"]
    lost = [j["id"] for j in chaos["jobs"] if j["state"] != "finished"]
    changed = [j["id"] for j, digest, (n, _, steps) in zip(chaos["jobs"], chaos["sha256"], specs)
               if j["state"] == "finished" and digest != references[n, steps]]
    usual = [step_seconds(line) for line in runs.get("fault-free", chaos)["timeline"]]
    print(f"\njobs lost: {len(lost)} {lost}  bits changed: {len(changed)} {changed}  "
          f"run twice at once: {len(chaos['twice'])} {chaos['twice'][:3]}  "
          f"processes seen at once: up to {chaos['most_processes']}")
    for job in chaos["jobs"]:
        print(f"  {job['id']}: {job['state']} {job.get('note') or ''}")
    print("\n| fault | count | time it cost, median (s) | max (s) |\n|---|---:|---:|---:|")
    for kind in KINDS:
        costs = [fault_cost(f, chaos["timeline"], usual) for f in chaos["faults"] if f["kind"] == kind]
        if costs:
            print(f"| {kind} | {len(costs)} | {statistics.median(costs):.1f} | {max(costs):.1f} |")
    print("\n| run | makespan (s) | mean job time (s) |\n|---|---:|---:|")
    for name, r in runs.items():
        print(f"| {name} | {max(r['times']):.0f} | {statistics.mean(r['times']):.0f} |")
    return dict(lost=len(lost), changed=len(changed), twice=len(chaos["twice"]), faults=len(chaos["faults"]),
                makespans={name: max(r["times"]) for name, r in runs.items()})


def main():
    from easyscale_ext.sched.policies import POLICIES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="fifo", help="the scheduler's policies, comma-separated, run in turn")
    ap.add_argument("--faults", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gap", type=float, default=7.0, help="mean seconds between faults")
    ap.add_argument("--steps", type=int, default=150, help="most steps per epoch of a job (2 epochs)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the fault-free run (costs less one step of "
                    "the faulty run's own usual step)")
    ap.add_argument("--json", default="", help="write the runs' records here")
    ap.add_argument("--work", default="", help="keep the runs' job tables, logs and checkpoints in this folder")
    args = ap.parse_args()
    policies = args.policy.split(",")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        ap.error(f"unknown --policy {', '.join(unknown)}: choose from {', '.join(POLICIES)}")

    specs = job_specs(args.seed, args.jobs, args.steps)
    references = {(n, steps): None for n, _, steps in specs}
    for key in references:
        references[key] = run_job("reference", n=key[0], steps=key[1])
    rows, records = {}, {}
    with contextlib.nullcontext(args.work) if args.work else tempfile.TemporaryDirectory() as work:
        for policy in policies:
            runs = {}
            for name, faults in ([] if args.no_baseline else [("fault-free", 0)]) + [("chaos", args.faults)]:
                print(f"-- {policy}, {name}: {len(specs)} jobs (virtual workers, slots, steps per epoch) {specs}",
                      flush=True)
                runs[name] = run(os.path.join(work, policy, name), specs, args.seed, faults, args.gap, policy)
            rows[policy] = report(runs, specs, references)
            records[policy] = {k: {key: v[key] for key in ("faults", "twice", "times")} for k, v in runs.items()}
    if len(policies) > 1:
        print("\n| policy | faults | jobs lost | bits changed | run twice at once | makespan, fault-free (s) | "
              "makespan, faults (s) | ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|")
        for policy, row in rows.items():
            free, chaos = row["makespans"].get("fault-free"), row["makespans"]["chaos"]
            print(f"| {policy} | {row['faults']} | {row['lost']} | {row['changed']} | {row['twice']} | "
                  f"{free or float('nan'):.0f} | {chaos:.0f} | {chaos / free if free else float('nan'):.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1, default=str)
    sys.exit(1 if any(row["lost"] or row["changed"] or row["twice"] for row in rows.values()) else 0)


if __name__ == "__main__":
    main()

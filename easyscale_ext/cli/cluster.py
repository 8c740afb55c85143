"""Cluster mode's commands: `easyscale cluster start|stop|reserve|unreserve|report`, `submit`, `status`, `logs`,
`cancel`.

`cluster start` without --address starts Ray on this machine (on loopback: a head, and a node per entry of
--slots, each of its type) and the scheduler; with --address it joins an existing Ray cluster (`ray start --head` and
`ray start --address` on the machines, or KubeRay) and starts the scheduler there. The other commands
reach the scheduler through Ray (`status` reads the scheduler's job table instead, where it is on this machine and
fresh); the cluster's address and state folder are kept in $EASYSCALE_HOME (default ~/.easyscale).
"""
import argparse
import os
import socket
import sqlite3
import sys
import time
from collections import Counter

from ..cluster.lifecycle import HOLDING, LIVE
from . import ray_session as session
from .errors import UsageError


SHOWN_ENDED = 10  # jobs that ended shown by `status` without --all
FRESH_S = 3.0  # `status` reads the job table if the scheduler's next description there is at most this late


def add_parsers(sub) -> None:
    from ..sched.policies import POLICIES

    p = sub.add_parser("cluster", help="start or stop cluster mode (Ray) and its scheduler")
    verbs = p.add_subparsers(dest="verb", required=True)
    q = verbs.add_parser("start", help="start the scheduler (and, without --address, Ray on this machine)")
    q.add_argument("--address", help="join this Ray cluster (HOST:PORT of its head) instead of starting one")
    q.add_argument("--slots-per-node", "--slots", dest="slots", default=None, metavar="K[:TYPE][,K:TYPE...]",
                   help="when Ray is started here: a node per entry, with K slots standing for the device TYPE "
                        "(default: one node, this machine's CPU count, of --slot-type); e.g. 4:t4,4:a100")
    q.add_argument("--policy", default="fifo", help=f"the scheduling policy: {', '.join(POLICIES)} (default fifo, "
                   "which, as yarn-cs and tiresias, needs no --application; for jobs that name theirs, "
                   "elastic-goodput for the lowest average JCT, sia-inplace for the lowest p99 JCT and makespan: "
                   "BENCHMARKS.md)")
    q.add_argument("--round", type=float, default=60.0, metavar="SECONDS", help="seconds per round (default 60)")
    q.add_argument("--no-preempt", dest="preempt", action="store_false",
                   help="never suspend a job: a reservation takes only slots above the jobs' minimums")
    q.add_argument("--slot-type", default="t4", help="the GPU type whose profiles model a slot of a node that "
                   "declares none (default t4)")
    q.set_defaults(run=start)
    q = verbs.add_parser("stop", help="stop the scheduler, and the Ray processes `cluster start` started (no others)")
    q.set_defaults(run=stop)
    q = verbs.add_parser("reserve", help="take K slots back from training (jobs leave them in place)")
    q.add_argument("count", type=int, metavar="K")
    q.add_argument("--node", default=None, help="on this node (an id or its first characters; default any)")
    q.set_defaults(run=reserve)
    q = verbs.add_parser("unreserve", help="give reserved slots back to training")
    q.add_argument("count", type=int, nargs="?", default=None, metavar="K", help="how many (default all)")
    q.add_argument("--node", default=None)
    q.set_defaults(run=unreserve)
    q = verbs.add_parser("report", help="the run's JSON and plots, as `easyscale simulate --out` writes them")
    q.add_argument("--out", required=True, help="folder to write to")
    q.set_defaults(run=report)
    # No abbreviations: `--n` must not be taken as --name (and everything after the script is the script's).
    p = sub.add_parser("submit", allow_abbrev=False, usage="%(prog)s --virtual-workers N [options] [--] SCRIPT [ARGS]",
                       help="run a training script as a job of the cluster; prints its id",
                       description="Everything after the script's path is the script's own arguments, as with "
                                   "torchrun: `easyscale submit --virtual-workers 4 train.py --epochs 3`.")
    p.add_argument("--virtual-workers", type=int, required=True, help="the job's N")
    p.add_argument("--min-procs", type=int, default=1)
    p.add_argument("--max-procs", type=int, default=None,
                   help="at most this many slots (default N; capped to the cluster's slots)")
    p.add_argument("--name", default=None)
    p.add_argument("--application", default=None,
                   help="the profiled application that models the job for the policy (e.g. cifar10)")
    p.add_argument("--batch-size", type=int, default=None, help="the job's global batch, for its model")
    p.add_argument("--level", default="D0", help="determinism level D0, D1 or D2 whose environment the job's "
                   "processes get (default D0); a D2 job may span device types, balanced by measured speed")
    p.add_argument("--isa", default=None, help="D2's instruction-set floor (default AVX2)")
    p.add_argument("script", help="the training script (a path every node reads)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    p.set_defaults(run=submit)
    p = sub.add_parser("status", help="the cluster's jobs: state, processes and where, progress")
    p.add_argument("job", nargs="?")
    p.add_argument("--all", action="store_true", help=f"every job ended (default: the {SHOWN_ENDED} that ended last)")
    p.set_defaults(run=status)
    p = sub.add_parser("logs", help="a job's output (of its first process, or --worker)")
    p.add_argument("job")
    p.add_argument("--worker", default=None)
    p.add_argument("-f", "--follow", action="store_true")
    p.set_defaults(run=logs)
    p = sub.add_parser("cancel", help="stop a job")
    p.add_argument("job")
    p.set_defaults(run=cancel)


def _call(ray, ref):
    """A scheduler call's result; its ValueError (bad input) as one line."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = e.as_instanceof_cause()
        if isinstance(cause, ValueError):
            raise UsageError(str(cause).splitlines()[-1].removeprefix("ValueError: "))
        raise


def start(args) -> int:
    from ..sched.policies import POLICIES

    if args.policy not in POLICIES:
        raise UsageError(f"unknown policy {args.policy!r}: choose one of {', '.join(POLICIES)}")
    slots = _slots(args.slots, args.slot_type)
    state = session.home()
    os.makedirs(state, exist_ok=True)
    saved = session.running()
    if saved is None:
        saved = session.start_ray(args.address, slots, state)
    elif args.address not in (None, saved["address"]) or args.slots is not None and saved["local"]:
        raise UsageError(f"a cluster is running at {saved['address']}: stop it first with `easyscale cluster stop` "
                         "to start another or change its slots")
    else:
        print(f"easyscale: Ray already runs at {saved['address']}; starting its scheduler unless it runs",
              file=sys.stderr)
    address = saved["address"]
    os.environ.update(session.ray_env(saved))
    import ray

    from ..cluster.scheduler import launch

    session.init_ray(address, "start its head with `ray start --head`, or leave out --address to start one here")
    # max_restarts: if its actor dies, Ray starts it again and it takes its jobs back from the job table
    scheduler = launch(saved["state"], args.policy, args.round, args.slot_type, args.preempt, name="scheduler",
                       lifetime="detached", get_if_exists=True, max_restarts=-1)
    try:
        ray.get(scheduler.status.remote())
    except ray.exceptions.RayActorError as e:
        raise UsageError(str(e.__cause__ or e).splitlines()[-1])
    print(f"easyscale: cluster at {address}, scheduler running ({args.policy}, rounds of {args.round:g} s); "
          "submit jobs with `easyscale submit --virtual-workers N SCRIPT [ARGS]`")
    return 0


def _slots(spec, default_type: str) -> str:
    """`--slots` checked, as `python -m easyscale_ext.cluster.local` takes it (K: this machine's CPU count if not
    given), or a UsageError."""
    from ..sched.models.application import GPU_TYPES

    entries = [entry.partition(":") for entry in (spec or str(os.cpu_count())).split(",")]
    for count, colon, gpu_type in entries:
        if not count.isdigit() or int(count) < 1 or colon and not gpu_type:
            raise UsageError(f"--slots {spec}: expected K or K:TYPE entries with K >= 1 slots, separated by commas, "
                             "e.g. 4 or 4:t4,4:a100")
    for t in {t for _, _, t in entries if t} | {default_type}:
        if t not in GPU_TYPES:
            raise UsageError(f"unknown slot type {t!r}: the profiles know {', '.join(GPU_TYPES)}")
    return ",".join(f"{k}:{t}" if t else k for k, _, t in entries)


def stop(args) -> int:
    saved = session.load()
    try:
        ray, scheduler = session.connect(saved)
        ray.kill(scheduler)
        ray.shutdown()
        stopped = ["the scheduler"]
    except UsageError as e:  # nothing to stop there: say so, and end what this machine's Ray left
        print(f"easyscale: {e}", file=sys.stderr)
        stopped = []
    if saved["local"] and "ray_sessions" in saved:
        stopped.append(f"Ray at {saved['address']} ({session.stop_ray(saved)} processes `cluster start` started)")
    elif saved["local"]:  # started by a version that did not record its processes
        print("easyscale: this cluster's Ray was started by an earlier version that did not record its processes: "
              "end it with `ray stop` (which ends every Ray on this machine)", file=sys.stderr)
    else:
        print(f"easyscale: Ray at {saved['address']} was not started here and keeps running", file=sys.stderr)
    os.unlink(os.path.join(session.home(), "cluster.json"))
    print(f"easyscale: stopped {' and '.join(stopped) or 'nothing (nothing was running)'}")
    return 0


def submit(args) -> int:
    ray, scheduler = session.connect(session.load())
    job = _call(ray, scheduler.submit.remote([os.path.abspath(args.script)] + args.args, args.virtual_workers,
                                             args.min_procs, args.max_procs, args.name,
                                             {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
                                             args.application, args.batch_size, args.level, args.isa))
    capped = _call(ray, scheduler.status.remote(job))[0]["max_procs"]
    if capped < (args.max_procs or args.virtual_workers):
        print(f"easyscale: the cluster has {capped} slots: {job} runs on at most {capped} processes "
              f"(of {args.max_procs or args.virtual_workers} asked)", file=sys.stderr)
    print(job)
    return 0


def _from_table(saved: dict, job_id, ended):
    """(nodes, jobs) as `status` shows them, read from the scheduler's job table if the scheduler runs on this
    machine and is not late (by FRESH_S) to describe the cluster there again; else None (ask it through Ray, which also
    says what is wrong when it does not run)."""
    from ..cluster.jobtable import JobTable, no_such_job

    path = os.path.join(saved["state"], "jobs.sqlite")
    if not os.path.exists(path) or session.ended(saved):
        return None
    try:
        table = JobTable(path, read_only=True)
        described = table.described()
        if described is None or described["host"] != socket.gethostname() or \
                not os.path.exists(f"/proc/{described['pid']}") or \
                time.time() - described["time"] > (described["next_s"] or 0.0) + FRESH_S:
            return None
        jobs = table.shown(job_id, ended)
    except sqlite3.Error:  # a table of an older scheduler: ask it
        return None
    if job_id and not jobs:
        raise UsageError(no_such_job(job_id))
    for job in jobs:
        if job["state"] not in HOLDING:  # its last answer is history
            job["live"] = None
    return described["nodes"], jobs


def status(args) -> int:
    saved = session.load()
    ended = None if args.all else SHOWN_ENDED
    shown = _from_table(saved, args.job, ended)
    if shown is None:
        ray, scheduler = session.connect(saved)
        shown = _call(ray, scheduler.nodes.remote()), _call(ray, scheduler.status.remote(args.job, ended))
    nodes, jobs = shown
    if not args.job:
        print(f"{'node':<10} {'type':<8} {'slots':>5} {'reserved':>8} {'held':>5}")
        for node in nodes:
            print(f"{node['node'][:8]:<10} {node['type']:<8} {node['slots']:>5} {node['reserved']:>8} "
                  f"{node['held']:>5}")
        print()
    print(f"{'job':<24} {'state':<10} {'processes on nodes':<28} {'steps/s':>8} {'progress':>12}")
    for job in jobs:
        live = job["live"] or {}
        progress = live.get("progress") or {}
        where = ", ".join(f"{n}x {node[:8]}" for node, n in Counter(live.get("nodes", [])).items())
        rate = f"{1 / job['step_s']:.2f}" if job.get("step_s") else ""
        step = f"{progress['step']}/{progress.get('total') or '?'}" if progress else ""
        # why it waits, or why it failed (its first failed process's last line; `easyscale logs` has the rest)
        note = f"  ({job['note']})" if job["state"] in (*LIVE, "failed") and job.get("note") else ""
        print(f"{job['id']:<24} {job['state']:<10} {where:<28} {rate:>8} {step:>12}{note}")
    if not args.job and not args.all and sum(j["state"] not in LIVE for j in jobs) == SHOWN_ENDED:
        print(f"(the {SHOWN_ENDED} jobs that ended last; `easyscale status --all` lists every one)")
    return 0


def logs(args) -> int:
    ray, scheduler = session.connect(session.load())
    offset = 0
    while True:  # with -f, the state is read before the output, so the output read after an end is all of it
        ended = not args.follow or _call(ray, scheduler.status.remote(args.job))[0]["state"] not in LIVE
        chunk = _call(ray, scheduler.log.remote(args.job, args.worker, offset))
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
        offset += len(chunk)
        if ended and not chunk:
            return 0
        if not chunk:
            time.sleep(1.0)


def _node(ray, scheduler, prefix):
    """The full id of the node whose id starts with `prefix` (None: any node)."""
    if prefix is None:
        return None
    ids = [n["node"] for n in _call(ray, scheduler.nodes.remote()) if n["node"].startswith(prefix)]
    if len(ids) != 1:
        raise UsageError(f"{'no' if not ids else 'more than one'} node with an id starting {prefix!r}: "
                         "`easyscale status` lists them")
    return ids[0]


def reserve(args) -> int:
    ray, scheduler = session.connect(session.load())
    taken = _call(ray, scheduler.reserve.remote(args.count, _node(ray, scheduler, args.node)))
    print(f"easyscale: reserved {len(taken)} slots on " + ", ".join(f"{n}x {node[:8]}" for node, n in
                                                                   Counter(taken).items())
          + " (their jobs leave them at their next step boundary)")
    return 0


def unreserve(args) -> int:
    ray, scheduler = session.connect(session.load())
    count = _call(ray, scheduler.unreserve.remote(args.count, _node(ray, scheduler, args.node)))
    print(f"easyscale: {count} reserved slots given back to training")
    return 0


def report(args) -> int:
    from pathlib import Path
    from types import SimpleNamespace

    from ..sched.metrics import summarize
    from .simulate import write_outputs

    saved = session.load()
    ray, scheduler = session.connect(saved)
    result = _call(ray, scheduler.report.remote())
    if not result.jobs:
        raise UsageError("no job of this cluster has finished yet: report again later")
    slots = sum(n["slots"] for n in _call(ray, scheduler.nodes.remote()))
    summary = summarize(result, slots)
    write_outputs(Path(args.out), "cluster", result.policy, SimpleNamespace(spec=result.cluster, total_gpus=slots),
                  SimpleNamespace(workload=saved["address"], seed=0), {}, [result.policy], [(result, summary, 0.0)])
    return 0


def cancel(args) -> int:
    ray, scheduler = session.connect(session.load())
    _call(ray, scheduler.cancel.remote(args.job))
    print(f"easyscale: cancelled {args.job}")
    return 0

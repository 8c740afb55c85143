"""Cluster mode's commands: `easyscale cluster start|stop|reserve|unreserve|report`, `submit`, `status`, `logs`,
`cancel`.

`cluster start` without --address starts Ray on this machine (on loopback: a head, and a node per entry of
--slots, each of its type) and the scheduler; with --address it joins an existing Ray cluster (`ray start --head` and
`ray start --address` on the machines, or KubeRay) and starts the scheduler there. The other commands
reach the scheduler through Ray (`status` reads the scheduler's job table instead, where it is on this machine and
fresh); the cluster's address and state folder are kept in $EASYSCALE_HOME (default ~/.easyscale).
"""
import argparse
import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter

from ..sched.lifecycle import HOLDING, LIVE
from .errors import UsageError


SHOWN_ENDED = 10  # jobs that ended shown by `status` without --all
FRESH_S = 3.0  # `status` reads the job table if the scheduler described the cluster there within this many seconds


def home() -> str:
    return os.environ.get("EASYSCALE_HOME") or os.path.join(os.path.expanduser("~"), ".easyscale")


def add_parsers(sub) -> None:
    from ..sched.policies import POLICIES

    p = sub.add_parser("cluster", help="start or stop cluster mode (Ray) and its scheduler")
    verbs = p.add_subparsers(dest="verb", required=True)
    q = verbs.add_parser("start", help="start the scheduler (and, without --address, Ray on this machine)")
    q.add_argument("--address", help="join this Ray cluster (HOST:PORT of its head) instead of starting one")
    q.add_argument("--slots-per-node", "--slots", dest="slots", default=None, metavar="K[:TYPE][,K:TYPE...]",
                   help="when Ray is started here: a node per entry, with K slots standing for the device TYPE "
                        "(default: one node, this machine's CPU count, of --slot-type); e.g. 4:t4,4:a100")
    q.add_argument("--policy", default="fifo", help=f"the scheduling policy (default fifo): {', '.join(POLICIES)}")
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


def _saved() -> dict:
    path = os.path.join(home(), "cluster.json")
    if not os.path.exists(path):
        raise UsageError("no cluster is running: start one with `easyscale cluster start`")
    with open(path) as f:
        return json.load(f)


def _ray_env(saved: dict) -> dict:
    """What a process that starts or joins the cluster's Ray needs in its environment (before ray loads): a
    cluster started here stays on loopback and requires its token."""
    if not saved["local"]:
        return {}
    from ..cluster.local import loopback_env
    return dict(loopback_env(), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=saved["token"]) if "token" in saved \
        else loopback_env()  # started by a version without it


def _connect(saved: dict):
    """This process joined to the cluster's Ray, and the scheduler's handle."""
    os.environ.update(_ray_env(saved))
    import ray

    address = saved["address"]
    if _ended(saved):
        raise UsageError(f"the cluster at {address} is not running (its Ray processes are gone): start it again "
                         "with `easyscale cluster start`")
    _init_ray(address, "is its Ray running? Start it with `easyscale cluster start`")
    try:
        return ray, ray.get_actor("scheduler")
    except ValueError:
        again = "easyscale cluster start" + ("" if saved["local"] else f" --address {address}")
        raise UsageError(f"Ray runs at {address} but the cluster's scheduler does not: start it again with "
                         f"`{again}` (the jobs it had are kept in its job table)")


def _init_ray(address: str, advice: str, timeout_s: float = 20.0) -> None:
    """Join this process to the Ray at `address`, or a UsageError with `advice` within `timeout_s` (ray.init
    retries a GCS that does not serve, e.g. one being stopped, without end)."""
    import ray

    from ..cluster import NAMESPACE

    failure, joined = [], threading.Event()

    def join():
        try:
            # ray.init retries a token the cluster refuses until our timeout; one call to its GCS says at once
            ray._raylet.GcsClient(address=address)
            ray.init(address=address, namespace=NAMESPACE, logging_level="ERROR", log_to_driver=False)
        except Exception as e:  # noqa: BLE001 (raised in the caller's thread)
            failure.append(e)
        joined.set()

    threading.Thread(target=join, daemon=True).start()
    if not joined.wait(timeout_s):
        raise UsageError(f"the cluster at {address} does not answer within {timeout_s:g} s: {advice}")
    if failure and isinstance(failure[0], ray.exceptions.AuthenticationError):
        token = os.environ.get("RAY_AUTH_TOKEN_PATH", "Ray's token")
        raise UsageError(f"the cluster at {address} refuses this process's token ({token}): only who holds the "
                         "token of the `easyscale cluster start` that started it may command it")
    if failure and isinstance(failure[0], ConnectionError):
        raise UsageError(f"the cluster at {address} does not answer ({str(failure[0]).splitlines()[0]}): {advice}")
    if failure:
        raise failure[0]


def _ended(saved: dict) -> bool:
    """Whether the Ray that `cluster start` started here has ended (every process of its sessions is gone)."""
    return saved["local"] and "ray_sessions" in saved and not _ray_pids(saved)


def _ray_pids(saved: dict) -> list:
    """The processes of the Ray that `cluster start` started here: every one in the sessions it recorded (Ray's
    own processes and its workers stay in the session of the `ray start` that made them)."""
    sessions = set(saved.get("ray_sessions", ()))
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, _, _, session = f.read().rsplit(")", 1)[1].split()[:4]
            if int(session) in sessions and state != "Z":  # a zombie has ended: only its parent's wait is left
                pids.append(int(entry))
        except (OSError, ValueError, IndexError):  # gone meanwhile
            pass
    return pids


def _stop_ray(saved: dict) -> int:
    """End the Ray processes `cluster start` started (SIGTERM, then SIGKILL after 3 s: gcs_server and the raylet
    take longer to heed SIGTERM); how many there were."""
    pids = _ray_pids(saved)
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        for pid in _ray_pids(saved):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while _ray_pids(saved) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _ray_pids(saved):
            break
    return len(pids)


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
    state = home()
    os.makedirs(state, exist_ok=True)
    saved = _running()
    if saved is None:
        saved = _start_ray(args.address, slots, state)
    elif args.address not in (None, saved["address"]) or args.slots is not None and saved["local"]:
        raise UsageError(f"a cluster is running at {saved['address']}: stop it first with `easyscale cluster stop` "
                         "to start another or change its slots")
    else:
        print(f"easyscale: Ray already runs at {saved['address']}; starting its scheduler unless it runs",
              file=sys.stderr)
    address = saved["address"]
    os.environ.update(_ray_env(saved))
    import ray

    from ..cluster.scheduler import launch

    _init_ray(address, "start its head with `ray start --head`, or leave out --address to start one here")
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


def _running():
    """The saved cluster if its Ray still runs (or, joined with --address, may run); None if there is none."""
    try:
        saved = _saved()
    except UsageError:
        return None
    if _ended(saved):  # without `cluster stop`
        os.unlink(os.path.join(home(), "cluster.json"))
        return None
    return saved


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


def _start_ray(address, slots, state: str) -> dict:
    """Start Ray on this machine (or note the cluster at `address`) and save what `stop` needs to end it."""
    local = address is None
    saved = {"address": address, "local": local, "state": os.path.join(state, "state"),
             "token": os.path.join(state, "ray_auth_token")}
    if local:
        if not os.path.exists(saved["token"]):  # Ray's token auth: its ports answer only who holds this file
            with os.fdopen(os.open(saved["token"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(secrets.token_hex(32))
        # In a session of its own, which Ray's processes keep: `cluster stop` ends that session and nothing else.
        # Not `ray start`: a second node on one machine would leave loopback (ray.cluster_utils does not).
        starter = subprocess.Popen([sys.executable, "-m", "easyscale_ext.cluster.local", slots],
                                   env=dict(os.environ, **_ray_env(saved)), start_new_session=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = starter.communicate()
        saved["ray_sessions"] = [starter.pid]
        if starter.returncode != 0:
            _stop_ray(saved)
            raise UsageError(f"Ray did not start: {err.strip().splitlines()[-1:]}")
        saved["address"] = out.split()[-1]
    with open(os.path.join(state, "cluster.json"), "w") as f:
        json.dump(saved, f)
    return saved


def stop(args) -> int:
    saved = _saved()
    try:
        ray, scheduler = _connect(saved)
        ray.kill(scheduler)
        ray.shutdown()
        stopped = ["the scheduler"]
    except UsageError as e:  # nothing to stop there: say so, and end what this machine's Ray left
        print(f"easyscale: {e}", file=sys.stderr)
        stopped = []
    if saved["local"] and "ray_sessions" in saved:
        stopped.append(f"Ray at {saved['address']} ({_stop_ray(saved)} processes `cluster start` started)")
    elif saved["local"]:  # started by a version that did not record its processes
        print("easyscale: this cluster's Ray was started by an earlier version that did not record its processes: "
              "end it with `ray stop` (which ends every Ray on this machine)", file=sys.stderr)
    else:
        print(f"easyscale: Ray at {saved['address']} was not started here and keeps running", file=sys.stderr)
    os.unlink(os.path.join(home(), "cluster.json"))
    print(f"easyscale: stopped {' and '.join(stopped) or 'nothing (nothing was running)'}")
    return 0


def submit(args) -> int:
    ray, scheduler = _connect(_saved())
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
    machine and described the cluster there lately (within FRESH_S); else None (ask it through Ray, which also
    says what is wrong when it does not run)."""
    from ..cluster.jobtable import JobTable, no_such_job

    path = os.path.join(saved["state"], "jobs.sqlite")
    if not os.path.exists(path) or _ended(saved):
        return None
    try:
        table = JobTable(path, read_only=True)
        described = table.described()
        if described is None or described["host"] != socket.gethostname() or \
                not os.path.exists(f"/proc/{described['pid']}") or time.time() - described["time"] > FRESH_S:
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
    saved = _saved()
    ended = None if args.all else SHOWN_ENDED
    shown = _from_table(saved, args.job, ended)
    if shown is None:
        ray, scheduler = _connect(saved)
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
        note = f"  ({job['note']})" if job["state"] in LIVE and job.get("note") else ""
        print(f"{job['id']:<24} {job['state']:<10} {where:<28} {rate:>8} {step:>12}{note}")
    if not args.job and not args.all and sum(j["state"] not in LIVE for j in jobs) == SHOWN_ENDED:
        print(f"(the {SHOWN_ENDED} jobs that ended last; `easyscale status --all` lists every one)")
    return 0


def logs(args) -> int:
    ray, scheduler = _connect(_saved())
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
    ray, scheduler = _connect(_saved())
    taken = _call(ray, scheduler.reserve.remote(args.count, _node(ray, scheduler, args.node)))
    print(f"easyscale: reserved {len(taken)} slots on " + ", ".join(f"{n}x {node[:8]}" for node, n in
                                                                   Counter(taken).items())
          + " (their jobs leave them at their next step boundary)")
    return 0


def unreserve(args) -> int:
    ray, scheduler = _connect(_saved())
    count = _call(ray, scheduler.unreserve.remote(args.count, _node(ray, scheduler, args.node)))
    print(f"easyscale: {count} reserved slots given back to training")
    return 0


def report(args) -> int:
    from pathlib import Path
    from types import SimpleNamespace

    from ..sched.metrics import summarize
    from .simulate import write_outputs

    saved = _saved()
    ray, scheduler = _connect(saved)
    result = _call(ray, scheduler.report.remote())
    if not result.jobs:
        raise UsageError("no job of this cluster has finished yet: report again later")
    slots = sum(n["slots"] for n in _call(ray, scheduler.nodes.remote()))
    summary = summarize(result, slots)
    write_outputs(Path(args.out), "cluster", result.policy, SimpleNamespace(spec=result.cluster, total_gpus=slots),
                  SimpleNamespace(workload=saved["address"], seed=0), {}, [result.policy], [(result, summary, 0.0)])
    return 0


def cancel(args) -> int:
    ray, scheduler = _connect(_saved())
    _call(ray, scheduler.cancel.remote(args.job))
    print(f"easyscale: cancelled {args.job}")
    return 0

"""Cluster mode's commands: `easyscale cluster start|stop|reserve|unreserve|report`, `submit`, `status`, `logs`,
`cancel`.

`cluster start` without --address starts Ray on this machine (one node on loopback, its slots given by
--slots) and the scheduler; with --address it joins an existing Ray cluster (`ray start --head` and
`ray start --address` on the machines, or KubeRay) and starts the scheduler there. The other commands
reach the scheduler through Ray; the cluster's address and state folder are kept in $EASYSCALE_HOME
(default ~/.easyscale).
"""
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections import Counter

from .main import UsageError


def home() -> str:
    return os.environ.get("EASYSCALE_HOME") or os.path.join(os.path.expanduser("~"), ".easyscale")


def add_parsers(sub) -> None:
    p = sub.add_parser("cluster", help="start or stop cluster mode (Ray) and its scheduler")
    verbs = p.add_subparsers(dest="verb", required=True)
    q = verbs.add_parser("start", help="start the scheduler (and, without --address, Ray on this machine)")
    q.add_argument("--address", help="join this Ray cluster (HOST:PORT of its head) instead of starting one")
    q.add_argument("--slots-per-node", "--slots", dest="slots", type=int, default=os.cpu_count(),
                   help="slots of this machine's node when Ray is started here (default: its CPU count)")
    q.add_argument("--policy", default="fifo", help="the scheduling policy, any of `easyscale simulate`'s "
                   "(default fifo)")
    q.add_argument("--round", type=float, default=60.0, metavar="SECONDS", help="seconds per round (default 60)")
    q.add_argument("--slot-type", default="t4", help="the GPU type whose profiles model a slot (default t4)")
    q.set_defaults(run=start)
    q = verbs.add_parser("stop", help="stop the scheduler (and Ray, if `cluster start` started it)")
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
    p = sub.add_parser("submit", help="run a training script as a job of the cluster; prints its id")
    p.add_argument("--virtual-workers", type=int, required=True, help="the job's N")
    p.add_argument("--min-procs", type=int, default=1)
    p.add_argument("--max-procs", type=int, default=None, help="at most this many slots (default N)")
    p.add_argument("--name", default=None)
    p.add_argument("--application", default=None,
                   help="the profiled application that models the job for the policy (e.g. cifar10)")
    p.add_argument("--batch-size", type=int, default=None, help="the job's global batch, for its model")
    p.add_argument("script", nargs="+", help="SCRIPT [ARGS]")
    p.set_defaults(run=submit)
    p = sub.add_parser("status", help="the cluster's jobs: state, processes and where, progress")
    p.add_argument("job", nargs="?")
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

    from ..cluster import NAMESPACE

    try:
        ray.init(address=saved["address"], namespace=NAMESPACE, logging_level="ERROR", log_to_driver=False)
        return ray, ray.get_actor("scheduler")
    except (ConnectionError, ValueError) as e:
        raise UsageError(f"the cluster at {saved['address']} does not answer ({e}); start it with "
                         "`easyscale cluster start`")


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
    state = home()
    os.makedirs(state, exist_ok=True)
    local = args.address is None
    saved = {"address": args.address, "local": local, "state": os.path.join(state, "state"),
             "token": os.path.join(state, "ray_auth_token")}
    if local:
        from ..cluster import SLOT
        from ..cluster.local import HOST

        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        saved["address"] = f"{HOST}:{port}"
        if not os.path.exists(saved["token"]):  # Ray's token auth: its ports answer only who holds this file
            with os.fdopen(os.open(saved["token"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(secrets.token_hex(32))
        ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
        started = subprocess.run([ray_cli, "start", "--head", "--node-ip-address", HOST, "--port", str(port),
                                  "--resources", json.dumps({SLOT: args.slots}), "--include-dashboard", "false",
                                  "--disable-usage-stats"], env=dict(os.environ, **_ray_env(saved)),
                                 capture_output=True, text=True)
        if started.returncode != 0:
            raise UsageError(f"Ray did not start: {started.stderr.strip().splitlines()[-1:]}")
    with open(os.path.join(state, "cluster.json"), "w") as f:
        json.dump(saved, f)
    address = saved["address"]
    os.environ.update(_ray_env(saved))
    import ray

    from ..cluster import NAMESPACE
    from ..cluster.scheduler import launch

    ray.init(address=address, namespace=NAMESPACE, logging_level="ERROR", log_to_driver=False)
    scheduler = launch(saved["state"], args.policy, args.round, args.slot_type, name="scheduler", lifetime="detached",
                       get_if_exists=True)
    try:
        ray.get(scheduler.status.remote())
    except ray.exceptions.RayActorError as e:
        raise UsageError(str(e.__cause__ or e).splitlines()[-1])
    print(f"easyscale: cluster at {address}, scheduler running ({args.policy}, rounds of {args.round:g} s); "
          "submit jobs with `easyscale submit SCRIPT --virtual-workers N`")
    return 0


def stop(args) -> int:
    saved = _saved()
    ray, scheduler = _connect(saved)
    ray.kill(scheduler)
    ray.shutdown()
    if saved["local"]:
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), "stop", "--force"],
                       capture_output=True)
    os.unlink(os.path.join(home(), "cluster.json"))
    print("easyscale: cluster stopped")
    return 0


def submit(args) -> int:
    ray, scheduler = _connect(_saved())
    script = [os.path.abspath(args.script[0])] + args.script[1:]
    job = _call(ray, scheduler.submit.remote(script, args.virtual_workers, args.min_procs, args.max_procs,
                                             args.name, {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
                                             args.application, args.batch_size))
    print(job)
    return 0


def status(args) -> int:
    ray, scheduler = _connect(_saved())
    jobs = _call(ray, scheduler.status.remote(args.job))
    if not args.job:
        print(f"{'node':<10} {'slots':>5} {'reserved':>8} {'held':>5}")
        for node in _call(ray, scheduler.nodes.remote()):
            print(f"{node['node'][:8]:<10} {node['slots']:>5} {node['reserved']:>8} {node['held']:>5}")
        print()
    print(f"{'job':<24} {'state':<10} {'processes on nodes':<28} {'steps/s':>8} {'progress':>12}")
    for job in jobs:
        live = job["live"] or {}
        progress = live.get("progress") or {}
        where = ", ".join(f"{n}x {node[:8]}" for node, n in Counter(live.get("nodes", [])).items())
        rate = f"{1 / job['step_s']:.2f}" if job.get("step_s") else ""
        step = f"{progress['step']}/{progress.get('total') or '?'}" if progress else ""
        print(f"{job['id']:<24} {job['state']:<10} {where:<28} {rate:>8} {step:>12}")
    return 0


def logs(args) -> int:
    ray, scheduler = _connect(_saved())
    offset = 0
    while True:
        chunk = _call(ray, scheduler.log.remote(args.job, args.worker, offset))
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
        offset += len(chunk)
        if not args.follow:
            return 0
        if _call(ray, scheduler.status.remote(args.job))[0]["state"] not in ("queued", "running"):
            return 0
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

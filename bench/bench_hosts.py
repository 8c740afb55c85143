"""Faults across machines: a job on two training hosts emulated in network namespaces (tests/support/hosts.py: a
head and hosts a and b, each with its own address and link; the README's across-machines commands start Ray and the
scheduler, with Ray's token authentication on), struck once a run by one kind of fault:

    cut           b's link goes down (nothing killed, nobody told) until Ray takes b for dead, then up again
    short cut     b's link goes down for 2 s, below the job's liveness bound (5 s)
    partition     the head and b lose what they send each other, b still reaches a, until Ray takes b for dead
    freeze        every process on b stopped (SIGSTOP) until Ray takes b for dead, then let go (SIGCONT)
    kill          every process on b killed (a machine that crashed: its peers' connections are reset)
    head restart  every process on the head killed (the scheduler and the job's store with them); the machines'
                  Ray started again, as their service managers would, then `easyscale cluster start`

The job: tests/support/train_job.py, 4 virtual workers on 4 processes (two a host), steps of 0.5 s until the fault
has played out. Measured from the fault (t = 0): `regrouped`, when the job's members leave b's processes out (its
supervisor's report); `trains`, when a process of the new arrangement logs its first step; `ray dead`, when Ray's
head takes b for dead; `stale end`, after the link or the processes come back, when b's processes have ended. Checked:
the job ends finished with its fixed-size SHA-256, and b's processes log no step after the one in flight at the
fault (nothing trained by a stale generation; a process stopped between a step and its log line writes that line
when it runs again). Medians of --runs runs a kind; exit status 1 if a check failed. `--loopback`: the same hosts
as addresses of one machine's loopback (127.0.0.x), where every local cluster runs and a link cannot be cut: the
kinds freeze, kill and head restart, to set beside the same faults across hosts.

    .venv/bin/python bench/bench_hosts.py [--kinds cut,short-cut,...] [--runs 3] [--loopback] [--json FILE]
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from support.hosts import Hosts, RayOnHosts, unavailable  # noqa: E402
from support.jobs import JOB, logged_steps as steps, reference  # noqa: E402
from support.sockets import listening_of  # noqa: E402

KINDS = ("cut", "short-cut", "partition", "freeze", "kill", "head-restart")
ON_LOOPBACK = ("freeze", "kill", "head-restart")
STEPS = 60
BOUND_S = 300  # what any phase may take before the run is called failed


def until(condition, what: str, bound_s: float = BOUND_S) -> float:
    """Poll `condition` until it holds; the time it then was."""
    deadline = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {bound_s:.0f} s")
        time.sleep(0.2)
    return time.time()


def run_once(kind: str, work: pathlib.Path, loopback: bool) -> dict:
    hosts, job, place = Hosts(["head", "a", "b"], loopback=loopback), None, "loopback" if loopback else "hosts"
    try:
        cluster = RayOnHosts(hosts, ["a100", "a100"], work)
        cluster.start("fifo", "--round", "2")
        times, fast, out = work / "times", work / "fast", work / "hash"
        job = cluster.submit("--virtual-workers", "4", "--min-procs", "2", JOB, "--mode", "easyscale", "--elastic",
                             "1", "--out", str(out), "--virtual-workers", "4", "--steps", str(STEPS), "--step-sleep",
                             "0.5", "--sleep-until", str(fast), "--log-times", str(times), "--ckpt-dir",
                             str(work / "checkpoints"), "--ckpt-every", "2", "--resume", "1")
        until(lambda: len({w for w, s, _, _ in steps(times) if s >= 2}) == 4, "four processes training")
        live = cluster.row(job)["live"]
        where = {address: host for host, address in hosts.address.items()}
        on_b = {m for m, n in zip(live["members"], live["nodes"]) if where[cluster.node_address[n]] == "b"}
        b_node = next(n for n, (address, _) in cluster.nodes().items() if address == hosts.address["b"])
        t0 = time.time()
        result = {"kind": kind, "where": place}

        def since(at):
            return None if at is None else round(at - t0, 2)

        def regrouped():
            members = (cluster.row(job)["live"] or {}).get("members") or []
            return bool(members) and not on_b & set(members)

        def new_steps():  # the steps of the new arrangement: a process of a now holds two virtual workers
            return [at for w, _, at, local in steps(times) if at > t0 and local == 2 and w not in on_b]

        def b_dead():
            return not cluster.nodes()[b_node][1]

        def b_jobs_gone():
            return not [p for p, command, *_ in listening_of(hosts.pids("b")) if command == "python"]

        if kind == "short-cut":
            hosts.cut("b")
            time.sleep(2)
            hosts.heal("b")
            until(lambda: max(s for w, s, _, _ in steps(times) if w in on_b) >= max(
                s for w, s, at, _ in steps(times) if at <= t0) + 3, "b's processes training on")
            result["lost"] = 0 if not regrouped() else len(on_b)
            gaps = sorted(at for w, _, at, _ in steps(times) if w not in on_b)
            result["longest step gap"] = round(max(b - a for a, b in zip(gaps, gaps[1:])), 2)
        elif kind == "head-restart":
            hosts.kill("head")
            for host in "ab":  # the machines' Ray lose their head; their service managers start it again
                hosts.kill(host)
            for host in ("head", "a", "b"):
                until(lambda: not hosts.pids(host), f"{host}'s processes gone")
            restarted = time.time()  # no process of the job's is left to log a step
            cluster.start("fifo", "--round", "2")
            until(lambda: any(at > restarted for _, _, at, _ in steps(times)), "a step after the restart")
            result["trains"] = since(min(at for _, _, at, _ in steps(times) if at > restarted))
        else:
            fault, mend = {"cut": (lambda: hosts.cut("b"), lambda: hosts.heal("b")),
                           "partition": (lambda: hosts.partition("head", "b"), lambda: hosts.mend("head", "b")),
                           "freeze": (lambda: hosts.freeze("b"), lambda: hosts.thaw("b")),
                           "kill": (lambda: hosts.kill("b"), None)}[kind]
            fault()
            result["regrouped"] = since(until(regrouped, "regrouping"))
            until(new_steps, "a step without b")
            result["trains"] = since(min(new_steps()))  # as the step's process logged it
            result["ray dead"] = since(until(b_dead, "Ray taking b for dead"))
            if mend is not None:
                mended = time.time()
                mend()
                result["stale end"] = round(until(b_jobs_gone, "b's processes ended") - mended, 2)
                # A step b's processes log after the fault is the one then in flight at most (completed with a's
                # before the fault, its line written after the thaw): any later one was trained without the job.
                in_flight = max(s for _, s, at, _ in steps(times) if at <= t0) + 1
                result["stale steps"] = len([s for w, s, at, _ in steps(times)
                                             if w in on_b and at > t0 and s > in_flight])
            cluster.start_ray("b")  # its Ray ended itself on learning it was taken for dead, or was killed
        fast.touch()
        result["state"] = cluster.wait(job)["state"]
        result["bits equal"] = out.exists() and out.read_text() == reference(n=4, steps=STEPS)
        return result
    except TimeoutError as e:  # what the job and its processes were doing, to read after the run
        row = cluster.row(job) if job else None
        return {"kind": kind, "where": place, "state": f"stuck: {e}", "bits equal": False,
                "job": row and {k: row[k] for k in ("state", "note", "live", "nodes")},
                "last steps": steps(work / "times")[-8:]}
    finally:
        hosts.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", help=f"faults, of {', '.join(KINDS)} (default: all; on a loopback "
                                    f"{', '.join(ON_LOOPBACK)})")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--loopback", action="store_true", help="the hosts on one machine's loopback")
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args()
    kinds = args.kinds.split(",") if args.kinds else list(ON_LOOPBACK if args.loopback else KINDS)
    choices = ON_LOOPBACK if args.loopback else KINDS
    unknown = sorted(set(kinds) - set(choices))
    if unknown:
        ap.error(f"fault kinds {unknown} are not among those {'a loopback has' if args.loopback else 'known'}: "
                 f"choose from {', '.join(choices)}")
    why = unavailable()
    if why:
        raise SystemExit(f"bench_hosts: {why}")
    runs = []
    for kind in kinds:
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="bench-hosts-") as work:
                runs.append(run_once(kind, pathlib.Path(work), args.loopback))
            print(json.dumps(runs[-1], default=str), flush=True)
    columns = ("regrouped", "trains", "ray dead", "stale end", "stale steps", "lost", "longest step gap")
    print(f"\n{'On one loopback' if args.loopback else 'Across hosts'}:\n\n| fault | runs | "
          + " | ".join(f"{c}, s" if c not in ("stale steps", "lost") else c for c in columns)
          + " | finished, bits equal |")
    print("|---|---:|" + "---:|" * len(columns) + "---|")
    failed = False
    for kind in kinds:
        mine = [r for r in runs if r["kind"] == kind]
        cells = []
        for c in columns:
            values = [r[c] for r in mine if r.get(c) is not None]
            cells.append(f"{statistics.median(values):g}" if values else "")
        ok = sum(r["state"] == "finished" and r["bits equal"] and not r.get("stale steps") for r in mine)
        failed |= ok < len(mine)
        print(f"| {kind} | {len(mine)} | " + " | ".join(cells) + f" | {ok} of {len(mine)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

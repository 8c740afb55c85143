"""Cluster mode from the command line, as the README gives it: start, submit, status, logs, cancel, stop."""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray", reason="cluster mode needs Ray (pip install 'easyscale_ext[cluster]')")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_elastic.py")
PRINT_ARGV = "import sys; print('argv', sys.argv[1:])\n"


@pytest.fixture
def easyscale(tmp_path):
    env = dict(os.environ, EASYSCALE_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")

    def run(*args, timeout=300):  # `logs -f` waits for a job: its start and steps on a loaded machine
        return subprocess.run([sys.executable, "-m", "easyscale_ext.cli", *args], capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=ROOT)
    yield run
    run("cluster", "stop")


def session_pids(session: int):
    """Live processes of a session, from /proc."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, _, _, sid = f.read().rsplit(")", 1)[1].split()[:4]
            if int(sid) == session and state != "Z":  # a zombie has ended
                pids.append(int(entry))
        except (OSError, ValueError):
            pass
    return pids


def test_the_readme_commands_run_their_job_and_jobs_keep_their_fixed_bits(easyscale, tmp_path):
    for args in (["status"], ["submit", "--virtual-workers", "2", EXAMPLE], ["cancel", "x"]):
        out = easyscale(*args)
        assert out.returncode == 2 and "no cluster is running: start one with `easyscale cluster start`" in out.stderr
    out = easyscale("cluster", "start", "--policy", "nope")
    assert out.returncode == 2 and "unknown policy 'nope': choose one of fifo" in out.stderr, out.stderr
    assert "easyscale-homo" in easyscale("cluster", "start", "--help").stdout  # the policies are listed
    # The README's two commands, as written: N = 4 on 2 slots runs on the 2 (it used to wait for 4 forever).
    out = easyscale("cluster", "start", "--slots", "2")
    assert out.returncode == 0 and "scheduler running" in out.stdout, out.stderr
    saved = json.loads((tmp_path / "home" / "cluster.json").read_text())
    assert oct((tmp_path / "home" / "ray_auth_token").stat().st_mode & 0o777) == "0o600"
    from easyscale_ext.cluster.local import loopback_env
    stranger = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={saved['address']!r})"],
                              capture_output=True, text=True, timeout=120,
                              env=dict({k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")},
                                       **loopback_env()))
    assert stranger.returncode != 0 and "InvalidAuthToken" in stranger.stderr, stranger.stderr[-2000:]  # no token
    token = tmp_path / "home" / "ray_auth_token"
    kept = token.read_text()
    # A command with a token the cluster does not hold is refused when it connects: that message comes only from a
    # refusal, never from init_ray's timeout (whose message says the cluster does not answer).
    token.write_text("0" * 64)
    out = easyscale("cancel", "x")
    token.write_text(kept)
    assert out.returncode == 2 and "refuses this process's token" in out.stderr, out.stderr
    out = easyscale("submit", "--virtual-workers", "4", "examples/train_elastic.py")
    assert out.returncode == 0 and "the cluster has 2 slots" in out.stderr and "at most 2 processes" in out.stderr
    jobs = [out.stdout.strip()]
    out = easyscale("submit", "--virtual-workers", "4", "--max-procs", "1", EXAMPLE)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    jobs.append(out.stdout.strip())
    # Everything after the script is the script's: options it shares with submit, or abbreviations of them.
    script = tmp_path / "argv.py"
    script.write_text(PRINT_ARGV)
    for args, expected in ((["--virtual-workers", "1", str(script), "--epochs", "3", "--n", "4", "--", "x"],
                            ["--epochs", "3", "--n", "4", "--", "x"]),
                           (["--virtual-workers", "1", "--", str(script), "--name", "y"], ["--name", "y"])):
        out = easyscale("submit", *args)
        assert out.returncode == 0, out.stderr
        assert f"argv {expected}" in easyscale("logs", "-f", out.stdout.strip()).stdout
    digests = []
    for job in jobs:
        out = easyscale("logs", "-f", job)
        assert out.returncode == 0, out.stderr
        digests += re.findall(r"^step 48: sha256 ([0-9a-f]{64})$", out.stdout, re.M)
    assert len(digests) == 2 and digests[0] == digests[1]
    for table in (easyscale("status").stdout, easyscale("status", "--all").stdout):
        assert all(re.search(rf"^{job}\s+finished", table, re.M) for job in jobs), table
    # A script that fails as it starts: its job fails, and `status` says with what (`logs` has the whole output).
    script.write_text("raise RuntimeError('broken before its first step')\n")
    failed = easyscale("submit", "--virtual-workers", "1", str(script)).stdout.strip()
    deadline = time.monotonic() + 120
    while not re.search(rf"^{failed}\s+failed\s.*\(w0: RuntimeError: broken before its first step\)$",
                        table := easyscale("status").stdout, re.M):
        assert time.monotonic() < deadline, table
        time.sleep(1)
    # On the head, `status` reads the scheduler's job table: it does not join Ray (most of its second went there)
    probe = ("import sys; from easyscale_ext.cli.main import main; code = main(['status']); "
             "assert 'ray' not in sys.modules, 'status joined Ray'; sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env=dict(os.environ, EASYSCALE_HOME=str(tmp_path / "home")))
    assert out.returncode == 0 and all(re.search(rf"^{job}\s+finished", out.stdout, re.M) for job in jobs), \
        out.stdout + out.stderr
    out = easyscale("cluster", "reserve", "1")
    assert out.returncode == 0 and "reserved 1 slots on 1x " in out.stdout, out.stderr
    assert re.search(r"^\S+\s+t4\s+2\s+1\s+0$", easyscale("status").stdout, re.M)  # node, type, slots, reserved, held
    out = easyscale("cluster", "reserve", "2")
    assert out.returncode == 2 and "only 1 of 2 slots can be reserved in the cluster" in out.stderr, out.stderr
    assert "1 reserved slots given back" in easyscale("cluster", "unreserve").stdout
    out = easyscale("cluster", "report", "--out", str(tmp_path / "report"))
    assert out.returncode == 0, out.stderr
    record = json.loads((tmp_path / "report" / "cluster-fifo.json").read_text())
    assert set(jobs) <= {j["name"] for j in record["jobs"]} and record["summary"]["avg_jct"] > 0
    assert {p.name for p in (tmp_path / "report").glob("*.png")} == {
        f"cluster-fifo-{kind}.png" for kind in ("gantt", "jct-cdf", "gpus", "summary")}
    for args, message in ((["submit", "--virtual-workers", "2", "no/such.py"], "no training script at"),
                          (["submit", "--virtual-workers", "8", "--min-procs", "5", EXAMPLE],
                           "needs at least 5 slots and the cluster has 2"),
                          (["status", "nope"], "no job 'nope'"), (["cancel", "nope"], "no job 'nope'")):
        out = easyscale(*args)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_stop_ends_only_the_ray_it_started_and_a_lost_scheduler_is_named(easyscale, tmp_path):
    from easyscale_ext.cluster.local import loopback_env

    other = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head",
                              "--node-ip-address", "127.0.0.1", "--port", "0", "--include-dashboard", "false",
                              "--disable-usage-stats"], env=dict(os.environ, **loopback_env()), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for spec, message in (("2:h100x", "unknown slot type 'h100x': the profiles know"),
                              ("a:t4", "--slots a:t4: expected K or K:TYPE"),
                              ("2:t4,", "--slots 2:t4,: expected K or K:TYPE")):
            out = easyscale("cluster", "start", "--slots", spec)
            assert out.returncode == 2 and message in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
            assert not (tmp_path / "home" / "cluster.json").exists()  # nothing started
        assert other.wait(timeout=120) == 0 and session_pids(other.pid), "the other Ray did not start"
        out = easyscale("cluster", "start", "--slots", "1:a100,2:t4")  # a node per entry
        assert out.returncode == 0, out.stderr
        nodes = easyscale("status").stdout
        assert re.search(r"^\S+\s+a100\s+1\s+0\s+0$", nodes, re.M) and re.search(r"^\S+\s+t4\s+2\s+0\s+0$", nodes,
                                                                                   re.M), nodes  # each node's type
        out = easyscale("submit", "--virtual-workers", "4", "--min-procs", "3", EXAMPLE)
        assert out.returncode == 2 and "the cluster has 2 of one type" in out.stderr, out.stderr
        # At D2 a job has the same bits on either type at any size: on the 2 t4 slots, and on the 1 a100 slot
        d2 = [easyscale("submit", "--virtual-workers", "4", "--level", "D2", *extra, EXAMPLE).stdout.strip()
              for extra in ([], ["--max-procs", "1"])]
        logs = [easyscale("logs", "-f", job).stdout for job in d2]
        digests = [re.findall(r"sha256 ([0-9a-f]{64})", log) for log in logs]
        assert digests[0] and digests[0] == digests[1], logs
        saved = json.loads((tmp_path / "home" / "cluster.json").read_text())
        env = dict(os.environ, **loopback_env(), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=saved["token"])
        kill = (f"import ray; ray.init(address={saved['address']!r}, namespace='easyscale'); "
                "ray.kill(ray.get_actor('scheduler'))")
        assert subprocess.run([sys.executable, "-c", kill], env=env, timeout=120).returncode == 0
        deadline = time.monotonic() + 10  # the killed actor's process exits (until then its table may be read)
        while (out := easyscale("status")).returncode == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert out.returncode == 2 and "but the cluster's scheduler does not: start it again with " \
            "`easyscale cluster start`" in out.stderr and "Failed to look up" not in out.stderr, out.stderr
        out = easyscale("cluster", "start")
        assert out.returncode == 0 and "Ray already runs at" in out.stderr, out.stderr
        assert easyscale("status").returncode == 0
        out = easyscale("cluster", "start", "--slots", "3")
        assert out.returncode == 2 and "stop it first with `easyscale cluster stop`" in out.stderr, out.stderr
        assert session_pids(saved["ray_sessions"][0])
        out = easyscale("cluster", "stop")
        assert out.returncode == 0 and re.search(rf"stopped the scheduler and Ray at {saved['address']} \(\d+ "
                                                 r"processes `cluster start` started\)", out.stdout), out.stdout
        assert not session_pids(saved["ray_sessions"][0]), "a process of the cluster outlived `cluster stop`"
        assert session_pids(other.pid), "`cluster stop` ended a Ray it did not start"
    finally:
        for pid in session_pids(other.pid):
            with contextlib.suppress(ProcessLookupError):  # ended with the session's leader, killed a moment ago
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while session_pids(other.pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_the_readme_two_type_commands_run_as_written_and_keep_the_fixed_size_bits(tmp_path):
    """The README's two-type block, run by bash exactly as printed there; the job's SHA-256 is the one the same
    script has at D2 on one local process."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    block = re.search(r"On one machine, a two-type cluster:\n\n```sh\n(.*?)```", readme, re.S).group(1)
    env = dict(os.environ, EASYSCALE_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    try:
        out = subprocess.run(["bash", "-e", "-c", block], capture_output=True, text=True, env=env, timeout=300,
                             cwd=ROOT)
    finally:
        subprocess.run([sys.executable, "-m", "easyscale_ext.cli", "cluster", "stop"], env=env, capture_output=True,
                       timeout=120)
    assert out.returncode == 0 and "stopped the scheduler and Ray" in out.stdout, out.stdout + out.stderr
    assert re.search(r"^\S+\s+a100\s+2\s+0\s+\d$", out.stdout, re.M), out.stdout  # status lists both types
    local = subprocess.run([sys.executable, "-m", "easyscale_ext.cli", "run", "--procs", "1", "--level", "D2", "--",
                            EXAMPLE], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    digests = [re.findall(r"sha256 ([0-9a-f]{64})", text) for text in (out.stdout, local.stdout + local.stderr)]
    assert digests[0] and digests[0] == digests[1], (out.stdout, local.stdout, local.stderr)

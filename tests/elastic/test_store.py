"""A job store listens on the address it is given, not on every interface (torch's TCPStore alone does), and
keeps its job's keys under a secret only the job's processes and its owner's tools hold."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from easyscale_ext.elastic.client import (SECRET_ENV, NotTheJobsSecret, connect, current_members, new_secret,
                                          request_scale, save_secret, secret_file, serve)
from easyscale_ext.elastic.membership import MemberLost, Membership
from easyscale_ext.elastic.protocol import hosted
from easyscale_ext.elastic.recovery import Replicas
from easyscale_ext.elastic.launcher import ElasticLauncher
from support.jobs import JOB, reference
from support.sockets import listening


def test_a_job_store_listens_on_its_host_only_and_answers_there():
    store = serve("127.0.0.1")
    assert listening(store.port) == ["127.0.0.1"]
    connect(f"127.0.0.1:{store.port}", timeout_s=5).set_target(3)
    assert store.get("target") == b"3"


def test_a_stale_secret_file_neither_hangs_nor_goes_unread(tmp_path, monkeypatch):
    """A job killed before it removed its secret file leaves it for its port: a later store on that port that keeps
    no secret is reached without it (a request is read), and another job's store refuses it by name at once instead
    of every wait hanging and every request going unread under the wrong prefix."""
    monkeypatch.setenv("EASYSCALE_HOME", str(tmp_path))
    monkeypatch.delenv(SECRET_ENV, raising=False)
    plain = serve("127.0.0.1", timeout_s=5)
    save_secret(f"127.0.0.1:{plain.port}", new_secret())
    connect(f"127.0.0.1:{plain.port}", timeout_s=5).set_target(3)
    assert plain.get("target") == b"3"
    server = serve("127.0.0.1")
    job = hosted(server, new_secret())
    save_secret(f"127.0.0.1:{server.port}", new_secret())
    with pytest.raises(NotTheJobsSecret, match="the one it holds is another job's"):
        connect(f"127.0.0.1:{server.port}", timeout_s=5)
    assert job.target() is None


def test_a_jobs_secret_file_lives_in_the_home_every_command_keeps_its_state_in(tmp_path, monkeypatch):
    """`easyscale scale` finds the secret where `easyscale run` left it, in the home `easyscale cluster` keeps the
    cluster's state in: $EASYSCALE_HOME, else ~/.easyscale."""
    from easyscale_ext.cli import ray_session
    from easyscale_ext.home import home

    assert ray_session.home is home
    monkeypatch.setenv("EASYSCALE_HOME", str(tmp_path / "set"))
    assert secret_file("127.0.0.1:29500") == str(tmp_path / "set" / "stores" / "127.0.0.1-29500")
    monkeypatch.delenv("EASYSCALE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert secret_file("127.0.0.1:29500") == str(tmp_path / "user" / ".easyscale" / "stores" / "127.0.0.1-29500")


def test_easyscale_runs_store_is_on_loopback_by_default():
    launcher = ElasticLauncher([sys.executable, "-c", "pass"], 1)
    assert listening(int(launcher.address.rpartition(":")[2])) == ["127.0.0.1"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_only_the_jobs_processes_and_its_owners_tools_reach_its_keys(tmp_path, monkeypatch):
    """A stranger who reaches the store's port without the job's secret: its `easyscale scale` is refused, saying
    why, and what its own client writes (a scale to 1 process, a release, a split) is never read by the job, which
    trains on on its 2 processes; the owner's request (its `easyscale run` left the secret, mode 0600) is heard."""
    owner = dict(os.environ, OMP_NUM_THREADS="1", EASYSCALE_HOME=str(tmp_path / "owner"))
    owner.pop(SECRET_ENV, None)
    stranger = dict(owner, EASYSCALE_HOME=str(tmp_path / "stranger"))
    job = subprocess.Popen([sys.executable, "-m", "easyscale_ext.cli", "run", "--procs", "2", "--", JOB, "--mode",
                            "easyscale", "--elastic", "1", "--out", str(tmp_path / "hash"), "--virtual-workers", "4",
                            "--steps", "40", "--step-sleep", "0.2", "--sleep-until", str(tmp_path / "heard")],
                           env=owner, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        address = re.search(r"job store at (\S+);", job.stdout.readline()).group(1)
        secret = tmp_path / "owner" / "stores" / address.replace(":", "-")
        assert oct(secret.stat().st_mode & 0o777) == "0o600"
        monkeypatch.setenv("EASYSCALE_HOME", owner["EASYSCALE_HOME"])
        store = connect(address, 60, 5)  # the owner's view
        deadline = time.monotonic() + 120
        while (store.progress() or {"step": 0})["step"] < 2:
            assert time.monotonic() < deadline and job.poll() is None, "the job made no progress"
            time.sleep(0.2)
        refused = subprocess.run([sys.executable, "-m", "easyscale_ext.cli", "scale", "--store", address, "--procs",
                                  "1"], env=stranger, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "has not its secret" in refused.stderr, refused.stderr
        host, port = address.rsplit(":", 1)
        raw = subprocess.run([sys.executable, "-c", STRANGER, host, port], env=stranger, capture_output=True,
                             text=True, timeout=120)
        assert raw.returncode == 0 and raw.stdout.split() == ["False", "False"], raw.stdout + raw.stderr
        step = store.progress()["step"]
        while store.progress()["step"] < step + 5:  # past the boundaries that would have acted
            assert time.monotonic() < deadline and job.poll() is None, "the job stopped"
            time.sleep(0.2)
        assert current_members(store) == ["w0", "w1"]
        request_scale(address, 3)  # the owner's: heard
        while current_members(store) != ["w0", "w1", "w2"]:
            assert time.monotonic() < deadline and job.poll() is None, "the owner's request was not heard"
            time.sleep(0.2)
        (tmp_path / "heard").touch()  # its steps need no more time than they take
        out, _ = job.communicate(timeout=240)
    finally:
        job.kill()
        job.wait()
    assert job.returncode == 0, out
    assert not secret.exists()  # gone with the job
    assert (tmp_path / "hash").read_text() == reference(n=4, steps=40)


# What a stranger's own store client can do: read the job's keys (it sees none) and write its requests' keys.
STRANGER = """
import sys
import threading
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False, timeout=timedelta(seconds=10))
print(store.check(["gen/0/members"]), store.check(["progress"]))
store.set("target", "1")
store.append("releases", "w1\\n")
store.set("split", "[3, 1]")
"""


def test_a_replication_returns_only_once_the_store_holds_it():
    """A step must not complete before its contexts are in the store (recovery reads them there): TCPStore answers
    no set, so a write to a store that cannot answer (its host partitioned away; here, stopped) would return at once
    and the step go on unreplicated."""
    server = subprocess.Popen([sys.executable, "-c", "import time; from easyscale_ext.elastic.client import serve; "
                               "store = serve('127.0.0.1'); print(store.port, flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        address = f"127.0.0.1:{server.stdout.readline().strip()}"
        store = connect(address, timeout_s=60)
        os.kill(server.pid, signal.SIGSTOP)
        writer = threading.Thread(target=store.replicate, args=(0, b"7 0 0\n", {0: b"context"}))
        writer.start()
        writer.join(2)
        assert writer.is_alive(), "replicate returned while the store could not have taken the contexts"
        os.kill(server.pid, signal.SIGCONT)
        writer.join(60)
        assert not writer.is_alive()
        assert connect(address, timeout_s=5).replica(0, 0) == b"7 0 0\ncontext"
    finally:
        server.kill()
        server.wait()


def test_a_process_taken_for_lost_replicates_nothing():
    """A process stopped or cut off while the others went on without it must not write a replica when it runs again:
    it would take the slot of a newer replica of its workers, written by the processes that now run them."""
    store = serve("127.0.0.1")
    member = Membership(f"127.0.0.1:{store.port}", "w2", "gloo", timeout_s=30, liveness_s=5)
    try:
        replicas = Replicas(member)
        replicas.write({2: b"at 7"}, step=7)
        member.store.mark_lost("w2", "0")
        with pytest.raises(MemberLost, match="taken for lost"):
            replicas.write({2: b"at 8"}, step=8)
        assert replicas.context(2, 8) == (None, [7])
    finally:
        member.close()

"""The cluster's Ray, as `easyscale` commands see it: where its address and state are kept ($EASYSCALE_HOME, default
~/.easyscale), starting it on this machine (on loopback, with a token) or noting one joined with --address,
joining this process to it, telling whether it still runs, and stopping what was started here.
"""
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time

from ..home import home
from .errors import UsageError


def load() -> dict:
    """What `cluster start` saved of the cluster, or a UsageError if there is none."""
    path = os.path.join(home(), "cluster.json")
    if not os.path.exists(path):
        raise UsageError("no cluster is running: start one with `easyscale cluster start`")
    with open(path) as f:
        return json.load(f)


def ray_env(saved: dict) -> dict:
    """What a process that starts or joins the cluster's Ray needs in its environment (before ray loads): a
    cluster started here stays on loopback and requires its token."""
    if not saved["local"]:
        return {}
    from ..cluster.local import loopback_env
    return dict(loopback_env(), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=saved["token"]) if "token" in saved \
        else loopback_env()  # started by a version without it


def connect(saved: dict):
    """This process joined to the cluster's Ray, and the scheduler's handle."""
    os.environ.update(ray_env(saved))
    import ray

    address = saved["address"]
    if ended(saved):
        raise UsageError(f"the cluster at {address} is not running (its Ray processes are gone): start it again "
                         "with `easyscale cluster start`")
    init_ray(address, "is its Ray running? Start it with `easyscale cluster start`")
    try:
        return ray, ray.get_actor("scheduler")
    except ValueError:
        again = "easyscale cluster start" + ("" if saved["local"] else f" --address {address}")
        raise UsageError(f"Ray runs at {address} but the cluster's scheduler does not: start it again with "
                         f"`{again}` (the jobs it had are kept in its job table)")


def init_ray(address: str, advice: str, timeout_s: float = 20.0) -> None:
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


def ended(saved: dict) -> bool:
    """Whether the Ray that `cluster start` started here has ended (every process of its sessions is gone)."""
    return saved["local"] and "ray_sessions" in saved and not ray_pids(saved)


def ray_pids(saved: dict) -> list:
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


def stop_ray(saved: dict) -> int:
    """End the Ray processes `cluster start` started (SIGTERM, then SIGKILL after 3 s: gcs_server and the raylet
    take longer to heed SIGTERM); how many there were."""
    pids = ray_pids(saved)
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        for pid in ray_pids(saved):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while ray_pids(saved) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not ray_pids(saved):
            break
    return len(pids)


def running():
    """The saved cluster if its Ray still runs (or, joined with --address, may run); None if there is none."""
    try:
        saved = load()
    except UsageError:
        return None
    if ended(saved):  # without `cluster stop`
        os.unlink(os.path.join(home(), "cluster.json"))
        return None
    return saved


def start_ray(address, slots, state: str) -> dict:
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
                                   env=dict(os.environ, **ray_env(saved)), start_new_session=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = starter.communicate()
        saved["ray_sessions"] = [starter.pid]
        if starter.returncode != 0:
            stop_ray(saved)
            raise UsageError(f"Ray did not start: {err.strip().splitlines()[-1:]}")
        saved["address"] = out.split()[-1]
    with open(os.path.join(state, "cluster.json"), "w") as f:
        json.dump(saved, f)
    return saved

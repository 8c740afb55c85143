"""A job store listens on the address it is given, not on every interface (torch's TCPStore alone does)."""
import sys

from easyscale_ext.elastic.client import connect, serve
from easyscale_ext.elastic.launcher import ElasticLauncher
from support.sockets import listening


def test_a_job_store_listens_on_its_host_only_and_answers_there():
    store = serve("127.0.0.1")
    assert listening(store.port) == ["127.0.0.1"]
    connect(f"127.0.0.1:{store.port}", timeout_s=5).set("asked", "1")
    assert store.get("asked") == b"1"


def test_easyscale_runs_store_is_on_loopback_by_default():
    launcher = ElasticLauncher([sys.executable, "-c", "pass"], 1)
    assert listening(int(launcher.address.rpartition(":")[2])) == ["127.0.0.1"]

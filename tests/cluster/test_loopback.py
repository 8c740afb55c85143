"""Ray in tests stays on loopback: every connect() of a local cluster's processes goes to 127.0.0.1 (or ::1),
apart from the system resolver's DNS lookups (by default Ray would reach the machine's interface address and a
cloud metadata address; tests/conftest.py puts every test under `use_loopback`)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to watch connect()")]

START_AND_USE = """
from easyscale_ext.cluster.local import LocalCluster
cluster = LocalCluster(nodes=2, slots=1)
import ray
from easyscale_ext.cluster import SLOT
@ray.remote(num_cpus=0, resources={SLOT: 1})
def where():
    return ray.util.get_node_ip_address()
print(ray.get([where.remote() for _ in range(2)]), flush=True)
cluster.shutdown()
"""


def test_a_local_cluster_connects_to_loopback_only(tmp_path):
    trace = tmp_path / "connect"
    out = subprocess.run(["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace), sys.executable, "-c",
                          START_AND_USE], capture_output=True, text=True, timeout=240,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "['127.0.0.1', '127.0.0.1']" in out.stdout
    calls = [line for line in trace.read_text().splitlines() if "connect(" in line]
    inet = [line for line in calls if "AF_INET" in line]
    assert inet, "no TCP connection seen: strace did not follow Ray's processes"
    far = [line for line in inet if not re.search(r'inet_addr\("127\.|inet_pton\(AF_INET6, "(::1|::ffff:127\.)', line)
           and "htons(53)" not in line]
    assert not far, "connections off loopback:\n" + "\n".join(far[:10])

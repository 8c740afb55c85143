"""Ray on one machine, every byte on loopback: the embedded cluster of `easyscale cluster start` without
--address, and the multi-node test clusters (ray.cluster_utils.Cluster).

Ray's defaults leave loopback in two ways: it takes the machine's interface address for its nodes, and each
start asks a cloud metadata address which cloud it is on. `loopback_env` keeps both on this machine; a
real cluster over several machines (`ray start --head` / `--address`, KubeRay) needs none of it.
"""
import os
import tempfile
from typing import Dict, List, Optional, Sequence

from . import SLOT, TYPED

HOST = "127.0.0.1"


def loopback_env(home: Optional[str] = None) -> Dict[str, str]:
    """The environment every process that starts or joins a local Ray must have: Ray resolves its own
    address to 127.0.0.1, sends no usage statistics, and finds a bootstrap file in HOME, which stops its
    cloud probe."""
    home = home or os.path.join(tempfile.gettempdir(), f"easyscale-ray-home-{os.getuid()}")
    os.makedirs(home, exist_ok=True)
    bootstrap = os.path.join(home, "ray_bootstrap_config.yaml")
    if not os.path.exists(bootstrap):
        with open(bootstrap, "w") as f:
            f.write("{}\n")
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "HOME": home}


def use_loopback(home: Optional[str] = None) -> None:
    """Put `loopback_env` into this process's environment, before it imports ray."""
    os.environ.update(loopback_env(home))


def slot_resources(slots: int, gpu_type: Optional[str] = None) -> Dict[str, int]:
    """The Ray resources of a node with `slots` slots (of `gpu_type`, if given)."""
    return {SLOT: slots, **({TYPED + gpu_type: slots} if gpu_type else {})}


class LocalCluster:
    """A Ray cluster of `nodes` worker nodes with `slots` slots each (of the type `types[i]` for node i, if given),
    plus a head node that holds no slot (the scheduler and the jobs' supervisors live there), all on this
    machine. Connects this process."""

    def __init__(self, nodes: int = 2, slots: int = 4, cpus_per_node: int = 2, types: Sequence[str] = ()):
        use_loopback()  # before ray loads: it reads these when imported
        import ray
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "node_ip_address": HOST, "include_dashboard": False})
        self.nodes = [self.cluster.add_node(num_cpus=cpus_per_node, node_ip_address=HOST,
                                            resources=slot_resources(slots, types[i] if types else None))
                      for i in range(nodes)]
        ray.init(address=self.cluster.address, logging_level="ERROR", log_to_driver=False)

    def node_ids(self) -> List[str]:
        """The slot nodes' ids, in the order they were added."""
        return [n.node_id for n in self.nodes]

    def add_node(self, slots: int, cpus: int = 2, gpu_type: Optional[str] = None) -> int:
        """Another slot node (as a machine joining), of `gpu_type` if given; returns its index."""
        self.nodes.append(self.cluster.add_node(num_cpus=cpus, node_ip_address=HOST,
                                                resources=slot_resources(slots, gpu_type)))
        return len(self.nodes) - 1

    def remove_node(self, index: int) -> None:
        self.cluster.remove_node(self.nodes[index])

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()

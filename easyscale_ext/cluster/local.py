"""Ray on one machine, every byte on loopback: the embedded cluster of `easyscale cluster start` without
--address, and the multi-node test clusters (ray.cluster_utils.Cluster).

Ray's defaults leave loopback in two ways: it takes the machine's interface address for its nodes, and each
start asks a cloud metadata address which cloud it is on. `loopback_env` keeps both on this machine; a
real cluster over several machines (`ray start --head` / `--address`, KubeRay) needs none of it.
"""
import os
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

from . import SLOT, TYPED

HOST = "127.0.0.1"


def loopback_env(home: Optional[str] = None) -> Dict[str, str]:
    """The environment every process that starts or joins a local Ray must have: Ray resolves its own
    address to 127.0.0.1, sends no usage statistics, and finds a bootstrap file in HOME, which stops its
    cloud probe. Its jobs' gloo groups use the loopback interface too (by default gloo binds to whatever address
    the machine's hostname resolves to)."""
    home = home or os.path.join(tempfile.gettempdir(), f"easyscale-ray-home-{os.getuid()}")
    os.makedirs(home, exist_ok=True)
    bootstrap = os.path.join(home, "ray_bootstrap_config.yaml")
    if not os.path.exists(bootstrap):
        with open(bootstrap, "w") as f:
            f.write("{}\n")
    gloo = {"GLOO_SOCKET_IFNAME": "lo"} if sys.platform.startswith("linux") else {}
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "HOME": home, **gloo}


def use_loopback(home: Optional[str] = None) -> None:
    """Put `loopback_env` into this process's environment, before it imports ray."""
    os.environ.update(loopback_env(home))


def slot_resources(slots: int, gpu_type: Optional[str] = None) -> Dict[str, int]:
    """The Ray resources of a node with `slots` slots (of `gpu_type`, if given)."""
    return {SLOT: slots, **({TYPED + gpu_type: slots} if gpu_type else {})}


def emulated_isas(types: Sequence[str]) -> Dict[str, Optional[str]]:
    """The instruction set each slot type's node runs at on this machine, to emulate different hardware: the
    first type this CPU's own (None: no cap), each further type one level below the type before (from
    determinism.ISAS, derived from this CPU, never assumed), as far as the CPU allows (then no cap)."""
    from ..determinism import FLOORS, isa_below, native_isa

    isas, isa = {}, native_isa()
    for i, gpu_type in enumerate(dict.fromkeys(types)):
        if i:
            isa = isa_below(isa)
        isas[gpu_type] = isa if i and isa in FLOORS else None  # FLOORS: the levels that can be capped to
    return isas


class LocalCluster:
    """A Ray cluster of `nodes` worker nodes with `slots` slots each (of the type `types[i]` for node i, if given),
    plus a head node that holds no slot (the scheduler and the jobs' supervisors live there), all on this
    machine. With `emulate`, each type's node runs its processes at that type's instruction set
    (`emulated_isas`), as different hardware would: their conv gradients differ in bits unless a job runs at D2.
    Connects this process unless `connect=False`; with `detached`, its Ray outlives this process."""

    def __init__(self, nodes: int = 2, slots: int = 4, cpus_per_node: int = 2, types: Sequence[str] = (),
                 emulate: bool = False, connect: bool = True, detached: bool = False):
        use_loopback()  # before ray loads: it reads these when imported
        from ray.cluster_utils import Cluster

        self.isas = emulated_isas(types) if emulate else {}
        self.cluster = Cluster(initialize_head=True, shutdown_at_exit=not detached, head_node_args={
            "num_cpus": 1, "node_ip_address": HOST, "include_dashboard": False})
        self.nodes = []
        for i in range(nodes):  # `types` may name more types than nodes: the nodes added later (emulate)
            self.add_node(slots, cpus_per_node, types[i] if types else None)
        if connect:
            import ray
            ray.init(address=self.cluster.address, logging_level="ERROR", log_to_driver=False)

    @property
    def address(self) -> str:
        return self.cluster.address

    def node_ids(self) -> List[str]:
        """The slot nodes' ids, in the order they were added, less those removed."""
        return [n.node_id for n in self.nodes]

    def add_node(self, slots: int, cpus: int = 2, gpu_type: Optional[str] = None) -> int:
        """Another slot node (as a machine joining), of `gpu_type` if given; returns its index in `node_ids()`."""
        from ..determinism import isa_caps

        caps = isa_caps(self.isas[gpu_type]) if self.isas.get(gpu_type) else {}
        before = {k: os.environ.get(k) for k in caps}
        os.environ.update(caps)  # the node's processes (its raylet's workers, their children) inherit them
        try:
            self.nodes.append(self.cluster.add_node(num_cpus=cpus, node_ip_address=HOST,
                                                    resources=slot_resources(slots, gpu_type)))
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v
        return len(self.nodes) - 1

    def remove_node(self, index: int) -> None:
        """Take the node at `index` of `node_ids()` away (as a machine lost); the nodes after it move up one."""
        self.cluster.remove_node(self.nodes.pop(index))

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()


def main() -> None:
    """`python -m easyscale_ext.cluster.local SLOTS:TYPE[,SLOTS:TYPE...]`: start a detached local cluster of a node
    per entry (types emulated), print its address and exit, leaving Ray running (`easyscale cluster start`)."""
    entries = [(int(k), t or None) for k, _, t in (entry.partition(":") for entry in sys.argv[1].split(","))]
    local = LocalCluster(nodes=0, types=[t for _, t in entries], emulate=True, connect=False, detached=True)
    for slots, gpu_type in entries:
        local.add_node(slots, gpu_type=gpu_type)
    print(local.address, flush=True)


if __name__ == "__main__":
    main()

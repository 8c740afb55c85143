"""The cluster: nodes, each with a number of GPUs of one type.

A spec lists groups of identical nodes, `COUNTxGPUS[:TYPE]`, comma-separated: "16x4:t4" is the Pollux
artifact's 64 T4s; "6x4:t4,2x8:a100,3x8:2080ti" is Sia's heterogeneous cluster. The type defaults to t4. A name
of SHAPES stands for its spec.
"""
from dataclasses import dataclass

import numpy as np

# The three artifacts' clusters of 64 GPUs, and two more of 64 weighted to one type (validation draws).
SHAPES = {"pollux": "16x4:t4", "sia": "6x4:t4,2x8:a100,3x8:2080ti", "easyscale": "4x8:v100,2x8:p100,4x4:t4",
          "t4-heavy": "10x4:t4,1x8:a100,2x8:2080ti", "a100-heavy": "2x4:t4,5x8:a100,2x8:2080ti"}
DEFAULT = SHAPES["pollux"]
EASYSCALE = SHAPES["easyscale"]  # EasyScale's simulated 32 V100 + 16 P100 + 16 T4


@dataclass(frozen=True)
class Cluster:
    spec: str
    gpus: tuple  # GPUs per node
    types: tuple  # GPU type per node

    @classmethod
    def parse(cls, spec: str = DEFAULT) -> "Cluster":
        spec = SHAPES.get(spec, spec)
        gpus, types = [], []
        for group in spec.replace(" ", "").split(","):
            shape, _, gpu_type = group.partition(":")
            try:
                count, per_node = (int(x) for x in shape.split("x"))
            except ValueError:
                count = per_node = 0
            if count < 1 or per_node < 1:
                raise ValueError(f"bad cluster group {group!r} in {spec!r}: expected COUNTxGPUS[:TYPE] with "
                                 f"COUNT nodes of GPUS GPUs each, both at least 1, e.g. 16x4:t4; or a "
                                 f"shape's name: {', '.join(SHAPES)}")
            gpus += [per_node] * count
            types += [gpu_type or "t4"] * count
        return cls(spec, tuple(gpus), tuple(types))

    @property
    def num_nodes(self) -> int:
        return len(self.gpus)

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus)

    def used(self, allocations) -> np.ndarray:
        """GPUs in use on each node."""
        nodes = [n for alloc in allocations.values() for n in alloc]
        return np.bincount(np.asarray(nodes, dtype=int), minlength=self.num_nodes)

    def free(self, allocations) -> np.ndarray:
        return np.asarray(self.gpus) - self.used(allocations)

    @property
    def homogeneous(self) -> bool:
        return len(set(self.types)) == 1

    def nodes_of(self, gpu_type) -> np.ndarray:
        """Which nodes have GPUs of `gpu_type`."""
        return np.array([t == gpu_type for t in self.types])

    def room(self, free) -> dict:
        """Free GPUs per GPU type, given free GPUs per node."""
        room = dict.fromkeys(self.types, 0)
        for gpu_type, f in zip(self.types, free):
            room[gpu_type] += int(f)
        return room


    def groups(self, alloc) -> dict:
        """{GPU type: GPUs per node} of an allocation (a node index per GPU)."""
        by_type = {}
        for node in alloc:
            by_type.setdefault(self.types[node], []).append(node)
        return {t: placement_of(nodes) for t, nodes in by_type.items()}


def placement_of(alloc) -> tuple:
    """GPUs per node of an allocation (a node index per GPU), nodes in the order they first appear."""
    counts = {}
    for node in alloc:
        counts[node] = counts.get(node, 0) + 1
    return tuple(counts.values())

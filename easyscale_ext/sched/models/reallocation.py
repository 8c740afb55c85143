"""What a reallocation costs a job: seconds without progress, by how the job runs, not by who moved it.

Restart-based (any job that is not on this runtime, and every job's first start or a start after holding no
GPUs): checkpoint, stop, process start, warm-up. As the artifacts model it: a flat `restart_s` (Pollux's
simulator, 30 s) or per application (`restart_by_app`; Sia's simulator, 15 s for ncf to 250 s for imagenet).

In place (a job on this runtime that holds GPUs before and after): the joiners prepare while the job trains
(process start, imports), then the job pauses for the measured pause of an in-place scale event (`pause_s`,
BENCHMARKS.md "Scale-event pause": 55.5 ms scale-out, 72.1 ms scale-in) plus the bytes that move:

- every GPU the job gains needs a replica of the model's state (parameters and optimizer state, fp32): once
  over the inter-node link to each node the job did not hold before, over the intra-node link to the others
  (a node receives the state once and copies it to its other new GPUs; nodes receive in parallel);
- every GPU it loses hands its virtual workers' contexts (per-worker buffers and RNG states) to a GPU it keeps,
  over the intra-node link if the job keeps a GPU on that node, else the inter-node link.
The transfers of a kind go one after another (a conservative sum). Bandwidths are cluster parameters.
"""
from dataclasses import dataclass

# The pause of an in-place scale event that every simulated table charges: scale-in 2 -> 1 as bench/bench_elastic.py
# measured it on the EPYC on 2026-11-22. Reruns land at 50-90 ms (BENCHMARKS.md, "Scale-event pause"); the figure is
# kept so that the tables stay comparable.
PAUSE_S = 0.0721

# Link bandwidths, GB/s (10^9 bytes). Intra-node: PCIe 3.0 x16 between GPUs through host memory, ~12 GB/s of
# its 15.75 GB/s raw (T4, RTX 2080Ti and the artifacts' other PCIe nodes have no NVLink; taking NVLink's faster
# rate on A100 nodes would only make moves cheaper). Inter-node: 25 Gbit/s Ethernet, 3.125 GB/s, half the
# 50 Gbit/s of the AWS g4dn.12xlarge nodes of Pollux's testbed (Qiao et al., OSDI'21, section 5.1), a
# conservative common datacentre link.
INTRA_NODE_GBPS = 12.0
INTER_NODE_GBPS = 3.125


@dataclass(frozen=True)
class ModelState:
    """What a replica holds: `params` fp32 parameters (millions), `slots` optimizer tensors per parameter
    (SGD with momentum 1, Adam/AdamW 2), and `context_mb` per virtual worker (buffers such as BatchNorm's
    running statistics, RNG states)."""
    params_m: float
    slots: int
    context_mb: float

    @property
    def state_bytes(self) -> float:
        return self.params_m * 1e6 * 4 * (1 + self.slots)

    @property
    def context_bytes(self) -> float:
        return self.context_mb * 1e6


# Per profiled application: the model and optimizer its artifact trains (Pollux, OSDI'21, Table 1; the adaptdl
# osdi21-artifact examples).
# - cifar10: ResNet-18 (CIFAR variant), 11.2 M parameters (He et al., CVPR'16), SGD with momentum; BatchNorm
#   buffers ~0.04 MB.
# - imagenet: ResNet-50, 25.6 M parameters (counted from its 161 tensors, BENCHMARKS.md "Core"), SGD with
#   momentum; its 53 BatchNorm layers' buffers 0.2 MB (same table).
# - bert: BERT-base fine-tuned on SQuAD, 109.5 M parameters (199 tensors, BENCHMARKS.md "Core"), AdamW; no
#   buffers beyond RNG states (~0.01 MB).
# - yolov3: YOLOv3 (Darknet-53 backbone), 61.9 M parameters (Redmon and Farhadi, 2018), SGD with momentum;
#   BatchNorm buffers ~0.2 MB.
# - deepspeech2: DeepSpeech2 (Amodei et al., ICML'16) with deepspeech.pytorch's defaults (2 convolutions, 5
#   bidirectional LSTM layers of 1024 units): ~86 M parameters by our count of those layers, an estimate;
#   optimizer taken as Adam-like (2 slots, the larger choice).
# - ncf: NeuMF-end on MovieLens-1M (adaptdl examples/NCF: 32 factors, 3 MLP layers; 6040 users and 3706 items):
#   (6040 + 3706) x (32 + 128) embedding weights + ~0.05 M MLP weights = 1.6 M parameters, Adam.
MODEL_STATE = {
    "cifar10": ModelState(11.2, 1, 0.04),
    "imagenet": ModelState(25.6, 1, 0.2),
    "bert": ModelState(109.5, 2, 0.01),
    "yolov3": ModelState(61.9, 1, 0.2),
    "deepspeech2": ModelState(86.0, 2, 0.01),
    "ncf": ModelState(1.6, 2, 0.01),
}
UNKNOWN_STATE = ModelState(110.0, 2, 0.2)  # an application not listed: BERT-base's size, Adam


def restart_cost(job, config) -> float:
    """Seconds a restart-based (re)start costs the job: its application's, else the flat
    `restart_s`, or `start_s` at its first start."""
    own = config.restart_by_app.get(job.spec.app)
    if own:
        return own
    return config.restart_s if job.starts else config.start_s


def in_place_cost(job, old, new, cluster, config) -> float:
    """Seconds an in-place move from allocation `old` to `new` (a node index per GPU, both non-empty) costs:
    the pause plus the state sent to the GPUs gained and the contexts of the GPUs lost (module docstring)."""
    model = MODEL_STATE.get(job.spec.app, UNKNOWN_STATE)
    old_per_node, new_per_node = _per_node(old), _per_node(new)
    intra, inter = config.intra_node_gbps * 1e9, config.inter_node_gbps * 1e9
    gained = {n: k - old_per_node.get(n, 0) for n, k in new_per_node.items() if k > old_per_node.get(n, 0)}
    lost = {n: k - new_per_node.get(n, 0) for n, k in old_per_node.items() if k > new_per_node.get(n, 0)}
    seconds = config.in_place_s
    if any(n not in old_per_node for n in gained):  # state to a node the job did not hold
        seconds += model.state_bytes / inter
    if any(n in old_per_node or k > 1 for n, k in gained.items()):  # state copied within a node
        seconds += model.state_bytes / intra
    workers = _workers_per_gpu(job, len(old))
    for node, k in lost.items():
        link = intra if node in new_per_node else inter
        seconds += k * workers * model.context_bytes / link
    return seconds


def reallocation_cost(job, old, new, cluster, config, in_place) -> float:
    """Seconds without progress when the job goes from `old` to `new` (non-empty): in place if it runs in place
    and held GPUs, else a restart."""
    if in_place and old:
        return in_place_cost(job, old, new, cluster, config)
    return restart_cost(job, config)


def _per_node(alloc) -> dict:
    counts = {}
    for node in alloc:
        counts[node] = counts.get(node, 0) + 1
    return counts


def _workers_per_gpu(job, gpus) -> float:
    """Virtual workers per GPU of an allocation of `gpus` GPUs: the job's D over its GPUs; one for a job that
    runs no virtual workers (each replica is one worker)."""
    d = getattr(job.spec, "virtual_workers", None)
    return max(d / gpus, 1.0) if d else 1.0

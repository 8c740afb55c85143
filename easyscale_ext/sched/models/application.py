"""A profiled application: its measured step times per GPU type, its gradient noise and its length."""
from functools import cached_property
from pathlib import Path

import numpy as np

from .efficiency import GradientNoise
from .profile import StepTimeProfile
from .traces import read_csv

# Epochs to completion, as in the Pollux artifact's simulator (applications.py).
EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
# The artifact caps yolov3's per-GPU batch at 8 (its T4s run out of memory above that).
MAX_LOCAL_BSZ = {"yolov3": 8}
# Per-GPU batches a GPU type's memory holds below its profile's largest (Sia's artifact, applications.py).
MEMORY_CAPS = {("deepspeech2", "2080ti"): 57}
# The artifact never gives ncf more than one GPU (elastic baselines and Pollux alike), and Pollux runs it at
# the largest validated batch.
SINGLE_GPU = {"ncf"}
# Where each GPU type's profile is: Pollux's own (T4) or Sia's files named by its cluster (DATA.md).
PROFILE_FILES = {
    "t4": ("pollux", "placements.csv", "scalability.csv"),
    "v100": ("sia", "placements-azure.csv", "scalability-azure.csv"),
    "a100": ("sia", "placements-dgx-ext.csv", "scalability-dgx-ext.csv"),
    "rtx6000": ("sia", "placements-quad.csv", "scalability-quad.csv"),
    "2080ti": ("sia", "placements-rtx.csv", "scalability-rtx.csv"),
}
# GPU types profiled by EasyScale only: derived from the T4 profile with its per-model step-time ratios (plain
# DDP, step_s_d0), by the nearest model it measured; applications it has no model for take the geometric mean.
DERIVED_FROM_T4 = ("p100",)
EASYSCALE_MODEL = {"bert": "Bert", "cifar10": "ResNet50", "imagenet": "ResNet50", "ncf": "NeuMF", "yolov3": "YOLOv3"}
GPU_TYPES = (*PROFILE_FILES, *DERIVED_FROM_T4)
# EasyScale's applications (its artifact's workloads/test.csv) that have no profile here, and the profiled one of
# the same family that runs in their place. What a stand-in keeps is its data set's noise and length and its model's
# step times, so the family is chosen by data set first: the artifact trains all four vision models on ImageNet
# (its applications.py), and imagenet here is ResNet-50 on ImageNet (exactly resnet50; VGG19 and ShuffleNetv2 are
# CNNs of the same task; SwinTransformer is a transformer, but on images: bert's are a text model's noise and its
# SQuAD epochs). Electra is BERT's architecture, trained there on the same SQuAD set, with the same measured step
# times (gpu_step_times.csv: 0.442 s against Bert's 0.441 s on a V100).
STAND_INS = {"electra": "bert", "resnet50": "imagenet", "vgg19": "imagenet", "shufflenetv2": "imagenet",
             "swintransformer": "imagenet"}


class Application:
    def __init__(self, name: str, data: Path):
        self.name = name
        self.data = Path(data)
        self.epochs = EPOCHS[name]
        self.single_gpu = name in SINGLE_GPU
        self.noise = GradientNoise(self.data / "pollux" / "traces" / name)
        self.init_batch_size = self.noise.init_batch_size
        self.max_batch_size = self.noise.max_batch_size
        self._profiles = {}
        t4 = self.profile("t4")  # the batch limits are the measured (T4) ones, as in the artifact
        self.min_local_bsz = t4.min_local_bsz
        self.max_local_bsz = MAX_LOCAL_BSZ.get(name, t4.max_local_bsz)

    def max_local_bsz_on(self, gpu_type: str) -> int:
        """The largest per-GPU batch measured on `gpu_type` (within its memory), as Sia's artifact bounds a job on
        each type; the T4's bound on the T4 and on the types derived from it."""
        if gpu_type == "t4" or gpu_type in DERIVED_FROM_T4:
            return self.max_local_bsz
        return MEMORY_CAPS.get((self.name, gpu_type), self.profile(gpu_type).max_local_bsz)

    def profile(self, gpu_type: str) -> StepTimeProfile:
        if gpu_type not in self._profiles:
            if gpu_type in DERIVED_FROM_T4:
                self._profiles[gpu_type] = self.profile("t4").scaled(self.step_ratio(gpu_type))
            elif gpu_type in PROFILE_FILES:
                source, placements, scalability = PROFILE_FILES[gpu_type]
                folder = self.data / source / "traces" / self.name
                self._profiles[gpu_type] = StepTimeProfile.from_csv(folder / placements, folder / scalability)
            else:
                raise ValueError(f"no step-time profile for GPU type {gpu_type!r}; known: {list(GPU_TYPES)}")
        return self._profiles[gpu_type]

    def step_ratio(self, gpu_type: str) -> float:
        """EasyScale's step time on `gpu_type` over its step time on a T4, for this application's model."""
        return self._easyscale_ratio(lambda t: t["d0"][gpu_type] / t["d0"]["t4"])

    @cached_property
    def d2_cost(self) -> float:
        """What D2 (one result on every GPU type) costs: EasyScale's D2 over plain-DDP step time, for this
        application's model, the geometric mean over the GPU types it measured."""
        return self._easyscale_ratio(lambda t: float(np.exp(np.mean([np.log(t["d2"][g] / t["d0"][g])
                                                                      for g in t["d0"]]))))

    def _easyscale_ratio(self, ratio) -> float:
        """ratio({"d0"|"d2": {GPU type: step time}}) on EasyScale's measurements of this application's model;
        for an application it has no model for, the geometric mean over its models."""
        cols = read_csv(self.data / "easyscale" / "gpu_step_times.csv")
        values = {}
        for model in dict.fromkeys(cols["model"]):
            mine = cols["model"] == model
            values[model] = ratio({level: dict(zip(cols["gpu"][mine], cols[f"step_s_{level}"][mine]))
                                   for level in ("d0", "d2")})
        model = EASYSCALE_MODEL.get(self.name)
        return values[model] if model else float(np.exp(np.mean(np.log(list(values.values())))))

    def worker_compute_time(self, gpu_type: str, local_bsz: int) -> float:
        """Seconds one GPU of `gpu_type` computes one micro-batch of `local_bsz` (a single-GPU step, no sync)."""
        step, sync = self.profile(gpu_type).step_time((1,), local_bsz)
        return step - sync

    @cached_property
    def total_progress(self) -> float:
        return self.noise.progress_at(self.epochs)


class Applications(dict):
    """Applications by name, loaded on first use."""

    def __init__(self, data: Path):
        super().__init__()
        self.data = Path(data)

    def __missing__(self, name):
        if name not in EPOCHS:
            raise KeyError(f"unknown application {name!r}; known: {sorted(EPOCHS)}")
        self[name] = Application(name, self.data)
        return self[name]

"""The data the package ships, and the workloads it reads: EasyScale's own (its artifact's test.csv, shipped as
easyscale/workloads/test.csv), CSVs lacking columns, repeated job names."""
import gzip
from importlib.resources import files
from pathlib import Path

import pytest

from easyscale_ext.sched.models import traces
from easyscale_ext.sched.models.application import EPOCHS, STAND_INS
from easyscale_ext.sched.models.cluster import EASYSCALE, Cluster
from easyscale_ext.sched.models.traces import ENV_VAR, data_dir, read_csv
from easyscale_ext.sched.metrics import isolated_runtime
from easyscale_ext.sched.models.workload import (APPLICATIONS_BY_GPU_HOURS, JobSpec, load_workload, unique_names,
                                                 with_applications, with_stand_ins)
from easyscale_ext.sched.policies.easyscale import EasyScalePolicy
from easyscale_ext.sched.policies.fifo import FifoPolicy
from easyscale_ext.sched.policies.sia import SiaPolicy
from easyscale_ext.sched.simulator import simulate, validate


def test_the_packaged_copy_is_found_without_a_checkout(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    packaged = Path(str(files("easyscale_ext.sched") / "data"))
    assert data_dir() == traces.PACKAGED == packaged
    assert (packaged / "pollux" / "LICENSE-Apache-2.0.txt").exists() and (packaged / "README.md").exists()
    for gpu_files in ("placements.csv", "placements-azure.csv", "placements-dgx-ext.csv", "placements-quad.csv",
                      "placements-rtx.csv"):
        for app in EPOCHS:
            source = "pollux" if gpu_files == "placements.csv" else "sia"
            assert (packaged / source / "traces" / app / gpu_files).exists()


def test_a_compressed_csv_is_read_in_place_of_the_missing_csv(tmp_path):
    with gzip.open(tmp_path / "t.csv.gz", "wt") as f:
        f.write("a,b\n1,x\n2,y\n")
    cols = read_csv(tmp_path / "t.csv")
    assert list(cols["a"]) == [1.0, 2.0] and list(cols["b"]) == ["x", "y"]
    assert len(load_workload(data_dir() / "pollux" / "traces" / "philly.csv", limit=5)) == 5  # shipped as .csv.gz


def test_the_philly_trace_runs_as_applications_drawn_by_its_gpu_hours(data, apps):
    trace = load_workload(data / "pollux" / "traces" / "philly.csv", limit=3000)
    specs = with_applications(trace, apps, seed=1)
    assert specs == with_applications(trace, apps, seed=1) != with_applications(trace, apps, seed=2)  # seeded
    validate(specs, SiaPolicy(), Cluster.parse("100x8:t4,100x8:a100,100x8:2080ti"))  # a profiled policy runs them
    assert [s.arrival for s in specs] == [s.arrival for s in trace]
    for job, spec in zip(trace, specs):
        hours = job.num_gpus * job.duration / 3600
        odds = next(odds for bound, odds in APPLICATIONS_BY_GPU_HOURS if hours < bound)
        assert spec.app in odds or spec.app == "cifar10" and "ncf" in odds and job.num_gpus > 1
        assert spec.num_gpus == 1 or spec.app != "ncf"
        assert 1 <= spec.epochs <= apps[spec.app].epochs and spec.duration is None
    # Its epochs take about its duration alone on its GPUs: where they were not bounded, within a factor of 2.5
    # (the application's whole epochs would take up to hundreds of times longer).
    fitted = [(job, spec) for job, spec in zip(trace, specs) if 1 < spec.epochs < apps[spec.app].epochs]
    assert len(fitted) > 1000 and {s.app for _, s in fitted} >= {"cifar10", "imagenet", "yolov3"}
    for job, spec in fitted[::20]:
        assert 0.4 < isolated_runtime(spec, apps, 8, "t4") / job.duration < 2.5


@pytest.fixture(scope="module")
def artifact(data):
    return load_workload(data / "easyscale" / "workloads" / "test.csv")


def test_easyscales_own_workload_loads_with_stand_ins_and_a_name_per_job(artifact):
    assert len(artifact) == 68
    specs, used = with_stand_ins(artifact, STAND_INS)
    assert used == {a: STAND_INS[a] for a in ("electra", "swintransformer", "shufflenetv2", "resnet50", "vgg19")}
    assert sum(s.app != a.app for s, a in zip(specs, artifact)) == 42 and {s.app for s in specs} <= set(EPOCHS)
    specs, renamed = unique_names(specs)
    assert sorted(renamed) == ["electra-28-1#2", "electra-28-1#3", "electra-28-2#2", "electra-28-2#3",
                               "electra-28-3#2", "electra-28-3#3"]
    assert len({s.name for s in specs}) == 68
    first = next(s for s in specs if s.name == "electra-28-1")  # the earliest of the three keeps the name
    assert first.arrival == 3356 and next(s for s in specs if s.name == "electra-28-1#3").arrival == 4498


def test_easyscales_own_workload_runs_on_its_cluster(artifact, apps):
    specs = unique_names(with_stand_ins(artifact, STAND_INS)[0])[0]
    for policy in (FifoPolicy(exclusive=True), EasyScalePolicy()):  # fifo: a 32-worker job prefers the 16 P100s
        result = simulate(specs, policy, Cluster.parse(EASYSCALE), apps)
        assert len(result.jobs) == 68


def test_an_application_neither_profiled_nor_mapped_is_named():
    specs = [JobSpec("a", 0, 1, "gpt9", 8), JobSpec("b", 0, 1, "electra", 8), JobSpec("c", 0, 1, "bert", 8)]
    with pytest.raises(ValueError, match=r"no profile for application\(s\) gpt9, electra \(profiled"):
        with_stand_ins(specs, {})
    assert [s.app for s in with_stand_ins(specs, {"gpt9": "cifar10", **STAND_INS})[0]] == ["cifar10", "bert", "bert"]


def test_repeated_names_are_refused_by_the_simulator_not_an_index_error(apps):
    specs = [JobSpec("a", 0, 1, duration=60), JobSpec("a", 10, 1, duration=60)]
    with pytest.raises(ValueError, match=r"job names repeat \(a\)"):
        simulate(specs, FifoPolicy(), Cluster.parse("1x2"), apps)


def test_jobs_preferring_a_type_the_cluster_lacks_are_refused(artifact, apps):
    with pytest.raises(ValueError, match=r"lacks \(p100, v100\)"):
        simulate(artifact, EasyScalePolicy(), Cluster.parse("16x4:t4"), apps)


@pytest.mark.parametrize("header, missing", [("name,time,application,num_replicas", "batch_size"),
                                             ("name,time,application,max_parallelism,batch_size,epochs,"
                                              "preferred_gpu", "enable_heterogeneous_deterministic"),
                                             ("timestamp,num_gpus", "duration")])
def test_a_workload_lacking_a_column_says_which(tmp_path, header, missing):
    path = tmp_path / "w.csv"
    path.write_text(header + "\n" + ",".join("1" for _ in header.split(",")) + "\n")
    with pytest.raises(ValueError, match=f"lacks the column\\(s\\) {missing} of a"):
        load_workload(path)

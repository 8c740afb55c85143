"""Workloads drawn by Pollux's and Sia's samplers' rules: the rules reproduce what the shipped workloads hold, and a
draw is a function of its seed, load and cluster."""
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from easyscale_ext.sched.models import sampler
from easyscale_ext.sched.models.cluster import SHAPES, Cluster
from easyscale_ext.sched.models.traces import read_csv
from easyscale_ext.sched.models.workload import load_workload

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trace_csv(data):
    return data / "pollux" / "traces" / "philly.csv"


def shipped_configurations(paths) -> dict:
    found = defaultdict(set)
    for path in paths:
        cols = read_csv(path)
        for app, gpus, batch in zip(cols["application"], cols["num_replicas"], cols["batch_size"]):
            found[str(app)].add((int(gpus), int(batch)))
    return dict(found)


def test_pollux_rules_give_exactly_the_configurations_of_pollux_workloads(data, apps):
    rules = sampler.RULES["pollux"]
    shipped = shipped_configurations(sorted((data / "pollux" / "workloads").glob("workload-*.csv")))
    assert len(shipped) == 6
    for app, configs in shipped.items():
        assert set(sampler.configurations(apps[app], rules.gpu_type, rules.per_node, rules.gpu_counts)) == configs


def test_sia_rules_on_its_2080tis_give_the_imagenet_configurations_of_sia_workloads(data, apps):
    shipped = shipped_configurations(sorted((data / "sia" / "workloads" / "philly").glob("workload-*.csv")))
    rules = sampler.RULES["sia"]
    assert sampler.reference(rules, Cluster.parse("sia")) == ("2080ti", 8)
    assert set(sampler.configurations(apps["imagenet"], "2080ti", 8, rules.gpu_counts)) == shipped["imagenet"]


def test_every_job_of_pollux_workloads_is_a_pool_job_in_its_applications_band(data, trace_csv):
    arrival, gpu_hours = sampler.philly_pool(str(trace_csv), *sampler.WINDOW)
    bounds = [bound for bound, _ in sampler.APPLICATIONS]
    band = np.searchsorted(bounds, gpu_hours, side="right")
    for path in sorted((data / "pollux" / "workloads").glob("workload-*.csv")):
        for job in load_workload(path):
            at = band[arrival == job.arrival]
            assert any(job.app in sampler.APPLICATIONS[b][1] for b in at), (path.name, job)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_draw_is_seeded_scaled_by_its_load_and_sized_for_its_cluster(apps, trace_csv, shape):
    cluster = Cluster.parse(shape)
    draw = sampler.sample_workload(trace_csv, apps, cluster, seed=7)
    assert draw == sampler.sample_workload(trace_csv, apps, cluster, seed=7)
    assert draw != sampler.sample_workload(trace_csv, apps, cluster, seed=8)
    assert len(draw) == 160 and len(sampler.sample_workload(trace_csv, apps, cluster, 7, load=0.5)) == 80
    assert [j.arrival for j in draw] == sorted(j.arrival for j in draw)
    assert all(0 <= j.arrival < 8 * 3600 for j in draw)
    assert not any(j.app == "ncf" for j in draw)  # Sia's rules
    gpu_type, per_node = sampler.reference(sampler.RULES["sia"], cluster)
    for job in draw:
        options = sampler.configurations(apps[job.app], gpu_type, per_node, sampler.RULES["sia"].gpu_counts)
        assert (job.num_gpus, job.batch_size) in options


def test_pollux_rules_draw_what_pollux_workloads_hold(data, apps, trace_csv):
    shipped = shipped_configurations(sorted((data / "pollux" / "workloads").glob("workload-*.csv")))
    draw = sampler.sample_workload(trace_csv, apps, Cluster.parse("pollux"), seed=1, rules="pollux", load=2)
    assert {"ncf", "cifar10"} <= {j.app for j in draw}
    assert all((j.num_gpus, j.batch_size) in shipped[j.app] for j in draw)


@pytest.mark.parametrize("load,message", [(0, "a positive number"), (float("inf"), "a positive number"),
                                          (500, "the trace's window holds")])
def test_a_load_the_trace_cannot_give_is_refused(apps, trace_csv, load, message):
    with pytest.raises(ValueError, match=message):
        sampler.sample_workload(trace_csv, apps, Cluster.parse("sia"), seed=0, load=load)


def test_the_command_writes_the_draw_in_pollux_format(tmp_path, apps, trace_csv):
    out = tmp_path / "w.csv"
    run = subprocess.run([sys.executable, "-m", "easyscale_ext.cli", "workload", "--sample", "4", "--load", "0.25",
                          "--cluster", "t4-heavy", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "wrote 40 jobs" in run.stdout, run.stderr
    assert out.read_text().splitlines()[0] == "name,time,application,num_replicas,batch_size"
    by_name = lambda jobs: sorted(jobs, key=lambda j: j.name)  # noqa: E731 (ties in arrival sort by name there)
    assert by_name(load_workload(out)) == by_name(sampler.sample_workload(trace_csv, apps, Cluster.parse("t4-heavy"),
                                                                          4, 0.25))


def test_the_readmes_command_runs_as_written(tmp_path, apps, trace_csv):
    command = "easyscale workload --sample 3 --load 1.5 --cluster a100-heavy --out w.csv"
    assert command in " ".join((REPO / "README.md").read_text().split())
    run = subprocess.run([sys.executable, "-m", "easyscale_ext.cli", *command.split()[1:]], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "wrote 240 jobs to w.csv" in run.stdout, run.stderr
    by_name = lambda jobs: sorted(jobs, key=lambda j: j.name)  # noqa: E731
    assert by_name(load_workload(tmp_path / "w.csv")) == by_name(
        sampler.sample_workload(trace_csv, apps, Cluster.parse("a100-heavy"), 3, 1.5))


def test_the_api_references_example_runs_as_written(tmp_path):
    text = (REPO / "docs" / "api" / "scheduling.rst").read_text()
    block = text.split("Workloads drawn for validation", 1)[1].split(".. code-block:: python", 1)[1]
    lines = block.splitlines()[1:]
    body = lines[:next(i for i, line in enumerate(lines) if line and not line.startswith("   "))]
    code = textwrap.dedent("\n".join(body))
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("240 JobSpec(name="), run.stderr


def test_the_command_refuses_a_negative_seed_and_writes_nothing(tmp_path):
    run = subprocess.run([sys.executable, "-m", "easyscale_ext.cli", "workload", "--sample", "-1", "--out",
                          str(tmp_path / "w.csv")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "a seed is a whole number of at least 0" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "w.csv").exists()

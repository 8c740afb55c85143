"""EasyScale's own job model (models/easyscale.py) and setting: its published figures reproduced, a job's length and
speed computed by hand from the artifact's rules and EasyScale's measurements."""
import csv
from dataclasses import replace

import pytest

from easyscale_ext.sched.models.application import STAND_INS
from easyscale_ext.sched.models.cluster import EASYSCALE as EASYSCALE_CLUSTER
from easyscale_ext.sched.models.cluster import Cluster
from easyscale_ext.sched.models.easyscale import EasyScaleJob
from easyscale_ext.sched.metrics import isolated_runtime
from easyscale_ext.sched.models.workload import JobSpec, last_per_name, load_workload, with_stand_ins
from easyscale_ext.sched.policies.easyscale import EasyScalePolicy
from easyscale_ext.sched.policies.fifo import FifoPolicy
from easyscale_ext.sched.simulator import EASYSCALE, job_maker, simulate

PUBLISHED = {"easyscale-heter": 677, "easyscale-homo": 1071, "yarn-cs": 8905}  # average JCT, s (SC'23; data/DATA.md)


def measured(data, model, gpu):
    """(per-GPU batch, D0 step s) of EasyScale's measurement, and the mean D2/D0 over all of them."""
    with open(data / "easyscale" / "gpu_step_times.csv") as f:
        rows = list(csv.DictReader(f))
    mean = sum(float(r["step_s_d2"]) / float(r["step_s_d0"]) for r in rows) / len(rows)
    row = next(r for r in rows if r["model"] == model and r["gpu"] == gpu)
    return int(row["per_gpu_batch"]), float(row["step_s_d0"]), mean


def test_easyscales_setting_gives_its_published_average_jcts_within_10_percent(data, apps):
    specs, repeated = last_per_name(with_stand_ins(load_workload(data / "easyscale/workloads/test.csv"),
                                                   STAND_INS)[0])
    assert len(specs) == 62 and repeated == ["electra-28-1", "electra-28-2", "electra-28-3"]
    cluster, avg = Cluster.parse(EASYSCALE_CLUSTER), {}
    for policy in (EasyScalePolicy(), EasyScalePolicy(heterogeneous=False), FifoPolicy(exclusive=True)):
        jobs = simulate(specs, policy, cluster, apps, EASYSCALE).jobs
        avg[policy.name] = sum(j["jct"] for j in jobs) / len(jobs)
    assert avg["easyscale-heter"] < avg["easyscale-homo"] < avg["yarn-cs"]
    for name, published in PUBLISHED.items():
        assert abs(avg[name] / published - 1) <= 0.10, (name, avg[name], published)


def test_a_job_trains_epochs_of_one_percent_of_its_data_set_at_its_own_models_measured_speed(data, apps):
    # Electra (run as bert, SQuAD's 88,641 samples), 4 workers of 4 samples, 200 epochs: no cap at bert's 2.
    spec = JobSpec("e", 0, 4, "bert", 16, virtual_workers=4, heterogeneous=True, preferred_gpu="v100", epochs=200,
                   model="electra")
    batch, d0, mean_d2 = measured(data, "Electra", "v100")
    step = d0 * mean_d2 * 4 / batch  # one micro-batch per V100, no exchange
    alone = isolated_runtime(spec, apps, 4, "v100", job_maker(EASYSCALE))
    assert alone == pytest.approx(200 * 0.01 * 88641 / 16 * step, rel=1e-12)
    # On 2 GPUs each computes 2 micro-batches: twice as long.
    assert isolated_runtime(replace(spec, num_gpus=2), apps, 4, "v100", job_maker(EASYSCALE)) == \
        pytest.approx(2 * alone, rel=1e-12)


def test_mixed_types_cost_nothing_and_the_workers_follow_speed(data, apps):
    spec = JobSpec("b", 0, 5, "bert", 40, virtual_workers=5, heterogeneous=True, preferred_gpu="v100", epochs=1)
    job = EasyScaleJob(spec, apps["bert"], data)
    (batch, v100, _), (_, t4, mean_d2) = measured(data, "Bert", "v100"), measured(data, "Bert", "t4")
    v100, t4 = (s * mean_d2 * 8 / batch for s in (v100, t4))
    # 5 workers: the V100 (1.54x a T4 for Bert) takes 3, the T4 2; the step is the slower GPU's, D2 free.
    step, waste = job.step_on((("v100", (1,)), ("t4", (1,))))
    assert step == pytest.approx(max(3 * v100, 2 * t4), rel=1e-12)
    assert waste == pytest.approx(1 - (3 * v100 + 2 * t4) / (2 * step), rel=1e-12)


def test_an_application_or_gpu_type_easyscale_never_measured_is_refused(data, apps):
    spec = JobSpec("c", 0, 4, "cifar10", 64, virtual_workers=4, preferred_gpu="t4", epochs=1)
    with pytest.raises(ValueError, match="knows the data sets of its artifact's applications only"):
        EasyScaleJob(spec, apps["cifar10"], data)
    job = EasyScaleJob(replace(spec, app="imagenet"), apps["imagenet"], data)
    with pytest.raises(ValueError, match="EasyScale measured no ResNet50 step on a100"):
        job.step_on((("a100", (1,)),))

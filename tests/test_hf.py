"""EasyScaleTrainer (easyscale_ext/hf.py), as the README gives it: its example, a transformers BERT built from a
config, ends with one SHA-256 on 1 and 2 processes and on 4 after a restart from a Trainer checkpoint the 2 wrote,
under gradient accumulation; each setting it cannot honour fails at once, naming the setting."""
import os

import pytest
from support.jobs import in_readme, printed_state, run_script

pytestmark = pytest.mark.multiprocess  # every test starts processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_hf.py")


def torchrun(procs, *args, cwd):
    return run_script(["-m", "torch.distributed.run", "--nproc-per-node", str(procs), "--standalone", EXAMPLE, *args],
                      cwd)


def one_process(*args, cwd):
    return run_script([EXAMPLE, *args], cwd)  # as the README runs one: no torchrun agent


@pytest.mark.slow  # 8 Trainer processes and 2 torchrun agents, each importing transformers or torch: a minute or so
def test_the_same_bits_on_1_and_2_processes_and_on_4_after_a_restart(tmp_path):
    """Under gradient_accumulation_steps=2: an optimizer step every two batches of the N virtual workers, so the
    job takes both the steps that synchronise (every step of a job that does not accumulate) and those that do not.
    The job on 1 and on 2 processes, and on 4 from the checkpoint the 2 processes wrote after the first epoch."""
    job, epoch = ["--accumulate", "2"], 16 // 2  # optimizer steps an epoch
    one = printed_state(one_process("--out", "run1", *job, cwd=tmp_path))
    assert printed_state(torchrun(2, "--out", "run2", *job, "--save", cwd=tmp_path)) == one
    assert sorted(os.listdir(tmp_path / "run2")) == sorted([f"checkpoint-{epoch}", f"checkpoint-{2 * epoch}"])
    again = torchrun(4, "--out", "again", *job, "--resume", str(tmp_path / "run2" / f"checkpoint-{epoch}"),
                     cwd=tmp_path)
    assert printed_state(again) == one
    assert one != printed_state(one_process("--out", "plain", cwd=tmp_path))  # it accumulates: not the plain run


def test_the_readme_shows_the_example_as_it_runs():
    assert in_readme(EXAMPLE)


@pytest.mark.parametrize("mode, says", [
    ("mid-epoch", "was written inside an epoch (step 3, 8 steps an epoch): EasyScaleTrainer resumes from epoch ends"),
])
def test_a_setting_it_cannot_honour_is_named(tmp_path, mode, says):
    out = run_script([os.path.join(ROOT, "tests", "support", "hf_misuse.py"), mode, str(tmp_path / "out")], tmp_path)
    assert out.returncode != 0 and says in out.stderr, out.stderr[-3000:]


def test_the_process_group_ends_before_the_interpreter_does(tmp_path):
    # Accelerate leaves it alive, and a gloo group alive at interpreter shutdown can abort a finished run.
    out = run_script(["-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                      os.path.join(ROOT, "tests", "support", "hf_misuse.py"), "exit", str(tmp_path / "out")], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("group at exit: ended") == 2, out.stdout


def test_more_processes_than_virtual_workers_are_refused(tmp_path):
    out = torchrun(2, "--virtual-workers", "1", cwd=tmp_path)
    assert out.returncode != 0
    assert "EasyScaleTrainer(virtual_world_size=1) runs on at most 1 process; torchrun started 2" in out.stderr

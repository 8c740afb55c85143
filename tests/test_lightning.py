"""EasyScaleStrategy (easyscale_ext/lightning.py), as the README gives it: its Lightning example ends with one
SHA-256 on 1 process and on 2 then, restarted from its checkpoint, 4 processes, under gradient accumulation;
each setting it cannot honour fails at once, naming the setting."""
import os

import pytest
from support.jobs import in_readme, printed_state, run_script

pytestmark = pytest.mark.multiprocess  # every test starts processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_lightning.py")


def run(script, *args, cwd):
    return run_script([script, *args], cwd)


@pytest.mark.slow  # 8 Lightning processes, each importing Lightning (15 s of CPU apiece): a minute or two
def test_the_same_bits_on_1_process_as_on_2_then_4_across_a_restart(tmp_path):
    """Under accumulate_grad_batches=2: an optimizer step every two batches of the N virtual workers, so the job
    takes both the steps that synchronise (every step of a job that does not accumulate) and those under no_sync.
    The job on one process against the same job trained on 2 processes for its first epoch and, restarted from its
    checkpoint, on 4 for its second: each number of processes trains what one process does, across a restart."""
    job = ["--accumulate", "2"]
    one = printed_state(run(EXAMPLE, "--devices", "1", *job, cwd=tmp_path))
    first = printed_state(run(EXAMPLE, "--devices", "2", "--epochs", "1", "--ckpt-dir", "ck", *job, cwd=tmp_path))
    assert first != one  # an epoch short: what the restart must make up
    assert printed_state(run(EXAMPLE, "--devices", "4", "--resume", "ck/last.ckpt", *job, cwd=tmp_path)) == one
    assert one != printed_state(run(EXAMPLE, "--devices", "1", cwd=tmp_path))  # it accumulates: not the plain run


def test_the_process_group_ends_before_the_interpreter_does(tmp_path):
    """Lightning ends its group at exit for NCCL only, and a gloo group alive at interpreter shutdown can abort a
    run that trained to its end (pytorch/pytorch#190489): the example, run as it is, has no group left by then."""
    last = ("import atexit, runpy, sys, torch.distributed as dist\n"  # registered first, so it runs last
            "atexit.register(lambda: print('group at exit:', 'alive' if dist.is_initialized() else 'ended'))\n"
            f"sys.argv = [{EXAMPLE!r}, '--devices', '1', '--epochs', '1']\n"
            f"runpy.run_path({EXAMPLE!r}, run_name='__main__')\n")
    out = run("-c", last, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "group at exit: ended", out.stdout


def test_the_readme_shows_the_example_as_it_runs():
    assert in_readme(EXAMPLE)


MISUSE = {
    "manual": "EasyScaleStrategy runs automatic optimization only",
    "syncbn": "Trainer(sync_batchnorm=True) is not supported by EasyScaleStrategy",
    "sampler": "the training DataLoader's WeightedRandomSampler cannot be kept",
    "hook": "EasyScaleStrategy does not take DDP communication hooks",
}


def test_each_setting_it_cannot_honour_is_named(tmp_path):
    """One run of tests/support/lightning_misuse.py: a process per setting, forked after one import of Lightning."""
    ran = run(os.path.join(ROOT, "tests", "support", "lightning_misuse.py"), str(tmp_path), *MISUSE, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    for mode, says in MISUSE.items():
        code, stderr = int((tmp_path / f"{mode}.code").read_text()), (tmp_path / f"{mode}.err").read_text()
        assert code != 0 and says in stderr, f"{mode}: exit {code}\n{stderr[-3000:]}"


def test_more_processes_than_virtual_workers_are_refused(tmp_path):
    out = run(EXAMPLE, "--devices", "2", "--virtual-workers", "1", cwd=tmp_path)
    assert out.returncode != 0
    assert "EasyScaleStrategy(virtual_world_size=1) runs on at most 1 process; Trainer(devices=2, num_nodes=1) " \
           "starts 2" in out.stderr, out.stderr[-3000:]

"""D2 across real machines: a D2 job has one set of bits wherever its floor runs, so its hash is recorded once
(torch 2.14.1, on an AVX-512 machine) and checked on every machine the suite runs on (AVX2-only ones
included, and a GPU host's CPU). Emulating an older CPU on this one cannot show this: the emulation is the
very cap D2 applies."""
import pytest
import torch

from easyscale_ext import determinism
from support.jobs import reference, run_job

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(torch.__version__.split("+")[0] != "2.14.1",
                                 reason="the recorded hashes are torch 2.14.1's (re-record them for another torch)")]

# (model, D2 floor) -> SHA-256 of the state after training N = 4 (tests/support/train_job.py)
GOLDEN = {
    ("cnn", "AVX2"): "6ac53eb15085ee7746a11333281aec98d5d39692e3f7204f33aec7c0a5a1325d",
    ("cnn", "AVX"): "7f0c4a974fb47decce693a80e7ab49572e30667c674ec9b6a4909d632354a825",
    ("transformer", "AVX2"): "6015b322dc7b65e8c54c28186018a7189eaa6ba8bc4bcbb73c3bfc61f9607614",
    ("transformer", "AVX"): "4f812b2628a5b10ffe3271d6b0e694d038e8f6f05d2450433dbf9df1a12696aa",
}


def within_reach(isa: str) -> bool:
    cpu = determinism.cpu_isa()
    return cpu is not None and determinism.ISAS.index(isa) <= determinism.ISAS.index(cpu)


@pytest.mark.parametrize("model,isa", sorted(GOLDEN))
def test_a_d2_job_has_the_recorded_bits_on_this_machine(model, isa):
    if not within_reach(isa):
        pytest.skip(f"this CPU is below the {isa} floor")
    env = determinism.environment("D2", isa=isa)
    assert run_job("easyscale", procs=2, n=4, level="D2", model=model, env_per_rank=[env, env]) == GOLDEN[model, isa]


def test_the_floor_is_what_fixes_the_bits():
    # Negative control: another floor gives other bits, and so does no floor (D1 at this CPU's own level, above
    # AVX2), so the check above fails on a machine where the floor did not take effect.
    assert GOLDEN["cnn", "AVX2"] != GOLDEN["cnn", "AVX"]
    if determinism.native_isa() == "AVX2":
        pytest.skip("this CPU runs at the AVX2 floor natively: its D1 bits may be D2's")
    assert reference(level="D1") != GOLDEN["cnn", "AVX2"]

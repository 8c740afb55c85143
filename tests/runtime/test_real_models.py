"""Model code nobody here wrote, at D1: torchvision's resnet18 (BatchNorm, in-place ReLU) with torchvision's random
augmentation in DataLoader workers, and a transformers BERT built from a small config (dropout, attention). Each
ends with the same SHA-256 (parameters, buffers, optimizer state) on 1 and 4 processes and through in-place scale
events from 1 to 2 to 4."""
import pytest

from support.jobs import run_elastic, run_job

pytestmark = pytest.mark.multiprocess  # each case starts real processes


@pytest.mark.slow  # 9 processes importing torchvision or transformers
@pytest.mark.parametrize("model", ["resnet18", "bert"])
def test_the_same_bits_on_1_and_4_processes_and_through_scale_events(model):
    options = dict(model=model, n=4, level="D1", steps=3, epochs=2, batch=4)
    # resnet18's augmentation in 2 DataLoader worker processes on one run, in the main process on the others
    one = run_job("easyscale", procs=1, num_workers=2 if model == "resnet18" else 0, **options)
    assert run_job("easyscale", procs=4, num_workers=0, **options) == one
    assert run_elastic(1, "2:2,4:4", num_workers=0, **options) == one  # grown in place at step 2, again at step 4

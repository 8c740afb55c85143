"""Replaced by `limits.Limits`: `NonPreemptive(policy)` is `Limits(policy, preempt=False)`. This name keeps old
imports working, with a DeprecationWarning; it goes in a later release."""
import warnings

from .limits import Limits


def NonPreemptive(policy):  # noqa: N802 (the old class's name)
    warnings.warn("NonPreemptive(policy) is now Limits(policy, preempt=False) from "
                  "easyscale_ext.sched.policies.limits", DeprecationWarning, stacklevel=2)
    return Limits(policy, preempt=False)

"""Moved to `easyscale_ext.determinism` (torch-free, so launchers and the cluster's scheduler read it without
torch). This name keeps old imports working, with a DeprecationWarning; it goes in a later release."""
import sys
import warnings

from .. import determinism

warnings.warn("easyscale_ext.runtime.determinism moved to easyscale_ext.determinism: import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = determinism

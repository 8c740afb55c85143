"""Where easyscale keeps a user's state: the cluster's address, state and token (`easyscale cluster`), the secrets of
the jobs `easyscale run` started (`easyscale scale` reads them). One home for every command, so none of them looks
elsewhere; no torch, no Ray, so any layer may ask.
"""
import os


def home() -> str:
    """$EASYSCALE_HOME, else ~/.easyscale."""
    return os.environ.get("EASYSCALE_HOME") or os.path.join(os.path.expanduser("~"), ".easyscale")

"""Trace-driven cluster-scheduling simulator: job model from measured traces, cluster, event loop, policies.

No dependency on the training runtime (numpy, SciPy, matplotlib, tqdm only). See docs/SCHEDULER.md.
"""
import os

# The throughput fits are thousands of tiny L-BFGS-B solves; a multi-threaded BLAS makes each ~25x slower on a
# busy machine. Set before SciPy loads its BLAS; a user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

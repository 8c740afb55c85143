"""The trace-driven cluster-scheduling simulator (docs/SCHEDULER.md).

What it owns (everything here serves the simulator and the cluster's scheduler alike):
    models/      jobs and the cluster as measured traces describe them: applications' step times and gradient
                 noise, throughput and goodput models, workloads, the cluster, the job records policies read (which
                 the simulator advances, or the cluster's reports write), and where the traces are found
    policies/    one module per scheduling policy, their shared base, and the registry POLICIES
    rounds       the one scheduling loop both backends run: a round's view, the policy's decision, typed changes
    limits       every decision held to each job's limits (and, without preemption, running jobs kept running)
    ledger       who held how many GPUs when, each job's starts: one account for both backends
    simulator    the simulated backend: arrivals, (re)allocation delays, completions, invariants
    costs        what a real runtime's starts, exits, joins and suspensions cost, for a simulation to charge
    bound        a lower limit on a workload's average JCT under the job model, whatever the policy
    metrics      JCT, makespan, utilisation and finish-time fairness of a run
    plots        Gantt chart, JCT CDF, GPUs over time, a summary per policy
    data/        the measured traces and workloads it ships (data/README.md: what, from where, licenses)

What it may import: numpy, SciPy, tqdm, the standard library, matplotlib (plots only, loaded when plotting),
easyscale_ext.placement and easyscale_ext._search (the policies' compiled searches; both torch-free). Never torch, never
easyscale_ext.runtime, .elastic or .cli: the simulator runs where torch is not installed and loads none of it
(tests/sched/test_no_torch.py checks). Policies depend on models only; the command line (`easyscale simulate`)
lives in easyscale_ext/cli/simulate.py.
"""
import os

# The throughput fits are thousands of tiny L-BFGS-B solves; a multi-threaded BLAS makes each ~25x slower on a
# busy machine. Set before SciPy loads its BLAS; a user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

"""What carrying decisions out costs on a real runtime, beyond the published setups' restarts and in-place pauses:
the cost model the simulated backend (simulator.SimulatedCluster) applies to compare a simulation with a run of
cluster mode. `bench/bench_cluster.py` measures it on this machine, from a run apart from those it compares (its
`--costs` file). On one machine every process that starts (imports torch, builds its job) shares a few cores with
the scheduler and the jobs training, so starts slow one another down; a real scheduler also decides at moments of
its own (a submission, a job's end), not only every round. The default costs nothing and decides every round, as
the published simulators do: every published figure is simulated with it.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeCosts:
    exit_s: float = 0.0  # a job's last step to its processes' exit: it holds its GPUs, and is not done, until then
    exit_weight: float = 0.0  # an exit of n processes takes exit_s * n ** exit_weight (they leave side by side)
    join_s: float = 0.0  # an in-place change that adds processes: they prepare this long, the job training as before
    suspend_s: float = 0.0  # a preempted job leaves its GPUs this long after the decision (its next step boundary,
    # a checkpoint saved, its processes' exit): a job given GPUs it still leaves (a node's free ones go first) waits
    # until they are left, its processes starting only then, and the policy sees the preempted job again only once it
    # has left, as cluster mode's scheduler
    parallel_starts: float = 0.0  # processes starting (a job's first start or a resume, its joiners preparing) that
    # go at full speed at once; with k > that, every start goes at parallel_starts / k (0: no limit)
    start_weight: float = 1.0  # a start of n processes weighs n ** start_weight processes in that count: a job's
    # processes start side by side, partly waiting rather than computing
    training_weight: float = 0.0  # and each process training beside the starts weighs this much (it computes too)
    # When the scheduler decides, besides every round:
    rounds_at_arrivals: bool = False  # a job's arrival starts a round at once (as cluster mode's submit does)
    completion_poll_s: float = 0.0  # a job's end starts a round at the next look, every this many seconds, for ended
    # jobs (cluster mode's scheduler looks each second, then decides at once); 0: jobs end into the next round
    arrival_lag_s: float = 0.0  # with rounds_at_arrivals: that round decides this long after the arrival (the
    # scheduler records the submission first), so the new job is that old to the policy (Pollux's restart factor
    # is 0 at age 0)
    reported_steps: int = 0  # a job runs this many equal steps over its length, reporting each when done (cluster
    # mode's jobs): the policy knows its share done as of its last report and sees a job given GPUs as reallocating
    # until it reported a step on them, as cluster mode's scheduler does (cluster.live), and a job leaves GPUs in place
    # when its step in flight ends; 0: the policy knows its progress at every moment, and that it runs from the end
    # of its modelled start, and changes in place take effect at once

"""Cluster mode: many elastic jobs on a Ray cluster, grown, shrunk and moved in place by a scheduler that runs
the simulator's policy objects on live measurements.

Owns the Ray side: a slot's actor that runs one process of a job (worker), a job's supervisor actor that
hosts its store and starts and releases its processes (supervisor), the job table in SQLite (jobtable),
the scheduler actor and its verbs (scheduler), the scheduling loop's backend that carries decisions out on Ray
(backend), slots taken back for serving (reserve), a run's results as
the simulator reports them (report), and Ray on loopback for one machine and the tests (local). Imports ray,
`easyscale_ext.sched` (policies and models), the elastic layer's store requests and `easyscale_ext.placement`;
the training runtime only inside a job's processes.
"""
SLOT = "easyscale_slot"  # the Ray resource a node offers per slot: a GPU, or a share of a CPU-only node
TYPED = SLOT + "_"  # a node's slots of type T also carry the resource `easyscale_slot_T` (one per slot): its type
TYPE_ENV = "EASYSCALE_SLOT_TYPE"  # a job process's slot type (e.g. to emulate that device's speed)
NAMESPACE = "easyscale"  # the Ray namespace of the scheduler and the supervisors (named, detached actors)
NODE_ENV = "EASYSCALE_NODE"  # a job process's Ray node id (where it runs, e.g. to know its placement)
JOB_ENV = "EASYSCALE_JOB"  # a job process's incarnation: "<job id>:<a token of the supervisor that started it>"

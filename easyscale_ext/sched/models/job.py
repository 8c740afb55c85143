"""Jobs: the record a policy reads of each job (its allocation, service, progress, epoch, measurements), and how
fast each kind of job progresses where the simulator advances it.

A record has one writer per backend: the simulator's model of the job (`advance`), or in cluster mode what the real
job reported (`report`); neither overwrites the other's fields.

An AppJob is one of the profiled applications: it progresses at its measured step time on its placement times
the statistical efficiency of its batch size, until it has run its epochs. A VirtualWorkerJob is an AppJob of
EasyScale's kind: D virtual workers with a fixed batch each, on any number of GPUs up to D, of one GPU type or
(with D2) several. A TraceJob is a job of the Philly trace, known only by its duration on the GPUs it asked
for: it runs on exactly those.
"""
import math
from typing import NamedTuple

from . import goodput
from .efficiency import gain
from .throughput import fit_perf_params
from .virtual_workers import mixed_step, virtual_worker_step


class Joining(NamedTuple):
    groups: dict  # what it changes to
    delay: float  # then its pause
    free_in: float  # seconds until its new GPUs are free (jobs preempted from them still leave them): then they prepare
    prepare_left: float  # seconds its new processes still prepare, at full speed
    wait_left: float  # then seconds until its step in flight ends
    gained: int  # GPUs it holds meanwhile beyond its current ones


class Job:
    def __init__(self, spec):
        self.spec = spec
        self.name = spec.name
        self.arrival = spec.arrival
        self.groups = {}  # GPU type -> GPUs on each node it holds of that type
        self.placement = ()  # GPUs on each node it holds, all types
        self.gpu_type = None  # the GPU type it runs on; None if none or several
        self.delay_left = 0.0  # seconds of the current (re)start still to pass before it progresses
        self.delay_starts = False  # that delay starts processes (a first start, a resume): starts share the machine
        self.free_in = 0.0  # seconds until the GPUs it was given are free (jobs preempted from them still leave them):
        # its delay begins then, and its processes start only then
        self.exit_s = 0.0  # seconds from its last step to its processes' exit: it holds its GPUs until then
        self.exit_weight = 0.0  # with n processes, that takes exit_s * n ** exit_weight
        self.exit_left = None  # seconds of that exit still to pass, once its last step is done
        self.joining = None  # a Joining: an in-place change waiting for its new processes and its step (allocate_after)
        self.report_at = 0.0  # its progress at its first report on its allocation (reported_steps)
        self.stopped_at = None  # its progress while it holds no GPUs (simulated): the same when it gets some again
        self.leaves_at = None  # when it has left the GPUs it was preempted from (simulated: RuntimeCosts.suspend_s)
        self.completion = None
        self.step_s = None  # seconds per step its real job measured on its slots (cluster mode's reports)
        self.attained = 0.0  # GPU-seconds held
        self.attained_on = {}  # GPU type -> GPU-seconds held on it running (not joiners' GPUs while they prepare)
        self.run_s = 0.0  # seconds holding GPUs
        self.starts = 0

    reported_steps = 0  # RuntimeCosts.reported_steps: the simulator sets it

    @property
    def num_gpus(self) -> int:
        return sum(self.placement)

    @property
    def restarts(self) -> int:
        return max(self.starts - 1, 0)

    @property
    def processes_starting(self) -> int:
        """The processes the job is starting now: all of them at its first start or a resume, the joiners while
        they prepare; 0 when none."""
        if self.joining is not None:
            joining = self.joining
            if joining.free_in or not joining.prepare_left:
                return 0
            return max(sum(sum(p) for p in joining.groups.values()) - self.num_gpus, 1)
        return self.num_gpus if self.delay_starts and self.delay_left > 0 and not self.free_in else 0

    @property
    def processes_training(self) -> int:
        """The processes it trains with now: none while it starts, pauses or exits, or has no GPUs."""
        if self.completion is not None or self.exit_left is not None or (
                (self.delay_left > 0 or self.free_in > 0) and self.joining is None):
            return 0
        return self.num_gpus

    @property
    def reallocating(self) -> bool:
        """Its processes are (re)starting or its joiners preparing, or (with reported_steps) it has not yet reported
        a step on its allocation: a policy that leaves such a job be waits until it runs on what it was given (in
        cluster mode, until the real job reports that it does: cluster.live)."""
        return self.delay_left > 0 or self.free_in > 0 or self.joining is not None or self.progress < self.report_at

    @property
    def done(self) -> float:
        """Its share of its length done, as of its last report: with reported_steps, a whole number of steps."""
        share = self.progress / self.length
        return math.floor(share * self.reported_steps + 1e-9) / self.reported_steps if self.reported_steps else share

    def starts_change_in(self, start_rate) -> float:
        """Seconds until the processes it starts change: its wait for its GPUs ends (its start begins), or its start
        ends where starts go at `start_rate` < 1 (they share the machine); inf if neither is under way."""
        joining = self.joining
        free_in, start = (joining.free_in, joining.prepare_left) if joining is not None else (
            self.free_in, self.delay_left if self.delay_starts else 0.0)
        return free_in if free_in else start / start_rate if start and start_rate < 1.0 else math.inf

    def allocate(self, groups, delay, starts: bool = False, free_in: float = 0.0):
        """Run on `groups` ({GPU type: GPUs per node}, {} = stop) from now on; nothing progresses for `free_in`
        seconds (its GPUs are still being left), then for `delay` seconds (with `starts`: its processes start
        meanwhile)."""
        self.joining = None
        self.delay_starts = starts
        self.groups = {t: tuple(p) for t, p in groups.items() if p}
        self.placement = sum(self.groups.values(), ())
        self.gpu_type = next(iter(self.groups)) if len(self.groups) == 1 else None
        if len(self.groups) > 1 and not self.spec.heterogeneous:
            raise ValueError(f"{self.name} may not mix GPU types ({sorted(self.groups)}): it does not allow D2")
        self.delay_left = float(delay) if self.placement else 0.0
        self.free_in = float(free_in) if self.placement else 0.0
        self.step_s = None  # measured on other slots
        if self.placement:
            self.starts += 1
            self._configure()
            if self.reported_steps:  # its first report on these GPUs comes a step from now
                self.report_at = self.progress + self.length / self.reported_steps

    def allocate_after(self, groups, delay, prepare_s, gained=0, free_in=0.0):
        """Change in place to `groups` once its `gained` new GPUs' processes have prepared (`prepare_s` seconds from
        when those GPUs are free, in `free_in` seconds: they start while the job trains on its current GPUs, holding
        the new ones, and join at a step boundary) or, with none to prepare, once its step in flight has ended (with
        reported_steps); then pause `delay` seconds."""
        boundary = 0.0 if prepare_s or free_in else self._to_step_boundary()
        self.joining = Joining(groups, delay, free_in, prepare_s, boundary, gained)

    def advance(self, now, seconds, start_rate=1.0):
        """Let `seconds` pass from time `now`; a start in progress goes at `start_rate` of its full speed (the
        starts at once share the machine: RuntimeCosts.parallel_starts)."""
        while self.joining is not None:
            groups, delay, free_in, left, wait, gained = self.joining
            first = min(free_in if free_in else left / start_rate if left else wait, seconds)
            self._advance(now, first)
            self.attained += first * gained  # held, not yet used
            if self.completion is not None:
                self.joining = None
                return
            if free_in:
                free_in = _left(free_in, first)
            elif left:
                left = _left(left, first * start_rate)
            else:
                wait = _left(wait, first)
            now, seconds = now + first, seconds - first
            self.joining = self.joining._replace(free_in=free_in, prepare_left=left, wait_left=wait)
            if free_in or left or wait:
                if seconds <= 0:
                    return
                continue
            self.allocate(groups, delay)
        self._advance(now, seconds, start_rate)

    def _to_step_boundary(self) -> float:
        """Seconds until its step in flight ends, at its speed now (0 without reported_steps): an in-place change
        waits for it."""
        if not self.reported_steps or not self.placement:
            return 0.0
        step = self.length / self.reported_steps
        return self.delay_left + ((math.floor(self.progress / step + 1e-9) + 1) * step - self.progress) / self._rate()

    def _advance(self, now, seconds, start_rate=1.0):
        if self.completion is not None or not self.placement:
            return
        used = min(self.free_in, seconds)  # its GPUs are still being left: its start has not begun
        self.free_in = _left(self.free_in, used)
        rate = start_rate if self.delay_starts else 1.0
        start = min(self.delay_left / rate, seconds - used)
        self.delay_left = _left(self.delay_left, start * rate)
        used += start
        if self.exit_left is None and seconds > used:
            used += self._work(now + used, seconds - used)
            if self.completion is not None and self.exit_s:  # its last step is done; it ends when it has exited
                self.exit_left, self.completion = self.exit_s * self.num_gpus ** self.exit_weight, None
        if self.exit_left is not None and seconds > used:
            out = min(self.exit_left, seconds - used)
            self.exit_left -= out
            used += out
            if self.exit_left <= 0:
                self.completion = now + used
        self._hold(used)

    def _hold(self, seconds):
        """Count `seconds` of service on its GPUs."""
        self.attained += seconds * self.num_gpus
        for gpu_type, per_node in self.groups.items():
            self.attained_on[gpu_type] = self.attained_on.get(gpu_type, 0.0) + seconds * sum(per_node)
        self.run_s += seconds

    def report(self, seconds, done=None, step_s=None, runs=False):
        """What its real job did over the last `seconds`, on the slots it holds: `done`, the share of its steps run
        (None: unknown); `step_s`, its seconds per step measured there; `runs`, whether it trains on every one of
        them (its start or its joiners' preparation is over). Only the real job says when it ends."""
        if not self.placement:
            return
        if runs:
            self.delay_left = 0.0
        self._hold(seconds)
        if step_s is not None:
            self.step_s = step_s

    def _configure(self):
        """Choose how to run on the new placement."""

    def _work(self, now, seconds) -> float:
        """Progress for up to `seconds` from `now`; set `completion` if done. Returns the seconds used."""
        raise NotImplementedError

    def _rate(self) -> float:
        """Progress per second on its GPUs now."""
        raise NotImplementedError


def _left(seconds, spent):
    """What is left of `seconds` once `spent` has passed; none below float noise (a start that is over)."""
    return seconds - spent if seconds - spent > 1e-9 else 0.0


class TraceJob(Job):
    """A job known by its duration on the GPUs it asked for, on which it runs: rigid, unless its spec declares limits
    (a real job of unknown length, which the cluster may run on any number of slots within them)."""

    def __init__(self, spec):
        super().__init__(spec)
        self.progress = 0.0  # seconds run

    @property
    def length(self) -> float:
        return self.spec.duration

    def _configure(self):
        spec = self.spec
        if spec.max_gpus is None and self.num_gpus != spec.num_gpus:
            raise ValueError(f"{self.name} is a trace job that runs on exactly {spec.num_gpus} GPUs, "
                             f"not {self.num_gpus}")
        if spec.max_gpus is not None and not spec.min_gpus <= self.num_gpus <= spec.max_gpus:
            raise ValueError(f"{self.name} runs on {spec.min_gpus} to {spec.max_gpus} GPUs, not {self.num_gpus}")

    def _rate(self) -> float:
        return 1.0

    def _work(self, now, seconds):
        used = min(seconds, self.spec.duration - self.progress)
        self.progress += used
        if self.progress >= self.spec.duration:
            self.completion = now + used
        return used


class AppJob(Job):
    """A profiled application. With `batch_size` None it adapts its batch as a Pollux agent does: it fits the
    throughput model to the step times it has observed and picks the batch of best modelled goodput."""

    def __init__(self, spec, app, batch_size):
        super().__init__(spec)
        self.app = app
        self.batch_size = batch_size
        self.progress = 0.0  # steps at the initial batch size
        self.epoch = 0
        self.epochs = min(spec.epochs or app.epochs, app.epochs)  # the validation profiles end at app.epochs
        self.local_bsz = 0
        self.accum_steps = 0
        self.observed = {}  # (nodes, replicas, micro-batch) -> (step time, sync time): what the agent measured,
        # a configuration's first measurement whatever the GPU type (what policies read)
        self.observed_on = {}  # GPU type -> the same, measured on that type (with per_type_fit)
        self.perf = None  # throughput model fitted to `observed`, or with per_type_fit to the current type's
        self.fits = {}  # frozenset of measurements -> PerfParams; the jobs of one run share one (`_fit`)
        self.grad = None  # last measured (grad_sqr, grad_var)
        self._mixed = 0.0  # seconds per step on mixed GPU types (mixed_step)

    # Layer freezing (models/freezing.py): None, or a timeline whose at(share of training done) gives the factors
    # on compute time, sync time and progress per iteration; the simulator sets it where the job opts in.
    freezing = None
    slowdown = 1.0  # progresses this many times slower than its profiles say (a simulator's calibration)
    per_type_fit = False  # tunes its batch with a model per GPU type, fitted to what it measured there (the jobs
    # of Sia's artifact; one that has not measured on its type yet runs the initial batch); else one model fitted
    # to whatever it measured (Pollux's agent, unaware of types)
    per_type_batch = False  # bound its per-GPU batch by each GPU type's own profile, not the T4's (Sia's artifact)
    micro_batch = None  # fixed by the job (virtual workers'), else chosen per configuration

    @property
    def length(self) -> float:
        return self.app.noise.progress_at(self.epochs)

    def max_local_bsz_on(self, gpu_type) -> int:
        """The largest per-GPU batch the job may run on `gpu_type` (None: several types, the T4's bound)."""
        if self.per_type_batch and gpu_type is not None:
            return self.app.max_local_bsz_on(gpu_type)
        return self.app.max_local_bsz

    def freezing_factors(self) -> tuple:
        return self.freezing.at(self.progress / self.app.noise.progress_at(self.epochs))

    @property
    def global_batch(self) -> int:
        return self.num_gpus * self.local_bsz * (self.accum_steps + 1)

    @property
    def max_profiled_replicas(self) -> int:
        return max((key[1] for key in self.observed), default=0)

    @property
    def configuration(self) -> tuple:
        """(nodes, replicas, micro-batch): what a measurement of its step time is of."""
        return len(self.placement), self.num_gpus, self.local_bsz

    def goodput_model(self, perf=None, gpu_type=None):
        """Its goodput model under its own fit (or `perf`, fitted on `gpu_type`), at its batch if that is fixed."""
        if perf is None and self.perf is None:
            return None
        gpu_type = gpu_type if perf is not None else self.gpu_type
        return goodput.GoodputModel(perf or self.perf, *self.grad, self.app, self.max_local_bsz_on(gpu_type),
                                    self.batch_size, self.micro_batch)

    def _configure(self):
        app, reps = self.app, self.num_gpus
        if self.per_type_fit and self.gpu_type is not None:  # on mixed types: as on the last one
            self.perf = self._fit(self.observed_on[self.gpu_type]) if self.gpu_type in self.observed_on else None
        if self.batch_size is None and self.perf is not None:
            _, local, accum = self.goodput_model().best(len(self.placement), reps)
            local, accum = int(local[0]), int(accum[0])
        else:  # a fixed batch; an adaptive job starts at the smallest batch it can run
            batch = self.batch_size or max(app.init_batch_size, app.min_local_bsz * reps)
            local, accum = goodput.fixed_batch_config(batch, reps, app, self.max_local_bsz_on(self.gpu_type))
        self.local_bsz, self.accum_steps = goodput.cap_local_bsz(local, accum, reps, app), accum
        if len(self.groups) > 1:  # GPU types mixed: the batch runs as virtual workers (mixed_step)
            self._mixed = mixed_step(app, reps * (accum + 1), self.local_bsz, tuple(self.groups.items()))

    @property
    def mixed(self) -> bool:
        return len(self.groups) > 1

    def _observe(self, step, sync, grad):
        self.grad = grad
        key, own = self.configuration, self._own()
        new = key not in own
        self.observed.setdefault(key, (step, sync))
        own.setdefault(key, (step, sync))
        if new:
            self.perf = self._fit(own)

    def _own(self) -> dict:
        """The measurements its own model is fitted to: the current type's with per_type_fit."""
        return self.observed_on.setdefault(self.gpu_type, {}) if self.per_type_fit else self.observed

    def _fit(self, observed):
        """The throughput model fitted to `observed`: jobs of one application tend to measure the same, so the jobs
        of one simulation (or one scheduler) share their fits, keyed by the measurements themselves (the same
        configurations may have been measured on other types). A fit's last bits depend on the order of its
        measurements, so the cache lives no longer than the run: another run's order never decides this one's."""
        key = frozenset(observed.items())
        if key not in self.fits:
            self.fits[key] = fit_perf_params(*zip(*((*k, *v) for k, v in observed.items())))
        return self.fits[key]

    def iteration_time(self) -> float:
        if self.mixed:  # no per-type measurement to record; the step of the balanced split (mixed_step)
            self.grad = self.app.noise.grad_stats(self.global_batch, self.epoch)
            compute = 1.0 if self.freezing is None else self.freezing_factors()[0]  # whole step, approximately
            return self._mixed * compute
        step, sync = self.app.profile(self.gpu_type).step_time(self.placement, self.local_bsz)
        if self.batch_size is None:
            self._observe(step, sync, self.app.noise.grad_stats(self.global_batch, self.epoch))
        if self.freezing is not None:  # frozen layers skip their backward pass and their gradients' exchange
            compute, exchange, _ = self.freezing_factors()
            step, sync = (step - sync) * compute + sync * exchange, sync * exchange
        return step + self.accum_steps * (step - sync)

    def report(self, seconds, done=None, step_s=None, runs=False):
        super().report(seconds, done, step_s, runs)
        if done is not None:
            noise = self.app.noise
            self.progress = min(done, 1.0) * noise.progress_at(self.epochs)
            self.epoch = min(sum(noise.progress_at(e + 1) <= self.progress for e in range(self.epochs)),
                             self.epochs - 1)  # its last epoch runs until the real job ends
        if runs and self.placement:
            self.iteration_time()  # its agent's measurement there, from the profile the real job's step time follows

    def _rate(self) -> float:
        batch = self.global_batch
        grad = self.app.noise.grad_stats(batch, self.epoch)
        rate = float(gain(*grad, batch / self.app.init_batch_size)) / self.iteration_time() / self.slowdown
        if self.freezing is not None:
            rate *= self.freezing_factors()[2]  # the frozen penalty: a frozen iteration makes less progress
        return rate

    def _work(self, now, seconds):
        app, used = self.app, 0.0
        while True:
            rate = self._rate()
            need = app.noise.progress_at(self.epoch + 1) - self.progress
            if rate * (seconds - used) < need:
                self.progress += rate * (seconds - used)
                used = seconds
            else:
                used += need / rate
                self.progress = app.noise.progress_at(self.epoch + 1)
                self.epoch += 1
                if self.epoch == self.epochs:
                    self.completion = now + used
                    return used
            if self.batch_size is None:
                self._configure()  # the agent re-tunes its batch with what it has learnt
            if used >= seconds:
                return used


class VirtualWorkerJob(AppJob):
    """EasyScale's job: D virtual workers with batch b each, on any number of GPUs up to D (virtual_worker_step)."""

    def __init__(self, spec, app):
        super().__init__(spec, app, spec.batch_size)
        self._iteration = 0.0

    @property
    def global_batch(self) -> int:
        return self.spec.batch_size

    def _configure(self):
        d = self.spec.virtual_workers
        if self.num_gpus > d:
            raise ValueError(f"{self.name} has {d} virtual workers and cannot use {self.num_gpus} GPUs")
        self.local_bsz, self.accum_steps = self.micro_batch, 0
        self._iteration = self.step_on(tuple(self.groups.items()))[0]

    @property
    def micro_batch(self) -> int:
        return self.spec.batch_size // self.spec.virtual_workers

    def step_on(self, groups) -> tuple:
        """(seconds per step, EasyScale's waste) on `groups` ((GPU type, GPUs per node) pairs): what a policy
        weighs a proposal by (virtual_worker_step)."""
        return virtual_worker_step(self.app, self.spec.virtual_workers, self.micro_batch, groups, self.spec.runs_d2)

    def iteration_time(self) -> float:
        if not self.mixed:  # its agent measures as a job's on one type does (Pollux's and Sia's models fit it)
            grad = self.app.noise.grad_stats(self.global_batch, self.epoch)
            if self.configuration in self._own():
                self.grad = grad
            else:
                self._observe(*self.app.profile(self.gpu_type).step_time(self.placement, self.local_bsz), grad)
        return self._iteration


def make_job(spec, apps, batch_size):
    if spec.app is None:
        return TraceJob(spec)
    if spec.virtual_workers is not None and batch_size is not None:  # else a policy that tunes the batch
        return VirtualWorkerJob(spec, apps[spec.app])
    return AppJob(spec, apps[spec.app], batch_size)

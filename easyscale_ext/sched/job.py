"""Jobs as the simulator advances them: allocation bookkeeping, and how fast each kind of job progresses.

An AppJob is one of the profiled applications: it progresses at its measured step time on its placement times
the statistical efficiency of its batch size, until it has run its application's epochs. A TraceJob is a job
of the Philly trace, known only by its duration on the GPUs it asked for: it runs on exactly those.
"""
import math

from . import goodput
from .efficiency import gain
from .throughput import fit_perf_params


class Job:
    def __init__(self, spec):
        self.spec = spec
        self.name = spec.name
        self.arrival = spec.arrival
        self.placement = ()  # GPUs on each node it holds
        self.gpu_type = None
        self.delay_left = 0.0  # seconds of the current (re)start still to pass before it progresses
        self.completion = None
        self.attained = 0.0  # GPU-seconds held
        self.run_s = 0.0  # seconds holding GPUs
        self.starts = 0

    @property
    def num_gpus(self) -> int:
        return sum(self.placement)

    @property
    def restarts(self) -> int:
        return max(self.starts - 1, 0)

    def allocate(self, placement, gpu_type, delay):
        """Run on `placement` (GPUs per node, () = stop) from now on; nothing progresses for `delay` seconds."""
        self.placement, self.gpu_type = tuple(placement), gpu_type
        self.delay_left = float(delay) if placement else 0.0
        if placement:
            self.starts += 1
            self._configure()

    def advance(self, now, seconds):
        """Let `seconds` pass from time `now`."""
        if self.completion is not None or not self.placement:
            return
        wait = min(self.delay_left, seconds)
        self.delay_left -= wait
        used = wait + (self._work(now + wait, seconds - wait) if seconds > wait else 0.0)
        self.attained += used * self.num_gpus
        self.run_s += used

    def _configure(self):
        """Choose how to run on the new placement."""

    def _work(self, now, seconds) -> float:
        """Progress for up to `seconds` from `now`; set `completion` if done. Returns the seconds used."""
        raise NotImplementedError


class TraceJob(Job):
    """A rigid job of known duration."""

    def __init__(self, spec):
        super().__init__(spec)
        self.progress = 0.0  # seconds run

    def _configure(self):
        if self.num_gpus != self.spec.num_gpus:
            raise ValueError(f"{self.name} is a trace job that runs on exactly {self.spec.num_gpus} GPUs, "
                             f"not {self.num_gpus}")

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
        self.local_bsz = 0
        self.accum_steps = 0
        self.observed = {}  # (nodes, replicas, micro-batch) -> (step time, sync time): what the agent measured
        self.perf = None  # throughput model fitted to `observed`
        self.grad = None  # last measured (grad_sqr, grad_var)

    @property
    def global_batch(self) -> int:
        return self.num_gpus * self.local_bsz * (self.accum_steps + 1)

    @property
    def max_profiled_replicas(self) -> int:
        return max((key[1] for key in self.observed), default=0)

    def goodput_model(self):
        return None if self.perf is None else goodput.GoodputModel(self.perf, *self.grad, self.app)

    def _configure(self):
        app, reps = self.app, self.num_gpus
        if self.batch_size is None and self.perf is not None:
            _, local, accum = self.goodput_model().best(len(self.placement), reps)
            local, accum = int(local[0]), int(accum[0])
        else:  # a fixed batch; an adaptive job starts at the smallest batch it can run
            batch = self.batch_size or max(app.init_batch_size, app.min_local_bsz * reps)
            local, accum = goodput.fixed_batch_config(batch, reps, app)
        self.local_bsz, self.accum_steps = goodput.cap_local_bsz(local, accum, reps, app), accum

    def _observe(self, step, sync, grad):
        self.grad = grad
        key = (len(self.placement), self.num_gpus, self.local_bsz)
        if key in self.observed:
            return
        self.observed[key] = (step, sync)
        # Jobs of one application tend to see the same configurations: the fit depends only on the set.
        fits = self.app.fits.setdefault(self.gpu_type, {})
        keys = frozenset(self.observed)
        if keys not in fits:
            cols = list(zip(*((*k, *v) for k, v in self.observed.items())))
            fits[keys] = fit_perf_params(*cols)
        self.perf = fits[keys]

    def _work(self, now, seconds):
        app, used = self.app, 0.0
        profile = app.profile(self.gpu_type)
        while True:
            step, sync = profile.step_time(self.placement, self.local_bsz)
            batch = self.global_batch
            grad = app.noise.grad_stats(batch, self.epoch)
            if self.batch_size is None:
                self._observe(step, sync, grad)
            rate = float(gain(*grad, batch / app.init_batch_size)) / (step + self.accum_steps * (step - sync))
            need = app.noise.progress_at(self.epoch + 1) - self.progress
            if rate * (seconds - used) < need:
                self.progress += rate * (seconds - used)
                used = seconds
            else:
                used += need / rate
                self.progress = app.noise.progress_at(self.epoch + 1)
                self.epoch += 1
                if self.epoch == app.epochs:
                    self.completion = now + used
                    return used
            if self.batch_size is None:
                self._configure()  # the agent re-tunes its batch with what it has learnt
            if used >= seconds:
                return used


def make_job(spec, apps, batch_size):
    return TraceJob(spec) if spec.app is None else AppJob(spec, apps[spec.app], batch_size)


def isolated_runtime(spec, apps, gpus_per_node, gpu_type) -> float:
    """Seconds the job needs alone on the GPUs it asked for, with its own batch size, packed on full nodes
    and never restarted: the reference for finish-time fairness."""
    job = make_job(spec, apps, spec.batch_size)
    full, rest = divmod(spec.num_gpus, gpus_per_node)
    job.allocate((gpus_per_node,) * full + ((rest,) if rest else ()), gpu_type, 0.0)
    horizon = spec.duration if spec.app is None else 1e9
    job.advance(0.0, horizon)
    return math.inf if job.completion is None else job.completion

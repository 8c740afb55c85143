"""Figures of one or more runs on one workload (matplotlib, no display needed).

Every figure's title names the workload and the cluster (`where`), and a policy has the same colour in all of them.
"""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402

from .policies import RUNNABLE  # noqa: E402

# One colour per registered policy, fixed: tab20's ten dark shades, then its ten light ones, in registry order (a
# new policy appended to the registry takes the next one and moves no other).
COLOURS = dict(zip(RUNNABLE, (plt.cm.tab20(i) for i in [*range(0, 20, 2), *range(1, 20, 2)])))


def _save(fig, path):
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def jct_cdf(results, where, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        jct = np.sort([j["jct"] for j in r.jobs]) / 3600
        ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=r.policy, color=COLOURS[r.policy])
    ax.set(xscale="log", xlabel="JCT (hours)", ylabel="fraction of jobs", title=f"JCT CDF: {where}")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)


def gpus_over_time(results, total_gpus, where, path):
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in results:
        ax.step(np.asarray(r.timeline["time"]) / 3600, r.timeline["gpus"], where="post", label=r.policy, lw=0.8,
                color=COLOURS[r.policy])
    ax.axhline(total_gpus, color="k", ls=":", lw=0.8)
    ax.set(xlabel="time (hours)", ylabel="GPUs allocated", title=f"Allocated GPUs: {where}")
    ax.legend()
    _save(fig, path)


def summary(names, summaries, where, path):
    """Average and p99 JCT and makespan, one bar per policy."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 0.8 + 0.3 * len(names)), sharey=True)
    for ax, (key, label) in zip(axes, [("avg_jct", "average JCT"), ("p99_jct", "p99 JCT"), ("makespan", "makespan")]):
        ax.barh(names, [s[key] / 3600 for s in summaries], color=[COLOURS[n] for n in names])
        ax.set(xlabel=f"{label} (hours)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].invert_yaxis()
    fig.suptitle(where)
    _save(fig, path)


def gantt(result, where, path):
    """One row per job (arrival order): a thin line while it waits, a bar coloured by GPU count while it runs."""
    row = {j["name"]: i for i, j in enumerate(result.jobs)}
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.03 * len(row))))
    ax.hlines([row[j["name"]] for j in result.jobs], [j["arrival"] / 3600 for j in result.jobs],
              [j["completion"] / 3600 for j in result.jobs], color="0.8", lw=0.5)
    if result.segments:
        name, start, end, gpus = zip(*result.segments)
        lines = ax.hlines([row[n] for n in name], np.array(start) / 3600, np.array(end) / 3600, lw=2)
        lines.set(array=np.asarray(gpus), cmap="viridis", norm=LogNorm(1, max(2, max(gpus))))
        bar = fig.colorbar(lines, ax=ax, pad=0.01, label="GPUs held")
        ticks = 2 ** np.arange(int(np.log2(max(2, max(gpus)))) + 1)
        bar.set_ticks(ticks, labels=[str(t) for t in ticks])
        bar.minorticks_off()
    ax.set(xlabel="time (hours)", ylabel="job (arrival order)",
           title=f"{result.policy}, {where}: jobs over time (grey: waiting)")
    ax.invert_yaxis()
    _save(fig, path)

"""Figures of one or more runs on one workload (matplotlib, no display needed)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def jct_cdf(results, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        jct = np.sort([j["jct"] for j in r.jobs]) / 3600
        ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=r.policy)
    ax.set(xscale="log", xlabel="JCT (hours)", ylabel="fraction of jobs", title="JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def gpus_over_time(results, total_gpus, path):
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in results:
        ax.step(np.asarray(r.timeline["time"]) / 3600, r.timeline["gpus"], where="post", label=r.policy, lw=0.8)
    ax.axhline(total_gpus, color="k", ls=":", lw=0.8)
    ax.set(xlabel="time (hours)", ylabel="GPUs allocated", title="Allocated GPUs")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def gantt(result, path):
    """One row per job (arrival order): a thin line while it waits, a bar shaded by GPU count while it runs."""
    row = {j["name"]: i for i, j in enumerate(result.jobs)}
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.03 * len(row))))
    ax.hlines([row[j["name"]] for j in result.jobs], [j["arrival"] / 3600 for j in result.jobs],
              [j["completion"] / 3600 for j in result.jobs], color="0.8", lw=0.5)
    if result.segments:
        name, start, end, gpus = zip(*result.segments)
        y = [row[n] for n in name]
        ax.hlines(y, np.array(start) / 3600, np.array(end) / 3600, lw=2,
                  colors=plt.cm.viridis(np.log2(gpus) / max(1.0, np.log2(max(gpus)))))
    ax.set(xlabel="time (hours)", ylabel="job (arrival order)",
           title=f"{result.policy}: jobs over time (grey: waiting; colour: GPUs held, dark 1 .. yellow most)")
    ax.invert_yaxis()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)

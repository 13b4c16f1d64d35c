"""One PNG per workload: a panel per metric, variants along x, targets side by side
as bars (median, whiskers min-max). Targets without a number get an "N/A" mark at
their slot so the gap is visibly deliberate."""

import os

from . import report
from . import workloads as W

COLORS = {"oleo": "#d62728", "btrfs": "#1f77b4", "xfs": "#2ca02c", "ext4": "#9467bd",
          "fuse2fs": "#8c564b", "zfs-fuse": "#e377c2", "btrfs-fuse": "#ff7f0e", "raw": "#7f7f7f"}


def write(results_dir, recs, meta):
    """Returns the list of PNGs written, or a reason string if plotting is impossible."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (run bench/run --setup); no plots"
    groups = report.summarize(recs)
    order = meta.get("targets") or []
    out_dir = os.path.join(results_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for wcls in W.ALL:
        keys = [k for k in groups if k[0] == wcls.name]
        if not keys:
            continue
        variants = []
        for k in keys:
            if k[1] not in variants:
                variants.append(k[1])
        targets = report.ordered({k[2] for k in keys}, order)
        fig, axes = plt.subplots(1, len(wcls.metrics), squeeze=False,
                                 figsize=(max(6, 1.2 + 0.45 * len(targets) * len(variants)) * len(wcls.metrics), 4.2))
        width = 0.8 / max(1, len(targets))
        for ax, metric in zip(axes[0], wcls.metrics):
            for ti, t in enumerate(targets):
                for vi, v in enumerate(variants):
                    x = vi + (ti - (len(targets) - 1) / 2) * width
                    g = groups.get((wcls.name, v, t))
                    s = report.stats(r["metrics"].get(metric.key) for r in g["ok"]) if g else None
                    if s is None:
                        ax.text(x, 0, "N/A", rotation=90, ha="center", va="bottom", fontsize=7,
                                color=COLORS.get(t, "black"))
                        continue
                    med, lo, hi, _ = s
                    ax.bar(x, med, width, color=COLORS.get(t), label=t if vi == 0 else None)
                    if hi > lo:
                        ax.errorbar(x, med, yerr=[[med - lo], [hi - med]], fmt="none",
                                    ecolor="black", elinewidth=0.8, capsize=2)
            ax.set_xticks(range(len(variants)))
            ax.set_xticklabels([v or "" for v in variants])
            ax.set_ylabel(metric.label + ("" if metric.higher else " (lower is better)"))
            ax.grid(axis="y", alpha=0.3)
            ax.set_ylim(bottom=0)
        # Every target in the legend, those without any number marked N/A.
        from matplotlib.patches import Patch
        measured = {k[2] for k in keys if groups[k]["ok"]}
        handles = [Patch(color=COLORS.get(t, "black"), label=t if t in measured else f"{t} (N/A)")
                   for t in targets]
        fig.legend(handles=handles, loc="center right", fontsize=8)
        seed = f" (seed {wcls.seed})" if wcls.seed else ""
        fig.suptitle(f"{wcls.name}{seed}, scale {meta.get('scale', '?')}, "
                     f"median of {meta.get('reps', '?')}, whiskers min–max")
        fig.tight_layout(rect=(0, 0, 0.9, 0.95))
        path = os.path.join(out_dir, f"{wcls.name}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written

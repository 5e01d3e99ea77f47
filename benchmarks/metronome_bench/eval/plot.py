"""The perplexity-vs-position plot: one panel per W, every policy, the trained length marked."""

from __future__ import annotations

from pathlib import Path

from .quality import QualityReport

__all__ = ["plot_quality"]


def plot_quality(report: QualityReport, path: Path) -> Path:
    """Write a small PNG to ``path`` and return it."""
    import matplotlib  # a dependency of metronome-bench, imported late: a run's start stays quick

    matplotlib.use("Agg")  # no display here, and none wanted
    import matplotlib.pyplot as plt

    cfg = report.config
    mids = [(a + b) / 2 for a, b in report.bounds]
    fig, axes = plt.subplots(1, len(cfg.windows), figsize=(4.2 * len(cfg.windows), 3.4), squeeze=False, sharey=True)
    for ax, w in zip(axes[0], cfg.windows, strict=True):
        ax.plot(mids, report.slice_ppl(report.full), color="0.35", label="full context", lw=1.5)
        ax.plot(mids, report.slice_ppl(report.windowed[(w, 0)]), color="tab:red", label="window, no sinks", lw=1.5)
        ax.plot(
            mids,
            report.slice_ppl(report.windowed[(w, cfg.sinks)]),
            color="tab:blue",
            label=f"window + {cfg.sinks} sinks",
            lw=1.5,
        )
        ax.plot(
            mids,
            report.paired_by_slice(report.oracle[w], w),
            color="tab:green",
            ls="--",
            marker="o",
            ms=3,
            label="recompute (sampled)",
        )
        ax.plot(
            mids,
            report.paired_by_slice(report.windowed[(w, cfg.sinks)], w),
            color="tab:blue",
            ls=":",
            marker="x",
            ms=3,
            label="sinks on oracle positions",
        )
        if report.bounds[-1][1] > report.trained_context:
            ax.axvline(report.trained_context, color="0.6", ls="--", lw=1)
        ax.set_yscale("log")
        ax.set_title(f"W = {w}")
        ax.set_xlabel("position in the stream (tokens)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("perplexity per slice")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path

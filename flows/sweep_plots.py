"""A sweep report's two plots: learning curves per variant (mean over seeds, ± sd band, each seed's line) and
a forest plot of the contrasts (mean, seed-level t interval, seed × question bootstrap)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator


def seeds(n: int) -> str:
    return f"{n} seed{'' if n == 1 else 's'}"


def plot_curves(df: pd.DataFrame, out: Path) -> None:
    """Per series a panel: each variant's mean over seeds with a ± sd band, and each seed's line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(dict.fromkeys(df["series"])) or ["held-out"]
    fig, axes = plt.subplots(1, len(series), figsize=(5.5 * len(series), 4), squeeze=False)
    for ax, name in zip(axes[0], series):
        sel = df[df["series"] == name]
        for k, (v, g) in enumerate(sel.groupby("variant", sort=False)):
            colour = f"C{k}"
            for _, line in g.groupby("seed"):
                ax.plot(line["iteration"], line["value"], color=colour, alpha=0.3, lw=0.8)
            stat = g.groupby("iteration")["value"].agg(["mean", "std"]).fillna({"std": 0.0})
            ax.plot(stat.index, stat["mean"], "o-", color=colour, label=f"{v} ({seeds(g['seed'].nunique())})")
            ax.fill_between(
                stat.index, stat["mean"] - stat["std"], stat["mean"] + stat["std"], color=colour, alpha=0.15
            )
        ax.set(xlabel="iteration", ylabel=name, title=name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def plot_forest(summary: pd.DataFrame, out: Path) -> None:
    """Each contrast and split: the mean difference, its seed-level t interval (line) and bootstrap (ticks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary.reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.4))
    y = np.arange(len(rows))[::-1]
    for yi, r in zip(y, rows.itertuples()):
        colour = "C2" if str(r.verdict).startswith("shown") else "C0"
        if not np.isnan(r.t_low):
            ax.plot([r.t_low, r.t_high], [yi, yi], color=colour, lw=2)
        if not np.isnan(r.boot_low):
            ax.plot([r.boot_low, r.boot_high], [yi, yi], "|", color="k", ms=10)
        ax.plot([r.mean], [yi], "o", color=colour)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(y, [f"{r.contrast} ({r.split}, {seeds(r.seeds)})" for r in rows.itertuples()], fontsize=8)
    ax.set(xlabel="difference A − B", title="line: seed-level t 95%; ticks: seed × question bootstrap 95%")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)

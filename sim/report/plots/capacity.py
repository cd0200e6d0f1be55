"""Time to train and cost against the number of GPUs: where adding GPUs stops paying.

A capacity sweep (``dapple-plan sweep`` over ``cluster.nodes``) has per point the run's
expected days and its cost (``planner.sweeps.columns.RUN_COLUMNS``). Doubling the GPUs at
best halves the days at the same cost; past some size the days fall slower than the GPUs grow
(the pipeline bubble, communication, more failures), and the cost rises. The figure draws both
on a log GPU axis and marks the size of **minimum cost × time** (days × cost, or × GPU-hours
without a price): a single point that weighs a day saved against money spent, with no
threshold to choose. Beyond it each doubling costs more than it saves in the product.
"""

from __future__ import annotations

from typing import Any

from sim.report.plots.style import pyplot

__all__ = ["minimum_cost_time", "time_and_cost_vs_gpus_figure"]


def minimum_cost_time(table, *, gpus: str = "cluster_devices", days: str = "expected_days",
                      cost: str = "cost") -> tuple[float, str] | None:
    """(GPUs, the cost column used) of the point with the least days × cost; ``gpu_hours`` stands in
    for a cost column that is empty. None when no point has a run."""
    used = cost if cost in table.columns and table[cost].notna().any() else "expected_gpu_hours"
    rows = table[table[days].notna() & table[used].notna()]
    if rows.empty:
        return None
    product = rows[days].astype(float) * rows[used].astype(float)
    return float(rows.loc[product.idxmin(), gpus]), used


def time_and_cost_vs_gpus_figure(table, *, gpus: str = "cluster_devices", days: str = "expected_days",
                                 cost: str = "cost", title: str | None = None) -> Any:
    """Days (top) and cost or GPU-hours (bottom) against GPUs, the best row per GPU count, with the
    minimum of cost × time marked on both."""
    fig, (top, bottom) = pyplot().subplots(2, 1, figsize=(8, 6.5), sharex=True)
    found = minimum_cost_time(table, gpus=gpus, days=days, cost=cost)
    used = cost if found is None else found[1]
    ran = table[table[days].notna()]
    best = ran.sort_values(days).groupby(gpus, sort=True).head(1).sort_values(gpus)
    x = best[gpus].astype(float)
    top.plot(x, best[days].astype(float), marker="o", color="C0")
    top.set_ylabel("days to train (expected, with failures)")
    scale, unit = (1e6, "M") if best[used].astype(float).max() >= 1e6 else (1e3, "k")
    bottom.plot(x, best[used].astype(float) / scale, marker="o", color="C1")
    bottom.set_ylabel(f"{'cost' if used == cost else 'GPU-hours'} ({unit})")
    if found is not None:
        for ax in (top, bottom):
            ax.axvline(found[0], linestyle="--", color="0.35", linewidth=1)
        top.annotate(f"minimum cost × time: {found[0]:g} GPUs", (found[0], top.get_ylim()[1]),
                     textcoords="offset points", xytext=(4, -14), fontsize="small")
    values = sorted(set(x))
    if len(values) > 1:
        bottom.set_xscale("log", base=2)
    bottom.set_xticks(values, [f"{v:g}" for v in values])
    bottom.minorticks_off()
    bottom.set_xlabel("GPUs")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    top.set_title(title or "time to train and cost against GPUs")
    fig.tight_layout()
    return fig


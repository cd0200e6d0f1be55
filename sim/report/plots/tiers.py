"""Traffic per fabric tier: what crossed each tier in one iteration, by parallel group, against its capacity.

One bar per tier of the cluster's fabric (``sim.core.fabric_traffic``), bottom tier first: the
bytes that reached the tier per direction, stacked by the kind of group that sent them (TP,
CP, EP, PP, DP), in MB, GB, TB or PB as the tallest bar asks. A black tick over each bar marks what the tier could carry in
the iteration (its capacity × the iteration time); a capacity far above every bar is written
under the bar instead, so that the bars stay readable. Each bar's label gives its utilisation
(bytes over capacity × time): a ring's data parallelism is as busy on a 1:7 core as on its
leaves, a placement that spreads tensor parallelism over servers is not.
"""

from __future__ import annotations

from typing import Any

from sim.report.plots.style import figure_and_axes, format_duration

__all__ = ["KIND_COLOURS", "tiers_figure"]

KIND_COLOURS = {"TP": "C0", "CP": "C4", "EP": "C2", "PP": "C1", "DP": "C3"}
"""One colour per parallel group kind, the same in every figure of tiers."""

OFF_SCALE = 4.0
"""A capacity more than this many times the tallest bar is written, not drawn."""


def tiers_figure(result, *, ax=None) -> Any:
    """Stacked bars of each tier's bytes per iteration by group kind, capacity marked (``result``'s
    summary must have a ``fabric``: a cluster with a fabric, an iteration that finished)."""
    summary = result.summarize()
    fabric, T = summary.fabric, summary.iteration_time_s
    fig, ax = figure_and_axes(ax, (8, 4.8))
    x = range(len(fabric.tiers))
    scale, unit = _unit(max((t.bytes for t in fabric.tiers), default=0.0))
    bottoms = [0.0] * len(fabric.tiers)
    for kind, colour in KIND_COLOURS.items():
        heights = [dict(t.bytes_by_kind).get(kind, 0.0) / scale for t in fabric.tiers]
        if any(heights):
            ax.bar(x, heights, bottom=bottoms, color=colour, label=kind, width=0.6)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    tallest = max(bottoms, default=0.0) or 1.0
    labels = []
    for i, tier in enumerate(fabric.tiers):
        capacity = tier.capacity_bytes_per_s * T / scale
        label = f"{tier.name}\n{tier.utilisation:.1%} of capacity"
        if capacity <= OFF_SCALE * tallest:
            ax.hlines(capacity, i - 0.4, i + 0.4, colors="black", linewidth=2,
                      label="capacity × iteration" if i == 0 else None)
        else:
            label += f"\ncapacity {capacity:,.0f} {unit} (off scale)"
        labels.append(label)
    ax.set_xticks(list(x), labels, fontsize="small")
    ax.set_ylabel(f"{unit} per iteration, per direction")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)  # room for the key above the bars
    ax.legend(fontsize="small", loc="upper center", ncol=6, frameon=False)
    ax.set_title(f"{summary.name}: traffic per fabric tier in one iteration ({format_duration(T)})", fontsize="medium")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _unit(largest_bytes: float) -> tuple[float, str]:
    """(bytes per unit, name) for bars up to ``largest_bytes``: MB, GB, TB or PB, at most four digits."""
    for scale, name in ((1e15, "PB"), (1e12, "TB"), (1e9, "GB")):
        if largest_bytes >= scale:
            return scale, name
    return 1e6, "MB"

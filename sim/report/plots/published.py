"""The shipped presets against published runs: one bar per row, its relative error, with its key.

``dapple-sim published --out`` draws each published row's error, ``predicted / published − 1``
in percent, as a horizontal bar coloured by the paper's table it comes from (the key names each
table and its source). What a bar right of zero means depends on the metric: a predicted time
or memory above the published one is too slow or too large; a predicted rate (TFLOP/s, tokens/s)
above it is too fast. So the bar is hatched when the prediction is too optimistic (too fast, too
small) and plain when it is too pessimistic, whatever side of zero it falls, and the key says
so; the ±5% and ±10% bands are drawn and keyed. The axis reads in percent, widened to the
largest error.
"""

from __future__ import annotations

from typing import Any, Sequence

from sim.report.plots.style import pyplot, wrap_to_width

__all__ = ["HIGHER_IS_FASTER", "published_figure"]

HIGHER_IS_FASTER = frozenset({"tflops_per_gpu", "tokens_per_s_per_gpu"})
"""Metrics that are rates: a prediction above the published value is too fast (too optimistic)."""


def published_figure(rows: Sequence[tuple[str, str, str, str, float, bool]]) -> Any:
    """``rows``: ``(source, table, row, metric, error, oom)`` each, ``error`` the fraction
    ``predicted / published − 1``; returns the figure (see the module docstring)."""
    # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import PercentFormatter

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 0.3 * len(rows) + 2.0))
    tables = list(dict.fromkeys((source, table) for source, table, *_ in rows))
    colours = {key: f"C{i}" for i, key in enumerate(tables)}
    ordered = list(rows)[::-1]  # the suite's first row on top
    errors = [100 * r[4] for r in ordered]
    optimistic = [(r[4] > 0) == (r[3] in HIGHER_IS_FASTER) and r[4] != 0 for r in ordered]
    labels = [f"{table}: {row}" + (" (out of memory)" if oom else "") for _, table, row, _, _, oom in ordered]
    bars = ax.barh(range(len(ordered)), errors, color=[colours[(r[0], r[1])] for r in ordered], edgecolor="white",
                   linewidth=0.4)
    for bar, hatched in zip(bars, optimistic):
        if hatched:
            bar.set_hatch("///")
    ax.set_yticks(range(len(ordered)), labels, fontsize=7)
    for x in (-10, -5, 5, 10):
        ax.axvline(x, color="grey", lw=0.6, ls=":" if abs(x) == 10 else "--")
    ax.axvline(0, color="black", lw=0.8)
    widest = max([abs(e) for e in errors] + [12.0])
    ax.set_xlim(-widest * 1.08, widest * 1.08)
    ax.xaxis.set_major_formatter(PercentFormatter(decimals=0))
    ax.set_xlabel("predicted / published − 1")
    ax.set_title("Shipped presets against published runs", loc="left", fontsize="medium")
    key = [Patch(facecolor=colours[key], label=wrap_to_width(f"{key[1]} ({key[0]})", 2.2, points=7))
           for key in tables]
    key += [Patch(facecolor="0.8", label="plain: too slow or too large\n(pessimistic)"),
            Patch(facecolor="0.8", hatch="///", label="hatched: too fast or too small\n(optimistic)"),
            Line2D([], [], color="grey", lw=0.6, ls="--", label="±5%"),
            Line2D([], [], color="grey", lw=0.6, ls=":", label="±10%")]
    ax.legend(handles=key, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="x-small", frameon=False,
              borderaxespad=0.0)
    fig.tight_layout()
    return fig

"""What every figure shares: matplotlib on a screenless machine, the figure helper, units.

matplotlib is imported inside the functions so that importing a plot module stays light, and
with the non-interactive Agg backend when nothing else was chosen, so plots work on machines
without a screen.

Time is drawn in the unit its magnitude asks for (:func:`time_unit`): milliseconds below 10 s,
seconds below 10 min, minutes below 10 h, else hours, so that a label never needs more than
four digits before the unit changes (a run of 128 micro-batches read "164701.9 ms").
Figures keep their data in milliseconds; :func:`set_time_axis` only relabels the ticks, so
lines drawn in milliseconds elsewhere (a measured step's marker) stay where they were.
"""

from __future__ import annotations

import textwrap

__all__ = ["GiB", "figure_and_axes", "format_duration", "pyplot", "set_time_axis", "time_unit", "to_rgb", "wrap_to_width"]

GiB = 2.0**30

_TIME_UNITS = ((10.0, 1e-3, "ms"), (600.0, 1.0, "s"), (36_000.0, 60.0, "min"))
"""(span below which the unit serves, seconds per unit, unit): ten of the next unit up."""


def time_unit(span_s: float) -> tuple[float, str]:
    """(seconds per unit, unit name) to show a span of ``span_s`` seconds: ``ms`` below 10 s,
    ``s`` below 10 min, ``min`` below 10 h, else ``h``."""
    for below_s, unit_s, name in _TIME_UNITS:
        if abs(span_s) < below_s:
            return unit_s, name
    return 3600.0, "h"


def format_duration(value_s: float) -> str:
    """``value_s`` seconds in the unit :func:`time_unit` picks for it: ``12.3 ms`` (one decimal
    in ms, as titles always wrote), ``164.7 s``, ``15 min``, ``27,778 h`` (four significant
    digits, whole units with thousands separators from 10,000 on)."""
    unit_s, name = time_unit(value_s)
    value = value_s / unit_s
    if name == "ms":
        return f"{value:.1f} ms"
    return f"{value:,.0f} {name}" if abs(value) >= 1e4 else f"{value:.4g} {name}"


def set_time_axis(ax, span_s: float, *, label: bool = True) -> None:
    """Relabel ``ax``'s x axis, whose data are milliseconds, in the unit for ``span_s`` seconds:
    ticks at round values of that unit, and ``time (unit)`` as the axis label unless ``label``
    is False."""
    # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    unit_s, name = time_unit(span_s)
    per_ms = unit_s * 1e3  # milliseconds per unit

    class _UnitLocator(MaxNLocator):
        """Round ticks in the chosen unit, placed on the axis's milliseconds."""

        def tick_values(self, vmin, vmax):
            return super().tick_values(vmin / per_ms, vmax / per_ms) * per_ms

    ax.xaxis.set_major_locator(_UnitLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value / per_ms:,.6g}"))
    if label:
        ax.set_xlabel(f"time ({name})")


def wrap_to_width(text: str, width_in: float, *, points: float = 10.0, max_lines: int | None = None) -> str:
    """``text`` wrapped to lines that fit ``width_in`` inches at a font of ``points`` (an
    average character being about 0.55 of the font's size: matplotlib's DejaVu Sans); past
    ``max_lines`` lines cut, the last ending in an ellipsis."""
    columns = max(20, int(width_in * 72 / (0.55 * points)))
    lines = textwrap.wrap(text, columns, break_long_words=False)
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: columns - 1].rstrip() + "…"
    return "\n".join(lines) or text


def to_rgb(colour) -> tuple[float, float, float]:
    """``colour`` (a name, ``#rrggbb`` or an RGB tuple) as an RGB tuple of 0..1 floats."""
    # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
    from matplotlib.colors import to_rgb as rgb

    return rgb(colour)


def pyplot():
    # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        matplotlib.use("Agg")
    # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
    import matplotlib.pyplot as plt

    return plt


def figure_and_axes(ax, size: tuple[float, float]):
    """(figure, axes): ``ax``'s figure when given, else a new figure of ``size`` inches."""
    if ax is not None:
        return ax.figure, ax
    return pyplot().subplots(figsize=size)

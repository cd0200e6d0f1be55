"""What every figure shares: matplotlib on a screenless machine, the figure helper, units.

matplotlib is imported inside the functions so that importing a plot module stays light, and
with the non-interactive Agg backend when nothing else was chosen, so plots work on machines
without a screen.
"""

from __future__ import annotations

__all__ = ["GiB", "figure_and_axes", "pyplot"]

GiB = 2.0**30


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

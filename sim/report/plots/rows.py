"""Which devices a chart draws, one row each, so that 16,384 devices stay a page.

A small run draws every device (``dev 5``). Past ``ROW_CAP`` devices a chart draws one row
per class of identical devices (``sim.engine.classes``: devices that run the same actions at
the same times, one standing for all), labelled as the text report labels its rows, by the
stages it runs and how many devices it stands for: ``stage 3 · 128 devices``. Past
``ROW_CAP`` classes (a contention replay splits a stage's devices by their NIC's position)
the classes that run the same stages are merged into one row, through the text report's own
grouping (``sim.core.summary.stage_groups``), its first device drawn; past ``ROW_CAP`` stages
an evenly spaced choice of them is drawn, the first and the last included. ``PlotRows.note``
says what was merged or left out, for the figure's title.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.summary import stage_groups

__all__ = ["PlotRow", "PlotRows", "ROW_CAP", "plot_rows"]

ROW_CAP = 32
"""Most rows a Gantt or memory chart draws (the text report's ``MAX_CLASS_ROWS`` too)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlotRow:
    """One row of a chart: a device drawn for the devices it stands for."""

    device: int
    """The device drawn (the first of those it stands for)."""
    count: int
    """Devices it stands for (1: itself)."""
    label: str
    """Its label on the chart: ``dev 5``, ``stage 3 · 128 devices``, ``stages 0,16 · 128 devices``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlotRows:
    """The rows of a chart and what a reader must be told about them."""

    rows: tuple[PlotRow, ...]
    note: str = ""
    """What was merged or left out (``256 device classes, a row per stage``); empty when every
    device or class has its row."""


def _stages_label(stages: tuple[int, ...], count: int) -> str:
    name = f"stage {stages[0]}" if len(stages) == 1 else "stages " + ",".join(map(str, stages))
    return f"{name} · {count:,} device" + ("s" if count > 1 else "")


def _evenly(n: int, cap: int) -> list[int]:
    """``cap`` indices of ``range(n)`` evenly spaced, the first and the last included."""
    if n <= cap:
        return list(range(n))
    return sorted({round(i * (n - 1) / (cap - 1)) for i in range(cap)})


def plot_rows(result, cap: int = ROW_CAP, *, by_class: bool = False) -> PlotRows:
    """The rows of ``result``'s (a ``SimResult``'s) charts, at most ``cap`` (see the module
    docstring); ``by_class``: a row per class even when every device would fit (schedules
    compared: identical replicas share a row, so that the schedules' differences stand out)."""
    workload = result.workload
    if workload.num_devices <= cap and not by_class:
        return PlotRows(rows=tuple(PlotRow(device=d, count=1, label=f"dev {d}") for d in workload.devices))
    classes = sorted(workload.classes, key=lambda c: c.devices[0])
    if len(classes) <= cap:
        shared = {}
        for cls in classes:
            shared[cls.stages] = shared.get(cls.stages, 0) + 1
        rows = tuple(PlotRow(device=cls.devices[0], count=len(cls.devices),
                             label=_stages_label(cls.stages, len(cls.devices))
                             + (f" (dev {cls.devices[0]})" if shared[cls.stages] > 1 else ""))
                     for cls in classes)
        return PlotRows(rows=rows)
    groups = stage_groups(result.summarize().devices)
    chosen = _evenly(len(groups), cap)
    rows = tuple(PlotRow(device=groups[i][1][0].device, count=len(groups[i][1]),
                         label=_stages_label(groups[i][0], len(groups[i][1]))) for i in chosen)
    note = f"{len(classes):,} device classes, a row per stage"
    if len(chosen) < len(groups):
        note += f" ({len(chosen)} of {len(groups)} stage groups shown, evenly spaced)"
    return PlotRows(rows=rows, note=note)

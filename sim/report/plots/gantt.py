"""Drawing a Gantt chart of event rows: what every device did, with its key.

The rows are ``sim.core.events.EventRow``s (a replay's, or a measured run's: both use them).
The colour says what an action is: forward blue, backward orange, zero bubble's
input-gradient backward (I) red and weight-gradient backward (W) green, so the colours never
repeat whatever the number of micro-batches; the number in a bar is its micro-batch. With
many micro-batches (or bars too narrow for a number) every k-th is numbered, forwards above
the row and backwards below, and where bars are too narrow for white edges neighbouring
micro-batches alternate two shades of their colour. An interleaved plan's model chunks on
one device are told apart by hatching (chunk 0 plain, chunk 1 ``///``, ...; on bars too narrow
for hatching, by a darker tint a chunk). The gradient
all-reduce is a grey bar under the row and the optimizer step a black one; a simulated run
draws instead every collective of the device there (gradient reductions and group collectives:
tensor-, context-parallel, FSDP's and ZeRO's gathers), the part its compute stream was idle
for (exposed, ``sim.engine.exposure``) strong and the part under compute faint. ``gantt_key``
is the legend of what was drawn; ``add_key`` puts one (or several charts' merged) to the
right of the axes.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from sim.report.plots.lanes import COMMUNICATION_KINDS, OTHER_KIND
from sim.report.plots.style import set_time_axis, to_rgb

__all__ = ["ALLREDUCE_COLOUR", "CHUNK_HATCHES", "EXPOSED_COLOUR", "HIDDEN_COLOUR", "KINDS", "LABEL_EVERY_MICROBATCHES", "LEGEND",
           "OPTIMIZER_COLOUR", "add_key", "draw_gantt", "gantt_key", "lane_kinds", "merge_keys"]

KINDS = {
    "F": ("#4e79a7", "forward (F)"),
    "B": ("#f28e2b", "backward (B)"),
    "I": ("#e15759", "input-gradient backward (I)"),
    "W": ("#59a14f", "weight-gradient backward (W)"),
}
"""Compute kind -> (colour, its name in the key)."""

ALLREDUCE_COLOUR = "0.55"
EXPOSED_COLOUR, HIDDEN_COLOUR = COMMUNICATION_KINDS["REDUCE"][:2]
"""The gradient reduction's lane: strong purple where the compute stream is idle (exposed), the
same purple faint where it runs under compute (hidden by overlap)."""
OPTIMIZER_COLOUR = "black"
CHUNK_HATCHES = ("", "///", "...", "xxx", "\\\\\\", "+++")
"""Hatch of model chunk k on a device (interleaved): chunk 0 plain."""

LABEL_EVERY_MICROBATCHES = 32
"""Above this many micro-batches (or where bars are too narrow for their numbers) only every
k-th micro-batch is numbered, about 16 numbers a row, above and below the row; bars too
narrow for white edges alternate two shades instead."""

LEGEND = ("colour: blue forward, orange backward, red input-gradient backward (I), green weight-gradient "
          "backward (W); number: micro-batch; hatched: a device's 2nd, 3rd ... model chunk; grey under the "
          "row: gradient all-reduce (a simulated run: a lane per kind of collective, its colour strong where "
          "exposed, faint where hidden under compute); black: optimizer step")


def _shade(colour: str, microbatch: int | None, alternate: bool):
    """The kind's colour; with ``alternate``, a little lighter for odd micro-batches, so that
    neighbours stay apart where bars are too narrow for white edges."""
    rgb = to_rgb(colour)
    if alternate and microbatch is not None and microbatch % 2:
        rgb = tuple(0.7 * c + 0.3 for c in rgb)
    return rgb


def _chunk_tint(rgb, chunk: int):
    """A narrow bar's colour for model chunk ``chunk``: chunk 0 as is, each later one darker."""
    factor = 1.0 - 0.55 * min(chunk, 3) / 3
    return tuple(factor * c for c in to_rgb(rgb))


def _darker(colour: str):
    return tuple(0.6 * c for c in to_rgb(colour))


def _chunks(events) -> dict[tuple[int, int], int]:
    """(device, stage) -> which of the device's model chunks the stage is (0 for most plans)."""
    stages: dict[int, set[int]] = {}
    for row in events:
        if row.kind in KINDS:
            stages.setdefault(row.device, set()).add(row.stage)
    return {(d, s): k for d, owned in stages.items() for k, s in enumerate(sorted(owned))}


_LABEL_PT = 6.0
"""Font size of the micro-batch numbers."""
_CRAMPED_PT = 24.0
"""Row pitch (points) under which micro-batch numbers go only above the first row and below the
last: above and below every row they would touch the next row's."""
_NICE_STEPS = (1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 200, 256, 500, 1000)


def _label_pt(text: str) -> float:
    """Width in points a number needs (digits are about 0.62 em wide, plus a margin)."""
    return 0.62 * _LABEL_PT * len(text) + 2.0


def _labelling(widths_pt: list[float], num_mb: int) -> tuple[int, bool]:
    """(k, inside): number every k-th micro-batch, inside its bars or, where the bars are
    too narrow, above (forward) and below (backward) the row.

    Inside when the typical bar holds the widest number; else every k-th with k the
    smallest nice step that leaves each number room, and at least enough to keep about
    ``LABEL_EVERY_MICROBATCHES // 2`` numbers per row.
    """
    widest = _label_pt(str(max(num_mb - 1, 0)))
    typical = statistics.median(widths_pt) if widths_pt else widest
    if typical >= widest and num_mb <= LABEL_EVERY_MICROBATCHES:
        return 1, True
    need = max(widest / max(typical, 1e-6) * 1.3, num_mb / (LABEL_EVERY_MICROBATCHES // 2))
    return next((k for k in _NICE_STEPS if k >= need), _NICE_STEPS[-1]), False


def _bar_collections(ax, bars: dict[tuple, list[tuple[float, float, float, float]]]) -> None:
    """Bars ``(x, y, width, height)`` in data units, grouped by ``(facecolour, edgecolour, hatch,
    hatch colour)``, as one ``PolyCollection`` a group.

    A patch per bar costs matplotlib about a third of a millisecond to add and as much to draw:
    a 2,048-GPU chart of 128 micro-batches holds ten thousands of bars (11 s); a collection a
    colour draws them in tens of milliseconds. Each collection keeps its bars as
    ``collection.bars`` (what tests and notebooks read back)."""
    # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
    from matplotlib.collections import PolyCollection

    for (face, edge, hatch, hatch_colour), boxes in sorted(bars.items(), key=repr):
        xywh = np.asarray(boxes, dtype=float)
        x0, y0 = xywh[:, 0], xywh[:, 1]
        x1, y1 = x0 + xywh[:, 2], y0 + xywh[:, 3]
        verts = np.stack([np.stack([x0, y0], 1), np.stack([x1, y0], 1), np.stack([x1, y1], 1),
                          np.stack([x0, y1], 1)], axis=1)
        collection = PolyCollection(verts, facecolors=[face], edgecolors=[edge], linewidths=0.4 if edge != "none" else 0,
                                    hatch=hatch, closed=True)
        if hatch:
            collection.set_hatchcolor(hatch_colour)
        collection.bars = [tuple(b) for b in boxes]
        collection.style = {"facecolor": face, "edgecolor": edge, "hatch": hatch}
        ax.add_collection(collection, autolim=False)


def draw_gantt(ax, events, rows: list[tuple[int, int]], num_mb: int, end_s: float, *, key: bool = True,
               communication: dict | None = None, labels: list[str] | None = None) -> list:
    """Bars of compute ``events`` (``sim.core.events.EventRow``) on one row per (device, devices it stands
    for), labelled ``labels`` (default ``dev 8 (x8)``), with the key (``gantt_key``) to the right of the
    axes unless ``key`` is False. Returns the key's handles (to merge the keys of several charts into
    one). ``communication`` maps a device to its collectives' ``(exposed, hidden)`` intervals by kind
    (``sim.report.plots.lanes.communication_lanes``), drawn as thin lanes under its row, one per kind,
    in place of the all-reduce's grey bar. Bars are drawn as one collection a colour
    (``_bar_collections``); numbers that would touch their neighbour are left out."""
    index = {d: i for i, (d, _) in enumerate(rows)}
    chunks = _chunks(events)
    span_ms = max(end_s * 1e3 * 1.01, 1e-9)
    # points per millisecond, from the axes' share of the figure (before layout: close enough)
    pt_per_ms = ax.get_position().width * ax.figure.get_figwidth() * 72 / span_ms
    drawn = [row for row in events if row.device in index and row.end_s > row.start_s]
    widths = [(row.end_s - row.start_s) * 1e3 * pt_per_ms for row in drawn if row.kind in KINDS]
    every, inside = _labelling(widths, num_mb)
    narrow = bool(widths) and sorted(widths)[len(widths) // 2] < 4.0  # white edges would hide the colours
    half = 0.35 if inside else 0.25  # bars' half height; thinner ones leave room for numbers above and below
    kinds = lane_kinds(communication)
    # outside numbering: the lanes take the bars' lower part, so the numbers below stay clear of them
    lane_h = 0.14 if inside else 0.12
    bar_h = 2 * half - (lane_h if kinds and not inside else 0.0)
    seen: set[str] = set()
    bars: dict[tuple, list] = {}
    numbers: list[tuple[float, float, str, str, Any]] = []
    for row in drawn:
        y = index[row.device]
        start, width = row.start_s * 1e3, (row.end_s - row.start_s) * 1e3
        kind = row.kind
        if kind in KINDS:
            m = row.microbatch
            colour = KINDS[kind][0]
            chunk = chunks.get((row.device, row.stage), 0)
            # narrow bars: hatching does not read, and Agg hatches path by path (seconds for 10,000 bars),
            # so a chunk is a darker tint of its colour instead
            hatch = None if narrow else CHUNK_HATCHES[chunk % len(CHUNK_HATCHES)] or None
            face = _chunk_tint(_shade(colour, m, narrow), chunk) if narrow else _shade(colour, m, narrow)
            style = (face, "none" if narrow else "white", hatch, _darker(colour))
            bars.setdefault(style, []).append((start, y - half, width, bar_h))
            seen.add(kind)
            if chunk:
                seen.add(f"chunk{chunk}")
            if m is None or m % every:
                continue
            if inside:
                if width * pt_per_ms >= _label_pt(str(m)):
                    numbers.append((start + width / 2, y - half + bar_h / 2, str(m), "center",
                                    "white" if not hatch else "black"))
            else:  # forwards' numbers above the row, backwards' below
                above = kind == "F"
                numbers.append((start, y - half - 0.01 if above else y + half + 0.01, str(m),
                                "above" if above else "below", _darker(colour)))
        elif kind == "REDUCE_GRAD" and communication is None:
            bars.setdefault((ALLREDUCE_COLOUR, "none", None, None), []).append((start, y + half, width, 0.14))
            seen.add(kind)
        elif kind == "OPTIM":
            bars.setdefault((OPTIMIZER_COLOUR, "none", None, None), []).append((start, y - half, width, 2 * half))
            seen.add(kind)
    if communication is not None:
        seen |= _lane_bars(communication, index, kinds, y_top=half + bar_h - 2 * half, height=lane_h, bars=bars)
    _bar_collections(ax, bars)
    # rows too close for numbers above and below each: the first row's forwards and the last's backwards
    pitch_pt = ax.get_position().height * ax.figure.get_figheight() * 72 / max(len(rows), 1)
    cramped = not inside and pitch_pt < _CRAMPED_PT and len(rows) > 1
    if cramped:
        numbers = [n for n in numbers if (n[3] == "above" and n[1] < 0) or (n[3] == "below" and n[1] > len(rows) - 1)]
    _draw_numbers(ax, _apart(numbers, pt_per_ms), _LABEL_PT if inside else _LABEL_PT - 0.5)
    if labels is None:
        labels = [f"dev {d}" + (f" (x{n})" if n > 1 else "") for d, n in rows]
    ax.set_yticks(range(len(rows)), labels)
    # first device on top, room for its numbers (and, cramped, for the last row's below it)
    ax.set_ylim(len(rows) - (0.25 if cramped else 0.5), -0.5 if inside else -0.75)
    ax.set_xlim(0, end_s * 1e3 * 1.01)
    set_time_axis(ax, end_s * 1.01)  # the data stay in ms; the ticks read in the unit the span asks
    handles = gantt_key(seen, every=every, inside=inside, alternate=narrow, cramped=cramped, tinted=narrow)
    if key:
        add_key(ax, handles)
    return handles


def lane_kinds(communication: dict | None) -> list[str]:
    """The collective kinds any drawn device has, in ``COMMUNICATION_KINDS`` order: a lane each."""
    if not communication:
        return []
    present = {kind for lanes in communication.values() for kind, (exposed, hidden) in lanes.items()
               if exposed or hidden}
    return [kind for kind in COMMUNICATION_KINDS if kind in present] + sorted(present - set(COMMUNICATION_KINDS))


def _lane_bars(communication: dict, index: dict, kinds: list[str], *, y_top: float, height: float,
               bars: dict) -> set[str]:
    """Each device's communication lanes under its compute bars (``y_top`` below the row's centre),
    one lane of ``height / len(kinds)`` a kind: exposed intervals strong, hidden faint. Returns what
    it drew (``EXPOSED:TP``, ``HIDDEN:REDUCE``, ...) for the key."""
    drawn = set()
    lane = height / max(len(kinds), 1)
    for device in sorted(communication):
        if device not in index:
            continue
        for k, kind in enumerate(kinds):
            exposed, hidden = communication[device].get(kind, ([], []))
            strong, faint, _ = COMMUNICATION_KINDS.get(kind, OTHER_KIND)
            y = index[device] + y_top + k * lane
            for name, colour, intervals in (("HIDDEN", faint, hidden), ("EXPOSED", strong, exposed)):
                if intervals:
                    bars.setdefault((colour, "none", None, None), []).extend(
                        (start * 1e3, y, (end - start) * 1e3, lane) for start, end in intervals)
                    drawn.add(f"{name}:{kind}")
    return drawn


def _apart(numbers: list[tuple[float, float, str, str, Any]], pt_per_ms: float) -> list:
    """The numbers less those that would touch the one before them on their row and side
    (warm-up micro-batches, several chunks' same micro-batch): left to right, a number is kept
    when it starts at least a point past the end of the last one kept."""
    kept: list = []
    last_end: dict[tuple[float, str], float] = {}
    for number in sorted(numbers, key=lambda n: (n[1], n[3], n[0])):
        x, y, text, where, _ = number
        width = _label_pt(text) - 2.0
        left = x * pt_per_ms - (width / 2 if where == "center" else 0.0)
        if left >= last_end.get((y, where), -1e18) + 1.0:
            kept.append(number)
            last_end[(y, where)] = left + width
    return kept


def merge_keys(handles) -> list:
    """Several charts' key handles as one key: each label once (its first handle), what the
    numbers mean last."""
    first: dict[str, Any] = {}
    for handle in handles:
        first.setdefault(handle.get_label(), handle)
    order = [name for _, name in KINDS.values()] + ["lighter", "gradient all-reduce"] + \
        [name for *_, name in COMMUNICATION_KINDS.values()] + [OTHER_KIND[2], "lanes", "optimizer step",
                                                                "model chunk", "number"]

    def rank(handle) -> tuple[int, str]:
        label = handle.get_label()
        return next((i for i, start in enumerate(order) if label.startswith(start)), len(order)), label

    return sorted(first.values(), key=rank)


def add_key(ax, handles) -> None:
    """A Gantt chart's key to the right of ``ax``; ``handles`` may hold several charts' keys
    (``merge_keys``)."""
    ax.legend(handles=merge_keys(handles), loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize="x-small",
              frameon=False, borderaxespad=0.0, handlelength=1.6)


def _draw_numbers(ax, numbers: list[tuple[float, float, str, str, Any]], size_pt: float) -> None:
    """The micro-batch numbers ``(x, y, text, where, colour)`` (``where``: ``center``, or
    ``above``/``below`` the point, left-aligned) as one collection of glyph outlines.

    A Text artist per number costs about half a millisecond to lay out and draw, and a
    Gantt chart of 16 devices holds a thousand numbers: drawn as one collection they take a
    few milliseconds. The numbers are kept as ``collection.numbers``, the texts in order."""
    if not numbers:
        return
    # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
    from matplotlib import collections, font_manager, textpath, transforms

    font = font_manager.FontProperties(size=size_pt)
    shapes: dict[tuple[str, str], Any] = {}
    for _, _, text, where, _ in numbers:
        if (text, where) in shapes:
            continue
        path = textpath.TextPath((0, 0), text, prop=font)
        box = path.get_extents()
        dx = -(box.x0 + box.x1) / 2 if where == "center" else -box.x0
        dy = {"center": -(box.y0 + box.y1) / 2, "above": -box.y0, "below": -box.y1}[where]
        shapes[text, where] = path.transformed(transforms.Affine2D().translate(dx, dy))
    collection = collections.PathCollection([shapes[text, where] for _, _, text, where, _ in numbers],
                                offsets=[(x, y) for x, y, *_ in numbers], offset_transform=ax.transData,
                                transform=transforms.Affine2D().scale(1 / 72) + ax.figure.dpi_scale_trans,  # points
                                facecolors=[colour for *_, colour in numbers], edgecolors="none", linewidths=0,
                                zorder=3)
    collection.numbers = [text for _, _, text, _, _ in numbers]
    ax.add_collection(collection, autolim=False)


def gantt_key(seen, *, every: int = 1, inside: bool = True, alternate: bool = False, cramped: bool = False,
              tinted: bool = False) -> list:
    """Legend handles for what a Gantt chart drew: the kinds in ``seen`` (``F``, ``B``, ``I``,
    ``W``, ``REDUCE_GRAD``, ``EXPOSED:TP``, ``HIDDEN:REDUCE``, ``OPTIM``, ``chunk1``...) and what the numbers are."""
    # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=colour, label=name) for kind, (colour, name) in KINDS.items() if kind in seen]
    if alternate:
        handles.append(Patch(facecolor=_shade(KINDS["F"][0], 1, True), label="lighter: odd micro-batch"))
    if "REDUCE_GRAD" in seen:
        handles.append(Patch(facecolor=ALLREDUCE_COLOUR, label="gradient all-reduce"))
    for kind in [k for k in COMMUNICATION_KINDS if f"EXPOSED:{k}" in seen or f"HIDDEN:{k}" in seen] + \
            sorted({k.split(":", 1)[1] for k in seen if ":" in k} - set(COMMUNICATION_KINDS)):
        strong, faint, name = COMMUNICATION_KINDS.get(kind, OTHER_KIND)
        if f"EXPOSED:{kind}" in seen:
            handles.append(Patch(facecolor=strong, label=f"{name}, exposed"))
        if f"HIDDEN:{kind}" in seen:
            handles.append(Patch(facecolor=faint, label=f"{name}, hidden"))
    if any(":" in k for k in seen):
        handles.append(Line2D([], [], linestyle="", label="lanes under a row: its collectives;\nexposed: compute "
                                                          "idle, hidden:\nunder compute"))
    if "OPTIM" in seen:
        handles.append(Patch(facecolor=OPTIMIZER_COLOUR, label="optimizer step"))
    chunks = sorted(int(k[5:]) for k in seen if k.startswith("chunk"))
    if chunks:
        handles.append(Patch(facecolor=KINDS["F"][0] if tinted else "0.85", label="model chunk 0 (plain)"))
        if tinted:  # narrow bars: chunks as darker tints (``_chunk_tint``)
            handles += [Patch(facecolor=_chunk_tint(KINDS["F"][0], k), label=f"model chunk {k} (darker)") for k in chunks]
        else:
            handles += [Patch(facecolor="0.85", hatch=CHUNK_HATCHES[k % len(CHUNK_HATCHES)], hatchcolor="0.3",
                              label=f"model chunk {k}") for k in chunks]
    if inside:
        numbers = "number: micro-batch"
    else:
        numbers = "number: micro-batch" + (f" (every {every}th)" if every > 1 else "") + \
            (";\nforward above the first row,\nbackward below the last" if cramped else
             ";\nforward above the row,\nbackward below")
    handles.append(Line2D([], [], linestyle="", label=numbers))  # no marker: the text says it
    return handles

"""Figures of a 2,048-GPU, 128-micro-batch plan are readable (issue 35, figures acceptance).

``scenarios/gpt3_175b_a100_2048.yaml`` (TP 8 x PP 16 x DP 16, 1F1B, 128 micro-batches) is
replayed on the fast path and its Gantt, memory and schedule-comparison figures drawn with
Agg as ``dapple-plan --out`` draws them. Then, for each: every text artist's window extent lies
inside the figure; no two labels (tick labels, row labels, micro-batch numbers, titles, key
entries) overlap by more than a pixel; at most ``ROW_CAP`` rows, labelled by stage
(``stage 3 · 128 devices``), not a wall of 2,048; the figure at most 20 x 14 inches. A
TP x PP x DP plan with FSDP keys its tensor-parallel, FSDP and gradient-reduction lanes.
"""

from __future__ import annotations

import itertools

import pytest

from conftest import SCENARIOS

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sim.engine.run import run_scenario  # noqa: E402
from sim.input.scenario import load_scenario  # noqa: E402
from sim.report import plots  # noqa: E402

SCENARIO = SCENARIOS / "gpt3_175b_a100_2048.yaml"
ROW_CAP = 32
"""The most rows a chart may draw (``sim.report.plots.rows.ROW_CAP``)."""
TOLERANCE_PX = 1.0


@pytest.fixture(scope="module")
def replays():
    own = run_scenario(load_scenario(SCENARIO), engine="fast")
    gpipe = run_scenario(load_scenario(SCENARIO, {"plan.schedule": "gpipe"}), engine="fast")
    assert own.workload.num_devices == 2048 and own.workload.num_microbatches == 128
    return own, gpipe


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _number_boxes(fig, renderer):
    """Window boxes of the micro-batch numbers (drawn as one collection of glyph paths a chart)."""
    from matplotlib.transforms import Bbox

    boxes = []
    for ax in fig.axes:
        for collection in ax.collections:
            if not hasattr(collection, "numbers"):
                continue
            offsets = collection.get_offset_transform().transform(collection.get_offsets())
            scale = collection.get_transform()
            for path, (x, y), text in zip(collection.get_paths(), offsets, collection.numbers):
                extent = path.get_extents(scale)
                boxes.append((f"number {text}", Bbox.from_extents(x + extent.x0, y + extent.y0, x + extent.x1,
                                                                  y + extent.y1)))
    return boxes


def _text_boxes(fig, renderer):
    """(what, window box) of every visible, non-empty text the figure draws (ticks outside the view
    are artists but not drawn: they are left out)."""
    hidden_ticks = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not low - 1e-9 * abs(high) <= tick.get_loc() <= high + 1e-9 * abs(high):
                    hidden_ticks |= {id(tick.label1), id(tick.label2)}
    boxes = []
    for text in fig.findobj(matplotlib.text.Text):
        if not text.get_visible() or not text.get_text().strip() or id(text) in hidden_ticks:
            continue
        boxes.append((repr(text.get_text()), text.get_window_extent(renderer)))
    return boxes


def _overlaps(a, b) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > TOLERANCE_PX) and (min(a.y1, b.y1) - max(a.y0, b.y0) > TOLERANCE_PX)


def _check_readable(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width, height = fig.canvas.get_width_height()
    assert fig.get_figwidth() <= 20 and fig.get_figheight() <= 14
    texts = _text_boxes(fig, renderer)
    for what, box in texts:
        assert box.x0 >= -TOLERANCE_PX and box.y0 >= -TOLERANCE_PX and box.x1 <= width + TOLERANCE_PX \
            and box.y1 <= height + TOLERANCE_PX, f"{what} runs off the page: {box}"
    labels = texts + _number_boxes(fig, renderer)
    clashes = [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(labels, 2) if _overlaps(box_a, box_b)]
    assert not clashes, f"{len(clashes)} overlapping labels, e.g. {clashes[:5]}"
    for ax in fig.axes:
        assert len(ax.get_yticks()) <= ROW_CAP or ax.get_ylabel().startswith("memory")


def test_gantt_of_2048_gpus_is_one_row_per_stage_and_readable(replays):
    own, _ = replays
    fig = plots.gantt_figure(own)
    rows = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert rows == [f"stage {s} · 128 devices" for s in range(16)]
    _check_readable(fig)


def test_memory_of_2048_gpus_is_readable(replays):
    own, _ = replays
    fig = plots.memory_figure(own)
    keyed = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert keyed[0] == "stage 0 · 128 devices" and len(keyed) <= 17
    _check_readable(fig)


def test_schedules_of_2048_gpus_are_readable(replays):
    own, gpipe = replays
    title = "gpt3-175b-a100-2048: best plan (" + " ".join(f"[{i}, {i + 6})" for i in range(0, 96, 6)) + ")"
    _check_readable(plots.schedule_comparison_figure({"1f1b": own, "gpipe": gpipe}, title=title))


def test_a_4d_plan_keys_its_tensor_parallel_fsdp_and_reduction_lanes():
    """TP 2 x PP 2 x DP 2 with FSDP (``sharding: full``): the tensor-parallel collectives, FSDP's
    gathers and the gradient reduction each have their lane and key entry."""
    from sim.report.plots.lanes import COMMUNICATION_KINDS

    result = run_scenario(load_scenario(SCENARIOS / "llama3_70b_h100_fsdp.yaml", {
        "cluster.nodes": "1", "plan.tensor_parallel": "2", "plan.pipeline_parallel": "2", "plan.data_parallel": "2",
        "model.layers": "8", "training.global_batch_size": "8", "training.microbatch_size": "2"}), engine="fast")
    labels = [t.get_text() for t in plots.gantt_figure(result).axes[0].get_legend().get_texts()]
    names = {name for kind, (*_, name) in COMMUNICATION_KINDS.items() if kind in ("TP", "FS", "REDUCE")}
    assert {label.rsplit(",", 1)[0] for label in labels if label.endswith((", exposed", ", hidden"))} >= names


def test_an_moe_plan_keys_its_expert_all_to_all_lane():
    """Expert parallelism's dispatch and combine (the engine's ``EP`` group collective) have a
    lane and a key entry of their own, not the grey of an unknown kind."""
    from sim.report.plots.lanes import COMMUNICATION_KINDS

    result = run_scenario(load_scenario(SCENARIOS / "moe_tiny_cpu.yaml"), engine="fast")
    labels = [t.get_text() for t in plots.gantt_figure(result).axes[0].get_legend().get_texts()]
    assert any(label.startswith(COMMUNICATION_KINDS["EP"][2] + ",") for label in labels), labels
    assert not any(label.startswith("other collective") for label in labels), labels


def test_published_figure_keys_each_table_the_bias_and_the_bands():
    """``published.png``: a key entry per table (with its source), what plain and hatched bars mean
    (too slow or large / too fast or small: a time above the published one is too slow, a rate above
    it too fast), the ±5% and ±10% bands; the axis in percent, wide enough for the largest error."""
    from sim.report.plots.published import published_figure

    rows = [("Narayanan et al. 2021", "Table 1", "175B", "tflops_per_gpu", 0.30, False),
            ("Korthikanti et al. 2022", "Table 5", "22B", "iteration_time", 0.30, False),
            ("Korthikanti et al. 2022", "Table 5", "1T", "iteration_time", -0.45, False)]
    fig = published_figure(rows)
    ax = fig.axes[0]
    keyed = [t.get_text() for t in ax.get_legend().get_texts()]
    assert keyed[0] == "Table 1 (Narayanan et al. 2021)" and keyed[1] == "Table 5 (Korthikanti et al. 2022)"
    assert any(k.startswith("plain: too slow") for k in keyed) and any(k.startswith("hatched: too fast") for k in keyed)
    assert "±5%" in keyed and "±10%" in keyed
    hatches = [bar.get_hatch() for bar in ax.patches]  # bottom-up: 1T (too fast), 22B (too slow), 175B (too fast)
    assert hatches == ["///", None, "///"]
    low, high = ax.get_xlim()
    assert low <= -45 and high >= 45
    fig.canvas.draw()
    assert ax.xaxis.get_ticklabels()[0].get_text().endswith("%")
    _check_readable(fig)

"""Figures of long runs speak in seconds, minutes or hours, and keep every label on the page.

At 128 micro-batches a Gantt chart's axis used to run to 160,000 ms and its title to read
"164701.9 ms" (issue 35, item 1). ``sim.report.plots.style.time_unit`` picks the unit for a
span, ``format_duration`` writes a time in it; every figure's time axis and title use them.
"""

from __future__ import annotations

import pytest

from conftest import SCENARIOS

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sim.engine.run import run_scenario  # noqa: E402
from sim.input.scenario import load_scenario  # noqa: E402
from sim.report import plots  # noqa: E402
from sim.report.plots.style import format_duration, time_unit  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize(("span_s", "unit"), [
    (0.0, (1e-3, "ms")), (0.0123, (1e-3, "ms")), (9.99, (1e-3, "ms")),
    (10.0, (1.0, "s")), (164.7, (1.0, "s")), (599.0, (1.0, "s")),
    (600.0, (60.0, "min")), (35_999.0, (60.0, "min")),
    (36_000.0, (3600.0, "h")), (1e7, (3600.0, "h")),
])
def test_time_unit_is_ms_below_10_s_s_below_10_min_min_below_10_h_else_h(span_s, unit):
    assert time_unit(span_s) == unit


@pytest.mark.parametrize(("value_s", "text"), [
    (0.0123, "12.3 ms"), (1.6646, "1664.6 ms"), (164.7019, "164.7 s"), (65.299, "65.3 s"),
    (900.0, "15 min"), (3 * 3600.0 + 1800.0, "210 min"), (36_000.0, "10 h"), (1e8, "27,778 h"),
])
def test_format_duration_writes_a_time_in_its_own_unit(value_s, text):
    assert format_duration(value_s) == text


def _long_replay(**overrides):
    """BERT-48's default plan at 128 micro-batches over a 1 Gb/s network: about 65 s an iteration."""
    settings = {"training.global_batch_size": 2048, "cluster.inter_node.bandwidth": "1Gb/s", **overrides}
    result = run_scenario(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml", settings))
    assert 60.0 < result.iteration_time_s < 600.0
    return result


def _tick_values(ax):
    return [float(t.get_text().replace("\u2212", "-").replace(",", "")) for t in ax.get_xticklabels() if t.get_text()]


def _texts_inside(fig):
    """Every drawn text artist (titles, axis labels, keys, notes) inside the figure, and the
    figure's tight box (what matplotlib drew, tick labels included) inside it too: tick labels
    of ticks beyond the view exist as artists but are not drawn, so they count only there."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    bounds = fig.bbox
    ticks = {id(t) for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()}
    outside = []
    for text in fig.findobj(matplotlib.text.Text):
        if id(text) in ticks or not text.get_visible() or not text.get_text().strip():
            continue
        box = text.get_window_extent(renderer)
        if box.x0 < bounds.x0 - 0.5 or box.y0 < bounds.y0 - 0.5 or box.x1 > bounds.x1 + 0.5 or box.y1 > bounds.y1 + 0.5:
            outside.append(text.get_text())
    drawn, page = fig.get_tightbbox(renderer), fig.bbox_inches
    if drawn.x0 < page.x0 - 0.01 or drawn.y0 < page.y0 - 0.01 or drawn.x1 > page.x1 + 0.01 or drawn.y1 > page.y1 + 0.01:
        outside.append(f"drawn {drawn} beyond the page {page}")
    return outside


def test_a_long_gantt_chart_counts_seconds_and_its_title_has_no_ms():
    result = _long_replay()
    fig = plots.gantt_figure(result)
    ax = fig.axes[0]
    fig.canvas.draw()
    assert ax.get_xlabel() == "time (s)"
    ticks = _tick_values(ax)
    assert ticks and max(ticks) <= 10_000 and max(ticks) >= 50  # seconds: up to about 65
    title = ax.get_title(loc="left")
    assert " ms" not in title and f"{format_duration(result.iteration_time_s)} per iteration" in title
    assert _texts_inside(fig) == []


def test_a_long_memory_chart_counts_seconds():
    fig = plots.memory_figure(_long_replay())
    ax = fig.axes[0]
    fig.canvas.draw()
    assert ax.get_xlabel() == "time (s)"
    assert max(_tick_values(ax)) <= 100
    assert _texts_inside(fig) == []


def test_schedules_compared_over_a_long_run_keep_their_titles_and_labels_on_the_page():
    results = {s: _long_replay(**{"plan.schedule": s}) for s in ("gpipe", "dapple")}
    long_title = "bert48-v100-2x8: best plan (" + ", ".join(f"stage {i} on 8 devices, recompute off" for i in range(6)) + ")"
    fig = plots.schedule_comparison_figure(results, title=long_title)
    fig.canvas.draw()
    assert fig.axes[-1].get_xlabel() == "time (s)"
    assert all(" ms" not in ax.get_title(loc="left") for ax in fig.axes[::2])
    assert _texts_inside(fig) == []


def test_a_title_wider_than_the_figure_wraps_onto_the_page():
    result = run_scenario(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml", {"training.global_batch_size": 2048}))
    fig = plots.gantt_figure(result, title=" ".join(["stage 0 on 8 devices"] * 20))
    assert _texts_inside(fig) == []
    assert "\n" in fig.axes[0].get_title(loc="left")


def test_a_long_run_s_fault_impact_counts_idle_time_in_seconds():
    from sim.report.plots.validation import fault_impact_figure

    settings = {"training.global_batch_size": 2048, "cluster.inter_node.bandwidth": "1Gb/s"}
    result = run_scenario(load_scenario(SCENARIOS / "bert48_v100_straggler.yaml", settings))
    assert result.baseline is not None and result.baseline.iteration_time_s > 60.0
    fig = fault_impact_figure(result)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "idle time per iteration (s)"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0] == f"fault-free ({format_duration(result.baseline.iteration_time_s)} per iteration)"
    assert all(" ms" not in label for label in labels)
    assert max(patch.get_height() for patch in ax.patches) < 600  # seconds, not tens of thousands of ms
    assert _texts_inside(fig) == []

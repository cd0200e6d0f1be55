"""Figures of what-if studies: what each one draws, checked on the artists it creates."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, SCENARIOS

pd = pytest.importorskip("pandas")
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sim.core.validation_report import ValidationReport
from sim.report import plots

GiB = 2.0**30


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def _replays(*schedules):
    from sim.engine.run import run_scenario
    from sim.input.scenario import load_scenario

    return {s: run_scenario(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml", {"plan.schedule": s})) for s in schedules}


def test_gantt_figure_draws_every_compute_action_of_its_rows():
    result = _replays("dapple")["dapple"]
    fig = plots.gantt_figure(result)
    ax = fig.axes[0]
    rows = plots.rows_to_plot(result)
    compute = [e for e in result.event_rows([d for d, _ in rows])
               if e.kind in ("F", "B", "I", "W", "REDUCE_GRAD", "OPTIM") and e.end_s > e.start_s]
    assert len(_bars(ax)) == len(compute)
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"dev {d}" for d, _ in rows]
    assert ax.get_xlim()[1] == pytest.approx(result.iteration_time_s * 1e3 * 1.01)


def test_schedule_comparison_stacks_gantt_and_memory_on_one_time_axis():
    results = _replays("gpipe", "dapple", "zb-h1")
    fig = plots.schedule_comparison_figure(results)
    assert len(fig.axes) == 6
    titles = [ax.get_title(loc="left") for ax in fig.axes[::2]]
    for title, (name, result) in zip(titles, results.items()):
        assert title.startswith(f"{name}: {result.iteration_time_s * 1e3:.1f} ms per iteration")
    longest = max(r.iteration_time_s for r in results.values()) * 1e3 * 1.01
    assert all(ax.get_xlim()[1] == pytest.approx(longest) for ax in fig.axes)
    # identical replicas share a row: one per server here
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["stage 0 · 8 devices", "stage 1 · 8 devices"]
    memory_limits = {ax.get_ylim() for ax in fig.axes[1::2]}
    assert len(memory_limits) == 1  # one memory scale on every panel
    low, high = memory_limits.pop()
    peak = max(r.summary()["peak_memory_bytes"] for r in results.values()) / GiB
    assert low < 5.0 < peak < high < 16  # zoomed on the curves: 16 GiB is far above them
    assert "usable 14.7 of 16 GiB, above the scale" in fig.axes[1].get_title(loc="left")
    from sim.engine.run import run_scenario
    from sim.input.scenario import load_scenario

    small = run_scenario(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml", {"cluster.device.memory": "6GiB", "cluster.device.memory_reserved": "0B"}))
    near = plots.schedule_comparison_figure({"dapple": small})  # 5 of 6 GiB: the capacity line is in view
    assert near.axes[1].get_ylim() == (0.0, pytest.approx(6 * 1.06))


def _table(rows):
    base = {"error": None, "oom": False, "memory_capacity_bytes": 16 * GiB}
    return pd.DataFrame([{**base, **row} for row in rows])


def test_throughput_vs_gpus_takes_the_best_fit_per_count_and_marks_the_target():
    table = _table([
        {"cluster_devices": 8, "throughput_samples_per_s": 10.0, "device_name": "A", "oom": True},
        {"cluster_devices": 16, "throughput_samples_per_s": 30.0, "device_name": "A"},
        {"cluster_devices": 16, "throughput_samples_per_s": 20.0, "device_name": "A"},
        {"cluster_devices": 32, "throughput_samples_per_s": 55.0, "device_name": "A"},
        {"cluster_devices": 8, "throughput_samples_per_s": 40.0, "device_name": "B"},
        {"cluster_devices": 16, "throughput_samples_per_s": 90.0, "device_name": "B"},
        {"cluster_devices": 32, "throughput_samples_per_s": 1e6, "device_name": "B", "error": "boom"},
    ])
    fig = plots.throughput_vs_gpus_figure(table, hue="device_name", target=50)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["A"].get_xdata()) == [16, 32] and list(lines["A"].get_ydata()) == [30.0, 55.0]
    assert list(lines["B"].get_xdata()) == [8, 16] and list(lines["B"].get_ydata()) == [40.0, 90.0]
    markers = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert [list(m.get_xdata()) for m in markers] == [[8]]  # only A at 8 GPUs has nothing that fits
    assert sorted(_texts(fig)) == ["16", "32"]
    assert ax.get_xscale() == "log"


def test_memory_vs_microbatches_marks_out_of_memory_points_and_capacity():
    table = _table([
        {"num_microbatches": m, "peak_memory_bytes": gib * GiB, "schedule": s, "oom": gib > 16}
        for s, values in (("gpipe", (4, 9, 18)), ("dapple", (4, 4, 4))) for m, gib in zip((2, 8, 32), values)
    ])
    fig = plots.memory_vs_microbatches_figure(table)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["gpipe"].get_ydata()) == [4, 9, 18] and list(lines["dapple"].get_ydata()) == [4, 4, 4]
    assert list(lines["capacity (x: out of memory)"].get_ydata()) == [16, 16]
    (oom,) = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert list(oom.get_xdata()) == [32] and list(oom.get_ydata()) == [18]


def test_oom_frontier_shows_the_best_fit_per_cell_and_oom_where_none_fits():
    table = _table([
        {"model_name": "small", "cluster_devices": 8, "peak_memory_bytes": 12 * GiB, "schedule": "gpipe"},
        {"model_name": "small", "cluster_devices": 8, "peak_memory_bytes": 8 * GiB, "schedule": "gpipe"},
        {"model_name": "big", "cluster_devices": 8, "peak_memory_bytes": 20 * GiB, "oom": True, "schedule": "gpipe"},
        {"model_name": "big", "cluster_devices": 16, "peak_memory_bytes": None, "error": "x", "schedule": "gpipe"},
        {"model_name": "small", "cluster_devices": 8, "peak_memory_bytes": 4 * GiB, "schedule": "dapple"},
        {"model_name": "big", "cluster_devices": 8, "peak_memory_bytes": 15 * GiB, "schedule": "dapple"},
    ])
    fig = plots.oom_frontier_figure(table, by="schedule")
    gpipe, dapple = fig.axes[0], fig.axes[1]
    cells = lambda ax: {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    assert cells(gpipe) == {(0, 0): "50%", (1, 0): "OOM", (1, 1): "err"}
    assert cells(dapple) == {(0, 0): "25%", (1, 0): "94%"}
    assert [t.get_text() for t in gpipe.get_yticklabels()] == ["small", "big"]
    assert [t.get_text() for t in gpipe.get_xticklabels()] == ["8", "16"]
    assert (gpipe.get_title(), dapple.get_title()) == ("gpipe", "dapple")


def test_planner_comparison_from_a_report_and_from_a_table():
    report = {"scenario": "s", "planners": {
        "dapple": {"plan": {"stages": []}, "metrics": {"throughput_samples_per_s": 90.0, "speedup_over_dp": 1.5}},
        "dp": {"plan": {"stages": []}, "metrics": {"throughput_samples_per_s": 60.0, "speedup_over_dp": 1.0}},
        "even": {"plan": None, "metrics": None},
    }}
    fig = plots.planner_comparison_figure(report)
    heights = [bar.get_height() for bar in fig.axes[0].patches]
    assert heights == [90.0, 60.0, 0.0]
    assert "no plan fits" in _texts(fig) and "90\n1.50x dp" in _texts(fig)
    # a report from before plans and metrics were split kept the metrics in the plan
    old = {"scenario": "s", "planners": {"dapple": {"plan": {"throughput_samples_per_s": 90.0}}, "even": {"plan": None}}}
    assert [bar.get_height() for bar in plots.planner_comparison_figure(old).axes[0].patches] == [90.0, 0.0]
    table = _table([
        {"planner": p, "model": m, "throughput_samples_per_s": v}
        for (p, m), v in {("dapple", "a"): 30.0, ("dp", "a"): 10.0, ("dapple", "b"): 8.0, ("dp", "b"): 4.0}.items()
    ])
    fig = plots.planner_comparison_figure(table, by="model", relative_to="dp")
    assert [bar.get_height() for bar in fig.axes[0].patches] == [3.0, 2.0, 1.0, 1.0]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["a", "b"]


def test_table_figures_draw_a_real_sweep(tmp_path):
    from planner.sweeps.run import load_sweep, run_sweep, write_plots

    sweep = load_sweep(REPO / "sweeps" / "bert48_schedules.yaml")
    table = run_sweep(sweep, workers=1).table
    (path,) = write_plots(sweep, table, tmp_path)
    assert path.name == "memory_vs_microbatches.png" and path.stat().st_size > 10_000
    for figure in (plots.throughput_vs_gpus_figure(table, hue="plan"),
                   plots.oom_frontier_figure(table, by="plan"),
                   plots.memory_vs_microbatches_figure(table, hue="plan")):
        assert figure.axes


def test_validation_figure_reads_the_recorded_schema():
    data = json.loads((REPO / "notebooks" / "data" / "validation_cpu.json").read_text())
    runs = data["runs"] if "runs" in data else [data]
    single = {k: v for k, v in data.items() if k != "runs"} | runs[0]  # the one-run form of the same schema
    for run in runs + [single]:
        fig = plots.validation_figure(run)  # a recording's JSON, as the notebook hands it over
        assert len(fig.axes) == 5
        times = [bar.get_height() for bar in fig.axes[0].patches]
        expected = [run["predicted"]["iteration_time_s"] * 1e3, run["measured"]["iteration_time_s"] * 1e3]
        assert times == pytest.approx(expected)
        devices = sorted(d["device"] for d in run["predicted"]["devices"])
        assert [t.get_text() for t in fig.axes[3].get_yticklabels()] == [f"dev {d}" for d in devices]
        assert ("PLACEHOLDER" in fig._suptitle.get_text()) == bool(run.get("placeholder"))
        typed = plots.validation_figure(ValidationReport.from_json(run))  # the report itself draws alike
        assert [bar.get_height() for bar in typed.axes[0].patches] == pytest.approx(expected)
        plt.close(typed)


# --- what a reader of a Gantt chart needs: a key, colours by kind, numbers, chunks ------------------


def _numbers(ax):
    """(x, y, text) of the micro-batch numbers a Gantt chart drew (one collection of glyphs)."""
    found = [c for c in ax.collections if hasattr(c, "numbers")]
    return [(x, y, t) for c in found for (x, y), t in zip(c.get_offsets(), c.numbers)]


def _bars(ax):
    """The Gantt chart's bars as Rectangles (it draws them as one collection a colour, each keeping
    its ``(x, y, width, height)`` boxes as ``bars`` and its colours and hatch as ``style``)."""
    from matplotlib.patches import Rectangle

    return [Rectangle((x, y), w, h, **c.style) for c in ax.collections if hasattr(c, "bars") for x, y, w, h in c.bars]


def test_gantt_has_a_key_and_colours_by_kind_with_the_micro_batch_written_in_each_bar():
    from matplotlib.colors import to_hex

    from sim.engine.run import run_scenario
    from sim.input.scenario import load_scenario
    from sim.report.plots.timeline import KINDS

    # 16 micro-batches: the old palette repeated after 10, so mb 11's backward looked like a forward
    result = run_scenario(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml",
                                        {"plan.schedule": "gpipe", "training.microbatch_size": "8"}))
    assert result.workload.num_microbatches == 16
    fig = plots.gantt_figure(result)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["forward (F)", "backward (B)"] and "optimizer step" in labels
    assert any(label.startswith("number: micro-batch") for label in labels)
    events = [e for e in result.event_rows([0]) if e.kind in ("F", "B")]
    bars = [b for b in _bars(ax) if abs(b.get_y() + b.get_height() / 2) < 1e-9]  # device 0's row
    colours = {to_hex(b.get_facecolor()) for b in bars if b.get_height() == pytest.approx(0.7)}
    assert colours >= {KINDS["F"][0], KINDS["B"][0]}
    assert len(colours - {"#000000"}) == 2  # one colour per kind, whatever the micro-batch
    numbers = sorted(int(t) for _, y, t in _numbers(ax) if abs(y) < 1e-9)
    assert numbers == sorted(e.microbatch for e in events)  # every F and B of device 0 is numbered


def test_an_interleaved_plans_chunks_are_hatched_and_in_the_key():
    from sim.engine.run import run_scenario
    from sim.input.scenario import load_scenario

    result = run_scenario(load_scenario(SCENARIOS / "gpt1.3b_h100_interleaved.yaml"))
    fig = plots.gantt_figure(result)
    ax = fig.axes[0]
    hatches = {b.get_hatch() for b in _bars(ax)}
    assert None in hatches and len(hatches - {None}) == 1  # chunk 0 plain, chunk 1 hatched
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "model chunk 0 (plain)" in labels and "model chunk 1" in labels


def test_many_micro_batches_are_numbered_every_kth_above_and_below_the_rows():
    from sim.engine.run import run_scenario
    from sim.input.scenario import load_scenario

    result = run_scenario(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml",
                                        {"training.global_batch_size": "1024", "training.microbatch_size": "16"}))
    assert result.workload.num_microbatches == 64
    fig = plots.gantt_figure(result)
    ax = fig.axes[0]
    numbers = {int(t) for *_, t in _numbers(ax)}
    assert numbers and all(m % 4 == 0 for m in numbers) and len(numbers) <= 16
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("every 4th" in label and "forward above the row" in label for label in labels)


def test_memory_figure_zooms_on_small_runs_and_draws_the_capacity_when_near():
    from sim.engine.run import run_scenario
    from sim.input.scenario import load_scenario

    small = run_scenario(load_scenario(SCENARIOS / "gpt_tiny_cpu.yaml"))  # a few MiB of 4 GiB
    ax = plots.memory_figure(small).axes[0]
    peak = small.summary()["peak_memory_bytes"] / 2**20
    low, high = ax.get_ylim()
    assert ax.get_ylabel() == "memory (MiB)" and peak < high < 1.5 * peak and low > 0
    assert any("capacity 4GiB" in t.get_text() and "above the scale" in t.get_text()
               for t in ax.get_legend().get_texts())
    near = run_scenario(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml", {"cluster.device.memory": "6GiB", "cluster.device.memory_reserved": "0B"}))
    ax = plots.memory_figure(near).axes[0]
    (capacity,) = [line for line in ax.get_lines() if line.get_label() == "capacity 6GiB"]
    assert list(capacity.get_ydata()) == [6, 6] and ax.get_ylim() == (0.0, pytest.approx(6 * 1.06))


def test_validation_memory_title_fits_in_its_figure():
    data = json.loads((REPO / "notebooks" / "data" / "validation_cpu.json").read_text())
    fig = plots.validation_memory_figure(ValidationReport.from_json(data["runs"][0]))
    fig.canvas.draw()
    box = fig.axes[0].title.get_window_extent()
    width, height = fig.canvas.get_width_height()
    assert box.x0 >= 0 and box.x1 <= width and box.y1 <= height


def test_sweep_legends_are_titled_with_their_axis_key():
    table = _table([
        {"cluster_devices": n, "throughput_samples_per_s": v, "model.hidden": h}
        for h, values in ((2048, (10.0, 20.0)), (4096, (5.0, 12.0))) for n, v in zip((8, 16), values)
    ])
    fig = plots.throughput_vs_gpus_figure(table, hue="model.hidden")
    assert fig.axes[0].get_legend().get_title().get_text() == "model.hidden"


def _communication_widths_ms(fig, colour):
    from matplotlib.colors import to_hex

    return [b.get_width() for b in _bars(fig.axes[0]) if to_hex(b.get_facecolor()) == colour]


@pytest.mark.parametrize("grad_reduce", [False, True])
def test_gantt_draws_exposed_communication_strong_and_hidden_faint(grad_reduce):
    """A data-parallel stage (F 1 s, B 2 s) whose all-reduce takes C alone: without overlap the
    lane's exposed bar is the whole all-reduce; bucketed (K = 4, C < B) only the last bucket
    after the backward, C/K, is exposed, and the reduction's span under the backward (from its
    first bucket, B/K in, to the backward's end) is drawn faint."""
    import dataclasses

    from conftest import synthetic_scenario
    from sim.core.overlap import OverlapSpec
    from sim.engine.rules import collective_alone_s
    from sim.engine.run import run_scenario
    from sim.report.plots.gantt import EXPOSED_COLOUR, HIDDEN_COLOUR

    scenario = synthetic_scenario(fwd_s=[1.0], bwd_s=[2.0], replicas=[2], microbatches=1, param_bytes=4e6,
                                  intra_bandwidth=4e6, stash_bytes=0.0)
    overlap = OverlapSpec(grad_reduce=grad_reduce, bucket_bytes=1e6)
    scenario = dataclasses.replace(scenario, plan=dataclasses.replace(scenario.plan, overlap=overlap))
    result = run_scenario(scenario, engine="fast")
    c_ms = collective_alone_s(result.workload.kinds, result.workload.collectives[0]) * 1e3
    assert 0 < c_ms < 2000.0  # shorter than the backward: hidden but for its last bucket when bucketed
    fig = plots.gantt_figure(result)
    exposed = _communication_widths_ms(fig, EXPOSED_COLOUR)
    hidden = _communication_widths_ms(fig, HIDDEN_COLOUR)
    rows = len(plots.rows_to_plot(result))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "gradient reduction, exposed" in labels
    if grad_reduce:
        assert exposed == pytest.approx([c_ms / 4] * rows)
        # issued once the first bucket is full (B/K in): under the backward from there to its end
        assert hidden == pytest.approx([2000.0 - 2000.0 / 4] * rows)
        assert "gradient reduction, hidden" in labels
    else:
        assert exposed == pytest.approx([c_ms] * rows) and hidden == []
    summary = result.summarize()
    assert summary.device(0).exposed_communication_s * 1e3 == pytest.approx(exposed[0])


def test_split_exposed_cuts_communication_where_compute_runs():
    from sim.engine.exposure import exposure_s, split_exposed

    communication, busy = [(0.0, 2.5), (3.0, 4.0), (1.0, 2.0)], [(1.0, 2.0), (3.0, 3.5), (6.0, 7.0)]
    exposed, hidden = split_exposed(communication, busy)
    assert exposed == [(0.0, 1.0), (2.0, 2.5), (3.5, 4.0)] and hidden == [(1.0, 2.0), (3.0, 3.5)]
    total, lost = exposure_s(communication, busy)
    assert sum(e - s for s, e in exposed) == lost and sum(e - s for s, e in exposed + hidden) == total


def test_chrome_trace_puts_group_collectives_on_their_own_thread():
    """FSDP's gathers (``sharding: full``) are group collectives: each forward's and backward's is
    a complete event on the device's ``group`` thread, spanning its collective's replay."""
    import dataclasses

    from conftest import synthetic_scenario
    from sim.core.parallelism import Sharding
    from sim.engine.run import run_scenario
    from sim.engine.trace import STREAM_THREADS, perfetto_trace
    from sim.engine.workload import GROUP

    scenario = synthetic_scenario(fwd_s=[1.0], bwd_s=[2.0], replicas=[2], microbatches=2, param_bytes=4e6,
                                  intra_bandwidth=4e6, stash_bytes=0.0)
    scenario = dataclasses.replace(scenario, plan=dataclasses.replace(scenario.plan, sharding=Sharding.FULL))
    result = run_scenario(scenario, engine="fast")
    trace = perfetto_trace(result)["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in trace if e["name"] == "thread_name" and e["tid"] == 4}
    assert names == {(0, "group"), (1, "group")}
    groups = [e for e in trace if e["ph"] == "X" and e["tid"] == STREAM_THREADS["group"] and e["pid"] == 0]
    cls, record = result.workload.classes[0], result.records[0]
    spans = [(s * 1e6, (e - s) * 1e6) for op, (s, e) in zip(cls.ops, record.op_times) if op.code == GROUP]
    assert len(groups) == 4  # F and B of two micro-batches gather again (reshard after forward)
    assert [(e["ts"], e["dur"]) for e in groups] == spans

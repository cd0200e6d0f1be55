"""What-if sweeps: points, rows, failures, reruns, and the same table on every executor."""

from __future__ import annotations

import json
from concurrent.futures import Executor, Future

import pytest
import yaml

from conftest import REPO, SCENARIOS

pd = pytest.importorskip("pandas")
from pandas.testing import assert_frame_equal  # noqa: E402

from planner.sweeps.run import SweepError, load_sweep, run_sweep, sweep_from_dict, sweep_points

BASE = str(SCENARIOS / "bert48_v100_2x8.yaml")


def _sweep(axes, **extra):
    return sweep_from_dict({"base": BASE, "axes": axes, **extra}, source="test.yaml")


def _write(tmp_path, data, name="sweep.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _no_wall(table):
    return table.drop(columns="wall_s")


# --- the sweep file ---------------------------------------------------------------------------


def test_example_sweep_is_the_product_of_its_axes_in_file_order():
    sweep = load_sweep(REPO / "sweeps" / "bert48_bandwidth.yaml")
    assert sweep.mode == "simulate" and sweep.engine == "simpy" and sweep.name == "bert48_bandwidth"
    assert sweep.axis_keys == ("cluster.inter_node.bandwidth", "plan.schedule")
    assert sweep_points(sweep) == [
        {"cluster.inter_node.bandwidth": bw, "plan.schedule": s}
        for bw in ("10Gb/s", "25Gb/s", "100Gb/s") for s in ("gpipe", "dapple")
    ]
    assert len({p.id for p in sweep.points}) == 6


def test_point_ids_depend_on_values_not_on_axis_order():
    a = _sweep({"plan.schedule": ["gpipe", "dapple"], "training.microbatch_size": [8, 16]})
    b = _sweep({"training.microbatch_size": [16, 8], "plan.schedule": ["dapple", "gpipe"]})
    assert {p.id for p in a.points} == {p.id for p in b.points}
    assert [p.id for p in a.points] != [p.id for p in b.points]  # but the order is the file's
    relabelled = _sweep({"plan.schedule": {"one-f-one-b": "dapple"}})
    plain = _sweep({"plan.schedule": ["dapple"]})
    assert relabelled.points[0].id != plain.points[0].id  # a new label is a new row


def test_labelled_axis_and_explicit_points_make_readable_columns():
    sweep = _sweep(
        {"plan": {"two-stage": {"schedule": "gpipe", "stages": [{"layers": [0, 27], "devices": "0-7"},
                                                               {"layers": [27, 53], "devices": "8-15"}]}}},
        points=[{"training.microbatch_size": 8}, {"training.microbatch_size": 16, "name": "big"}],
    )
    assert sweep.axis_keys == ("training.microbatch_size", "name", "plan")
    assert [dict(p.columns) for p in sweep.points] == [
        {"training.microbatch_size": 8, "plan": "two-stage"},
        {"training.microbatch_size": 16, "name": "big", "plan": "two-stage"},
    ]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"base": BASE, "axis": {}}, "test.yaml: axis: unknown key; did you mean 'axes'? valid: name, base, mode"),
        ({"axes": {}}, "test.yaml: base: missing"),
        ({"base": "nowhere.yaml"}, "test.yaml: base: cannot read scenario 'nowhere.yaml'"),
        ({"base": BASE, "mode": "simulated"}, "test.yaml: mode: unknown value 'simulated'; did you mean 'simulate'? valid: simulate, plan"),
        ({"base": BASE, "axes": {"cluster.inter_node.bandwith": ["10Gb/s"]}},
         "test.yaml: cluster.inter_node.bandwith: unknown key; did you mean 'bandwidth'?"),
        ({"base": BASE, "axes": {"cluster.intra.bandwidth": ["10Gb/s"]}}, "cluster.intra: unknown key"),
        ({"base": BASE, "axes": {"plan.schedule": ["gpipe", "dapplee"]}},
         "test.yaml: plan.schedule: plan.schedule.name: unknown value 'dapplee'"),
        ({"base": BASE, "axes": {"plan.schedule": "gpipe"}}, "test.yaml: axes.plan.schedule: must be a list of values"),
        ({"base": BASE, "axes": {"plan.schedule": []}}, "test.yaml: axes.plan.schedule: has no values"),
        ({"base": BASE, "axes": {"schedule": ["gpipe"]}}, "test.yaml: axes.schedule: 'schedule' is not a scenario key"),
        ({"base": BASE, "axes": {"planner": ["dapple"]}}, "'planner' is not a scenario key"),
        ({"base": BASE, "planner": "dapple"}, "test.yaml: planner: only for mode: plan"),
        ({"base": BASE, "mode": "plan", "engine": "fast"}, "test.yaml: engine: only for mode: simulate"),
        ({"base": BASE, "mode": "plan", "options": {"microbatch_size": [2]}},
         "test.yaml: options.microbatch_size: unknown planner option"),
        ({"base": BASE, "mode": "plan", "axes": {"planner": ["dapple", "magic"]}},
         "test.yaml: axes.planner[1]: unknown planner 'magic'"),
        ({"base": BASE, "axes": {"plan.stages.7.devices": [[0]]}},
         "test.yaml: plan.stages.7.devices: '7' is not an index"),
        ({"base": BASE, "axes": {"plan.schedule": ["gpipe"]}, "points": [{"plan.schedule": "dapple"}]},
         "test.yaml: points.plan.schedule: is also an axis"),
        ({"base": BASE, "plots": [{"figure": "oom_frontier", "colour": "red"}]},
         "test.yaml: plots[0].colour: unknown argument of oom_frontier"),
    ],
)
def test_bad_sweep_files_name_the_key(data, message):
    with pytest.raises(SweepError) as info:
        sweep_from_dict(data, source="test.yaml")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_command_line_rejects_a_bad_sweep_in_one_line(tmp_path, capsys):
    from planner.cli import main

    path = _write(tmp_path, {"base": BASE, "axes": {"cluster.inter_node.bandwith": ["10Gb/s"]}})
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cluster.inter_node.bandwith: unknown key" in err
    with pytest.raises(SystemExit) as info:
        main(["sweep", str(path)])
    assert info.value.code == 2


# --- rows ------------------------------------------------------------------------------------


def test_rows_hold_the_axis_values_and_the_summary_of_a_direct_replay():
    from sim.engine.run import run_scenario
    from sim.input.scenario import load_scenario

    sweep = _sweep({"cluster.inter_node.bandwidth": ["10Gb/s", "100Gb/s"], "plan.schedule": ["gpipe", "zb-h1"]})
    table = run_sweep(sweep, workers=1).table
    assert list(table.columns[:3]) == ["point", "cluster.inter_node.bandwidth", "plan.schedule"]
    assert list(table["point"]) == [p.id for p in sweep.points]
    for _, row in table.iterrows():
        overrides = {"cluster.inter_node.bandwidth": row["cluster.inter_node.bandwidth"],
                     "plan.schedule": row["plan.schedule"]}
        summary = run_scenario(load_scenario(BASE, overrides)).summary()
        assert row["iteration_time_s"] == summary["iteration_time_s"]
        assert row["peak_memory_bytes"] == summary["peak_memory_bytes"]
        assert row["bubble_fraction"] == summary["bubble_fraction"]
        assert row["schedule"] == summary["schedule"] == row["plan.schedule"]
        assert row["num_devices"] == 16 and row["num_microbatches"] == 8 and row["num_stages"] == 2
        assert row["model_name"] == "bert-48-pbs-2" and row["device_name"] == "V100-16GB"
        # what tensors may fill: the V100's 16 GiB less what the preset reserves (sim.cost.reserved)
        usable = load_scenario(BASE).cluster.device.usable_memory_bytes
        assert row["memory_capacity_bytes"] == usable < 16 * 2**30 and not row["oom"]
        assert pd.isna(row["error"]) and row["wall_s"] > 0
    slow, fast = table.iloc[0], table.iloc[2]  # gpipe at 10 Gb/s and at 100 Gb/s
    assert fast["iteration_time_s"] < slow["iteration_time_s"]


def test_out_of_memory_is_a_result_and_a_bad_point_an_error():
    sweep = _sweep({"cluster.device.memory": ["16GiB", "4GiB"], "training.microbatch_size": [16, 3]})
    table = run_sweep(sweep, workers=1).table
    fits, bad, small, bad_small = (table.iloc[i] for i in range(4))
    assert not fits["oom"] and pd.isna(fits["error"])
    assert small["oom"] and pd.isna(small["error"]) and small["oom_overshoot_bytes"] > 0
    assert small["oom_device"] in range(16) and small["iteration_time_s"] > 0
    for row in (bad, bad_small):
        assert "training" in row["error"] and "\n" not in row["error"]
        assert pd.isna(row["iteration_time_s"]) and pd.isna(row["oom"])


class _Exploding(Executor):
    """Futures that fail as if the worker process had died."""

    def submit(self, fn, /, *args, **kwargs):
        future = Future()
        future.set_exception(RuntimeError("worker lost"))
        return future


def test_a_dead_worker_fails_its_point_not_the_sweep():
    sweep = _sweep({"plan.schedule": ["gpipe", "dapple"]})
    table = run_sweep(sweep, executor=_Exploding()).table
    assert list(table["error"]) == ["worker failed: RuntimeError: worker lost"] * 2
    assert list(table["plan.schedule"]) == ["gpipe", "dapple"]


# --- the output folder -------------------------------------------------------------------------


class _Counting(Executor):
    """Runs calls in-process and counts them; raises KeyboardInterrupt after ``stop_after``."""

    def __init__(self, stop_after=None):
        self.calls, self.stop_after = 0, stop_after

    def submit(self, fn, /, *args, **kwargs):
        if self.stop_after is not None and self.calls >= self.stop_after:
            raise KeyboardInterrupt
        self.calls += 1
        future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def test_rerun_skips_points_done_and_gives_the_table_of_a_fresh_run(tmp_path):
    out = tmp_path / "out"
    small = _sweep({"plan.schedule": ["gpipe", "dapple"], "training.microbatch_size": [16, 3]})
    first = run_sweep(small, out, executor=_Counting())
    assert first.points_run == 4 and (out / "results.csv").is_file() and (out / "results.parquet").is_file()
    bigger = _sweep({"plan.schedule": ["gpipe", "dapple", "zb-h1"], "training.microbatch_size": [16, 3]})
    counting = _Counting()
    again = run_sweep(bigger, out, executor=counting)
    # 2 fitted points skipped; the 2 failed points are tried again, with the 2 new ones
    assert (again.points_skipped, again.points_run, counting.calls) == (2, 4, 4)
    fresh = run_sweep(bigger, workers=1)
    assert_frame_equal(_no_wall(again.table), _no_wall(fresh.table))
    from planner.sweeps.run import read_results

    assert_frame_equal(_no_wall(read_results(out)), _no_wall(fresh.table))
    csv = pd.read_csv(out / "results.csv")
    assert list(csv.columns) == list(fresh.table.columns) and len(csv) == 6


def test_an_interrupted_sweep_saves_what_ran_and_resumes(tmp_path):
    out = tmp_path / "out"
    sweep = _sweep({"plan.schedule": ["gpipe", "dapple", "zb-h1"], "training.microbatch_size": [8, 16]})
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, out, executor=_Counting(stop_after=3))
    from planner.sweeps.run import read_results

    assert len(read_results(out)) == 3
    resumed = run_sweep(sweep, out, executor=_Counting())
    assert (resumed.points_skipped, resumed.points_run) == (3, 3)
    assert_frame_equal(_no_wall(resumed.table), _no_wall(run_sweep(sweep, workers=1).table))


def test_an_output_folder_of_another_sweep_is_refused(tmp_path):
    out = tmp_path / "out"
    run_sweep(_sweep({"plan.schedule": ["gpipe"]}), out, workers=1)
    with pytest.raises(SweepError, match=r"\(engine was 'simpy', now 'fast'\); choose another --out"):
        run_sweep(_sweep({"plan.schedule": ["gpipe"]}, engine="fast"), out, workers=1)


# --- executors ---------------------------------------------------------------------------------

ACCEPTANCE = {  # 3 x 4 x 2 = 24 points, one of them failing
    "cluster.inter_node.bandwidth": ["10Gb/s", "25Gb/s", "100Gb/s"],
    "plan.schedule": ["gpipe", "dapple", {"name": "dapple", "policy": "2(s-i)-1"}, "zb-h1"],
    "training.microbatch_size": [16, 3],
}


def test_local_pool_and_dask_local_cluster_give_identical_tables():
    pytest.importorskip("dask.distributed")
    sweep = _sweep(ACCEPTANCE)
    pool = run_sweep(sweep, workers=2).table
    dask = run_sweep(sweep, workers=2, dask="local").table
    assert len(pool) == 24 and pool["error"].notna().sum() == 12
    assert_frame_equal(_no_wall(pool), _no_wall(dask))
    assert_frame_equal(_no_wall(pool), _no_wall(run_sweep(sweep, workers=1).table))


def test_unreachable_dask_scheduler_is_one_line(monkeypatch):
    pytest.importorskip("dask.distributed")
    monkeypatch.setattr("planner.sweeps.run.DASK_CONNECT_TIMEOUT_S", 1.0)
    with pytest.raises(SweepError, match="--dask tcp://127.0.0.1:9: cannot reach the scheduler"):
        run_sweep(_sweep({"plan.schedule": ["gpipe"]}), dask="tcp://127.0.0.1:9")


# --- plan mode and the command line -----------------------------------------------------------


@pytest.mark.slow  # 5 s: plans every row of a sweep
def test_plan_mode_rows_hold_a_plan_file_that_replays_to_the_same_time():
    from sim.engine.run import run_scenario
    from sim.input.scenario import load_scenario

    base = SCENARIOS / "paper" / "vgg19_v100_16x1.yaml"
    devices = {"16GiB": "V100-16GB", "1GiB": {"name": "V100-16GB", "memory": "1GiB", "memory_reserved": "0B"}}  # a labelled axis
    sweep = sweep_from_dict({"base": str(base), "mode": "plan", "options": {"microbatch_sizes": [32, 64]},
                             "axes": {"planner": ["dapple", "dp"], "cluster.device": devices}})
    table = run_sweep(sweep, workers=1).table
    assert list(table.columns[-6:]) == ["plan_description", "plan_placement", "plan_json", "planner_note",
                                        "error", "wall_s"]
    assert table["error"].isna().all()
    small = table[table["cluster.device"] == "1GiB"].set_index("planner")
    # VGG-19's states alone are over 1 GiB: both planners shard (and recompute) until a plan fits
    for planner in ("dapple", "dp"):
        assert not small.loc[planner, "oom"] and small.loc[planner, "peak_memory_bytes"] <= 2**30
    assert small.loc["dp", "plan_json"] and '"sharding"' in small.loc["dp", "plan_json"]
    for _, row in table[table["cluster.device"] == "16GiB"].iterrows():
        plan = json.loads(row["plan_json"])
        assert row["microbatch_size"] in (32, 64) and not row["oom"]
        replay = run_scenario(load_scenario(base, plan=plan)).summary()
        assert replay["iteration_time_s"] == pytest.approx(row["iteration_time_s"], rel=1e-12)
    dapple, dp = table.iloc[0], table.iloc[2]
    assert dapple["iteration_time_s"] <= dp["iteration_time_s"]


def test_command_line_sweep_writes_tables_and_plots_and_reruns(tmp_path, capsys):
    from planner.cli import main

    path = _write(tmp_path, {"base": BASE, "axes": {"training.global_batch_size": [64, 2048],
                                                    "plan.schedule": ["gpipe", "dapple"]},
                             "plots": [{"figure": "memory_vs_microbatches", "hue": "plan.schedule"}]})
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "sweep: 4 points (4 run, 0 already done)" in text and "1 out of memory, 0 failed" in text
    assert "OUT OF MEMORY" in text and "memory_vs_microbatches.png" in text
    assert (out / "memory_vs_microbatches.png").stat().st_size > 5000
    assert main(["sweep", str(path), "--out", str(out), "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert (counts["run"], counts["skipped"], counts["oom"], counts["failed"]) == (0, 4, 1, 0)


def test_command_line_sweep_exits_1_when_a_point_failed(tmp_path, capsys):
    from planner.cli import main

    path = _write(tmp_path, {"base": BASE, "axes": {"training.microbatch_size": [16, 3]}})
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "1 failed" in out and "error: " in out


TINY_MLP_NO_MICROBATCH = """\
name: tiny-mlp
cluster:
  nodes: 1
  devices_per_node: 2
  device: {name: cpu-core, memory: 2GiB, peak_flops: 50GFLOP/s, peak_fp32_flops: 50GFLOP/s, memory_bandwidth: 10GB/s}
  intra_node: {bandwidth: 2GB/s, latency: 30us}
  inter_node: {bandwidth: 1GB/s, latency: 50us}
model: {preset: mlp, layers: 4, hidden: 64, input_size: 32, num_classes: 10, dtype: fp32, optimizer: sgd}
training:
  global_batch_size: 12
"""


def test_plan_mode_sweep_takes_a_base_without_microbatch_size_as_dapple_plan_does(tmp_path, capsys):
    from planner.cli import main

    (tmp_path / "base.yaml").write_text(TINY_MLP_NO_MICROBATCH)
    path = _write(tmp_path, {"base": "base.yaml", "mode": "plan",
                             "axes": {"training.global_batch_size": [12, 24]}})
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    assert "2 run, 0 already done" in capsys.readouterr().out
    table = pd.read_csv(out / "results.csv")
    assert table["error"].isna().all()
    # each row's micro-batch size is the planner's choice: it divides the row's global batch
    for _, row in table.iterrows():
        assert row["training.global_batch_size"] % row["microbatch_size"] == 0 and not row["oom"]

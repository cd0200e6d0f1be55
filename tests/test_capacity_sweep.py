"""A capacity sweep: the run columns of each point and the time-and-cost figure."""

from __future__ import annotations

import math

import pandas as pd

from conftest import REPO
from planner.sweeps.file import load_sweep
from planner.sweeps.run import run_sweep, sweep_from_dict, write_plots
from sim.report.plots.capacity import minimum_cost_time

TINY = REPO / "scenarios" / "gpt_tiny_cpu.yaml"


def test_points_carry_days_gpu_hours_cost_and_goodput_and_the_figure_marks_the_minimum(tmp_path):
    sweep = sweep_from_dict({
        "base": str(TINY), "mode": "simulate", "engine": "fast",
        "points": [{"training.steps": 1_000_000, "cluster.price_per_gpu_hour": 3.0,
                    "reliability": {"gpu_mtbf_h": 1000, "checkpoint": {"write_bandwidth": "1GB/s"}, "restart_s": 60}}],
        "axes": {"cluster.nodes": [1, 2, 4]},
        "plots": [{"figure": "time_and_cost_vs_gpus", "file": "tc.png"}],
    }, source="s.yaml", base_dir=tmp_path)
    table = run_sweep(sweep, workers=1).table
    assert table["error"].isna().all()
    for _, row in table.iterrows():
        days = 1_000_000 * row["iteration_time_s"] / 86400
        assert math.isclose(row["days"], days, rel_tol=1e-12)
        assert math.isclose(row["gpu_hours"], row["cluster_devices"] * days * 24, rel_tol=1e-12)
        assert math.isclose(row["cost"], 3.0 * row["expected_gpu_hours"], rel_tol=1e-12)
        assert row["expected_days"] > row["days"] and 0 < row["goodput"] < 1
        assert math.isclose(row["goodput"], row["days"] / row["expected_days"], rel_tol=1e-9)
    # the plan uses 2 devices whatever the cluster: more servers only add idle GPUs to pay for
    gpus, used = minimum_cost_time(table)
    product = table["expected_days"] * table["cost"]
    assert used == "cost" and gpus == table.loc[product.idxmin(), "cluster_devices"] == 2
    (path,) = write_plots(sweep, table, tmp_path)
    assert path.name == "tc.png" and path.stat().st_size > 10_000


def test_a_point_without_a_run_length_leaves_the_run_columns_empty():
    sweep = sweep_from_dict({"base": str(TINY), "mode": "simulate", "axes": {"cluster.nodes": [1]}},
                            source="s.yaml", base_dir=TINY.parent)
    row = run_sweep(sweep, workers=1).table.iloc[0]
    assert pd.isna(row["days"]) and pd.isna(row["cost"]) and pd.isna(row["goodput"])


def test_the_shipped_capacity_sweep_plans_64_to_512_gpus_with_a_run_length_and_a_price():
    sweep = load_sweep(REPO / "sweeps" / "capacity_70b.yaml")
    assert sweep.mode == "plan" and [dict(p.settings)["cluster.nodes"] for p in sweep.points] == [8, 16, 32, 64]
    assert all(dict(p.settings)["training"]["tokens"] == "15T" for p in sweep.points)

"""Issue 35's rough edges, each as a new user met it: what a log, a usage line, a CSV or an
override should say, and says now."""

from __future__ import annotations

from conftest import SCENARIOS
from planner.cli import main as plan_main

BERT = str(SCENARIOS / "bert48_v100_2x8.yaml")


def test_dapple_plan_v_says_the_device_classes_a_few_times_not_once_per_replay(capsys):
    # the dp planner alone replays 8 candidates on the fast path and 2 in SimPy: 10 INFO lines before
    assert plan_main([BERT, "-v", "--planner", "dp"]) == 0
    err = capsys.readouterr().err
    assert "plan with dp" in err  # -v did turn INFO on
    assert sum("devices in" in line for line in err.splitlines()) <= 2

"""``dapple-sim schedule``: the new names, per-stage policies and torch's CSV."""

from __future__ import annotations

import pytest

from sim.app.cli import main
from sim.schedule import generate, lower, parse_csv, to_csv


def test_schedule_prints_an_overlapped_pair(capsys) -> None:
    assert main(["schedule", "dualpipe-v", "--stages", "2", "--microbatches", "4"]) == 0
    assert capsys.readouterr().out == str(generate("dualpipe-v", 2, 4)) + "\n"


@pytest.mark.parametrize("lowered", [False, True])
def test_schedule_csv_is_torch_s_pipeline_order(capsys, lowered) -> None:
    args = ["schedule", "zb-v", "--stages", "2", "--microbatches", "4", "--csv"] + (["--lower"] if lowered else [])
    assert main(args) == 0
    out = capsys.readouterr().out
    expected = generate("zb-v", 2, 4)
    expected = lower(expected) if lowered else expected
    assert out == to_csv(expected)
    assert parse_csv(out, name="zb-v") == expected


def test_schedule_takes_a_policy_per_stage(capsys) -> None:
    assert main(["schedule", "dapple", "--stages", "3", "--microbatches", "6", "--policy", "2(s-i)-1,s-i,s-i"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "0F0 0F1 0F2 0F3 0F4 0B0 0F5 0B1 0B2 0B3 0B4 0B5"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["dualpipe-v", "--stages", "4", "--microbatches", "4"], "dualpipe-v: num_microbatches=4 is fewer than"),
        (["dapple", "--stages", "4", "--microbatches", "8", "--policy", "s-i,2(s-i)-1,s-i,s-i"], "which deadlocks"),
        (["dapple", "--stages", "2", "--microbatches", "4", "--policy", "auto"], "'auto' is decided per stage"),
    ],
)
def test_schedule_errors_are_one_line(capsys, args, message) -> None:
    assert main(["schedule", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1


def test_schedule_rejects_an_unknown_policy_and_grid_with_csv(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["schedule", "dapple", "--stages", "2", "--microbatches", "4", "--policy", "greedy"])
    assert "invalid policy 'greedy'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["schedule", "gpipe", "--stages", "2", "--microbatches", "4", "--csv", "--grid"])

"""``dapple-run`` end to end: a checked run through torchrun, failures that name the rank and
the action, inputs rejected before any process starts, and the profiler's outputs loading
in the simulator."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import SCENARIOS

GPT = str(SCENARIOS / "gpt_tiny_cpu.yaml")


def _dapple_run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "runtime", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_help_explains_the_commands():
    result = _dapple_run("--help")
    assert result.returncode == 0
    assert "run" in result.stdout and "profile" in result.stdout and "torchrun" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((GPT, "--nproc", "3"), "the plan uses 2 devices (0-1) but 3 processes were launched; use --nproc 2"),
        ((GPT,), "--nproc: missing"),
        ((SCENARIOS / "bert48_v100_2x8.yaml", "--nproc", "16"), "model.profile: a measured profile has no layers"),
        ((GPT, "--nproc", "2", "--set", "plan.schedule=gpipe2"), "plan.schedule"),
        ((GPT, "--nproc", "2", "--fail-at", "one"), "--fail-at 'one'"),
    ],
    ids=["nproc-mismatch", "nproc-missing", "profile-model", "bad-schedule", "bad-fail-at"],
)
def test_bad_input_is_one_line_before_any_process_starts(tmp_path, args, message):
    out = tmp_path / "never"
    result = _dapple_run("run", *args, "--out", out)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert message in result.stderr
    assert not out.exists()  # nothing was launched


@pytest.mark.dist
def test_a_checked_run_end_to_end(checked_tiny_run):
    # run GPT --nproc 2 --steps 2 --json --check --out DIR (conftest.py; test_cli_outputs.py reads its trace)
    result, out = checked_tiny_run
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary == json.loads((out / "summary.json").read_text())  # --json prints rank 0's summary as written
    assert len(summary["iteration_times_s"]) == 2 and summary["median_iteration_time_s"] > 0
    assert summary["max_abs_grad_diff"] < 1e-6 and summary["check_passed"]
    assert summary["loss"] == pytest.approx(summary["reference_loss"], rel=1e-5)
    assert [d["device"] for d in summary["devices"]] == [0, 1]
    assert all(d["peak_memory_bytes"] > d["peak_activation_bytes"] > 0 for d in summary["devices"])
    # the event rows are in events.csv (the simulator's columns); trace.json is a Chrome trace of them
    import csv

    with open(summary["events_csv"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {r["action"] for r in rows if r["device"] == "1"} >= {"1RECV_F0", "1F0", "1B0", "1SEND_B0", "OPTIM"}
    trace = json.loads(Path(summary["trace"]).read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 1} >= {"1F0", "OPTIM"}


@pytest.mark.dist
@pytest.mark.parametrize(("fail_at", "expected"), [("1:1B1", "rank 1 failed at action 1B1 (step 0): RuntimeError"),
                                                   # each launch is 7 s: the two other ways to fail run under -m slow
                                                   pytest.param("0:0F2:exit", "rank 0 died at step 0 0F2",
                                                                marks=pytest.mark.slow),
                                                   # stopped from outside: the survivor only lost its peer
                                                   pytest.param("1:1B1:term", "rank 1 died at step 0 1B1 (exit code -15)",
                                                                marks=pytest.mark.slow)],
                         ids=["raises", "dies", "terminated"])
def test_a_failing_rank_stops_every_rank_and_is_named(tmp_path, fail_at, expected):
    start = time.monotonic()
    result = _dapple_run("run", GPT, "--nproc", 2, "--steps", 1, "--fail-at", fail_at, "--out", tmp_path, timeout=90)
    assert time.monotonic() - start < 60
    assert result.returncode == 1
    assert expected in result.stderr, result.stderr
    assert "stopped: rank" in result.stderr  # where the other rank was when torchrun stopped it
    assert result.stderr.count("\n") == 1


TP2_PP2 = ("--set", "cluster.devices_per_node=4", "--set", "plan.tensor_parallel=2",
           "--set", "plan.stages=[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 6], devices: [2, 3]}]")


@pytest.mark.slow  # 4 torchrun workers; the report's logic for 4 ranks is tested without processes below
@pytest.mark.parametrize(("fail_at", "expected"), [
    ("1:0F1:exit", "rank 1 died at step 0 0F1 (exit code 17)"),  # rank 0 waits inside a tensor-parallel collective
    ("1:0F1", "rank 1 failed at action 0F1 (step 0): RuntimeError"),
    ("1:0F1:stop", "rank 1 stopped responding at step 0 0F1 (its process was frozen; killed)"),
], ids=["dies", "raises", "frozen"])
def test_a_rank_failing_inside_a_tensor_parallel_collective_stops_every_rank(tmp_path, fail_at, expected):
    start = time.monotonic()
    result = _dapple_run("run", GPT, "--nproc", 4, *TP2_PP2, "--steps", 1, "--fail-at", fail_at, "--out", tmp_path,
                         timeout=120)
    assert time.monotonic() - start < 60
    assert result.returncode == 1
    assert expected in result.stderr, result.stderr
    assert "stopped: rank 0 at step 0 0F1" in result.stderr  # its tensor-parallel partner, inside the collective
    assert result.stderr.count("\n") == 1


@pytest.mark.slow
def test_a_frozen_rank_is_killed_and_named_within_a_minute(tmp_path):
    # rank 1 freezes (SIGSTOP); rank 0 times out waiting for it (--timeout 45 s by default), and
    # the launcher kills the stopped process, which torchrun's SIGTERM cannot end
    start = time.monotonic()
    result = _dapple_run("run", GPT, "--nproc", 2, "--steps", 1, "--fail-at", "1:1B1:stop", "--out", tmp_path,
                         timeout=120)
    assert time.monotonic() - start < 60
    assert result.returncode == 1
    assert "rank 1 stopped responding at step 0 1B1 (its process was frozen; killed)" in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.slow
def test_a_tensor_parallel_profile_measures_one_group_and_its_collectives(tmp_path):
    from runtime.commands.cli import main
    from sim.input.scenario import load_scenario

    overrides = [word for pair in zip(TP2_PP2[::2], TP2_PP2[1::2]) for word in pair]
    overrides += ["--set", "plan.sequence_parallel=true"]
    assert main(["profile", GPT, *overrides, "--out", str(tmp_path), "--warmup", "1", "--repeats", "2"]) == 0
    collectives = json.loads((tmp_path / "collectives.json").read_text())
    assert {row["kind"] for row in collectives} == {"all-gather", "reduce-scatter"}  # sequence parallelism's
    assert all(row["ranks"] == 2 and row["seconds"] > 0 for row in collectives)
    scenario = load_scenario(tmp_path / "scenario.yaml")  # one device per tensor-parallel group
    assert [list(stage.devices) for stage in scenario.plan.stages] == [[0], [1]]
    whole = load_scenario(GPT).model
    # one device's share: a block's parameters split over 2 but its norms' and output biases'
    assert whole.layers[1].param_bytes / 2 < scenario.model.layers[1].param_bytes < whole.layers[1].param_bytes * 0.6
    assert "all-gather of" in (tmp_path / "scenario.yaml").read_text()


def test_profile_loads_in_the_simulator(tmp_path):
    from runtime.commands.cli import main
    from sim.input.profiles import load_profile
    from sim.input.scenario import load_scenario, parse_scenario

    assert main(["profile", GPT, "--out", str(tmp_path), "--warmup", "1", "--repeats", "2"]) == 0
    spec = load_scenario(GPT).model
    profile = load_profile(tmp_path / "profile.txt", profile_batch_size=4)
    assert [layer.name for layer in profile.layers] == [layer.name for layer in spec.layers]
    assert [layer.param_bytes for layer in profile.layers] == [layer.param_bytes for layer in spec.layers]
    assert all(layer.fwd_s > 0 and layer.bwd_s > 0 for layer in profile.layers)
    detail = json.loads((tmp_path / "profile.json").read_text())
    assert all(layer["stash_bytes"] > 0 for layer in detail["layers"])
    scenario = yaml.safe_load(Path(GPT).read_text())
    scenario["cluster"] = yaml.safe_load((tmp_path / "cluster.yaml").read_text())["cluster"]
    cluster = parse_scenario(yaml.safe_dump(scenario)).cluster
    assert cluster.intra_node.bandwidth_bytes_per_s > 0 and cluster.intra_node.latency_s > 0
    # on a CPU the links also say what sending and receiving cost the ranks' compute
    links = json.loads((tmp_path / "links.json").read_text())
    assert len(links["send_issue_s"]) == len(links["sizes_bytes"]) == len(links["recv_s"])
    assert cluster.intra_node.send_overhead_s == pytest.approx(links["send_issue_s"][0], rel=1e-3)
    assert cluster.intra_node.send_overhead_s > 0 and cluster.intra_node.recv_overhead_s >= 0
    measured = load_scenario(tmp_path / "scenario.yaml")
    assert measured.model.num_layers == spec.num_layers and measured.plan == load_scenario(GPT).plan
    # the collectives the plan kinds call, fitted over 2 and 4 ranks (runtime.measure.collectives)
    fits = measured.cluster.intra_node.collectives.fits
    assert sorted({(f.kind, f.ranks) for f in fits}) == [
        (kind, ranks) for kind in ("all-gather", "all-reduce", "broadcast") for ranks in (2, 4)
    ] + [("point-to-point", 2), ("reduce-scatter", 2), ("reduce-scatter", 4), ("ring-shift", 2), ("ring-shift", 4)]
    assert cluster.intra_node.collectives == measured.cluster.intra_node.collectives


_TORCHRUN_REPORT = """Failures:
[1]:
  time      : 2026-11-29_16:40:00
  host      : box
  rank      : {other} (local_rank: {other})
  exitcode  : {other_code} (pid: 11)
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_16:40:00
  host      : box
  rank      : {first} (local_rank: {first})
  exitcode  : {first_code} (pid: 10)
"""


@pytest.mark.parametrize(("raised", "first_code", "other_code", "expected"), [
    (True, 1, -15, "rank 1 failed at action 1B1"),   # the other rank was stopped by torchrun
    (False, 17, -15, "rank 1 died at step 0 1B1 (exit code 17)"),
    (True, 1, -9, "rank 0 died at step 0 0RECV_B1 (exit code -9)"),  # a kill is a cause
    # both ended by SIGTERM, no one raised: torchrun observed rank 1 first, so it was stopped first
    (False, -15, -15, "rank 1 died at step 0 1B1 (exit code -15)"),
], ids=["raised-and-stopped", "crashed-and-stopped", "raised-and-killed", "all-stopped"])
def test_the_cause_of_a_failure_is_the_rank_torchrun_did_not_stop(tmp_path, capsys, raised, first_code,
                                                                  other_code, expected):
    from runtime.commands.cli import _report_failure
    from runtime.execution.status import StatusBoard, write_failure

    for rank, action in ((0, "0RECV_B1"), (1, "1B1")):
        board = StatusBoard(tmp_path, rank)
        board.set(0, action)
        board.close()
    if raised:
        write_failure(tmp_path, 1, "rank 1 failed at action 1B1 (step 0): RuntimeError")
    (tmp_path / "torchrun.log").write_text(_TORCHRUN_REPORT.format(first=1, first_code=first_code, other=0,
                                                                   other_code=other_code))
    assert _report_failure(tmp_path, 1) == 1
    assert expected in capsys.readouterr().err


_FOUR_RANK_REPORT = """Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : 17 (pid: 11)
[2]:
  rank      : 2 (local_rank: 2)
  exitcode  : -15 (pid: 12)  (SIGTERM)
[3]:
  rank      : 3 (local_rank: 3)
  exitcode  : -15 (pid: 13)  (SIGTERM)
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 10)
"""


def test_a_crash_is_the_cause_when_torchrun_stops_the_bystanders_of_four_ranks(tmp_path, capsys):
    # rank 1 died inside a tensor-parallel step; its partner rank 0 raised on the lost
    # connection; torchrun SIGTERMed ranks 2 and 3, which are not the cause
    from runtime.commands.cli import _report_failure
    from runtime.execution.status import StatusBoard, write_failure

    for rank, action in ((0, "0F1"), (1, "0F1"), (2, "1F0"), (3, "1F0")):
        board = StatusBoard(tmp_path, rank)
        board.set(0, action)
        board.close()
    write_failure(tmp_path, 0, "rank 0 failed at action 0F1 (step 0): RuntimeError: Connection closed by peer")
    (tmp_path / "torchrun.log").write_text(_FOUR_RANK_REPORT)
    assert _report_failure(tmp_path, 1) == 1
    assert "rank 1 died at step 0 0F1 (exit code 17)" in capsys.readouterr().err


def _links(device, sizes):
    from runtime.measure.bandwidth import measure_links

    return measure_links(device, sizes=sizes, repeats=2)


@pytest.mark.dist
def test_link_measurement_on_three_ranks_agrees_everywhere():
    # ranks 0 and 1 measure; rank 2 keeps every barrier company, so nobody waits forever
    from runtime.execution.launch import spawn

    results = spawn(_links, 3, (4, 4096), timeout_s=60)
    assert results[0] == results[1] == results[2]
    assert len(results[0]["send_issue_s"]) == 2 and results[0]["send_overhead_s"] > 0

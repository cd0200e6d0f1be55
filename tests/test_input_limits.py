"""Limits and ranges of what users write (issue 21): each fix, one specification.

The readers (``sim.core.userfiles``), the YAML loader (``sim.input.yaml_text``), the message
helpers (``sim.input.strict``), the ranges of the cluster, fault and profile readers, sweeps,
calibration CSVs and the JSON writer (``sim.core.jsonio``). ``test_hostile_input`` fuzzes the same
classes through the command lines.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from conftest import SCENARIOS
from sim.core.errors import DappleError, ScenarioError
from sim.core.userfiles import open_output, read_user_file, show_path, user_file_problem
from sim.input.scenario import load_scenario, parse_scenario
from sim.input.strict import show_value
from sim.input.yaml_text import MAX_DEPTH, MAX_NODES, check_nesting, load_yaml

TINY = SCENARIOS / "gpt_tiny_cpu.yaml"


def _tiny(replace: dict[str, str]) -> str:
    """The tiny CPU scenario's text with each ``old`` replaced by ``new``."""
    text = TINY.read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


# --- reading files -------------------------------------------------------------------------------


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "/dev/full"])
def test_a_device_is_refused_without_reading_it(special):
    with pytest.raises(DappleError, match=rf"^{special}: cannot read scenario file \(it is a character device"):
        read_user_file(special, "scenario file")


def test_a_fifo_a_folder_a_loop_and_a_long_name_are_one_line(tmp_path):
    fifo, loop = tmp_path / "fifo", tmp_path / "loop"
    os.mkfifo(fifo)
    os.symlink(loop, loop)
    with pytest.raises(DappleError, match=r"it is a FIFO \(named pipe\), not a file"):
        read_user_file(fifo, "scenario file")  # opened without blocking
    with pytest.raises(DappleError, match=r"it is a folder, not a file"):
        read_user_file(tmp_path, "scenario file")
    with pytest.raises(DappleError, match=r"a loop of symbolic links"):
        read_user_file(loop, "scenario file")
    long = tmp_path / ("x" * 300)
    with pytest.raises(DappleError, match=r"File name too long") as info:
        read_user_file(long, "scenario file")
    assert len(str(info.value)) < 250 and show_path(long) in str(info.value)
    with pytest.raises(DappleError, match=r"NUL byte"):
        read_user_file("a\0b", "scenario file")
    assert user_file_problem(fifo).startswith("it is a FIFO")


def test_a_file_over_its_limit_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (5 * 2**20))
    with pytest.raises(ScenarioError, match=r"scenario file is 5.0 MiB, over the limit of 4.0 MiB"):
        load_scenario(big)
    assert read_user_file(big, "profile", max_bytes=16 * 2**20).startswith("#")


def test_outputs_that_are_not_regular_files_are_refused(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for target, reason in ((fifo, "FIFO"), (tmp_path, "folder"), (Path("/dev/full"), "character device")):
        with pytest.raises(DappleError, match=reason), open_output(target, "summary") as handle:
            handle.write("{}")
    with open_output(tmp_path / "ok.json", "summary") as handle:
        handle.write("{}")
    assert (tmp_path / "ok.json").read_text() == "{}"


# --- YAML ----------------------------------------------------------------------------------------


def _bomb(levels: int) -> str:
    parts = ["&a0 [x, x, x, x, x, x, x, x, x, x]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def test_an_alias_bomb_is_refused_while_it_is_read():
    with pytest.raises(ScenarioError, match=rf"run.yaml: at line 1, column \d+: more than {MAX_NODES:,} values"):
        load_yaml(f"name: {_bomb(9)}", where="run.yaml")
    assert len(load_yaml(f"name: {_bomb(3)}", where="run.yaml")["name"]) == 3  # 1 110 values: fine


def test_nesting_cycles_long_numbers_and_bad_dates_are_one_line():
    for text, problem in [
        ("a: " + "[" * 500 + "]" * 500, f"nested deeper than {MAX_DEPTH}"),
        ("a: &x [" + "[" * 40 + "]" * 40 + "]\nb: [[[[[[[[[[[[[[[[[[[[[[[[[[*x]]]]]]]]]]]]]]]]]]]]]]]]]]", "nested deeper"),
        ("a: &a [*a]", "inside the node it names"),
        ("a: " + "9" * 5000, "a number of 5000 characters"),
        ("a: 2001-13-45", "is not a valid !!timestamp; write a date"),
        ("a: [1,", "not valid YAML at line 2, column 1"),
    ]:
        with pytest.raises(ScenarioError, match="^f.yaml: ") as info:
            load_yaml(text, where="f.yaml")
        assert problem in str(info.value) and "\n" not in str(info.value)
    check_nesting([[[1]]], where="plan.json")
    with pytest.raises(ScenarioError, match="nested deeper than"):
        deep: list = []
        for _ in range(100):
            deep = [deep]
        check_nesting(deep, where="plan.json")


def test_show_value_never_expands_a_value():
    value: list = ["x"] * 10
    for _ in range(9):
        value = [value] * 10  # 10^10 items, as a YAML alias bomb builds them
    started = time.process_time()
    shown = show_value(value)
    assert time.process_time() - started < 1.0 and len(shown) <= 60 and shown.startswith("[[[[")
    assert show_value(10**300) == "<an integer of 301 digits>" and "over 3900 digits" in show_value(10**5000)
    assert show_value({"name": "dapple", "policy": "2(s-i)-1"}) == "{'name': 'dapple', 'policy': '2(s-i)-1'}"


# --- numbers and their ranges ----------------------------------------------------------------------


@pytest.mark.parametrize("key, value, problem", [
    ("matmul_half_dim", "1.0e+308", "must be a number in [0, 1e+06]"),
    ("matmul_half_dim", "-1", "must be a number in [0, 1e+06]"),
    ("memory_efficiency", "0", "must be a number in [0.01, 1]"),
    ("memory_efficiency", ".inf", "must be a number in [0.01, 1]"),
    ("efficiency", ".nan", "must be a number in [0.01, 1]"),
    ("efficiency", "9" * 99, "got <an integer of 99 digits>"),
    ("kernel_overhead", "2s", "must be from 0s to 1s"),
    ("memory", "1e400GB", "not a finite bytes"),
    ("memory", "1KiB", "must be from 1MiB to 1PiB"),
    ("peak_flops", "1e30FLOP/s", "must be from 1GFLOP/s to 1000PFLOP/s"),
])
def test_device_numbers_have_ranges(key, value, problem):
    given = {"memory": "memory: 4GiB", "peak_flops": "peak_flops: 50GFLOP/s, peak_fp32"}
    if key in given:
        text = _tiny({given[key]: given[key].replace(given[key].split(": ")[1].split(",")[0], value)})
    else:
        text = _tiny({"memory_bandwidth: 10GB/s}": f"memory_bandwidth: 10GB/s, {key}: {value}}}"})
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, source="run.yaml", base_dir=SCENARIOS)
    assert str(info.value).startswith(f"run.yaml: cluster.device.{key}: ") and problem in str(info.value)


@pytest.mark.parametrize("replace, key, problem", [
    ({"bandwidth: 2GB/s": "bandwidth: 1e-320B/s"}, "cluster.intra_node.bandwidth", "from 1B/s to 1PB/s"),
    ({"latency: 30us": "latency: 1e308s"}, "cluster.intra_node.latency", "from 0s to 10s"),
    ({"nodes: 1": "nodes: 200000"}, "cluster.nodes", "from 1 to 100,000"),
])
def test_link_and_cluster_numbers_have_ranges(replace, key, problem):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(_tiny(replace), source="run.yaml", base_dir=SCENARIOS)
    assert str(info.value).startswith(f"run.yaml: {key}: ") and problem in str(info.value)


@pytest.mark.parametrize("fault, problem", [
    ("{type: straggler, device: 1, slowdown: 1.0e+308}", "faults[0].slowdown: must be a number in [1, 1000]"),
    ("{type: straggler, device: 1, slowdown: 0.5}", "faults[0].slowdown: must be a number in [1, 1000]"),
    ("{type: slow_link, device: 1, factor: 5.0e-324}", "faults[0].factor: must be a number in [0.001, 1]"),
    ("{type: failure, device: 1, at: 1e9s}", "faults[0].at: must be from 0s to 1e6s"),
    ("{type: jitter, seed: " + "9" * 40 + "}", "faults[0].seed: must be an integer from 0 to"),
])
def test_fault_numbers_have_ranges(fault, problem):
    with pytest.raises(ScenarioError, match="^run.yaml: ") as info:
        parse_scenario(TINY.read_text() + f"faults: [{fault}]\n", source="run.yaml", base_dir=SCENARIOS)
    assert problem in str(info.value)


def test_device_lists_are_counted_before_ranges_are_expanded():
    started = time.process_time()
    with pytest.raises(ScenarioError, match=r"plan.stages\[1\].devices: lists more device ids than the cluster's 2"):
        parse_scenario(_tiny({"devices: [1]": 'devices: "' + ", ".join(["0-1"] * 200_000) + '"'}),
                       source="run.yaml", base_dir=SCENARIOS)
    assert time.process_time() - started < 5.0
    with pytest.raises(ScenarioError, match=r"cannot read '²'"):
        parse_scenario(_tiny({"devices: [1]": 'devices: "²"'}), source="run.yaml", base_dir=SCENARIOS)


def _profile(tmp_path: Path, lines: str) -> str:
    (tmp_path / "p.txt").write_text(lines)
    text = TINY.read_text()
    assert "  tied_embeddings: false\n" in text  # a generator's parameter, not a profile's
    text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("  vocab_divisible_by:"))
    return (text.replace("  tied_embeddings: false\n", "")
            .replace("  preset: gpt\n  layers: 4\n  hidden: 64\n  heads: 4\n  seq_len: 32\n  vocab: 128\n  dtype: fp32\n",
                     f"  profile: {tmp_path / 'p.txt'}\n  profile_batch_size: 1\n")
            .replace("layers: [0, 3]", "layers: [0, 1]").replace("layers: [3, 6]", "layers: [1, 2]"))


def test_a_profile_of_zeros_or_of_1e308_bytes_is_refused(tmp_path):
    node = "node{n} -- l{n} -- forward_compute_time={t}, backward_compute_time={t}, activation_size=1, parameter_size={p}\n"
    zeros = node.format(n=1, t=0, p=0) + node.format(n=2, t=0, p=0) + "\tnode1 -- node2\n"
    with pytest.raises(ScenarioError, match="times add up to 0 ms"):
        parse_scenario(_profile(tmp_path, zeros), source="run.yaml")
    huge = node.format(n=1, t=1, p="1e308") + node.format(n=2, t=1, p=0) + "\tnode1 -- node2\n"
    with pytest.raises(ScenarioError, match=r"parameter_size '1e308' must be .* at most 1 PiB"):
        parse_scenario(_profile(tmp_path, huge), source="run.yaml")
    fine = node.format(n=1, t=1, p=0) + node.format(n=2, t=1, p=0) + "\tnode1 -- node2\n"
    assert parse_scenario(_profile(tmp_path, fine), source="run.yaml").model.num_layers == 2


# --- command lines -------------------------------------------------------------------------------


def test_set_errors_name_the_file_and_bound_what_they_echo(capsys):
    from sim.app.cli import main

    for item, expected in [("nokey", "--set 'nokey': write KEY=VALUE"), ("=1", "--set '=1': write KEY=VALUE"),
                           ("k" * 100_000 + "=1", "kkk..."), ("name=[1,", "--set name: not valid YAML"),
                           ("name=" + "[" * 600 + "]" * 600, "nested deeper than 64")]:
        assert main(["check", str(TINY), "--set", item]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"dapple-sim: error: {TINY}: ") and err.count("\n") == 1, err[:300]
        assert expected in err and len(err) < 400


def test_simulate_out_refuses_a_folder_a_device_and_a_loop_where_a_file_goes(tmp_path, capsys):
    from sim.app.cli import main

    for kind in ("folder", "device", "loop"):
        out = tmp_path / kind
        out.mkdir()
        target = out / "summary.json"
        if kind == "folder":
            target.mkdir()
        else:
            os.symlink("/dev/full" if kind == "device" else target, target)
        assert main(["simulate", str(TINY), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"dapple-sim: error: {target}: cannot write summary.json (") and err.count("\n") == 1


def test_a_plan_file_with_nan_deep_nesting_or_a_huge_number_is_one_line(tmp_path, capsys):
    from sim.app.cli import main

    for text, problem in [('{"stages": [], "num_microbatches": NaN}', "NaN is not a number"),
                          ("[" * 100_000 + "]" * 100_000, "nested too deep"),
                          ('{"num_microbatches": ' + "9" * 5000 + "}", "a number of 5000 characters")]:
        plan = tmp_path / "plan.json"
        plan.write_text(text)
        assert main(["check", str(TINY), "--plan", str(plan)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"dapple-sim: error: {plan}: ") and problem in err and err.count("\n") == 1


def test_calibration_csv_cells_are_ascii_integers_and_rows_are_bounded(tmp_path):
    from sim.report.analysis.calibrate import read_runs

    header = "hidden,heads,layers,seq_len,vocab,microbatch_size,global_batch_size,tp,dp,pp,recompute,iteration_time_s\n"
    csv = tmp_path / "runs.csv"
    csv.write_text(header + "64,4,2,32,128,²,8,1,1,1,0,0.01\n")
    with pytest.raises(DappleError, match=r"runs.csv:2: microbatch_size: '²' must be a positive integer"):
        read_runs(csv)
    csv.write_text(header + "64,4,2,32,128,2,8,1,1,1,0,0.01\n" * 10_001)
    with pytest.raises(DappleError, match=r"more than 10,000 runs"):
        read_runs(csv)
    csv.write_text(header + '"' + "x" * 200_000 + '",4,2,32,128,2,8,1,1,1,0,0.01\n')
    with pytest.raises(DappleError, match=r"not a readable CSV"):
        read_runs(csv)


# --- sweeps --------------------------------------------------------------------------------------


def _sweep_error(tmp_path: Path, body: str) -> str:
    from planner.sweeps.file import SweepError, load_sweep

    path = tmp_path / "s.yaml"
    path.write_text(f"base: {TINY}\n{body}")
    with pytest.raises(SweepError) as info:
        load_sweep(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


def test_a_sweep_is_counted_before_its_points_are_made(tmp_path):
    axes = "axes:\n" + "".join(f"  training.k{i}: [{', '.join(map(str, range(10)))}]\n" for i in range(10))
    started = time.process_time()
    assert "= 10,000,000,000 points, more than max_points (100,000)" in _sweep_error(tmp_path, axes)
    assert time.process_time() - started < 5.0
    assert "more than max_points (10)" in _sweep_error(tmp_path, "max_points: 10\n" + axes)
    assert "max_points: must be an integer from 1 to 1,000,000" in _sweep_error(tmp_path, "max_points: 0\n")


def test_sweep_values_and_plots_are_checked_before_any_point_runs(tmp_path):
    assert "axes.planner[0]: unknown planner ['dapple']" in _sweep_error(tmp_path, "mode: plan\naxes: {planner: [[dapple]]}\n")
    assert "is out of range" in _sweep_error(tmp_path, "axes: {training.global_batch_size: [" + "9" * 30 + "]}\n")
    plot = "axes: {training.microbatch_size: [4, 8]}\nplots: [{figure: memory_vs_microbatches, %s}]\n"
    assert "plots[0].hue: 'nope' is not a column of the table" in _sweep_error(tmp_path, plot % "hue: nope")
    assert "plots[0].hue: must be str or None, got True" in _sweep_error(tmp_path, plot % "hue: true")
    assert "plots[0].file: must be a file name" in _sweep_error(tmp_path, plot % "file: ../x.png")
    assert "needs a planner axis" in _sweep_error(tmp_path, "plots: [{figure: planner_comparison}]\n")


def test_a_sweep_base_with_a_nul_byte_or_in_a_loop_is_one_line(tmp_path):
    from planner.sweeps.file import SweepError, sweep_from_dict

    loop = tmp_path / "loop.yaml"
    os.symlink(loop, loop)
    for base, reason in (("a\0b", "NUL byte"), (str(loop), "loop of symbolic links"), ("/dev/zero", "character device")):
        with pytest.raises(SweepError, match=rf"^s.yaml: base: cannot read scenario .*{reason}"):
            sweep_from_dict({"base": base}, source="s.yaml", base_dir=tmp_path)


def test_point_ids_are_the_hash_of_their_settings_as_before():
    import hashlib

    from planner.sweeps.file import load_sweep

    for path in sorted((SCENARIOS.parent / "sweeps").glob("*.yaml")):
        sweep = load_sweep(path)
        for point in sweep.points:
            entries = [[k, v, c] for (k, v), (_, c) in zip(point.settings, point.columns)]
            identity = json.dumps(sorted(entries), sort_keys=True, default=str)
            assert point.id == hashlib.sha256(identity.encode()).hexdigest()[:16]


# --- JSON out -------------------------------------------------------------------------------------


def test_json_output_never_holds_nan_or_infinity(tmp_path):
    from sim.core.jsonio import dumps, write_json

    assert dumps({"a": [1.5, None]}, sort_keys=True) == '{"a": [1.5, null]}'
    with pytest.raises(DappleError, match=r"^summary.json: devices\[1\].idle_s is inf, not a finite number"):
        dumps({"devices": [{"idle_s": 0.0}, {"idle_s": float("inf")}]}, what="summary.json")
    with pytest.raises(DappleError, match=r"nan"):
        write_json(tmp_path / "x.json", {"x": float("nan")})
    assert not (tmp_path / "x.json").exists()  # nothing half-written


@pytest.mark.slow  # 17 s: loads every shipped scenario, the 16,384-GPU ones too; tests/test_scenarios.py loads the top-level ones by default
def test_shipped_scenarios_and_sweeps_are_within_every_limit():
    from sim.app.published import read_suite

    for path in sorted(SCENARIOS.rglob("*.yaml")):
        if path.name == "suite.yaml":  # the published-runs suite, which names scenarios
            assert read_suite(path)
            continue
        # scenarios/scale/ holds the planner's inputs at scale: no plan, so no micro-batch size
        load_scenario(path, ignore_plan=path.parent.name == "scale")
    assert yaml.safe_load(TINY.read_text()) == load_yaml(TINY.read_text(), where=str(TINY))


def test_a_million_device_ids_are_refused_where_the_limit_is_reached(tmp_path):
    import re

    path = tmp_path / "million.yaml"
    path.write_text(_tiny({"devices: [1]": "devices: [" + ", ".join(["1"] * 1_000_000) + "]"}))
    with pytest.raises(ScenarioError, match=rf"million.yaml: at line \d+, column \d+: more than {MAX_NODES:,}") as info:
        load_scenario(path)
    column = int(re.search(r"column (\d+)", str(info.value))[1])
    assert column < 1_000_000  # stopped at the 250 000th value, a quarter of the way into the 3 MB list

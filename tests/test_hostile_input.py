"""Hostile input (issue 21): every class ends in one line naming the file and exit code 2.

Each class is a hypothesis strategy of cases: YAML alias bombs, nesting hundreds deep, huge
and edge numbers, paths longer than the file system allows, special files (``/dev/zero``, a
FIFO, a folder, a symbolic-link loop), outputs that cannot be written, sweeps of billions of
points, and measured-run CSVs with bad cells. A case runs a command line in this process
(``sim.app.cli.main``, ``planner.cli.main``) under a 10 s alarm (a hang guard: it never
fires unless a read blocks or a loop does not end) with ``tracemalloc`` counting the peak of
Python's memory. A case is refused when it exits 2 with one line on stderr that names the
file at fault; a case that may also be valid (an edge number in its range) may instead
succeed, and then every JSON it wrote must be strict JSON (no ``NaN``, no ``Infinity``).

The default suite runs ``CASES`` cases per class (about 30 s in all); ``-m slow`` runs ten
times as many.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import tempfile
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import SCENARIOS
from sim.core.userfiles import show_path

CASES = 12
HANG_S = 10
MEMORY_BYTES = 500 * 2**20
TINY = SCENARIOS / "gpt_tiny_cpu.yaml"
TINY_RAW = yaml.safe_load(TINY.read_text())
CALIBRATION_BASE = SCENARIOS / "calibration" / "cpu_base.yaml"
CSV_HEADER = "hidden,heads,layers,seq_len,vocab,microbatch_size,global_batch_size,tp,dp,pp,recompute,iteration_time_s"
CSV_ROW = ["64", "4", "2", "32", "128", "2", "8", "1", "1", "1", "0", "0.01"]


# --- running a command line ---------------------------------------------------------------------


class _Hung(Exception):
    pass


@dataclass
class Outcome:
    rc: int | str
    out: str
    err: str
    peak_bytes: int


def run(command: str, argv: list[str], *, trace_memory: bool = True) -> Outcome:
    """Run ``dapple-sim`` (``command="sim"``) or ``dapple-plan`` with ``argv`` in this process;
    with ``trace_memory``, ``peak_bytes`` is the peak that tracemalloc saw (tracing every
    allocation makes the run, and a first import of matplotlib or pandas, several times slower:
    callers that do not bound the peak turn it off; ``peak_bytes`` is then 0)."""
    from planner.cli import main as plan_main
    from sim.app.cli import main as sim_main

    main = sim_main if command == "sim" else plan_main
    out, err = io.StringIO(), io.StringIO()

    def hung(signum, frame):
        raise _Hung()

    previous = signal.signal(signal.SIGALRM, hung)
    if trace_memory:
        tracemalloc.start()
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc: int | str = main(argv)
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else 2
    except _Hung:
        rc = f"hung for {HANG_S} s"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        peak = tracemalloc.get_traced_memory()[1] if trace_memory else 0
        if trace_memory:
            tracemalloc.stop()
    return Outcome(rc=rc, out=out.getvalue(), err=err.getvalue(), peak_bytes=peak)


def assert_refused(outcome: Outcome, *names: str | Path) -> None:
    """Exit 2, one line on stderr that names one of ``names`` (as messages show a path)."""
    lines = outcome.err.splitlines()
    assert outcome.rc == 2, (outcome.rc, outcome.err[-2000:])
    assert len(lines) == 1, outcome.err[:2000]
    assert "Traceback" not in outcome.err
    assert len(lines[0]) <= 2100, lines[0][:300]
    shown = [show_path(str(name)) for name in names]
    assert any(name in lines[0] for name in shown), (shown, lines[0][:500])
    assert outcome.peak_bytes < MEMORY_BYTES, outcome.peak_bytes


def assert_refused_or_strict(outcome: Outcome, folder: Path, *names: str | Path) -> None:
    """Refused as above, or a success whose stdout and written files hold strict JSON only."""
    if outcome.rc != 0:
        assert_refused(outcome, *names)
        return
    assert outcome.peak_bytes < MEMORY_BYTES
    assert_strict_json(outcome.out)
    for path in folder.rglob("*.json"):
        assert_strict_json(path.read_text())


def _no_constant(name: str):
    raise AssertionError(f"{name} in JSON output")


def assert_strict_json(text: str) -> None:
    if text.strip():
        json.loads(text, parse_constant=_no_constant)


def write_scenario(folder: Path, raw: dict, name: str = "scenario.yaml", extra: str = "") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False) + extra)
    return path


def bomb(levels: int, width: int) -> str:
    """A YAML flow list whose aliases expand to ``width ** levels`` items ("billion laughs")."""
    parts = [f"&a0 [{', '.join(['x'] * width)}]"]
    parts += [f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def nested(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "list" else "{a: " * depth + "1" + "}" * depth


FUZZ = settings(max_examples=CASES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
MANY = settings(max_examples=10 * CASES, deadline=None, suppress_health_check=list(HealthCheck))

Case = Callable[[Path], None]
"""A case: given an empty folder, writes its files, runs its command and checks the outcome."""


# --- the classes ---------------------------------------------------------------------------------


@st.composite
def alias_bombs(draw) -> Case:
    levels, width = draw(st.integers(6, 9)), draw(st.integers(10, 12))  # 10^6 to 5 * 10^9 items
    where = draw(st.sampled_from(["name", "nodes", "batch", "devices", "faults", "set", "sweep_axis", "sweep_name",
                                  "sweep_point"]))
    value = bomb(levels, width)

    def case(folder: Path) -> None:
        text = TINY.read_text()
        if where.startswith("sweep"):
            body = {"sweep_axis": f"axes:\n  name: {value}\n", "sweep_name": f"name: {value}\n",
                    "sweep_point": f"points:\n  - {{name: {value}}}\n"}[where]
            sweep = folder / "sweep.yaml"
            sweep.write_text(f"base: {TINY}\n{body}")
            assert_refused(run("plan", ["sweep", str(sweep), "--out", str(folder / "out"), "--workers", "1"]), sweep)
            return
        if where == "set":
            assert_refused(run("sim", ["check", str(TINY), "--set", f"training.global_batch_size={value}"]), TINY)
            return
        text = {"name": text.replace("name: gpt-tiny-cpu", f"name: {value}"),
                "nodes": text.replace("nodes: 1", f"nodes: {value}"),
                "batch": text.replace("global_batch_size: 16", f"global_batch_size: {value}"),
                "devices": text.replace("devices: [1]", f"devices: {value}"),
                "faults": text + f"faults: {value}\n"}[where]
        path = folder / "bomb.yaml"
        path.write_text(text)
        assert_refused(run("sim", ["check", str(path)]), path)

    return case


@st.composite
def deep_nesting(draw) -> Case:
    depth = draw(st.integers(65, 3000))
    kind = draw(st.sampled_from(["list", "mapping"]))
    where = draw(st.sampled_from(["file", "set", "plan_json", "sweep", "profile_key"]))

    def case(folder: Path) -> None:
        if where == "set":
            assert_refused(run("sim", ["check", str(TINY), "--set", f"plan.stages={nested(depth, kind)}"]), TINY)
        elif where == "plan_json":
            plan = folder / "plan.json"
            plan.write_text('{"stages": ' + "[" * depth + "]" * depth + "}")
            assert_refused(run("sim", ["check", str(TINY), "--plan", str(plan)]), plan)
        elif where == "sweep":
            sweep = folder / "sweep.yaml"
            sweep.write_text(f"base: {TINY}\naxes:\n  name: [{nested(depth, kind)}]\n")
            assert_refused(run("plan", ["sweep", str(sweep), "--out", str(folder / "out"), "--workers", "1"]), sweep)
        else:
            path = folder / "deep.yaml"
            key = "model" if where == "profile_key" else "cluster"
            path.write_text(TINY.read_text().replace(f"{key}:\n", f"{key}:\n  deep: {nested(depth, kind)}\n", 1))
            assert_refused(run("sim", ["check", str(path)]), path)

    return case


NUMBER_KEYS = [
    ("cluster", "nodes"), ("cluster", "devices_per_node"), ("cluster", "device", "memory"),
    ("cluster", "device", "peak_flops"), ("cluster", "device", "memory_bandwidth"),
    ("cluster", "device", "efficiency"), ("cluster", "device", "matmul_half_dim"),
    ("cluster", "device", "memory_efficiency"), ("cluster", "device", "kernel_overhead"),
    ("cluster", "device", "kernel_issue"), ("cluster", "intra_node", "collective_efficiency"),
    ("cluster", "intra_node", "bandwidth"), ("cluster", "intra_node", "latency"),
    ("cluster", "inter_node", "send_overhead"), ("model", "hidden"), ("model", "vocab"),
    ("training", "global_batch_size"), ("faults", 0, "slowdown"), ("faults", 0, "from"),
]
UNITS = {"memory": "B", "peak_flops": "FLOP/s", "memory_bandwidth": "B/s", "bandwidth": "B/s", "kernel_overhead": "s",
         "kernel_issue": "s", "latency": "s", "send_overhead": "s", "from": "s"}
EDGE_NUMBERS = ["0", "-1", "1", "0.01", "1.0e+308", "-1.0e+308", "5.0e-324", "1.0e-320", ".inf", "-.inf", ".nan",
                "1000", "1000000", "1.0e+15", "1.0e+18", "9" * 19, "9" * 99, "9" * 101, "9" * 400, "9" * 5000]


@st.composite
def edge_numbers(draw) -> Case:
    path = draw(st.sampled_from(NUMBER_KEYS))
    number = draw(st.sampled_from(EDGE_NUMBERS))
    quoted = draw(st.booleans()) and path[-1] in UNITS
    engine = draw(st.sampled_from(["check", "simpy", "fast"]))

    def case(folder: Path) -> None:
        raw = yaml.safe_load(TINY.read_text())
        raw["faults"] = [{"type": "straggler", "device": 1, "slowdown": 1.5}]
        node = raw
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = "@NUMBER@"
        text = yaml.safe_dump(raw, sort_keys=False)
        value = f"'{number}{UNITS[path[-1]]}'" if quoted and not number.startswith(".") else number
        scenario = folder / "numbers.yaml"
        scenario.write_text(text.replace("'@NUMBER@'", value))
        argv = ["check", str(scenario), "--json"] if engine == "check" else \
            ["simulate", str(scenario), "--json", "--engine", engine]
        assert_refused_or_strict(run("sim", argv), folder, scenario)

    return case


@st.composite
def long_paths(draw) -> Case:
    parts = draw(st.booleans())  # one name over 255 bytes, or names of a legal length over PATH_MAX (4096) in all
    length = draw(st.integers(4097, 9000) if parts else st.integers(256, 6000))
    where = draw(st.sampled_from(["scenario", "plan", "profile", "schedule_file", "sweep", "sweep_base", "out",
                                  "sweep_out", "csv"]))

    def case(folder: Path) -> None:
        name = "x" * length if not parts else "/".join(["y" * 200] * (length // 201 + 1))
        long = str(folder / name) + ".yaml"
        if where == "scenario":
            assert_refused(run("sim", ["check", long]), long)
        elif where == "plan":
            assert_refused(run("sim", ["check", str(TINY), "--plan", long]), long)
        elif where == "csv":
            assert_refused(run("sim", ["calibrate", str(CALIBRATION_BASE), "--fit", long]), long)
        elif where in ("profile", "schedule_file"):
            raw = yaml.safe_load(TINY.read_text())
            if where == "profile":
                raw["model"] = {"profile": long, "profile_batch_size": 1}
            else:
                raw["plan"]["schedule_file"] = long
                raw["plan"].pop("schedule")
            scenario = write_scenario(folder, raw)
            assert_refused(run("sim", ["check", str(scenario)]), scenario)
        elif where in ("sweep", "sweep_base"):
            sweep = folder / "sweep.yaml"
            sweep.write_text(f"base: {long}\n")
            target = long if where == "sweep" else sweep
            argv = ["sweep", long if where == "sweep" else str(sweep), "--out", str(folder / "out"), "--workers", "1"]
            assert_refused(run("plan", argv), target)
        elif where == "out":
            assert_refused(run("sim", ["simulate", str(TINY), "--out", long]), long)
        else:
            sweep = folder / "sweep.yaml"
            sweep.write_text(f"base: {TINY}\naxes: {{training.microbatch_size: [4]}}\n")
            assert_refused(run("plan", ["sweep", str(sweep), "--out", long, "--workers", "1"]), long)

    return case


def _special(folder: Path, kind: str) -> Path:
    """A path that is not a regular file: a device, a FIFO, a folder, a symbolic-link loop, a NUL byte."""
    if kind.startswith("/dev/"):
        return Path(kind)
    path = folder / f"special_{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "loop":
        os.symlink(path, path)
    elif kind == "big":
        with open(path, "w") as handle:
            handle.write("name: big\n# " + "x" * (17 * 2**20) + "\n")
    return path


SPECIALS = ["/dev/zero", "/dev/urandom", "/dev/full", "fifo", "folder", "loop", "big"]


@st.composite
def special_files(draw) -> Case:
    kind = draw(st.sampled_from(SPECIALS))
    where = draw(st.sampled_from(["scenario", "plan", "profile", "schedule_file", "sweep", "sweep_base", "csv"]))

    def case(folder: Path) -> None:
        special = _special(folder, kind)
        if where == "scenario":
            assert_refused(run("sim", ["check", str(special)]), special)
        elif where == "plan":
            assert_refused(run("sim", ["check", str(TINY), "--plan", str(special)]), special)
        elif where == "csv":
            assert_refused(run("sim", ["calibrate", str(CALIBRATION_BASE), "--fit", str(special)]), special)
        elif where in ("profile", "schedule_file"):
            raw = yaml.safe_load(TINY.read_text())
            if where == "profile":
                raw["model"] = {"profile": str(special), "profile_batch_size": 1}
            else:
                raw["plan"]["schedule_file"] = str(special)
                raw["plan"].pop("schedule")
            scenario = write_scenario(folder, raw)
            assert_refused(run("sim", ["check", str(scenario)]), scenario)
        elif where == "sweep":
            argv = ["sweep", str(special), "--out", str(folder / "out"), "--workers", "1"]
            assert_refused(run("plan", argv), special)
        else:
            sweep = folder / "sweep.yaml"
            sweep.write_text(f"base: {special}\n")
            assert_refused(run("plan", ["sweep", str(sweep), "--out", str(folder / "out"), "--workers", "1"]), sweep)

    return case


@st.composite
def unwritable_outputs(draw) -> Case:
    kind = draw(st.sampled_from(["folder", "/dev/full", "fifo", "loop"]))
    command = draw(st.sampled_from(["simulate", "sweep"]))
    name = draw(st.sampled_from(["summary.json", "trace.json", "events.csv"] if command == "simulate"
                                else ["sweep.json", "results.csv"]))

    def case(folder: Path) -> None:
        out = folder / "out"
        out.mkdir()
        target = out / name
        if kind == "/dev/full":
            os.symlink("/dev/full", target)
        elif kind == "loop":
            os.symlink(target, target)
        else:
            (_special(folder, kind)).rename(target)
        if command == "simulate":
            assert_refused(run("sim", ["simulate", str(TINY), "--out", str(out)]), target, out)
        else:
            sweep = folder / "sweep.yaml"
            sweep.write_text(f"base: {TINY}\naxes: {{training.microbatch_size: [4]}}\n")
            outcome = run("plan", ["sweep", str(sweep), "--out", str(out), "--workers", "1"])
            if kind == "folder":
                assert_refused(outcome, target, out)
            else:  # a sweep's tables are written beside and moved into place: the link or FIFO is replaced
                assert outcome.rc == 0, outcome.err
                assert target.is_file() and not target.is_symlink()

    return case


@st.composite
def huge_sweeps(draw) -> Case:
    values = draw(st.integers(2, 12))
    fewest = next(n for n in range(1, 40) if values ** n > 100_000)
    axes = fewest + draw(st.integers(0, 4))  # 10^5 to 10^10 points and beyond
    style = draw(st.sampled_from(["axes", "points", "max_points", "bad_max_points", "plot_column", "plot_type",
                                  "unhashable", "overflow"]))
    bad_limit = draw(st.sampled_from(["0", "-5", "1.5", "true", "[1]", "2000000", "9" * 50]))

    def case(folder: Path) -> None:
        body = "axes:\n" + "".join(f"  training.k{i}: [{', '.join(map(str, range(values)))}]\n" for i in range(axes))
        if style == "points":
            body = "points: [" + ", ".join(["{name: a}"] * values) + "]\n" + body
        elif style == "max_points":
            body = "max_points: 1000000\n" + body if values ** axes > 1_000_000 else "max_points: 10\n" + body
        elif style == "bad_max_points":
            body = f"max_points: {bad_limit}\n" + "axes: {name: [a]}\n"
        elif style == "plot_column":
            body = "axes: {training.microbatch_size: [4, 8]}\nplots: [{figure: memory_vs_microbatches, hue: nope}]\n"
        elif style == "plot_type":
            body = "axes: {training.microbatch_size: [4, 8]}\nplots: [{figure: memory_vs_microbatches, hue: true}]\n"
        elif style == "unhashable":
            body = "mode: plan\naxes:\n  planner: [[dapple]]\n"
        elif style == "overflow":
            body = "axes: {training.global_batch_size: [" + "9" * (19 + axes) + "]}\n"
        sweep = folder / "sweep.yaml"
        sweep.write_text(f"base: {TINY}\n{body}")
        assert_refused(run("plan", ["sweep", str(sweep), "--out", str(folder / "out"), "--workers", "1"]), sweep)

    return case


BAD_INTEGER_CELLS = ["²", "٣", "-1", "0", "1.5", "", "1e3", "99999999999", "9" * 5000, "0x10", "1 2", "inf", "nan",
                     "\x00", "x" * 1000]
BAD_TIME_CELLS = ["", "nan", "inf", "-1", "0", "1e400", "9" * 400, "x", "1e7", "\x00", "0x1p3"]
BAD_FLAG_CELLS = ["2", "maybe", "", "tru", "\x00"]


@st.composite
def bad_csv_cells(draw) -> Case:
    style = draw(st.sampled_from(["cell", "cell", "cell", "rows", "field", "missing", "nul"]))
    column = draw(st.integers(0, len(CSV_ROW) - 1))
    cells = BAD_TIME_CELLS if column == 11 else BAD_FLAG_CELLS if column == 10 else BAD_INTEGER_CELLS
    cell = draw(st.sampled_from(cells))
    good_rows = draw(st.integers(0, 3))

    def case(folder: Path) -> None:
        row = list(CSV_ROW)
        row[column] = cell
        lines = [CSV_HEADER] + [",".join(CSV_ROW)] * good_rows
        if style == "cell":
            lines.append(",".join('"' + c.replace('"', '""') + '"' for c in row))
        elif style == "rows":
            lines += [",".join(CSV_ROW)] * 10_001
        elif style == "field":
            lines.append('"' + "x" * 200_000 + '",' + ",".join(CSV_ROW[1:]))
        elif style == "missing":
            lines[0] = CSV_HEADER.replace(CSV_HEADER.split(",")[column], "other")
        else:
            lines.append(",".join(CSV_ROW) + "\x00")
        csv = folder / "runs.csv"
        csv.write_text("\n".join(lines) + "\n")
        assert_refused(run("sim", ["calibrate", str(CALIBRATION_BASE), "--fit", str(csv)]), csv)

    return case


CLASSES = {
    "alias_bombs": alias_bombs(), "deep_nesting": deep_nesting(), "edge_numbers": edge_numbers(),
    "long_paths": long_paths(), "special_files": special_files(), "unwritable_outputs": unwritable_outputs(),
    "huge_sweeps": huge_sweeps(), "bad_csv_cells": bad_csv_cells(),
}


def _run_case(case: Case) -> None:
    with tempfile.TemporaryDirectory() as folder:
        case(Path(folder))


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_hostile_input_is_refused_in_one_line(name):
    @FUZZ
    @given(case=CLASSES[name])
    def check(case):
        _run_case(case)

    check()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_much_more_hostile_input_is_refused_in_one_line(name):
    @MANY
    @given(case=CLASSES[name])
    def check(case):
        _run_case(case)

    check()


# --- accepted edge inputs: strict JSON only -------------------------------------------------------

EDGES_IN_RANGE = {
    ("cluster", "device", "memory"): ["1MiB", "1PiB"],
    ("cluster", "device", "peak_flops"): ["1GFLOP/s", "1000PFLOP/s"],
    ("cluster", "device", "peak_fp32_flops"): ["1GFLOP/s", "1000PFLOP/s"],
    ("cluster", "device", "memory_bandwidth"): ["1B/s", "1PB/s"],
    ("cluster", "device", "efficiency"): [0.01, 1],
    ("cluster", "device", "memory_efficiency"): [0.01, 1],
    ("cluster", "device", "matmul_half_dim"): [0, 1000000],
    ("cluster", "device", "kernel_overhead"): ["0s", "1s"],
    ("cluster", "device", "kernel_issue"): ["0s", "1s"],
    ("cluster", "device", "action_overhead"): ["0s", "1s"],
    ("cluster", "intra_node", "collective_efficiency"): [0.01, 1],
    ("cluster", "intra_node", "bandwidth"): ["1B/s", "1PB/s"],
    ("cluster", "intra_node", "latency"): ["0s", "10s"],
    ("cluster", "intra_node", "send_overhead"): ["0s", "1s"],
    ("cluster", "intra_node", "send_bandwidth"): ["1B/s", "1PB/s"],
    ("cluster", "intra_node", "recv_overhead"): ["0s", "1s"],
    ("model", "hidden"): [64, 65536],
    ("model", "seq_len"): [32, 1000000],
    ("model", "vocab"): [128, 16777216],  # 2**24, sim.models.params._MAX_SIZE,
}
FAULTS_IN_RANGE = [
    [], [{"type": "straggler", "device": 1, "slowdown": 1000}], [{"type": "straggler", "device": 0, "slowdown": 1}],
    [{"type": "straggler", "device": 1, "slowdown": 1000, "from": "1e6s"}],
    [{"type": "slow_link", "device": 1, "factor": 0.001}], [{"type": "jitter", "spread": 10, "seed": 2**63 - 1}],
    [{"type": "jitter", "spread": 10, "distribution": "lognormal"}],
    [{"type": "jitter", "spread": 0.999, "distribution": "uniform"}],
    [{"type": "failure", "device": 1, "at": "0s"}], [{"type": "failure", "device": 0, "at": "1e6s"}],
]


@st.composite
def accepted_edges(draw) -> tuple[dict, str]:
    raw = yaml.safe_load(TINY.read_text())
    for path, values in EDGES_IN_RANGE.items():
        if draw(st.integers(0, 2)) == 0:  # about a third of the keys at an end of their range
            node = raw
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = draw(st.sampled_from(values))
    raw["faults"] = draw(st.sampled_from(FAULTS_IN_RANGE))
    failure = any(f["type"] == "failure" for f in raw["faults"])
    return raw, "simpy" if failure else draw(st.sampled_from(["simpy", "fast"]))


def _check_written_json(raw: dict, engine: str, out: bool) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        scenario = write_scenario(folder, raw)
        for argv in (["check", str(scenario), "--json"],
                     ["simulate", str(scenario), "--json", "--engine", engine] + (["--out", str(folder / "out")]
                                                                                  if out else [])):
            outcome = run("sim", argv, trace_memory=False)  # no memory bound here: strict JSON is the point
            assert outcome.rc == 0, outcome.err[-2000:]  # every number is in its range: the scenario runs
            assert_strict_json(outcome.out)
        for path in folder.rglob("*.json"):
            assert_strict_json(path.read_text())


def _slowest() -> dict:
    """Every device and link number at its slow end of its range, and a 1000x straggler."""
    raw = yaml.safe_load(TINY.read_text())
    for path, values in EDGES_IN_RANGE.items():
        if path[0] == "cluster":
            raw["cluster"][path[1]][path[2]] = values[0] if path[2] not in ("efficiency", "memory_efficiency") \
                else 0.01
    raw["cluster"]["device"]["memory"] = "1PiB"
    raw["faults"] = FAULTS_IN_RANGE[1]
    return raw


@settings(max_examples=CASES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(case=accepted_edges(), out=st.integers(0, 5))
@example(case=(_slowest(), "simpy"), out=0)
def test_no_json_written_for_accepted_edge_inputs_holds_nan_or_infinity(case, out):
    raw, engine = case
    _check_written_json(raw, engine, out=out == 0)  # --out (plots are slow) one time in six


@pytest.mark.slow
@settings(max_examples=10 * CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=accepted_edges(), out=st.integers(0, 5))
def test_much_more_accepted_edge_input_writes_strict_json(case, out):
    raw, engine = case
    _check_written_json(raw, engine, out=out == 0)

"""What the commands write and say, as a user reads it: every trace.json a Chrome trace,
-v/-q on every command, progress on a terminal only, plans printed as the files write them,
a validation report whose headline its rows explain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SCENARIOS
from planner.cli import schedule_text
from terminal import run_on_a_terminal

GPT = str(SCENARIOS / "gpt_tiny_cpu.yaml")
BERT = str(SCENARIOS / "bert48_v100_2x8.yaml")


def assert_chrome_trace(path: Path) -> None:
    """``path`` is trace-event JSON that ui.perfetto.dev and chrome://tracing open: a
    ``traceEvents`` list; complete events with a name, pid, tid and non-negative ts and dur
    in microseconds; metadata naming processes and threads; counters with a pid and ts."""
    data = json.loads(path.read_text())
    assert isinstance(data, dict) and isinstance(data["traceEvents"], list), path
    events = data["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert complete, f"{path}: no complete (ph: X) events"
    for event in events:
        assert event["ph"] in ("X", "M", "C"), event
        assert isinstance(event["pid"], int), event
        if event["ph"] == "X":
            assert isinstance(event["name"], str) and isinstance(event["tid"], int)
            assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0
        elif event["ph"] == "M":
            assert event["name"] in ("process_name", "thread_name") and event["args"]["name"]
        else:
            assert event["ts"] >= 0 and event["args"]
    named = {(e["pid"], e.get("tid")) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in complete} <= named  # every track has a name


def _threads(path: Path) -> dict[str, int]:
    events = json.loads(path.read_text())["traceEvents"]
    return {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}


def test_simulate_writes_a_chrome_trace(tmp_path):
    from sim.app.cli import main

    for name in ("bert48_v100_2x8.yaml", "gpt1.3b_h100_interleaved.yaml", "bert48_v100_straggler.yaml"):
        out = tmp_path / name
        assert main(["simulate", str(SCENARIOS / name), "--out", str(out), "-q"]) == 0
        assert_chrome_trace(out / "trace.json")


def test_measured_trace_has_the_simulators_layout(tmp_path):
    from runtime.measure.trace import measured_trace, write_events
    from sim.engine.run import run_scenario
    from sim.engine.trace import perfetto_trace
    from sim.input.scenario import load_scenario

    result = run_scenario(load_scenario(GPT))
    rows = [row.to_json() for row in result.event_rows()]  # measured rows travel as their JSON
    (tmp_path / "measured.json").write_text(json.dumps(measured_trace(rows, metadata={"step": 3})))
    (tmp_path / "predicted.json").write_text(json.dumps(perfetto_trace(result)))
    for side in ("measured", "predicted"):
        assert_chrome_trace(tmp_path / f"{side}.json")
    assert _threads(tmp_path / "measured.json") == _threads(tmp_path / "predicted.json")
    measured = json.loads((tmp_path / "measured.json").read_text())
    assert measured["metadata"] == {"source": "measured", "step": 3}
    first = next(e for e in measured["traceEvents"] if e["ph"] == "X")
    assert first["ts"] == pytest.approx(rows[0]["start_s"] * 1e6)
    write_events(rows, tmp_path / "events.csv")
    header = (tmp_path / "events.csv").read_text().splitlines()[0]
    assert header == ",".join(result.events().columns)  # the simulator's events.csv columns


@pytest.mark.slow  # 24 s of gloo runs; test_measured_trace_has_the_simulators_layout checks the layout by default
@pytest.mark.dist
def test_run_and_validate_write_chrome_traces(tmp_path, checked_tiny_run, capsys):
    from runtime.commands.run import print_run

    # run GPT --nproc 2 --steps 2 --check --json --out DIR, launched once (conftest.py)
    run, out = checked_tiny_run
    assert run.returncode == 0, run.stderr
    assert_chrome_trace(out / "trace.json")
    assert (out / "events.csv").read_text().startswith("device,stage,kind,microbatch,action,stream")
    # without --json the command prints its summary so (cmd_run's print_run); both losses say which
    # step they are; the check names the reference
    print_run(json.loads(run.stdout), as_json=False)
    text = capsys.readouterr().out
    assert "loss: step 0 " in text and "last step (2)" in text
    assert "each step draws fresh random samples, so the loss measures the step and need not fall" in text
    assert "check: step 0's loss" in text and "the unsplit model's" in text
    validate = subprocess.run([sys.executable, "-m", "runtime", "validate", GPT, "--nproc", "2", "--steps", "2",
                               "--warmup", "1", "--slices", "2", "--repeats", "2", "--out", str(tmp_path / "val")],
                              capture_output=True, text=True, timeout=300)
    assert validate.returncode == 0, validate.stderr
    traces = sorted((tmp_path / "val").rglob("*trace*.json"))
    assert {p.name for p in traces} >= {"trace_predicted.json", "trace_measured.json"}
    for path in traces:
        assert_chrome_trace(path)
    assert _threads(traces[0]) == _threads(traces[1])
    assert "predicted   measured    error" in validate.stdout and "trace_measured.json" in validate.stdout


# --- -v, -q and progress -------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["-v", "simulate", BERT], ["simulate", BERT, "-v"], ["-q", "check", BERT], ["schedule", "gpipe", "--stages",
                                                                                "2", "--microbatches", "2", "-q"],
])
def test_dapple_sim_takes_verbose_and_quiet_before_or_after_the_command(argv):
    from sim.app.cli import _parser

    args = _parser().parse_args(argv)
    assert args.verbose == ("-v" in argv) and args.quiet == ("-q" in argv)


def test_dapple_run_takes_verbose_and_quiet_on_every_command():
    from runtime.commands.cli import _parser

    for command in ("run", "validate", "profile"):
        for flag in ("-v", "--verbose", "-q", "--quiet"):
            args = _parser().parse_args([command, GPT, flag])
            assert args.verbose == flag.startswith(("-v", "--v")) and args.quiet == flag.startswith(("-q", "--q"))
    assert _parser().parse_args(["-v", "run", GPT]).verbose


def test_dapple_plan_help_shows_sweep_and_verbose():
    result = subprocess.run([sys.executable, "-m", "planner.cli", "--help"], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert result.returncode == 0
    assert "dapple-plan sweep SWEEP.yaml" in result.stdout and "-v, --verbose" in result.stdout


def _dapple_plan(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from planner.cli import main; sys.exit(main())", *args]


@pytest.mark.slow  # 8 s: a whole plan under a pseudo-terminal
def test_dapple_plan_shows_progress_on_a_terminal_and_where_the_time_went(tmp_path):
    code, stdout, terminal = run_on_a_terminal(_dapple_plan(BERT, "--out", str(tmp_path / "a"), "-v",
                                                            "--planner", "dapple", "--planner", "dp"), REPO)
    assert code == 0, terminal[-2000:]
    best = json.loads((tmp_path / "a" / "best_plan.json").read_text())
    metrics = json.loads((tmp_path / "a" / "best_plan_metrics.json").read_text())
    own = schedule_text(best["schedule"]).split("/")[0]
    assert "dapple: replays" in terminal and "writing plots" in terminal and f"drawing gantt_{own}.png" in terminal
    assert "dapple-plan: time: plan with dapple" in terminal and "draw the plots" in terminal
    for kind in ("gantt", "memory"):  # the all-forwards-first order and the best plan's own
        drawn = sorted(p.name for p in (tmp_path / "a").glob(f"{kind}_*.png"))
        assert len(drawn) == 2 and f"{kind}_{own}.png" in drawn, drawn
    for name in ["best_plan.json", "best_plan_metrics.json", "schedules.png", "planners.png"] + drawn:
        assert (tmp_path / "a" / name).stat().st_size > 100
    # printed as one short line each (the files hold the stages): degrees, micro-batch size × count
    assert "best: dapple" in stdout and f"\n  {metrics['summary']}\n" in stdout and "layers [0, " not in stdout
    assert f"micro-batch {best['microbatch_size']} × {best['num_microbatches']}" in stdout
    assert '{"name"' not in stdout and "dapple: spend: " in terminal
    assert best["stages"][0]["layers"][0] == 0 and best["stages"][-1]["layers"][1] == 53
    # -q on a terminal: the results only
    code, stdout, terminal = run_on_a_terminal(_dapple_plan(BERT, "-q", "--planner", "even"), REPO)
    assert code == 0 and terminal == "" and "best: even" in stdout


def test_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path):
    result = subprocess.run(_dapple_plan(BERT, "--planner", "even", "--out", str(tmp_path)), capture_output=True,
                            text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0 and result.stderr == ""


def test_sweep_progress_and_verbosity_before_the_word_sweep(tmp_path):
    code, stdout, terminal = run_on_a_terminal(
        _dapple_plan("-v", "sweep", str(REPO / "sweeps" / "bert48_bandwidth.yaml"), "--out", str(tmp_path),
                     "--workers", "1"), REPO)
    assert code == 0, terminal[-2000:]
    assert "time: read the sweep file" in terminal and "run 6 points" in terminal
    assert "6 points (6 run, 0 already done)" in stdout


# --- dapple-run validate's table -----------------------------------------------------------------


def _recorded_run() -> dict:
    data = json.loads((REPO / "notebooks" / "data" / "validation_cpu.json").read_text())
    return data["runs"][0]


def _recorded_report():
    from sim.core.validation_report import ValidationReport

    return ValidationReport.from_json(_recorded_run())


def test_validation_report_has_headers_and_rows_that_explain_its_headline():
    from sim.core.units import format_time
    from sim.report.analysis.validation import format_report

    run = _recorded_run()
    text = format_report(_recorded_report())
    lines = text.splitlines()
    assert lines[1].split() == ["predicted", "measured", "error"]
    chosen = run["profile"]["slice"]
    headline = next(line for line in lines if line.strip().startswith("iteration time"))
    assert f"turn {chosen}'s prediction" in headline and f"median of all {run['steps']} steps" in headline
    predicted, measured = format_time(run["predicted"]["iteration_time_s"]), format_time(run["measured"]["iteration_time_s"])
    # the headline's prediction is its turn's row; its measurement the row of all steps
    turn_row = next(line for line in lines if line.strip().startswith(f"{chosen} ") and "the prediction above" in line)
    assert predicted in turn_row
    all_row = next(line for line in lines if line.strip().startswith("all steps"))
    assert measured in all_row
    assert len([line for line in lines if line.startswith("    ") and line.strip()[:1].isdigit()]) == len(run["slices"])


def test_validation_gantt_draws_the_measured_step_within_its_own_line():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from sim.report.plots.validation import validation_gantt_figure

    run = _recorded_run()
    fig = validation_gantt_figure(_recorded_report())
    measured_ax = fig.axes[1]
    (line,) = [ln for ln in measured_ax.get_lines() if ln.get_linestyle() == ":"]
    end_ms = max(row["end_s"] for row in run["measured"]["events"]) * 1e3
    assert line.get_xdata()[0] == pytest.approx(end_ms)
    assert measured_ax.get_title(loc="left").startswith("measured: the median step")
    assert fig.axes[0].get_legend() is not None


def test_simulate_exits_0_on_out_of_memory_and_3_with_fail_on_oom(capsys):
    from sim.app.cli import main

    mlp = str(SCENARIOS / "mlp_tiny_cpu.yaml")
    # hidden 1024: one 1024 × 1024 fp32 layer is 4 MiB, over the device's 1 MiB
    small = ["--set", "cluster.device.memory=1MiB", "--set", "model.hidden=1024"]
    assert main(["simulate", mlp, *small, "--json"]) == 0  # by default a plan that does not fit is a result
    assert json.loads(capsys.readouterr().out)["oom"] is True
    assert main(["simulate", mlp, *small, "--json", "--fail-on-oom"]) == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out)["oom"] is True  # the results are printed all the same
    assert captured.err == "dapple-sim: out of memory on device 0 (--fail-on-oom): exit 3\n"
    assert main(["simulate", mlp, "--json", "--fail-on-oom"]) == 0  # a plan that fits
    assert json.loads(capsys.readouterr().out)["oom"] is False

"""``dapple-run validate`` warns when the machine drifted more than the error it reports (issue 35, item 7).

Every turn of profile and run runs the same steps of the same plan, so the spread of the turns'
measured step times, (slowest − fastest) / median, is the machine's speed moving
(``sim.core.validation_report.turn_drift``). When it is larger than |the reported iteration-time
error| the report carries ``drift.exceeds_error`` and the command prints one warning line. The
reports here are synthetic: no process is started.
"""

from __future__ import annotations

import pytest

from conftest import SCENARIOS
from sim.core.validation_report import TurnComparison, ValidationReport
from sim.report.analysis.validation import compare, drift_warning, measured_view, run_side

GPT = str(SCENARIOS / "gpt_tiny_cpu.yaml")


def _report(turn_measured_s: list[float], predicted_s: float = 0.875):
    """A prediction of ``predicted_s`` against a run whose median step is 1 s, with one turn per
    entry of ``turn_measured_s`` (each predicted right)."""
    turns = tuple(TurnComparison(turn=k + 1, predicted_s=m, measured_s=m, iteration_time_frac=0.0)
                  for k, m in enumerate(turn_measured_s))
    measured = measured_view({"median_iteration_time_s": 1.0, "iteration_times_s": [1.0], "devices": [], "events": []})
    return compare(run_side(iteration_time_s=predicted_s, devices=[], events=[]), measured, scenario="toy",
                   schedule="gpipe", turns=turns)


def test_a_drift_larger_than_the_error_is_one_warning_line() -> None:
    report = _report([0.8, 1.0, 1.2])  # error (0.875 - 1) / 1 = -12.5%; drift (1.2 - 0.8) / 1.0 = 40%
    assert report.error.iteration_time_frac == pytest.approx(-0.125)
    assert report.drift.spread_frac == pytest.approx(0.4)
    assert (report.drift.fastest_s, report.drift.slowest_s, report.drift.exceeds_error) == (0.8, 1.2, True)
    warning = drift_warning(report)
    assert warning.count("\n") == 0
    assert warning.startswith("the machine's speed drifted 40% between turns")
    assert warning.endswith("more than the -12.5% error reported: rerun on an idle machine")
    assert report.to_json()["drift"] == {"spread_frac": pytest.approx(0.4), "fastest_s": 0.8, "slowest_s": 1.2,
                                         "exceeds_error": True}


def test_a_steady_machine_gets_no_warning_but_its_drift_is_reported() -> None:
    report = _report([0.99, 1.0, 1.01])  # 2% against 12.5%
    assert report.drift.spread_frac == pytest.approx(0.02) and not report.drift.exceeds_error
    assert drift_warning(report) is None
    assert report.to_json()["drift"]["exceeds_error"] is False


def test_the_median_of_an_even_count_of_turns_divides_the_spread() -> None:
    report = _report([0.5, 1.0, 1.5, 2.0], predicted_s=2.0)  # median 1.25: spread 1.5 / 1.25 = 120% > +100%
    assert report.drift.spread_frac == pytest.approx(1.2) and report.drift.exceeds_error


def test_a_single_turn_has_no_drift_and_writes_none() -> None:
    report = _report([])
    assert report.drift is None and drift_warning(report) is None and "drift" not in report.to_json()


def test_drift_round_trips_and_a_recording_without_it_still_reads() -> None:
    report = _report([0.8, 1.0, 1.2])
    document = report.to_json()
    assert ValidationReport.from_json(document) == report
    del document["drift"]  # a validation.json written before reports had it
    assert ValidationReport.from_json(document).drift is None


def test_the_command_prints_the_warning_on_stderr(tmp_path, monkeypatch, capsys) -> None:
    pytest.importorskip("torch")
    import runtime.commands.validate as command
    from runtime.commands.cli import main

    monkeypatch.setattr(command, "validate", lambda *args, **kwargs: _report([0.8, 1.0, 1.2]))
    monkeypatch.setattr(command, "write_report", lambda report, out, document=None: [])
    assert main(["validate", GPT, "--nproc", "2", "--out", str(tmp_path), "--json"]) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "drifted" in line] == [
        "dapple-run: warning: " + drift_warning(_report([0.8, 1.0, 1.2]))]

"""What the command fuzz (``tests/fuzzing``, issue 35) found, each as the command line that
showed it: every one now exits 2 with one line on stderr that names the limit or the fix."""

from __future__ import annotations

from fuzzing.cases import Case
from fuzzing.execute import execute, judge

from conftest import SCENARIOS

TINY = str(SCENARIOS / "gpt_tiny_cpu.yaml")


def refused(program: str, *argv: str, files=()) -> str:
    """Run the command line in process; assert that the fuzz finds nothing wrong and that it
    exits 2; return its one line of stderr."""
    case = Case(seed=-1, family="found", program=program, argv=argv, files=tuple(files))
    outcome = execute(case, alarm_s=60)
    assert judge(outcome, argv) is None, (judge(outcome, argv), outcome.err[-500:], outcome.crash)
    assert outcome.rc == 2, (outcome.rc, outcome.err[-500:])
    (line,) = outcome.err.splitlines()
    return line


def test_a_set_value_whose_bytes_are_not_utf8_is_refused_in_one_line():
    # a shell passes the byte 0xff through; Python keeps it as the lone surrogate \udcff, which
    # libyaml could not encode (UnicodeEncodeError, a traceback)
    line = refused("dapple-sim", "check", TINY, "--set", "model.optimizer=\udcff")
    assert "--set model.optimizer" in line and "not UTF-8" in line

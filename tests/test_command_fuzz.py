"""The command fuzz (issue 35's acceptance): generated hostile inputs across every command
end with no traceback, hang, memory blow-up or non-finite number, each bad input one line
and exit 2 (``tests/fuzzing``; replay a failure with ``python -m tests.fuzzing.replay SEED``).

The default suite runs a 1,000-case sample of cheap cases (small scenarios, most refused
while reading) on 2 worker processes; ``-m slow`` runs 10,000 cases of the full mix.
"""

from __future__ import annotations

import pytest
from fuzzing.runner import run_cases

SAMPLE_CASES = 1000
FULL_CASES = 10_000


def test_a_thousand_cheap_fuzz_cases_find_nothing():
    report = run_cases(range(SAMPLE_CASES), sample=True, workers=2)
    print(report.summary())
    assert len(report.results) == SAMPLE_CASES
    assert not report.failures, report.summary()


@pytest.mark.slow
def test_ten_thousand_fuzz_cases_find_nothing():
    report = run_cases(range(100_000, 100_000 + FULL_CASES), sample=False, workers=2)
    print(report.summary(slowest=10))
    assert len(report.results) == FULL_CASES
    assert not report.failures, report.summary()

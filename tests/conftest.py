"""Shared test helpers: paths of the repository, its scenarios and the bad-scenario corpus."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
BAD_SCENARIOS = Path(__file__).resolve().parent / "scenarios" / "bad"

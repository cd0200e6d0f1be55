"""The fuzz's cases: ``case(seed)`` is one command line and the files it reads.

A case names its program (``dapple-sim``, ``dapple-plan`` or ``dapple-run``), its argv and
the files to write into an empty folder (the argv's relative paths point into it). A file is
bytes, or a ``Special``: a FIFO, a folder, a symbolic link. The seed chooses a *family* (the
input kind: scenario YAML structure or values, ``--set``, flags, plan JSON, schedule text or
torch CSV, calibration CSV, sweep file, published suite, hostile file, the documented bounds)
and a command, then the mutation; ``sample=True`` draws the cheap cases the default suite
runs (small scenarios, most of them refused while reading).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from . import families as fa
from . import file_families as ff
from .families import ROOT, Special

__all__ = ["Case", "FAMILIES", "Special", "case", "ROOT"]

FAMILIES = {"yaml_text": fa.yaml_text, "yaml_values": fa.yaml_values, "overrides": fa.overrides,
            "bounds": fa.bounds, "plan_json": ff.plan_json, "schedule_file": ff.schedule_file,
            "calibration": ff.calibration, "sweep": ff.sweep, "published": ff.published, "hostile": ff.hostile,
            "flags": ff.flags, "schedule_command": ff.schedule_command, "argv": ff.special_argv}
"""Family name -> its builder: (rng, sample) -> (program, argv, files)."""

FULL = {"yaml_text": 14, "yaml_values": 14, "overrides": 10, "bounds": 6, "plan_json": 8, "schedule_file": 6,
        "calibration": 5, "sweep": 5, "published": 3, "hostile": 10, "flags": 8, "schedule_command": 8, "argv": 2}
"""Relative weights of the families in the full fuzz."""

SAMPLE = {**FULL, "calibration": 3, "sweep": 3, "published": 2}
"""The default suite's sample: the same kinds, fewer of the costly ones."""

@dataclass(frozen=True)
class Case:
    seed: int
    family: str
    program: str
    argv: tuple[str, ...]
    files: tuple[tuple[str, bytes | Special], ...] = ()

    @property
    def command(self) -> str:
        """``dapple-sim check``, ``dapple-plan``, ``dapple-plan sweep``, ``dapple-run run``, ..."""
        words = [a for a in self.argv if not a.startswith("-")]
        if self.program == "dapple-plan":
            return "dapple-plan sweep" if words[:1] == ["sweep"] else "dapple-plan"
        known = {"check", "simulate", "compare", "calibrate", "published", "schedule", "run", "validate", "profile"}
        first = next((w for w in words if w in known), "?")
        return f"{self.program} {first}"

    def describe(self) -> str:
        files = ", ".join(f"{name} ({len(body) if isinstance(body, bytes) else body.kind})" for name, body in self.files)
        return f"seed {self.seed} [{self.family}] {self.program} {' '.join(map(repr, self.argv))}" + (
            f"; files: {files}" if files else "")


def case(seed: int, *, sample: bool = False) -> Case:
    """The case of ``seed``: the same seed always gives the same case (``sample`` too)."""
    rng = random.Random(f"fuzz-{seed}-{sample}")
    table = SAMPLE if sample else FULL
    names = sorted(table)
    family = rng.choices(names, weights=[table[n] for n in names])[0]
    program, argv, files = FAMILIES[family](rng, sample)
    return Case(seed=seed, family=family, program=program, argv=tuple(argv),
                files=tuple(sorted((name, _bytes(body)) for name, body in files.items())))


def _bytes(body: str | bytes | Special) -> bytes | Special:
    return body.encode("utf-8", "surrogateescape") if isinstance(body, str) else body

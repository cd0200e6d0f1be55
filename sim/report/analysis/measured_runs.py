"""Measured runs: the CSV ``dapple-sim calibrate`` fits to, one row per training run.

A user measures a handful of training runs on their cluster (``dapple-run run --csv`` writes
them, or any framework's logs), one CSV row per run::

    hidden,heads,layers,seq_len,vocab,microbatch_size,global_batch_size,tp,dp,pp,recompute,iteration_time_s

``microbatch_size`` is per data-parallel replica, as Megatron-LM counts it. Two optional
columns say more about a run where the user knows it (a missing column or an empty cell:
not given):

* ``attention`` — the attention kernel the run used, ``flash``, ``sdpa``, ``cudnn`` or ``unfused``
  (``sim.core.specs.ATTENTION_KERNELS``); not given: the base scenario's model's;
* ``peak_memory_bytes`` — the most device memory the training process held on its busiest
  device, in bytes, everything included: what ``nvidia-smi`` shows for the process at its
  peak, or ``torch.cuda.mem_get_info``'s total less free. ``torch.cuda.max_memory_reserved()``
  leaves out the CUDA context and NCCL's buffers: add them, or the reserve fitted from it is
  the caching allocator's share alone.

Every row is a run that ran: it has a measured iteration time, so it fitted in memory.
Rows are read strictly: one line naming the file, the line and the column for any problem.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core.errors import DappleError
from sim.core.specs import ATTENTION_KERNELS
from sim.core.userfiles import CSV_MAX_BYTES, read_user_file, show_path

__all__ = ["COLUMNS", "MAX_INTEGER", "MAX_ITERATION_TIME_S", "MAX_PEAK_MEMORY_BYTES", "MAX_ROWS", "OPTIONAL_COLUMNS",
           "MeasuredRun", "read_runs"]

COLUMNS = ("hidden", "heads", "layers", "seq_len", "vocab", "microbatch_size", "global_batch_size", "tp", "dp",
           "pp", "recompute", "iteration_time_s")
"""The measured-run CSV's required columns (any order; extra columns are ignored)."""

OPTIONAL_COLUMNS = ("attention", "peak_memory_bytes")
"""Columns a CSV may add (see the module doc); a missing column or an empty cell is not given."""

MAX_ROWS = 10_000
"""Most measured runs in one CSV (each distinct one is replayed at every step of the fit)."""
MAX_INTEGER = 10**9
"""Largest integer cell (a model dimension, a batch, a degree)."""
MAX_ITERATION_TIME_S = 1e6
"""Longest measured iteration, seconds."""
MIN_ITERATION_TIME_S = 1e-6
"""Shortest measured iteration, seconds (no training step takes less than a microsecond; a
denormal such as 1e-320 made a run's relative error, and the MAPE, infinite)."""
MIN_PEAK_MEMORY_BYTES = 1.0
"""Smallest measured peak memory, bytes (below a byte a relative error can be infinite)."""
MAX_PEAK_MEMORY_BYTES = 2.0**50
"""Largest measured peak memory, bytes (1 PiB: far above any device's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRun:
    """One CSV row."""

    hidden: int
    heads: int
    layers: int
    seq_len: int
    vocab: int
    microbatch_size: int
    """Per data-parallel replica (Megatron's count)."""
    global_batch_size: int
    dp: int
    pp: int
    recompute: bool
    iteration_time_s: float
    """The measured iteration time, seconds."""
    line: int = 0
    """Line in its file, for error messages."""
    attention: str | None = None
    """The attention kernel the run used (``ATTENTION_KERNELS``); None: the base scenario's."""
    peak_memory_bytes: float | None = None
    """The measured peak device memory of the run's busiest device, everything included, bytes; None: not measured."""

    def as_dict(self) -> dict[str, Any]:
        """The row's columns (``tp`` is 1); an optional column only where the row gives it."""
        given = {name: getattr(self, name) for name in OPTIONAL_COLUMNS if getattr(self, name) is not None}
        return {name: getattr(self, name) for name in COLUMNS if name != "tp"} | {"tp": 1} | given


def _bool(text: str) -> bool | None:
    return {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}.get(text.strip().lower())


def read_runs(path: str | Path) -> list[MeasuredRun]:
    """Read a measured-run CSV (at most 16 MiB and ``MAX_ROWS`` runs); one line naming the
    file, line and column for any problem."""
    path = Path(path)
    shown = show_path(path)
    text = read_user_file(path, "CSV file", max_bytes=CSV_MAX_BYTES)
    reader = csv.DictReader(text.splitlines())
    try:
        fieldnames = reader.fieldnames or []
        missing = [c for c in COLUMNS if c not in fieldnames]
        if missing:
            raise DappleError(f"{shown}: missing column {missing[0]!r}; the columns are {', '.join(COLUMNS)} "
                              f"(and optionally {', '.join(OPTIONAL_COLUMNS)})")
        runs = []
        for line, row in enumerate(reader, start=2):
            if len(runs) >= MAX_ROWS:
                raise DappleError(f"{shown}: more than {MAX_ROWS:,} runs; fit on a sample of them")
            runs.append(_run(row, f"{shown}:{line}", line))
    except csv.Error as exc:
        raise DappleError(f"{shown}:{reader.line_num}: not a readable CSV ({exc})") from None
    if not runs:
        raise DappleError(f"{shown}: no runs (a header line and one row per measured run)")
    return runs


def _shown(raw: str) -> str:
    return repr(raw if len(raw) <= 40 else raw[:37] + "...")


def _number(raw: str, where: str, name: str, low: float, high: float, what: str) -> float:
    """A number cell from ``low`` (positive) to ``high``; ``what`` says what it is for the message."""
    try:
        value = float(raw) if len(raw) <= 100 else math.nan
    except ValueError:
        raise DappleError(f"{where}: {name}: {_shown(raw)} is not a number") from None
    if not low <= value <= high:  # NaN fails too
        raise DappleError(f"{where}: {name}: {_shown(raw)} must be {what}, from {low:g} to {high:g}")
    return value


def _run(row: dict, where: str, line: int) -> MeasuredRun:
    """One CSV row as a measured run; ``where`` is ``FILE:LINE`` for messages."""
    values: dict[str, Any] = {}
    for name in COLUMNS:
        raw = (row.get(name) or "").strip()
        if name == "recompute":
            flag = _bool(raw)
            if flag is None:
                raise DappleError(f"{where}: recompute: {_shown(raw)} is not 0/1/true/false")
            values[name] = flag
        elif name == "iteration_time_s":
            values[name] = _number(raw, where, name, MIN_ITERATION_TIME_S, MAX_ITERATION_TIME_S,
                                   "a positive time in seconds")
        else:  # ASCII digits only: '²'.isdigit() is true, int('²') fails
            if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or not 1 <= int(raw) <= MAX_INTEGER:
                raise DappleError(f"{where}: {name}: {_shown(raw)} must be a positive integer, at most {MAX_INTEGER:,}")
            values[name] = int(raw)
    if values.pop("tp") > 1:
        raise DappleError(f"{where}: tp: {row['tp'].strip()} > 1 is not modelled yet (tensor "
                          "parallelism); remove the row or measure with tp = 1")
    attention = (row.get("attention") or "").strip()
    if attention and attention not in ATTENTION_KERNELS:
        raise DappleError(f"{where}: attention: {_shown(attention)} is not one of {', '.join(ATTENTION_KERNELS)} "
                          "(or empty: the base scenario's)")
    peak = (row.get("peak_memory_bytes") or "").strip()
    return MeasuredRun(line=line, attention=attention or None, **values,
                       peak_memory_bytes=_number(peak, where, "peak_memory_bytes", MIN_PEAK_MEMORY_BYTES,
                                                 MAX_PEAK_MEMORY_BYTES,
                                                 "a positive number of bytes (or empty: not measured)")
                       if peak else None)

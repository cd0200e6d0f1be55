"""Where each rank is: a tiny memory-mapped file per rank holding its current step and action.

When a rank fails, torchrun stops the others with SIGTERM; a process blocked in a receive
cannot run Python code to say what it was doing. So every rank writes its current action
into a 64-byte memory-mapped file before running it (a copy of a few bytes, no system
call), and the launcher reads them all after the run to say where each rank stopped. A rank
that raised also leaves ``failure-rank{r}.txt`` with its one-line message.
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

__all__ = ["StatusBoard", "read_failures", "read_frozen", "read_status", "write_failure", "write_frozen"]

_SIZE = 64


class StatusBoard:
    """Rank ``rank``'s status file in ``folder`` (created, zero-filled)."""

    def __init__(self, folder: str | Path, rank: int) -> None:
        path = Path(folder) / f"status-rank{rank}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * _SIZE)
        # the launcher finds a frozen rank by its process id (``runtime.execution.launch``)
        (path.parent / f"pid-rank{rank}").write_text(str(os.getpid()), encoding="utf-8")
        self._file = open(path, "r+b")  # noqa: SIM115 — held open for the map's life
        self._map = mmap.mmap(self._file.fileno(), _SIZE)

    def set(self, step: int, action: str) -> None:
        text = f"step {step} {action}".encode()[: _SIZE - 1]
        self._map[: len(text) + 1] = text + b"\0"

    def close(self) -> None:
        self._map.close()
        self._file.close()


def read_status(folder: str | Path) -> dict[int, str]:
    """Rank -> ``step K ACTION`` it last started, for every status file in ``folder``."""
    found = {}
    for path in sorted(Path(folder).glob("status-rank*")):
        text = path.read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        if text:
            found[int(path.name.removeprefix("status-rank"))] = text
    return found


def write_failure(folder: str | Path, rank: int, message: str) -> None:
    """Record ``message`` and when it happened (the first failure is the cause, later ones
    are usually other ranks losing their peer)."""
    path = Path(folder) / f"failure-rank{rank}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{time.time():.6f} {message}\n", encoding="utf-8")


def read_failures(folder: str | Path) -> dict[int, tuple[float, str]]:
    """Rank -> (time, message), for every rank that wrote a failure."""
    found = {}
    for path in sorted(Path(folder).glob("failure-rank*.txt")):
        stamp, _, message = path.read_text(encoding="utf-8").strip().partition(" ")
        found[int(path.stem.removeprefix("failure-rank"))] = (float(stamp), message)
    return found


def write_frozen(folder: str | Path, rank: int) -> None:
    """Record that the launcher found ``rank`` stopped (frozen) and killed it."""
    (Path(folder) / f"frozen-rank{rank}").write_text(f"{time.time():.6f}\n", encoding="utf-8")


def read_frozen(folder: str | Path) -> list[int]:
    """Ranks the launcher found frozen, in rank order."""
    return sorted(int(p.name.removeprefix("frozen-rank")) for p in Path(folder).glob("frozen-rank*"))

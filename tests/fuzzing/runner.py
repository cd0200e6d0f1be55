"""Run many cases in a small pool of worker processes and summarise what they found.

Each worker (started by ``forkserver``, so the parent stays small) limits its own address
space (``MEMORY_LIMIT_BYTES``: a blow-up fails the case, never the machine), then runs the
cases it is sent in process (``execute.execute``) and returns each judged outcome. A worker
that does not answer within ``WALL_S`` plus a grace (a hang its alarm could not break) or
that dies is replaced, and its case counts as a hang or a crash. ``run_cases`` returns a
``Report``; ``Report.summary()`` prints cases per command, failures by kind, the slowest
cases and the peak memory, and each failure's seed and argv to replay it
(``python -m tests.fuzzing.replay SEED``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.connection
import os
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

from .cases import case
from .execute import WALL_S, execute, judge

MEMORY_LIMIT_BYTES = 4 * 2**30
GRACE_S = 15


@dataclass(frozen=True)
class Result:
    seed: int
    family: str
    command: str
    argv: tuple[str, ...]
    rc: int | str
    seconds: float
    peak_rss_bytes: int
    failure: tuple[str, str] | None


@dataclass
class Report:
    sample: bool
    results: list[Result] = field(default_factory=list)

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.failure is not None]

    def summary(self, slowest: int = 5) -> str:
        ran = [r for r in self.results if r.rc != "would launch"]
        lines = [f"command fuzz ({'sample' if self.sample else 'full'}): {len(self.results)} cases, "
                 f"{len(self.results) - len(ran)} skipped (a dapple-run case that would launch), "
                 f"{len(self.failures)} failures"]
        per = Counter(r.command for r in self.results)
        lines.append("  per command: " + ", ".join(f"{name} {n}" for name, n in sorted(per.items())))
        codes = Counter(str(r.rc) for r in self.results)
        lines.append("  exit codes: " + ", ".join(f"{code} {n}" for code, n in sorted(codes.items())))
        kinds = Counter(r.failure[0] for r in self.failures)
        lines.append("  failures by kind: " + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"))
        peak = max(self.results, key=lambda r: r.peak_rss_bytes, default=None)
        if peak is not None:
            lines.append(f"  peak RSS of a worker: {peak.peak_rss_bytes / 2**20:.0f} MiB (first reached by seed "
                         f"{peak.seed})")
        lines.append("  slowest:")
        for r in sorted(ran, key=lambda r: -r.seconds)[:slowest]:
            lines.append(f"    {r.seconds:6.2f} s  seed {r.seed} [{r.family}] {' '.join(r.argv)[:150]} -> {r.rc}")
        for r in self.failures:
            lines.append(f"  FAIL seed {r.seed} [{r.family}] {r.failure[0]}: {r.failure[1][:300]}")
            lines.append(f"       {r.command}: {r.argv!r}"[:600])
        return "\n".join(lines)


def _limit_memory() -> None:
    soft = min(MEMORY_LIMIT_BYTES, resource.getrlimit(resource.RLIMIT_AS)[1] % 2**63 or MEMORY_LIMIT_BYTES)
    resource.setrlimit(resource.RLIMIT_AS, (soft, resource.getrlimit(resource.RLIMIT_AS)[1]))


def run_one(seed: int, sample: bool, scratch: str | None = None) -> Result:
    """Generate, run and judge the case of ``seed`` in this process."""
    c = case(seed, sample=sample)
    outcome = execute(c, scratch=scratch)
    failure = None if outcome.rc == "would launch" else judge(outcome, c.argv)
    return Result(seed=seed, family=c.family, command=c.command, argv=c.argv, rc=outcome.rc,
                  seconds=outcome.seconds, peak_rss_bytes=outcome.peak_rss_bytes, failure=failure)


def _worker(conn, sample: bool, scratch: str) -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        os.environ.pop(name, None)
    _limit_memory()
    while True:
        seed = conn.recv()
        if seed is None:
            return
        conn.send(run_one(seed, sample, scratch))


class _Slot:
    def __init__(self, context, sample: bool, scratch: str) -> None:
        self.parent, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(child, sample, scratch), daemon=False)
        self.process.start()
        child.close()
        self.seed: int | None = None
        self.since = 0.0

    def give(self, seed: int) -> None:
        self.seed, self.since = seed, time.monotonic()
        self.parent.send(seed)

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()


def _lost(seed: int, sample: bool, kind: str, detail: str) -> Result:
    c = case(seed, sample=sample)
    return Result(seed=seed, family=c.family, command=c.command, argv=c.argv, rc=kind, seconds=WALL_S + GRACE_S,
                  peak_rss_bytes=0, failure=(kind, detail))


def run_cases(seeds, *, sample: bool, workers: int = 2) -> Report:
    """Run the cases of ``seeds`` on ``workers`` processes; the report lists them in seed order."""
    context = multiprocessing.get_context("forkserver")
    scratch = tempfile.mkdtemp(prefix="command-fuzz-")
    pending = list(reversed(list(seeds)))
    report = Report(sample=sample)
    slots = [_Slot(context, sample, scratch) for _ in range(workers)]
    try:
        while pending or any(s.seed is not None for s in slots):
            for slot in slots:
                if slot.seed is None and pending:
                    slot.give(pending.pop())
            busy = [s for s in slots if s.seed is not None]
            now = time.monotonic()
            wait_s = max(0.0, min(s.since for s in busy) + WALL_S + GRACE_S - now)
            ready = multiprocessing.connection.wait([s.parent for s in busy], timeout=wait_s)
            for k, slot in enumerate(slots):  # a worker past its alarm and the grace: its alarm could not stop it
                if slot.seed is not None and slot.parent not in ready and \
                        time.monotonic() - slot.since > WALL_S + GRACE_S:
                    report.results.append(_lost(slot.seed, sample, "hang", "the worker did not answer"))
                    slot.stop()
                    slots[k] = _Slot(context, sample, scratch)
            for k, slot in enumerate(slots):
                if slot.parent not in ready:
                    continue
                try:
                    report.results.append(slot.parent.recv())
                    slot.seed = None
                except (EOFError, OSError):
                    code = slot.process.exitcode
                    report.results.append(_lost(slot.seed, sample, "crash", f"the worker died (exit {code})"))
                    slot.stop()
                    slots[k] = _Slot(context, sample, scratch)
    finally:
        for slot in slots:
            try:
                slot.parent.send(None)
            except (BrokenPipeError, OSError):
                pass
            slot.process.join(timeout=5)
            slot.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    report.results.sort(key=lambda r: r.seed)
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.fuzzing.runner [N] [--sample] [--start K]``: run N cases, print the summary."""
    parser = argparse.ArgumentParser(prog="python -m tests.fuzzing.runner")
    parser.add_argument("cases", type=int, nargs="?", default=1000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--sample", action="store_true", help="the default suite's cheap cases")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    report = run_cases(range(args.start, args.start + args.cases), sample=args.sample, workers=args.workers)
    print(report.summary(slowest=10))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())

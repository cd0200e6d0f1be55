"""Run one case in this process and judge its outcome.

``execute`` writes the case's files into a fresh folder, calls the program's ``main(argv)``
there with stdout and stderr captured under alarms (``ALARM_S`` of CPU time, ``WALL_S`` of wall
time: a hang raises ``Hung``,
which no ``except Exception`` of the code can swallow), and never lets a ``dapple-run`` case
start torch ranks: the launch, the profiler and the GPU count are replaced by ``WouldLaunch``
(the case is then skipped, not judged). ``judge`` names what is wrong with an outcome, or
``None``: a traceback or uncaught exception, an exit code other than 0 or 2 (3 for
``--fail-on-oom``; 1 where documented: a sweep with failed points, a planner with no plan),
an error that is not one line, NaN or Infinity in stdout or in any text file written, the
time limit, ``MemoryError``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import resource
import shutil
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from .cases import Case, Special

ALARM_S = 20
"""CPU seconds a case may spend before it counts as a hang (``ITIMER_PROF``: CPU time, so that a
machine shared with other work does not turn a slow case into a hang)."""

WALL_S = 120
"""Wall-clock seconds a case may take (``ITIMER_REAL``): a read that blocks spends no CPU time."""

NON_FINITE = re.compile(r"(?<![A-Za-z_])-?(nan|inf|infinity)(?![A-Za-z_])", re.IGNORECASE)
TEXT_SUFFIXES = (".json", ".csv", ".yaml", ".txt", ".md")


class Hung(BaseException):
    """The alarm: a ``BaseException`` so that no ``except Exception`` in the code catches it."""


class WouldLaunch(BaseException):
    """A ``dapple-run`` case passed every check before launch: the fuzz stops it there."""


@dataclass(frozen=True)
class Outcome:
    seed: int
    family: str
    command: str
    rc: int | str
    out: str
    err: str
    seconds: float
    peak_rss_bytes: int
    written: tuple[tuple[str, str], ...] = ()
    crash: str = ""


def _mains():
    # imported in the worker only: the pool's parent process stays small (no simulator, planner or runtime)
    from planner.cli import main as plan_main
    from runtime.commands.cli import main as run_main
    from sim.app.cli import main as sim_main

    return {"dapple-sim": sim_main, "dapple-plan": plan_main, "dapple-run": run_main}


@contextlib.contextmanager
def _never_launch():
    """While the block runs, what would start processes or measure this machine raises ``WouldLaunch``."""
    # imported in the worker only, as in _mains
    import runtime.commands.profile as profile
    import runtime.commands.run as run
    import runtime.commands.validate as validate

    def stop(*args, **kwargs):
        raise WouldLaunch()

    patched = [(run, "_launch_run"), (run, "_check_gpus"), (validate, "validate"), (profile.profile_run, "profile_here")]
    saved = [getattr(module, name) for module, name in patched]
    for module, name in patched:
        setattr(module, name, stop)
    try:
        yield
    finally:
        for (module, name), original in zip(patched, saved):
            setattr(module, name, original)


def _write(folder: Path, files) -> None:
    for name, body in files:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(body, Special):
            if body.kind == "fifo":
                os.mkfifo(path)
            elif body.kind == "dir":
                path.mkdir()
            else:
                os.symlink(body.target, path)
        else:
            path.write_bytes(body)


def _written(folder: Path, inputs: set[str]) -> tuple[tuple[str, str], ...]:
    """The text files the command wrote (name, content), inputs left out."""
    found = []
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if name in inputs or path.is_symlink() or not path.is_file() or path.suffix not in TEXT_SUFFIXES:
            continue
        found.append((name, path.read_text(encoding="utf-8", errors="replace")[: 4 * 2**20]))
    return tuple(found)


def _alarm(signum, frame):
    raise Hung()


def execute(case: Case, *, alarm_s: float = ALARM_S, scratch: str | None = None) -> Outcome:
    """Run ``case`` here (in a new folder under ``scratch``) and return what it did."""
    with _never_launch():
        return _execute(case, _mains()[case.program], alarm_s, scratch)


def _execute(case: Case, main, alarm_s: float, scratch: str | None) -> Outcome:
    home = os.getcwd()
    folder = Path(tempfile.mkdtemp(prefix=f"fuzz-{case.seed}-", dir=scratch))
    out, err = io.StringIO(), io.StringIO()
    rc: int | str
    crash = ""
    started = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _alarm), signal.signal(signal.SIGPROF, _alarm)
    try:
        _write(folder, case.files)
        os.chdir(folder)
        signal.setitimer(signal.ITIMER_PROF, alarm_s)
        signal.setitimer(signal.ITIMER_REAL, max(alarm_s, WALL_S))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(case.argv))
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except WouldLaunch:
        rc = "would launch"
    except Hung:
        rc = f"hang (over {alarm_s:g} s of CPU or {max(alarm_s, WALL_S):g} s of wall time)"
    except MemoryError:
        rc = "memory (MemoryError)"
    except BaseException as exc:  # noqa: BLE001 - the fuzz's finding: an uncaught exception
        rc, crash = "traceback", "".join(traceback.format_exception(exc))[-4000:]
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous[0])
        signal.signal(signal.SIGPROF, previous[1])
        os.chdir(home)
    seconds = time.perf_counter() - started
    written = _written(folder, {name for name, _ in case.files}) if rc != "would launch" else ()
    shutil.rmtree(folder, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return Outcome(seed=case.seed, family=case.family, command=case.command, rc=rc, out=out.getvalue(),
                   err=err.getvalue(), seconds=seconds, peak_rss_bytes=peak, written=written, crash=crash)


def _allowed_codes(outcome: Outcome, argv: tuple[str, ...]) -> set[int]:
    codes = {0, 2}
    if "--fail-on-oom" in argv:
        codes.add(3)
    if outcome.command in ("dapple-plan sweep", "dapple-plan"):
        codes.add(1)  # documented: a sweep with failed points; no plan fits in memory
    return codes


def _error_lines(err: str, argv: tuple[str, ...]) -> list[str]:
    """stderr's lines that are not argparse's usage (a usage block precedes argparse's error)
    nor, under ``-v``, the log of each step the user asked for."""
    lines = err.splitlines()
    if lines and lines[0].startswith("usage:"):
        lines = [line for line in lines if line.startswith(("dapple-sim", "dapple-plan", "dapple-run"))]
    if "-v" in argv or "--verbose" in argv:
        lines = [line for line in lines if ": error: " in line or not line.startswith(PROGRAMS)]
    return lines


PROGRAMS = ("dapple-sim: ", "dapple-plan: ", "dapple-run: ")


def judge(outcome: Outcome, argv: tuple[str, ...]) -> tuple[str, str] | None:
    """(kind, detail) of what is wrong with ``outcome``, or None."""
    if outcome.rc == "traceback":
        return "traceback", outcome.crash.strip().splitlines()[-1]
    if isinstance(outcome.rc, str):
        return outcome.rc.split(" ")[0], outcome.rc
    if "Traceback (most recent call last)" in outcome.err:
        return "traceback", outcome.err.strip().splitlines()[-1]
    if outcome.rc not in _allowed_codes(outcome, argv):
        return "exit code", f"exit {outcome.rc}: {outcome.err.strip()[-300:]}"
    if outcome.rc == 2:
        lines = _error_lines(outcome.err, argv)
        errors = [line for line in lines if ": error: " in line]
        schedule_grid = len(errors) == 1 and "schedule" in errors[0]
        if len(errors) != 1 or (len(lines) != 1 and not schedule_grid):
            return "not one line", outcome.err.strip()[:400]
        if len(errors[0]) > 2100:
            return "not one line", f"an error of {len(errors[0])} characters"
    for name, text in (("stdout", outcome.out), *outcome.written):
        found = NON_FINITE.search(text)
        if found:
            at = text[max(0, found.start() - 80): found.end() + 40]
            return "non-finite", f"{name}: ...{at}..."
    return None

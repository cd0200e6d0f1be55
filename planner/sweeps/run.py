"""What-if sweeps: run every point of a sweep file (``planner.sweeps.file``) and collect one
table of results.

Points run on a ``concurrent.futures`` executor: in-process (one worker), a local process
pool, or a Dask cluster's executor; the code path is the same. The table has one row per
point in point order: the point's id (a hash of its settings), its axis values, what the
scenario is (model, device, sizes), the summary metrics and ``error`` and ``wall_s``. An
out-of-memory plan is a result (``oom`` true); a point that cannot run (a bad value, an
impossible plan, an exception) records its error in one line and the sweep goes on.
With ``out``, the table is saved as ``results.csv`` and ``results.parquet`` (every few seconds
too), and a rerun into the same folder skips the points already there without an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

from tqdm import tqdm

from planner.sweeps.columns import COLUMNS, PLAN_COLUMNS, RUN_COLUMNS, TAIL_COLUMNS
from planner.sweeps.file import Point, Sweep, SweepError, load_sweep, sweep_from_dict
from planner.sweeps.point import one_line, run_point
from sim.core.jsonio import dumps
from sim.core.userfiles import open_output, read_user_file, show_path
from sim.input.strict import show_text
from sim.report.plots.tables import TABLE_FIGURES

__all__ = [
    "SweepError", "Sweep", "Point", "SweepResult", "load_sweep", "sweep_from_dict", "sweep_points",
    "run_point", "run_sweep", "open_executor", "read_results", "write_plots", "COLUMNS",
]

log = logging.getLogger(__name__)

CHECKPOINT_S = 5.0
"""Seconds between saves of a running sweep's table (so an interrupted sweep resumes)."""
DASK_CONNECT_TIMEOUT_S = 10.0
"""Seconds to wait for a Dask scheduler given by address."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepResult:
    """A finished (or interrupted) sweep."""

    table: Any
    """pandas DataFrame, one row per point in point order."""
    points_run: int
    points_skipped: int
    """Points found in the output folder and not run again."""
    wall_s: float
    files: tuple[Path, ...] = field(default=())


# --- executors ------------------------------------------------------------------------------


class _InlineExecutor(Executor):
    """Runs each call when it is submitted, in this process (one worker, no pickling)."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


@contextlib.contextmanager
def open_executor(workers: int | None = None, dask: str | None = None, *,
                  source: str | None = None) -> Iterator[tuple[Executor, int]]:
    """(executor, parallelism): a local process pool (``workers`` processes, default
    min(CPUs, 4); one worker runs in-process), or with ``dask`` a Dask cluster's executor:
    ``"local"`` starts a ``LocalCluster`` of ``workers`` processes, anything else is a
    scheduler address (``tcp://host:8786``). ``source`` (the sweep file) starts every error's line."""
    prefix = f"{source}: " if source else ""
    if workers is not None and workers < 1:
        raise SweepError(f"{prefix}--workers {workers}: give a positive number of worker processes")
    count = workers or min(os.cpu_count() or 1, 4)
    if dask is None:
        if count == 1:
            yield _InlineExecutor(), 1
            return
        # forkserver: safe when threads run (tqdm, a Dask client); workers fork from a warm server
        context = multiprocessing.get_context("forkserver" if sys.platform != "win32" else "spawn")
        if context.get_start_method() == "forkserver":
            context.set_forkserver_preload(["planner.sweeps.run", "sim.engine.run", "sim.engine.replay", "planner.planners.registry"])
        with ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
            yield pool, count
        return
    try:
        # Dask only for a sweep on a Dask cluster (an optional dependency)
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise SweepError(f"{prefix}--dask needs Dask: pip install 'dask[distributed]'") from None
    cluster = None
    try:
        if dask == "local":
            cluster = LocalCluster(n_workers=count, threads_per_worker=1, processes=True, dashboard_address=None,
                                   silence_logs=logging.ERROR)
            client = Client(cluster)
        else:
            try:
                client = Client(dask, timeout=f"{DASK_CONNECT_TIMEOUT_S}s")
            except (OSError, TimeoutError, ValueError) as exc:
                raise SweepError(f"{prefix}--dask {show_text(dask)}: cannot reach the scheduler "
                                 f"({show_text(one_line(str(exc)), 200)})") from None
        try:
            yield client.get_executor(pure=False), max(1, sum(client.nthreads().values()))
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()


# --- the sweep ------------------------------------------------------------------------------


def run_sweep(
    sweep: Sweep,
    out: str | Path | None = None,
    *,
    workers: int | None = None,
    dask: str | None = None,
    executor: Executor | None = None,
    progress: bool | None = None,
) -> SweepResult:
    """Run every point not already in ``out``'s table; return (and save) the whole table.

    ``executor`` (any ``concurrent.futures.Executor``) replaces the one ``open_executor``
    makes from ``workers`` and ``dask``. ``progress``: a tqdm bar; default when stderr is a terminal.
    """
    started = time.perf_counter()
    out = Path(out) if out is not None else None
    if out is not None:
        _make_folder(out)  # before any point runs: an --out that cannot be written fails now
    done = _resume(sweep, out) if out is not None else {}
    pending = [p for p in sweep.points if p.id not in done]
    rows: dict[str, dict] = dict(done)
    files: tuple[Path, ...] = ()
    bar = _bar(len(pending), sweep.name, sys.stderr.isatty() if progress is None else progress)
    if executor is not None or not pending:  # nothing to run: start no workers
        opened = contextlib.nullcontext((executor, 4))
    else:
        opened = open_executor(workers, dask, source=sweep.source)
    try:
        with opened as (pool, parallelism):
            lean = replace(sweep, points=(), plots=())  # what a worker needs: not every point
            checkpoint = (lambda: _save(sweep, rows, out)) if out is not None else None
            _drain(lean, pending, pool, 2 * parallelism, rows, bar, checkpoint)
    finally:
        if bar is not None:
            bar.close()
        if out is not None:
            files = _save(sweep, rows, out)
    table = _table(sweep, rows)
    return SweepResult(table=table, points_run=len(pending), points_skipped=len(done),
                       wall_s=time.perf_counter() - started, files=files)


def _drain(lean: Sweep, pending: list[Point], pool: Executor, window: int, rows: dict, bar, checkpoint) -> None:
    """Keep ``window`` points in flight; collect rows as they finish; ``checkpoint()`` now and then."""
    queue, in_flight, saved = iter(pending), {}, time.monotonic()
    try:
        while True:
            for point in itertools.islice(queue, max(0, window - len(in_flight))):
                try:
                    in_flight[pool.submit(run_point, lean, point)] = point
                except BrokenExecutor:
                    raise SweepError(
                        "the worker processes died (killed, out of memory, or a script that calls run_sweep "
                        "without `if __name__ == \"__main__\":`); a rerun into the same output folder skips "
                        "the points done"
                    ) from None
            if not in_flight:
                return
            finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in finished:
                point = in_flight.pop(future)
                try:
                    rows[point.id] = future.result()
                except Exception as exc:  # the worker itself died (killed, out of host memory)
                    rows[point.id] = {"point": point.id, **dict(point.columns),
                                      "error": one_line(f"worker failed: {exc.__class__.__name__}: {exc}")}
                if bar is not None:
                    bar.update(1)
            if checkpoint is not None and time.monotonic() - saved > CHECKPOINT_S:
                checkpoint()
                saved = time.monotonic()
    finally:  # interrupted: keep what finished, drop what did not
        for future, point in in_flight.items():
            if future.done() and not future.cancelled() and future.exception() is None:
                rows[point.id] = future.result()
            future.cancel()


def _bar(total: int, name: str, show: bool):
    if not show or total == 0:
        return None
    return tqdm(total=total, desc=name, unit="point", file=sys.stderr)


def _table(sweep: Sweep, rows: Mapping[str, dict]):
    """The rows of ``sweep``'s points that have run, in point order, with fixed column types."""
    # pandas only when a table is built: keeps it off the import path of the rest
    import pandas as pd

    metrics = {**COLUMNS, **RUN_COLUMNS, **(PLAN_COLUMNS if sweep.mode == "plan" else {}), **TAIL_COLUMNS}
    columns = ["point", *sweep.axis_keys, *metrics]
    ordered = [rows[p.id] for p in sweep.points if p.id in rows]
    table = pd.DataFrame([[row.get(c) for c in columns] for row in ordered], columns=columns, dtype=object)
    table["point"] = table["point"].astype("string")
    for key in sweep.axis_keys:
        table[key] = _axis_column(table[key])
    for name, dtype in metrics.items():
        table[name] = table[name].astype(dtype)
    return table.reset_index(drop=True)


def _axis_column(column):
    column = column.map(lambda v: v.item() if hasattr(v, "item") else v)  # numpy scalars from a saved table
    values = [v for v in column if v is not None]
    if values and all(isinstance(v, bool) for v in values):
        return column.astype("boolean")
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return column.astype("Int64")
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return column.astype("float64")
    return column.map(lambda v: None if v is None else str(v)).astype("string")


# --- the output folder ----------------------------------------------------------------------


def _fingerprint(sweep: Sweep) -> dict[str, Any]:
    return {
        "base": sweep.base, "base_sha256": hashlib.sha256(sweep.base_text.encode()).hexdigest(),
        "mode": sweep.mode, "engine": sweep.engine if sweep.mode == "simulate" else None,
        "planner": sweep.planner if sweep.mode == "plan" else None,
        "options": json.loads(json.dumps(dict(sweep.options))) if sweep.mode == "plan" else None,
    }


def _make_folder(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or "the path holds a NUL byte"
        raise SweepError(f"--out {show_path(out)}: cannot create the folder ({reason})") from None


def _resume(sweep: Sweep, out: Path) -> dict[str, dict]:
    """Rows already in ``out`` for this sweep's points (failed ones are tried again)."""
    meta = out / "sweep.json"
    if not meta.is_file():
        return {}
    try:
        before = json.loads(read_user_file(meta, "sweep record", SweepError))
    except (SweepError, ValueError):
        before = None
    if not isinstance(before, dict):
        raise SweepError(f"{show_path(meta)}: cannot read it; delete the folder or choose another --out")
    now = _fingerprint(sweep)
    for key, value in now.items():
        if before.get(key) != value:
            what = (f"{key} was {before.get(key)!r}, now {value!r}" if key != "base_sha256"
                    else "the base scenario changed")
            raise SweepError(f"--out {show_path(out)}: holds results of another sweep ({show_text(what)}); choose "
                             "another --out or delete it")
    try:
        table = read_results(out)
        if table is None:
            return {}
        wanted = {p.id for p in sweep.points}
        records = table.astype(object).where(table.notna(), None).to_dict("records")
        return {r["point"]: r for r in records if r["point"] in wanted and r.get("error") is None}
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a damaged table (pyarrow's errors are ValueErrors)
        raise SweepError(f"--out {show_path(out)}: cannot read the saved results ({exc.__class__.__name__}); delete "
                         "results.csv and results.parquet to run every point again") from None


def read_results(out: str | Path):
    """The table saved in ``out`` (``results.parquet``, else ``results.csv``), or None."""
    # pandas only when a table is built: keeps it off the import path of the rest
    import pandas as pd

    out = Path(out)
    if (out / "results.parquet").is_file() and _has_pyarrow():
        return pd.read_parquet(out / "results.parquet")
    if (out / "results.csv").is_file():
        return pd.read_csv(out / "results.csv", dtype={"point": "string"})
    return None


def _has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def _save(sweep: Sweep, rows: Mapping[str, dict], out: Path) -> tuple[Path, ...]:
    _make_folder(out)
    table = _table(sweep, rows)
    written = [out / "sweep.json", out / "results.csv"]
    record = dumps(_fingerprint(sweep), what=show_path(written[0]), error=SweepError, indent=2, sort_keys=True)
    _atomic(written[0], lambda p: p.write_text(record + "\n"))
    _atomic(written[1], lambda p: table.to_csv(p, index=False))
    if _has_pyarrow():
        written.append(out / "results.parquet")
        _atomic(written[2], lambda p: table.to_parquet(p, index=False))
    else:
        log.warning("pyarrow is not installed: wrote results.csv only (pip install pyarrow for results.parquet)")
    return tuple(written)


def _atomic(path: Path, write) -> None:
    """``write(temporary)``, then the temporary file replaces ``path``; an error names ``path``."""
    temporary = path.with_name(f".{path.name}.partial")
    try:
        write(temporary)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise SweepError(f"{show_path(path)}: cannot write it ({exc.strerror or exc.__class__.__name__}); free some "
                         "space or choose another --out") from None


def sweep_points(sweep: Sweep) -> list[dict[str, Any]]:
    """Each point's settings as a dict, in order (what ``dapple-plan sweep`` will run)."""
    return [dict(p.settings) for p in sweep.points]


def write_plots(sweep: Sweep, table, out: str | Path) -> list[Path]:
    """Draw the sweep file's ``plots:`` from ``table`` into ``out``; returns the PNG paths."""
    if not sweep.plots:
        return []
    # matplotlib only when a figure is drawn: keeps it off the import path of what prints text
    import matplotlib.pyplot as plt

    written = []
    for index, entry in enumerate(sweep.plots):
        spec = dict(entry)
        name = spec.pop("figure")
        file = spec.pop("file", None) or f"{name}.png"
        try:
            fig = TABLE_FIGURES[name](table, **spec)
        except (KeyError, ValueError, TypeError) as exc:  # the arguments were checked when the sweep was read
            raise SweepError(f"{sweep.source}: plots[{index}]: cannot draw {name} from the table "
                             f"({exc.__class__.__name__}: {show_text(str(exc))}); the results are saved") from None
        path = Path(out) / file
        try:
            with open_output(path, "plot", binary=True, error=SweepError) as handle:
                fig.savefig(handle, dpi=110, format="png")
        finally:
            plt.close(fig)
        written.append(path)
    return written

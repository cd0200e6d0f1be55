"""What the planners of one ``dapple-plan`` run share: cost tables, evaluations, results, workers.

Several planners score many of the same candidates (DAPPLE's planner ranks Megatron's grid,
and must beat every baseline: ``planner.planners.dapple``), so a ``SearchContext`` keeps, for
one scenario, the cost tables of every layout (``TablesCache``), every evaluation made, by
candidate and engine, and every planner's result by name and options. A candidate replayed
by one planner is then not replayed again by another, and a planner asked twice answers from
its first run.

An evaluation taken from the context still counts in the asking planner's spend
(``planner.search.budget``): a budget is a count of the work a search *uses*, so a planner's
answer never depends on which planners ran before it.

Replays of independent candidates run on a local process pool when the cluster is large
enough for a replay to cost more than shipping it (``POOL_FROM`` devices): ``stream`` keeps
the workers a few candidates ahead of the search and hands back evaluations in the order
asked, so the search consumes them exactly as it would one by one (a budget that stops it
discards what the workers did beyond). The answer is the same with or without workers.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import weakref
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable, Iterator

from planner.search.evaluation import Evaluation, evaluate
from planner.search.ranking import PlannerResult, TablesCache
from planner.search.space import Candidate, PlannerOptions
from sim.input.scenario import Scenario

__all__ = ["POOL_FROM", "SearchContext"]

POOL_FROM = 256
"""Clusters of at least this many devices replay candidates on a process pool: below it a
replay takes milliseconds, less than starting workers and shipping results."""
MAX_WORKERS = 4
"""Most worker processes (``os.cpu_count()`` if fewer)."""

_WORKER_SCENARIO: Scenario | None = None  # the scenario a worker process evaluates on


def _start_worker(scenario: Scenario) -> None:
    global _WORKER_SCENARIO
    _WORKER_SCENARIO = scenario


def _evaluate_in_worker(candidate: Candidate, engine: str) -> Evaluation:
    return evaluate(_WORKER_SCENARIO, candidate, engine=engine)


class SearchContext:
    """One scenario's shared search state (see the module docstring)."""

    def __init__(self, scenario: Scenario, *, workers: int | None = None) -> None:
        self.scenario = scenario
        self.tables = TablesCache(scenario)
        self._evaluations: dict[tuple[Candidate, str], Evaluation] = {}
        self._results: dict[tuple[str, PlannerOptions], PlannerResult] = {}
        self._resolved: dict[Candidate, Scenario] = {}  # for the callers that keep no resolutions of their own
        if workers is None:
            workers = min(os.cpu_count() or 1, MAX_WORKERS) if scenario.cluster.num_devices >= POOL_FROM else 1
        self.workers = workers
        """Worker processes for replays (1: replays run in this process)."""
        self._pool: ProcessPoolExecutor | None = None

    def run(self, name: str, planner: Callable[..., PlannerResult], options: PlannerOptions, progress=None
            ) -> PlannerResult:
        """``planner``'s result on this context's scenario under ``options``, searched once."""
        key = (name, options)
        if key not in self._results:
            self._results[key] = planner(self.scenario, options, progress=progress, context=self)
        return self._results[key]

    def evaluate(self, candidate: Candidate, engine: str, resolved: dict[Candidate, Scenario] | None = None
                 ) -> Evaluation:
        """``planner.search.evaluation.evaluate`` of ``candidate`` with ``engine``, made once per
        context (``resolved`` as there: the resolutions a search shares between engines)."""
        key = (candidate, engine)
        found = self._evaluations.get(key)
        if found is None:
            shared = self._resolved if resolved is None else resolved
            found = self._evaluations[key] = evaluate(self.scenario, candidate, engine=engine, resolved=shared)
            if engine == "simpy":
                self._resolved.pop(candidate, None)  # settled: its resolution is not needed again
        return found

    def stream(self, candidates: Iterable[Candidate], engine: str, resolved: dict[Candidate, Scenario] | None = None,
               room: Callable[[], int] | None = None) -> Iterator[Evaluation]:
        """The evaluations of ``candidates`` with ``engine``, in order, made on the workers (a few
        ahead of the consumer) when the context has them; stop consuming at any point. ``room``,
        if given, says how many more the consumer may still use: no more are sent ahead (work
        past a budget would be thrown away)."""
        if self.workers <= 1:
            for candidate in candidates:
                yield self.evaluate(candidate, engine, resolved)
            return
        pool, ahead = self._executor(), deque()
        todo = iter(candidates)
        try:
            while True:
                while len(ahead) < (2 * self.workers if room is None else max(1, min(2 * self.workers, room()))):
                    candidate = next(todo, None)
                    if candidate is None:
                        break
                    known = self._evaluations.get((candidate, engine))
                    ahead.append((candidate, known if known is not None
                                  else pool.submit(_evaluate_in_worker, candidate, engine)))
                if not ahead:
                    return
                candidate, pending = ahead.popleft()
                if not isinstance(pending, Evaluation):
                    pending = self._evaluations.setdefault((candidate, engine), pending.result())
                yield pending
        finally:
            for _, pending in ahead:
                if not isinstance(pending, Evaluation):
                    pending.cancel()

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # forkserver: safe when threads run (a progress bar); each worker gets the scenario once
            method = "forkserver" if sys.platform != "win32" else "spawn"
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context(method),
                                             initializer=_start_worker, initargs=(self.scenario,))
            weakref.finalize(self, self._pool.shutdown, cancel_futures=True)
        return self._pool

    def close(self) -> None:
        """Stop the workers, if any were started."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

"""What the planners of one ``dapple-plan`` run share: cost tables, evaluations and results.

Several planners score many of the same candidates (DAPPLE's planner ranks Megatron's grid,
and must beat every baseline: ``planner.planners.dapple``), so a ``SearchContext`` keeps, for
one scenario, the cost tables of every layout (``TablesCache``), every evaluation made, by
candidate and engine, and every planner's result by name and options. A candidate replayed by one planner
is then not replayed again by another, and a planner asked twice answers from its first run.

An evaluation taken from the context still counts in the asking planner's spend
(``planner.search.budget``): a budget is a count of the work a search *uses*, so a planner's
answer never depends on which planners ran before it.
"""

from __future__ import annotations

from typing import Callable

from planner.search.evaluation import Evaluation, evaluate
from planner.search.ranking import PlannerResult, TablesCache
from planner.search.space import Candidate, PlannerOptions
from sim.input.scenario import Scenario

__all__ = ["SearchContext"]


class SearchContext:
    """One scenario's shared search state (see the module docstring)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.tables = TablesCache(scenario)
        self._evaluations: dict[tuple[Candidate, str], Evaluation] = {}
        self._results: dict[tuple[str, PlannerOptions], PlannerResult] = {}
        self._resolved: dict[Candidate, Scenario] = {}  # for the callers that keep no resolutions of their own

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

    def known(self, candidate: Candidate, engine: str) -> Evaluation | None:
        """The evaluation of ``candidate`` with ``engine`` if one was made."""
        return self._evaluations.get((candidate, engine))

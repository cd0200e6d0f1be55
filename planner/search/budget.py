"""What a search may spend and what it spent, counted in work, never in seconds.

Every planner runs within a budget of *work*: complete candidates scored by the closed forms
(``candidates``), partial plans a dynamic programme extends (``partials``: DAPPLE's Pareto
extensions, PipeDream's ``A(j, m)`` cells), and replays (the fast path's, within
``PlannerOptions.fast_max`` and ``fast_budget_ops``, and the SimPy engine's). A count of work
gives the same answer on any machine and under any load, which a time limit would not. A
planner that reaches a budget stops generating, settles what it has, and says which budget
it reached (``Spend.reached``); ``dapple-plan`` prints every planner's spend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Spend"]


@dataclass(slots=True, kw_only=True)
class Spend:
    """What one planner's search spent (a counter filled in as it works)."""

    candidates: int = 0
    """Complete candidates scored by the closed forms (``planner.search.ranking.analytic_score``)."""
    partials: int = 0
    """Partial plans a dynamic programme extended by a stage."""
    fast_replays: int = 0
    """Candidates evaluated with the fast path (counted for memory, and replayed when they fit)."""
    engine_replays: int = 0
    """Candidates settled by the SimPy engine."""
    replayed_ops: int = 0
    """Actions (of every device) the fast path's replays compiled."""
    reached: list[str] = field(default_factory=list)
    """The budgets the search reached, in words (``"candidates (200,000)"``); empty when none."""

    def reach(self, what: str, limit: int) -> None:
        """Note that the budget ``what`` of ``limit`` stopped part of the search (once per budget)."""
        text = f"{what} ({limit:,})"
        if text not in self.reached:
            self.reached.append(text)

    def count(self, evaluation) -> None:
        """Count one evaluation (a ``planner.search.evaluation.Evaluation``): a fast-path one
        with the actions it compiled, or an engine verdict."""
        if evaluation.engine == "fast":
            self.fast_replays += 1
            self.replayed_ops += evaluation.replayed_ops
        else:
            self.engine_replays += 1

    def add(self, other: "Spend") -> None:
        """Add ``other``'s counts to these (a planner that runs another's search pays for it)."""
        self.candidates += other.candidates
        self.partials += other.partials
        self.fast_replays += other.fast_replays
        self.engine_replays += other.engine_replays
        self.replayed_ops += other.replayed_ops
        for text in other.reached:
            if text not in self.reached:
                self.reached.append(text)

    @property
    def replays(self) -> int:
        """Fast-path and engine evaluations together."""
        return self.fast_replays + self.engine_replays

    def to_json(self) -> dict[str, Any]:
        return {"candidates": self.candidates, "partials": self.partials, "fast_replays": self.fast_replays,
                "engine_replays": self.engine_replays, "replayed_ops": self.replayed_ops,
                "budget_reached": list(self.reached)}

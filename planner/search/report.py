"""The planners' report: what each planner found, what it spent, and which plan wins.

``dapple-plan`` runs several planners on one scenario (``planner.planners.registry``); each
returns a ``planner.search.ranking.PlannerResult``. ``build_report`` turns them into one
``PlannerReport``: a ``PlannerEntry`` per planner (its best plan as an
``planner.search.evaluation.EvaluationRow``, or none, with the speed-up over pure data
parallelism; its spend, counted in work (``planner.search.budget.Spend``); the first earlier
planner that found the very same plan, if one did; its note), and the name of the planner
whose plan is the fastest by the SimPy engine; a tie goes to the name that sorts first, so
the same scenario always names the same winner. ``spend_text`` is a planner's spend in one
line, as ``dapple-plan`` prints it under its table and ``-v`` logs it.

JSON is made from a report at the edge, once, by ``PlannerReport.to_json()`` (what
``dapple-plan --json`` prints). A plan and its metrics sit side by side, never mixed: the
winner's plan is ``best`` (a plan file, what ``--plan`` reads) and its metrics
``best_metrics``; each planner's entry has ``plan`` and ``metrics``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from planner.search.evaluation import EvaluationRow, count_rejections, evaluation_row
from planner.search.ranking import PlannerResult

__all__ = ["PlannerEntry", "PlannerReport", "build_report", "spend_text"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerEntry:
    """One planner's outcome: its best plan (or none), what the search spent, and why none."""

    planner: str
    """The planner's name (``planner.planners.registry.PLANNERS``)."""
    row: EvaluationRow | None
    """The engine's best plan and its metrics (``speedup_over_dp`` set); None when nothing fits."""
    search_time_s: float
    """Wall-clock seconds the search took (reported, never used to decide anything)."""
    candidates_scored: int
    """Candidates scored by the closed forms."""
    replays: int
    """Candidates evaluated (fast path and engine)."""
    rejected: int
    """Evaluated candidates that cannot run."""
    rejected_by_kind: dict[str, int]
    """``rejected`` by kind (``out_of_memory``, ``invalid_plan``, ...), kinds in sorted order."""
    note: str
    """Why nothing fits (empty when a plan does)."""
    spend: dict[str, Any] = field(default_factory=dict)
    """What the search spent, in work (``planner.search.budget.Spend.to_json``: candidates,
    partial plans, fast and engine replays, replayed actions, the budgets it reached)."""
    same_plan_as: str | None = None
    """The first planner before this one whose plan file is the same as this one's; None when
    no earlier planner found this plan."""

    def to_json(self) -> dict[str, Any]:
        plan = {"plan": None, "metrics": None} if self.row is None else self.row.to_json()
        return {**plan, "search_time_s": self.search_time_s, "candidates_scored": self.candidates_scored,
                "replays": self.replays, "rejected": self.rejected, "rejected_by_kind": dict(self.rejected_by_kind),
                "note": self.note, "spend": dict(self.spend), "same_plan_as": self.same_plan_as}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerReport:
    """Every planner's entry on one scenario, and the winner."""

    scenario: str
    """The scenario's name."""
    planners: tuple[PlannerEntry, ...]
    """One entry per planner, in the order they ran."""
    best_planner: str | None
    """The planner whose plan is fastest; None when no planner's plan fits."""
    search_time_s: float
    """Wall-clock seconds all the planners took together."""
    dp_fits: bool
    """Whether pure data parallelism ran and fits in memory (``speedup_over_dp`` is then set)."""
    scenario_plan_ignored: bool
    """Whether the scenario named a plan of its own, which the planners ignore."""

    def entry(self, planner: str) -> PlannerEntry:
        """The entry of ``planner`` (a name that ran)."""
        return next(e for e in self.planners if e.planner == planner)

    @property
    def best(self) -> EvaluationRow | None:
        """The winning plan and its metrics; None when nothing fits."""
        return None if self.best_planner is None else self.entry(self.best_planner).row

    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {
            "scenario": self.scenario,
            "best": None if best is None else best.plan,
            "best_metrics": None if best is None else {"planner": self.best_planner, **best.metrics.to_json()},
            "planners": {e.planner: e.to_json() for e in self.planners},
            "search_time_s": self.search_time_s, "dp_fits": self.dp_fits,
            "scenario_plan_ignored": self.scenario_plan_ignored,
        }


def build_report(scenario_name: str, results: Mapping[str, PlannerResult], search_time_s: float, *,
                 scenario_plan_ignored: bool = False, cluster_devices: int | None = None) -> PlannerReport:
    """The report of ``results`` (planner name -> what it found, in the order they ran);
    ``cluster_devices`` (the scenario's cluster size) lets each plan count its idle devices."""
    dp = results.get("dp")
    dp_time = dp.best.iteration_time_s if dp is not None and dp.best is not None else None
    entries: list[PlannerEntry] = []
    for name, result in results.items():
        row = None
        if result.best is not None:
            row = evaluation_row(result.best, cluster_devices=cluster_devices)
            speedup = dp_time / result.best.iteration_time_s if dp_time else None
            row = replace(row, metrics=replace(row.metrics, speedup_over_dp=speedup))
        same = None if row is None else next(
            (e.planner for e in entries if e.row is not None and e.row.plan == row.plan), None)
        spend = result.spend.to_json()
        log.info("%s: spend: %s", name, spend_text(spend))
        entries.append(PlannerEntry(
            planner=name, row=row, search_time_s=result.search_time_s, candidates_scored=result.candidates_scored,
            replays=len(result.evaluations), rejected=sum(1 for e in result.evaluations if not e.ok),
            rejected_by_kind=count_rejections(result.evaluations), note=result.note, spend=spend,
            same_plan_as=same,
        ))
    ranked = sorted((r.best.iteration_time_s, name) for name, r in results.items() if r.best)
    return PlannerReport(scenario=scenario_name, planners=tuple(entries), best_planner=ranked[0][1] if ranked else None,
                         search_time_s=search_time_s, dp_fits=dp_time is not None,
                         scenario_plan_ignored=scenario_plan_ignored)


def spend_text(spend: Mapping[str, Any]) -> str:
    """``2,428 candidates · 0.46 M partial plans · 52 fast + 4 engine replays`` from a
    ``Spend.to_json()``, ending ``(reached its budget of 50,000 candidates: best so far)`` when
    a budget stopped the search."""
    candidates = spend.get("candidates", 0)
    parts = [f"{_count(candidates)} candidate{'' if candidates == 1 else 's'}"]
    if spend.get("partials"):
        parts.append(f"{_count(spend['partials'])} partial plans")
    parts.append(f"{spend.get('fast_replays', 0):,} fast + {spend.get('engine_replays', 0):,} engine replays")
    text = " · ".join(parts)
    reached = [_budget(b) for b in spend.get("budget_reached", ())]
    return text + (f" (reached its budget of {' and '.join(reached)}: best so far)" if reached else "")


def _count(value: int) -> str:
    """A count as people read it: ``2,428``; from 100,000 in millions, ``0.46 M``."""
    return f"{value:,}" if value < 100_000 else f"{value / 1e6:.2f} M"


def _budget(reached: str) -> str:
    """``Spend.reach``'s ``candidates (50,000)`` as ``50,000 candidates`` (other texts as they are)."""
    match = re.fullmatch(r"(.+) \(([\d,]+)\)", reached)
    return f"{match.group(2)} {match.group(1)}" if match else reached

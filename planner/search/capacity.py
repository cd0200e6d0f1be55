"""Choosing the cluster size for an objective: time to train, cost or energy.

A capacity question fixes the model, the tokens and the server kind and asks how many servers:
``dapple-plan --objective time | cost | energy [--deadline 30d] [--budget AMOUNT]``. Each
candidate size is planned from scratch (the planners of ``planner.planners``, through a
``SearchContext`` per size, within the usual work budgets), its best plan replayed, and the
replay turned into a whole run — days without and with failures, GPU-hours, cost, energy,
goodput — by ``sim.cost.capacity.estimate_run`` (no formula here). The objective then picks:

* ``time``: the size with the fewest expected days whose cost is within ``--budget``;
* ``cost``: the cheapest (GPU-hours when no price is set) that meets ``--deadline``;
* ``energy``: the one using the least energy that meets ``--deadline``.

Both constraints apply under every objective when given; ties go to fewer GPUs. Sizes
(``size_ladder``): whole servers on a geometric ladder, 1, 2, 4, ... servers up to the largest,
the largest itself and, when its count factors badly, the largest smooth count below it
(``planner.search.subsets``); on one server, 1, 2, 4, ... of its GPUs. Tables and replays are
not shared between sizes: a cost table is a layout on one cluster (``TablesCache``), and a
different number of servers is a different cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from planner.planners.registry import get_planner
from planner.search.context import SearchContext
from planner.search.evaluation import Evaluation, evaluation_row
from planner.search.space import PlannerOptions, restrict_cluster
from planner.search.subsets import subset_sizes
from sim.core.errors import DappleError
from sim.core.run_estimate import RunEstimate, RunTotals
from sim.core.units import format_time
from sim.cost.capacity import estimate_run
from sim.input.scenario import Scenario

__all__ = ["OBJECTIVES", "CapacityChoice", "SizeRow", "choose", "plan_sizes", "size_ladder", "sized"]

OBJECTIVES = ("time", "cost", "energy")
"""What ``--objective`` may minimise: expected days, cost (or GPU-hours), energy."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SizeRow:
    """One candidate cluster size: its best plan and the run that plan makes."""

    devices: int
    """GPUs of the candidate cluster (all of them paid for)."""
    nodes: int
    """Servers of the candidate cluster."""
    best: Evaluation | None
    """The fastest plan the planners found on it; None when none fits."""
    planner: str | None
    """The planner that found ``best``."""
    estimate: RunEstimate | None
    """The run of ``best`` (``sim.cost.capacity.estimate_run``); None without a plan."""

    @property
    def totals(self) -> RunTotals | None:
        """The run with failures when the scenario has a reliability section, else failure-free."""
        if self.estimate is None:
            return None
        return self.estimate.expected or self.estimate.failure_free

    def to_json(self) -> dict[str, Any]:
        row = None if self.best is None else evaluation_row(self.best, cluster_devices=self.devices)
        return {"devices": self.devices, "nodes": self.nodes, "planner": self.planner,
                "plan": None if row is None else row.plan, "metrics": None if row is None else row.metrics.to_json(),
                "run": None if self.estimate is None else self.estimate.to_json()}


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityChoice:
    """The sizes tried and the one the objective picks, with why in one line."""

    objective: str
    """``time``, ``cost`` or ``energy``."""
    deadline_s: float | None
    """Most expected wall-clock seconds allowed; None: no deadline."""
    budget: float | None
    """Most cost allowed, in the price's currency; None: no budget."""
    rows: tuple[SizeRow, ...]
    """Every size tried, fewest GPUs first."""
    chosen: SizeRow | None
    """The pick; None when no size meets the deadline and budget."""
    reason: str
    """The closing line: the choice and why, or why none."""

    def to_json(self) -> dict[str, Any]:
        return {"objective": self.objective, "deadline_s": self.deadline_s, "budget": self.budget,
                "sizes": [r.to_json() for r in self.rows],
                "chosen_devices": None if self.chosen is None else self.chosen.devices, "reason": self.reason}


def size_ladder(scenario: Scenario, max_devices: int | None = None) -> tuple[int, ...]:
    """Device counts to try, ascending (the module docstring); ``max_devices`` replaces the
    scenario's cluster size as the largest."""
    cluster = scenario.cluster
    per_node, largest = cluster.devices_per_node, max_devices or cluster.num_devices
    if largest < 1:
        raise DappleError(f"--max-gpus {largest}: give a positive number of GPUs")
    if largest <= per_node and cluster.nodes == 1:
        counts = {2 ** k for k in range(largest.bit_length()) if 2 ** k <= largest} | {largest}
        return tuple(sorted(counts))
    if largest % per_node:
        raise DappleError(f"--max-gpus {largest}: give whole servers of {per_node} GPUs ({cluster.device.name})")
    nodes = largest // per_node
    counts = {2 ** k for k in range(nodes.bit_length()) if 2 ** k <= nodes} | {nodes}
    counts |= {d // per_node for d in subset_sizes(replace(cluster, nodes=nodes))}
    return tuple(sorted(n * per_node for n in counts))


def sized(scenario: Scenario, devices: int) -> Scenario:
    """``scenario`` on ``devices`` GPUs of its server kind: whole servers, or GPUs of one server."""
    cluster, per_node = scenario.cluster, scenario.cluster.devices_per_node
    if cluster.nodes == 1 and devices <= per_node:
        return replace(scenario, cluster=restrict_cluster(cluster, devices))
    return replace(scenario, cluster=replace(cluster, nodes=devices // per_node))


def plan_sizes(scenario: Scenario, sizes: Sequence[int], planners: Sequence[str], options: PlannerOptions,
               tick: Callable[..., None] | None = None) -> tuple[SizeRow, ...]:
    """Plan every size with ``planners`` and estimate its run; ``tick(n, desc=)`` reports progress."""
    if scenario.training.steps is None:
        raise DappleError("--objective needs a run length: set training.tokens or training.steps "
                          "(e.g. --set training.tokens=15T)")
    rows = []
    for devices in sizes:
        if tick is not None:
            tick(0, desc=f"planning {devices:,} GPUs")
        one = sized(scenario, devices)
        context = SearchContext(one)
        try:
            results = {name: context.run(name, get_planner(name), options) for name in planners}
        finally:
            context.close()
        ranked = sorted((r.best.iteration_time_s, name) for name, r in results.items() if r.best is not None)
        best = results[ranked[0][1]].best if ranked else None
        estimate = None if best is None else estimate_run(one, best.summary)
        rows.append(SizeRow(devices=devices, nodes=one.cluster.nodes, best=best,
                            planner=ranked[0][1] if ranked else None, estimate=estimate))
        if tick is not None:
            tick(1)
    return tuple(rows)


def choose(rows: Sequence[SizeRow], objective: str, *, deadline_s: float | None = None,
           budget: float | None = None) -> CapacityChoice:
    """The size ``objective`` picks among ``rows`` under the deadline and budget (module docstring)."""
    if objective not in OBJECTIVES:
        raise DappleError(f"--objective {objective}: give one of {', '.join(OBJECTIVES)}")
    planned = [r for r in rows if r.totals is not None]
    if not planned:
        return CapacityChoice(objective=objective, deadline_s=deadline_s, budget=budget, rows=tuple(rows),
                              chosen=None, reason="no size has a plan that fits in memory")
    _check_inputs(planned, objective, budget)
    score = _score(objective)
    meets = [r for r in planned if _meets(r, deadline_s, budget)]
    if not meets:
        return CapacityChoice(objective=objective, deadline_s=deadline_s, budget=budget, rows=tuple(rows),
                              chosen=None, reason=_none_meets(planned, deadline_s, budget))
    chosen = min(meets, key=lambda r: (score(r), r.devices))
    return CapacityChoice(objective=objective, deadline_s=deadline_s, budget=budget, rows=tuple(rows),
                          chosen=chosen, reason=_why(chosen, planned, objective, deadline_s, budget))


def _check_inputs(planned: Sequence[SizeRow], objective: str, budget: float | None) -> None:
    totals = planned[0].totals
    if budget is not None and totals.cost is None:
        raise DappleError("--budget needs a price: set cluster.price_per_gpu_hour (e.g. --set "
                          "cluster.price_per_gpu_hour=2.5)")
    if objective == "energy" and totals.energy_kwh is None:
        raise DappleError("--objective energy needs the device's power: set cluster.device.power_w")


def _score(objective: str) -> Callable[[SizeRow], float]:
    if objective == "time":
        return lambda r: r.totals.time_s
    if objective == "energy":
        return lambda r: r.totals.energy_kwh
    return lambda r: r.totals.gpu_hours if r.totals.cost is None else r.totals.cost


def _meets(row: SizeRow, deadline_s: float | None, budget: float | None) -> bool:
    totals = row.totals
    return (deadline_s is None or totals.time_s <= deadline_s) and (budget is None or totals.cost <= budget)


def amount(value: float) -> str:
    """Money (or GPU-hours) in at most 4 significant figures: ``987``, ``12.3k``, ``1.23M``."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _days(row: SizeRow) -> str:
    return f"{row.totals.time_s / 86400:.3g} days"


def _spent(row: SizeRow, objective: str) -> str:
    totals = row.totals
    if objective == "energy":
        return f"{totals.energy_kwh / 1e3:.3g} MWh"
    return amount(totals.cost) if totals.cost is not None else f"{amount(totals.gpu_hours)} GPU-hours (no price set)"


def _limits(deadline_s: float | None, budget: float | None) -> str:
    shown = None if deadline_s is None else \
        (f"{deadline_s / 86400:g} d" if deadline_s >= 86400 else format_time(deadline_s))
    parts = ([] if deadline_s is None else [f"the {shown} deadline"]) + \
            ([] if budget is None else [f"the budget of {amount(budget)}"])
    return " and ".join(parts)


def _gpus(count: int) -> str:
    return f"{count:,} GPU" + ("" if count == 1 else "s")


def _why(chosen: SizeRow, planned: Sequence[SizeRow], objective: str, deadline_s: float | None,
         budget: float | None) -> str:
    """``512 GPUs: 28.4 days ≤ the 30 d deadline at the lowest cost, 1.23M; 256 GPUs would take 55.0 days``."""
    goal = {"time": "the fastest", "cost": "at the lowest cost", "energy": "with the least energy"}[objective]
    within = _limits(deadline_s, budget)
    line = f"{_gpus(chosen.devices)}: {_days(chosen)}" + (f" within {within}" if within else "") + \
        f", {goal}, {_spent(chosen, 'cost' if objective == 'time' else objective)}"
    smaller = [r for r in planned if r.devices < chosen.devices]
    larger = [r for r in planned if r.devices > chosen.devices]
    if objective == "time" and larger:
        other = min(larger, key=lambda r: r.totals.time_s)
        if other.totals.time_s < chosen.totals.time_s:
            return line + f"; {_gpus(other.devices)} would take {_days(other)} for {_spent(other, 'cost')}"
        return line + f"; {_gpus(other.devices)} would take {_days(other)}: adding GPUs stops paying"
    if smaller:
        other = max(smaller, key=lambda r: r.devices)
        return line + f"; {_gpus(other.devices)} would take {_days(other)} for {_spent(other, objective)}"
    return line


def _none_meets(planned: Sequence[SizeRow], deadline_s: float | None, budget: float | None) -> str:
    fastest = min(planned, key=lambda r: (r.totals.time_s, r.devices))
    cheapest = min(planned, key=lambda r: (r.totals.cost or 0.0, r.devices))
    if deadline_s is not None and fastest.totals.time_s > deadline_s:
        return (f"no size meets {_limits(deadline_s, None)}: the fastest, {fastest.devices:,} GPUs, takes "
                f"{_days(fastest)}")
    return (f"no size meets {_limits(deadline_s, budget)}: the cheapest, {cheapest.devices:,} GPUs, costs "
            f"{_spent(cheapest, 'cost')} and takes {_days(cheapest)}")

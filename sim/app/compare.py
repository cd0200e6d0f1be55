"""``dapple-sim compare``: one plan replayed under several schedules, side by side.

A schedule only orders work; the plan says which layers live on which devices. To compare
schedules fairly we keep what the plan fixes — its R distinct device sets (the pipeline
ranks) and its layer cuts — and lay the stages out the way each schedule expects:

- one stage per rank (``gpipe``, ``dapple``, ``1f1b``, ``zb-h1``): R stages, stage s on
  device set s;
- looped (``interleaved``, ``interleaved-zb``, ``looped-bfs``): v·R stages (v model chunks per
  rank: the plan's own v when it loops, else its schedule's ``chunks``, else 2), stage s on
  device set s mod R, so a micro-batch goes round the ranks v times;
- V-shaped (``zb-v``, ``dualpipe-v``): 2R stages folded like a hairpin, stages s and 2R−1−s
  on device set s (``sim.schedule.vshape.v_stage_ranks``), so the turn at the last rank is
  a local hand-off and every rank holds one chunk of each leg.

When the plan already has that many stages its layer boundaries are kept; otherwise the
layers are re-cut into balanced ranges (``sim.input.plan_section.balanced_cuts`` over each
layer's forward + backward time, as a grid plan is cut). Each variant is checked
(``sim.core.plan.check_plan``) and replayed (``sim.engine.run.run_scenario``); a schedule that
cannot run the plan (dualpipe-v with fewer than 2R micro-batches, say) gives a row saying why
instead of stopping the comparison. The rows show what someone choosing a schedule weighs:
iteration time, the bubble (idle share of device time), the largest device's peak memory and
whether it runs out of memory.

A comparison replays every variant, and a replay's work grows with its stages times its
micro-batches (each pair is a forward and a backward on one stage; a one-stage-per-rank variant of
the 1T GPT of Korthikanti et al. 2022, 64 stages by 512 micro-batches, is 32 768 pairs and about
5 s of SimPy). ``check_work`` counts those pairs over all the variants before any replays and
refuses more than ``MAX_STAGE_MICROBATCHES`` (``--max-stage-microbatches`` raises it), so a
comparison finishes in seconds or says up front why not: six schedules of that 1T plan are
294 912 pairs, half a minute.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from sim.core.errors import DappleError
from sim.core.plan import PlanSpec, StageSpec, check_plan
from sim.cost.compute import layer_times_s
from sim.engine.run import run_scenario
from sim.input.plan_section import balanced_cuts
from sim.models import shard_model
from sim.schedule.generators import GENERATORS, LOOPED_SCHEDULES, V_SCHEDULES
from sim.schedule.vshape import v_stage_ranks

__all__ = ["DEFAULT_SCHEDULES", "MAX_STAGE_MICROBATCHES", "Variant", "check_work", "format_rows", "plan_variants",
           "run_variants"]

DEFAULT_SCHEDULES = ("gpipe", "dapple", "interleaved", "zb-h1", "zb-v", "dualpipe-v")
"""What ``--schedules`` compares when not given."""

MAX_STAGE_MICROBATCHES = 65_536
"""Stage × micro-batch pairs a comparison replays in all, summed over its schedules, unless
``--max-stage-microbatches`` says otherwise (2¹⁶: a few seconds of SimPy on an idle core)."""


@dataclass(frozen=True)
class Variant:
    """The scenario's plan laid out for one schedule, or why it cannot be."""

    schedule: str
    plan: PlanSpec | None
    error: str | None = None


def parse_schedules(text: str) -> tuple[str, ...]:
    """``"gpipe,dapple"`` → ``("gpipe", "dapple")``; an unknown name is a ``DappleError`` listing valid ones."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not names:
        raise DappleError(f"--schedules: give at least one schedule; valid: {', '.join(sorted(GENERATORS))}")
    for name in names:
        if name not in GENERATORS:
            raise DappleError(f"--schedules: unknown schedule {name!r}; valid: {', '.join(sorted(GENERATORS))}")
    return names


def _layer_costs(scenario) -> list[float]:
    part = shard_model(scenario.model, scenario.plan.shard)
    return [sum(layer_times_s(layer, scenario.cluster.device, part.dtype, 1)[:2]) for layer in part.layers]


def plan_variants(scenario, schedules: Sequence[str]) -> list[Variant]:
    """The scenario's plan mapped onto each schedule's placement (see the module docstring)."""
    plan = scenario.plan
    if plan is None:
        raise DappleError(f"{scenario.path or scenario.name}: plan: missing; compare needs a plan to replay")
    ranks = plan.stage_ranks
    sets: dict[int, tuple[int, ...]] = {}
    for stage, rank in zip(plan.stages, ranks):
        sets.setdefault(rank, stage.devices)  # the devices in the plan's own layout order
    num_ranks = len(sets)
    num_layers = scenario.model.num_layers
    chunks = _chunks(plan, num_ranks)
    bounds_by_count = {plan.num_stages: (plan.stages[0].layers[0], *(s.layers[1] for s in plan.stages))}
    costs: list[float] | None = None
    variants = []
    for name in schedules:
        if name in V_SCHEDULES:
            owners = v_stage_ranks(num_ranks)
        elif name in LOOPED_SCHEDULES:
            owners = tuple(s % num_ranks for s in range(chunks * num_ranks))
        else:
            owners = tuple(range(num_ranks))
        count = len(owners)
        units = num_layers - len(scenario.model.no_cut_at)  # the mtp layer and the head share a stage
        if count > units:
            where = "" if units == num_layers else " a stage may start at"
            variants.append(Variant(name, None, f"needs {count} stages but the model has {units} layers{where}"))
            continue
        if count not in bounds_by_count:
            if costs is None:
                costs = _layer_costs(scenario)
            bounds_by_count[count] = balanced_cuts(costs, count, no_cut_at=scenario.model.no_cut_at)
        bounds = bounds_by_count[count]
        stages = tuple(StageSpec(layers=(bounds[s], bounds[s + 1]), devices=sets[owners[s]]) for s in range(count))
        params = plan.schedule_params if name == plan.schedule else ()
        if name in LOOPED_SCHEDULES:  # every looped schedule with the plan's chunk count
            params = tuple(sorted({**dict(params), "chunks": chunks}.items()))
        try:
            variant = replace(plan, stages=stages, schedule=name, schedule_params=params,
                              schedule_file=None, custom_schedule=None)
            check_plan(variant, num_layers=num_layers, num_devices=scenario.cluster.num_devices)
        except DappleError as exc:
            variants.append(Variant(name, None, str(exc)))
            continue
        variants.append(Variant(name, variant))
    return variants


def check_work(variants: Sequence[Variant], num_microbatches: int, *, limit: int = MAX_STAGE_MICROBATCHES) -> int:
    """The stage × micro-batch pairs replaying ``variants`` costs (those that can run); a
    ``DappleError`` naming the count, the limit and the flag that lifts it when over ``limit``."""
    counts = [(v.schedule, v.plan.num_stages * num_microbatches) for v in variants if v.plan is not None]
    total = sum(count for _, count in counts)
    if total > limit:
        largest = max(counts, key=lambda item: item[1])
        raise DappleError(
            f"compare: {len(counts)} schedules would replay {total:,} stage × micro-batch pairs ({largest[0]}: "
            f"{largest[1] // num_microbatches} stages × {num_microbatches} micro-batches), over the limit of "
            f"{limit:,}; compare fewer with --schedules, or raise the limit with --max-stage-microbatches {total}"
        )
    return total


def _chunks(plan: PlanSpec, num_ranks: int) -> int:
    """Model chunks per rank the looped variants use: the plan's own when it loops (24 stages on
    8 ranks: 3), else its schedule's ``chunks`` parameter, else 2."""
    if plan.schedule in LOOPED_SCHEDULES and plan.num_stages % num_ranks == 0:
        return plan.num_stages // num_ranks
    return int(dict(plan.schedule_params).get("chunks", 2))


def run_variants(scenario, variants: Sequence[Variant], *, engine: str = "simpy", contention: bool = True
                 ) -> tuple[list[dict[str, Any]], dict]:
    """Replay each variant: (one row per schedule, ``{schedule: SimResult}`` of those that ran)."""
    rows, results = [], {}
    for variant in variants:
        row: dict[str, Any] = {"schedule": variant.schedule, "num_stages": None, "iteration_time_s": None,
                               "bubble_fraction": None, "peak_memory_bytes": None, "peak_memory_device": None,
                               "oom": None, "error": variant.error}
        if variant.plan is not None:
            try:
                result = run_scenario(replace(scenario, plan=variant.plan), engine=engine, contention=contention)
            except DappleError as exc:  # ScheduleError included: e.g. dualpipe-v with M < 2R
                row["error"] = str(exc).splitlines()[0]
            else:
                results[variant.schedule] = result
                s = result.summarize()
                peak = max(s.devices, key=lambda d: d.peak_memory_bytes)
                row.update(num_stages=s.num_stages, iteration_time_s=s.iteration_time_s,
                           bubble_fraction=s.bubble_fraction, peak_memory_bytes=s.peak_memory_bytes,
                           peak_memory_device=peak.device, oom=s.oom)
        rows.append(row)
    return rows, results


def format_rows(rows: Sequence[dict[str, Any]], *, title: str = "") -> str:
    """A table: schedule, stages, iteration time, bubble, peak memory (largest device), OOM."""
    header = f"{'schedule':<15} {'stages':>6} {'iteration':>11} {'bubble':>7} {'peak memory':>16}  oom"
    lines = [title] if title else []
    lines.append(header)
    for row in rows:
        if row["error"] is not None:
            lines.append(f"{row['schedule']:<15} cannot run: {row['error']}")
            continue
        time = "-" if row["iteration_time_s"] is None else f"{row['iteration_time_s'] * 1e3:.2f} ms"
        bubble = "-" if row["bubble_fraction"] is None else f"{row['bubble_fraction']:.1%}"
        memory = f"{row['peak_memory_bytes'] / 2**30:.2f} GiB (d{row['peak_memory_device']})"
        lines.append(f"{row['schedule']:<15} {row['num_stages']:>6} {time:>11} {bubble:>7} {memory:>16}  "
                     f"{'OOM' if row['oom'] else 'no'}")
    return "\n".join(lines)

"""The ``plan:`` section: contiguous layer ranges on device groups, and a schedule.

A plan cuts the model into stages, each a ``[start, end)`` range of layers on one or more
devices (more than one: data-parallel replicas of that stage), and names the schedule that
orders their forwards and backwards, or a schedule file written in
``torch.distributed.pipelining``'s action text::

    plan:
      schedule: {name: dapple, policy: 2(s-i)-1}   # or schedule_file: my_schedule.txt
      stages:
      - {layers: [0, 27], devices: "0-7"}
      - {layers: [27, 53], devices: "8-15"}

The plan's parallel degrees hold for every stage: ``tensor_parallel``, ``sequence_parallel``,
``context_parallel``, ``sharding`` (none | optimizer | gradients | full) and ``recompute``
(none | selective | full; ``true``/``false`` mean full/none), and for a model with experts
``expert_parallel`` and ``expert_tensor_parallel`` (``PlanSpec.expert_groups``). Without ``stages``, a grid:
``pipeline_parallel`` and ``data_parallel`` build a uniform plan in Megatron-LM's rank order
(tensor-parallel rank innermost, then context, then data, then pipeline), the layers (the
embedding and the head count as layers) cut into stages of balanced compute; with
``schedule: interleaved`` and ``chunks: v`` the grid has v·p stages, stage s on device set
s mod p; with a V schedule (``zb-v``, ``dualpipe-v``) 2p stages, stage s and 2p − 1 − s on
device set s, cut so that each device set's two stages together are balanced (``balanced_v_cuts``).

Beyond the keys, the plan is checked as a whole (``sim.core.plan.check_plan``: the ranges cover
the model without gaps or overlaps, no device is used twice; the degrees divide the model's
heads, MLP width, vocabulary and sequence), and it is resolved once here
(``sim.schedule.resolved.resolve_plan``: stage costs, K_i policies, its schedule generated or
parsed and checked, lowered), so a schedule that cannot run is a scenario error; the scenario
keeps what was built (``Scenario.resolved``).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import replace
from itertools import accumulate
from typing import Any, Callable

from sim.core.errors import ScenarioError, ScheduleError, SpecError
from sim.core.model_spec import ModelSpec
from sim.core.overlap import FSDP_PATHS, FsdpSpec, OverlapSpec
from sim.core.parallelism import Recompute, Shard, Sharding
from sim.core.plan import PlanSpec, StageSpec, check_plan
from sim.core.specs import ClusterSpec
from sim.core.training import TrainingSpec
from sim.core.units import parse_bytes
from sim.core.userfiles import read_user_file
from sim.cost.compute import layer_times_s
from sim.input.strict import StrictReader, device_ids, join_key, show_value
from sim.models import shard_model
from sim.models.mtp import check_mtp_stage
from sim.schedule.generators import GENERATORS, V_SCHEDULES
from sim.schedule.plan_schedule import parse_schedule_for_plan
from sim.schedule.policy import DapplePolicy
from sim.schedule.resolved import ResolvedPlan, resolve_plan

__all__ = ["check_plan_shape", "read_fsdp", "read_overlap", "read_plan"]

_PLAN_KEYS = {"schedule", "schedule_file", "stages", "recompute", "tensor_parallel", "sequence_parallel",
              "context_parallel", "sharding", "pipeline_parallel", "data_parallel", "overlap", "fsdp",
              "expert_parallel", "expert_tensor_parallel"}


def read_plan(reader: StrictReader, data: Any, cluster: ClusterSpec, model: ModelSpec,
              training: TrainingSpec) -> ResolvedPlan:
    """The plan of a scenario's ``plan:`` mapping, checked against the cluster, model and
    training, and resolved on them (``sim.schedule.resolved``): its schedule is generated, or
    parsed and checked, once, and the caller keeps it."""
    data = reader.mapping(data, "plan")
    reader.keys(data, "plan", allowed=_PLAN_KEYS)
    if "schedule" in data and "schedule_file" in data:
        raise reader.fail("plan", "give either 'schedule' (a generator name) or 'schedule_file', not both")
    name, params = ("file", {}) if "schedule_file" in data else _schedule_name(reader, data.get("schedule", "dapple"))
    overlap_efficiency = params.pop("overlap_efficiency", 0.0)
    degrees = _degrees(reader, data)
    if "stages" in data:
        for key in ("pipeline_parallel", "data_parallel"):
            if key in data:
                raise reader.fail(f"plan.{key}", "give either stages or the grid (pipeline_parallel, data_parallel), "
                                                 "not both")
        stages_raw = data["stages"]
        if not isinstance(stages_raw, list) or not stages_raw:
            raise reader.fail("plan.stages", f"must be a non-empty list of {{layers: [start, end], devices: [...]}}, "
                                             f"got {show_value(stages_raw)}")
        stages = tuple(_stage(reader, item, f"plan.stages[{i}]", cluster.num_devices) for i, item in enumerate(stages_raw))
    elif "pipeline_parallel" in data or "data_parallel" in data:
        stages = _grid(reader, data, degrees, cluster, model, name, params)
    else:
        raise reader.fail("plan", "stages: missing; list the stages, or give the grid pipeline_parallel and "
                                  "data_parallel (e.g. pipeline_parallel: 4, data_parallel: 2)")
    plan = reader.build(
        "plan",
        PlanSpec,
        stages=stages,
        schedule=name,
        schedule_params=tuple(sorted(params.items())),
        schedule_file=str(reader.path(data["schedule_file"], "plan.schedule_file", data_fallback=False))
        if "schedule_file" in data
        else None,
        overlap_efficiency=overlap_efficiency,
        **degrees,
    )
    try:
        check_plan(plan, num_layers=model.num_layers, num_devices=cluster.num_devices)
        check_mtp_stage(plan, model)  # the mtp layer on the head's stage (Megatron-Core's placement)
        shard_model(model, plan.shard)  # the degrees divide the heads, the MLP, the vocabulary, the sequence
    except SpecError as exc:
        raise reader.fail(join_key("plan", exc.key), exc.problem) from None
    try:
        if plan.schedule_file is not None:
            text = read_user_file(plan.schedule_file, "schedule file", ScenarioError)
            plan = replace(plan, custom_schedule=parse_schedule_for_plan(plan, training.num_microbatches, text))
        return resolve_plan(plan, model, cluster, training)
    except ScheduleError as exc:
        key = "plan.schedule_file" if plan.schedule_file else "plan.schedule"
        raise ScenarioError(f"{reader.source}: {key}: {exc}" + (f"\n{exc.detail}" if exc.detail else "")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise reader.fail("plan.schedule_file", f"cannot read ({exc.__class__.__name__})") from None


def _schedule_name(reader: StrictReader, value: Any) -> tuple[str, dict]:
    if isinstance(value, str):
        value = {"name": value}
    data = reader.mapping(value, "plan.schedule")
    reader.keys(data, "plan.schedule", allowed={"name", "policy", "chunks", "overlap_efficiency"}, required={"name"})
    name = reader.string(data, "plan.schedule", "name", choices=GENERATORS)
    params: dict[str, Any] = {}
    if "policy" in data:
        params["policy"] = reader.string(data, "plan.schedule", "policy", choices={p.value for p in DapplePolicy})
    elif name in _AUTO_BY_DEFAULT:
        params["policy"] = DapplePolicy.AUTO.value  # the paper's rule per stage (issue 19 item 5)
    if "chunks" in data:
        params["chunks"] = reader.integer(data, "plan.schedule", "chunks")
    if "overlap_efficiency" in data:  # how much an OVERLAP_F_B pair hides (sim.cost.compute.overlapped_pair_s)
        params["overlap_efficiency"] = reader.number(data, "plan.schedule", "overlap_efficiency", low=0.0, high=1.0)
    return name, params


_AUTO_BY_DEFAULT = frozenset({"dapple"})
"""Schedules whose policy, when the scenario gives none, is ``auto``: ``s-i`` or ``2(s-i)-1`` per
stage from the plan's costs (``sim.schedule.plan_schedule.dapple_stage_policies``); ``1f1b``
keeps the textbook ``s-i``."""


def check_plan_shape(reader: StrictReader, data: Any) -> None:
    """Refuse a plan the planner will ignore when it is not a plan at all: its keys, and each
    stage's keys and ``[start, end]`` (an ignored plan may be for another cluster or model, so its
    ranges and devices are not checked; a mapping in ``layers`` or a misspelt key is still a typo)."""
    data = reader.mapping(data, "plan")
    reader.keys(data, "plan", allowed=_PLAN_KEYS)
    if isinstance(data.get("stages"), list):
        for i, item in enumerate(data["stages"]):
            _stage_layers(reader, item, f"plan.stages[{i}]")


def _stage_layers(reader: StrictReader, data: Any, key: str) -> tuple[dict, list[int]]:
    """A stage's mapping and its ``[start, end]``, their shape checked."""
    data = reader.mapping(data, key)
    reader.keys(data, key, allowed={"layers", "devices"}, required={"layers", "devices"})
    layers = data["layers"]
    if (
        not isinstance(layers, list)
        or len(layers) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
    ):
        raise reader.fail(join_key(key, "layers"), f"must be [start, end] (two integers, end exclusive), got {show_value(layers)}")
    return data, layers


def _stage(reader: StrictReader, data: Any, key: str, num_devices: int) -> StageSpec:
    data, layers = _stage_layers(reader, data, key)
    devices = device_ids(reader, data["devices"], join_key(key, "devices"), num_devices)
    return reader.build(key, StageSpec, layers=(layers[0], layers[1]), devices=devices)


def _degrees(reader: StrictReader, data: dict) -> dict[str, Any]:
    """The plan-wide parallel settings (``PlanSpec`` fields)."""
    recompute = data.get("recompute", False)
    if not isinstance(recompute, bool) and not (isinstance(recompute, str) and recompute in {r.value for r in Recompute}):
        raise reader.fail("plan.recompute", f"must be one of {', '.join(r.value for r in Recompute)} "
                                            f"(true/false: full/none), got {show_value(recompute)}")
    sharding = reader.string(data, "plan", "sharding", Sharding.NONE.value, choices={s.value for s in Sharding})
    return dict(
        recompute=Recompute.of(recompute),
        tensor_parallel=reader.integer(data, "plan", "tensor_parallel", 1),
        sequence_parallel=reader.boolean(data, "plan", "sequence_parallel", False),
        context_parallel=reader.integer(data, "plan", "context_parallel", 1),
        expert_parallel=reader.integer(data, "plan", "expert_parallel", 1),
        expert_tensor_parallel=reader.integer(data, "plan", "expert_tensor_parallel", 1),
        sharding=Sharding(sharding),
        overlap=read_overlap(reader, data.get("overlap", {})),
        fsdp=read_fsdp(reader, data.get("fsdp", {})),
    )


def read_overlap(reader: StrictReader, value: Any) -> OverlapSpec:
    """``plan.overlap``: which collectives run beside compute (``sim.core.overlap``)."""
    key = "plan.overlap"
    data = reader.mapping(value, key)
    reader.keys(data, key, allowed={"grad_reduce", "param_gather", "tensor_parallel", "bucket_size",
                                       "expert_all_to_all", "communication_sms", "reduce_after_flush",
                                       "paired_exchange", "pipeline_gather", "column_backward"})
    return reader.build(key, OverlapSpec,
                        grad_reduce=reader.boolean(data, key, "grad_reduce", False),
                        param_gather=reader.boolean(data, key, "param_gather", False),
                        tensor_parallel=reader.boolean(data, key, "tensor_parallel", False),
                        reduce_after_flush=reader.boolean(data, key, "reduce_after_flush", False),
                        paired_exchange=reader.boolean(data, key, "paired_exchange", False),
                        pipeline_gather=reader.boolean(data, key, "pipeline_gather", False),
                        column_backward=reader.boolean(data, key, "column_backward", False),
                        expert_all_to_all=reader.boolean(data, key, "expert_all_to_all", False),
                        communication_sms=reader.integer(data, key, "communication_sms", 0, minimum=0,
                                                         maximum=100_000),
                        bucket_bytes=reader.quantity(data, key, "bucket_size", parse_bytes, "25MiB"))


def read_fsdp(reader: StrictReader, value: Any) -> FsdpSpec:
    """``plan.fsdp``: how ZeRO-2/3 and FSDP gather by unit and reduce gradients."""
    key = "plan.fsdp"
    data = reader.mapping(value, key)
    reader.keys(data, key, allowed={"unit_layers", "reshard_after_forward", "reduce_every_microbatch", "prefetch",
                                    "path", "max_live_parameters", "max_reuse_distance", "reduce_scatter",
                                    "fp32_shards"})
    live, reuse = data.get("max_live_parameters"), data.get("max_reuse_distance")
    return reader.build(key, FsdpSpec,
                        unit_layers=reader.integer(data, key, "unit_layers", 1),
                        reshard_after_forward=reader.boolean(data, key, "reshard_after_forward", True),
                        reduce_every_microbatch=reader.boolean(data, key, "reduce_every_microbatch", True),
                        prefetch=reader.boolean(data, key, "prefetch", True),
                        fp32_shards=reader.boolean(data, key, "fp32_shards", False),
                        path=reader.string(data, key, "path", "hierarchical", choices=set(FSDP_PATHS)),
                        max_live_parameters=None if live is None else reader.number(
                            data, key, "max_live_parameters", low=0.0, high=1e18, low_open=True),
                        max_reuse_distance=None if reuse is None else reader.number(
                            data, key, "max_reuse_distance", low=0.0, high=1e18, low_open=True),
                        reduce_scatter=reader.boolean(data, key, "reduce_scatter", True))


def _grid(reader: StrictReader, data: dict, degrees: dict, cluster: ClusterSpec, model: ModelSpec, name: str,
          params: dict) -> tuple[StageSpec, ...]:
    """A uniform plan in Megatron-LM's rank order, its layers cut into stages of balanced compute."""
    p = reader.integer(data, "plan", "pipeline_parallel", 1)
    d = reader.integer(data, "plan", "data_parallel", 1)
    chunks = params.get("chunks", 2) if name == "interleaved" else 2 if name in V_SCHEDULES else 1
    group = d * degrees["context_parallel"] * degrees["tensor_parallel"]
    if p * group > cluster.num_devices:
        raise reader.fail("plan", f"pipeline_parallel {p} × data_parallel {d} × context_parallel "
                                  f"{degrees['context_parallel']} × tensor_parallel {degrees['tensor_parallel']} = "
                                  f"{p * group} devices, but the cluster has {cluster.num_devices}")
    units = model.num_layers - len(model.no_cut_at)  # the mtp layer and the head make one unit
    if p * chunks > units:
        raise reader.fail("plan.pipeline_parallel", f"{p * chunks} stages for a model of {units} layers "
                                                    f"a stage may start at; use at most {units // chunks}")
    shard = Shard(tensor=degrees["tensor_parallel"], context=degrees["context_parallel"],
                  sequence_parallel=degrees["sequence_parallel"], expert=degrees["expert_parallel"],
                  expert_tensor=degrees["expert_tensor_parallel"])
    try:
        part = shard_model(model, shard)
    except SpecError as exc:
        raise reader.fail(join_key("plan", exc.key), exc.problem) from None
    cost = [sum(layer_times_s(layer, cluster.device, part.dtype, 1)[:2]) for layer in part.layers]
    joined = model.no_cut_at
    bounds = balanced_v_cuts(cost, p, no_cut_at=joined) if name in V_SCHEDULES else \
        balanced_cuts(cost, p * chunks, no_cut_at=joined)
    sets = [tuple(range(r * group, (r + 1) * group)) for r in range(p)]
    # a V schedule (zb-v, dualpipe-v) places stage s and 2p − 1 − s on device set s
    place = (lambda s: s if s < p else 2 * p - 1 - s) if name in V_SCHEDULES else (lambda s: s % p)
    return tuple(StageSpec(layers=(a, b), devices=sets[place(s)]) for s, (a, b) in enumerate(zip(bounds, bounds[1:])))


def balanced_cuts(costs: list[float], parts: int, *, no_cut_at: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Boundaries ``(0, b1, ..., len(costs))`` of ``parts`` contiguous, non-empty ranges whose
    largest sum is the least possible (the linear partition problem; binary search on the
    bound with a greedy check, exact for non-negative costs), none at a boundary of ``no_cut_at``
    (``ModelSpec.no_cut_at``: :func:`over_units`)."""
    if no_cut_at:
        return over_units(balanced_cuts, costs, parts, no_cut_at)
    n = len(costs)
    if parts >= n:
        return tuple(range(n + 1))[: parts + 1]

    def cuts_for(bound: float) -> list[int] | None:
        cuts, total = [0], 0.0
        for i, c in enumerate(costs):
            # a new range when this layer would pass the bound, or when every layer left must
            # start a range of its own for all the parts to be non-empty
            if i > cuts[-1] and (total + c > bound or n - i == parts - len(cuts)):
                cuts.append(i)
                total = 0.0
            total += c
            if total > bound or len(cuts) > parts:
                return None
        return cuts + [n] if len(cuts) == parts else None

    low, high = max(costs), sum(costs)
    best = cuts_for(high) or [round(k * n / parts) for k in range(parts)] + [n]
    for _ in range(60):
        mid = (low + high) / 2
        found = cuts_for(mid)
        if found is None:
            low = mid
        else:
            high, best = mid, found
    return tuple(best)


def over_units(cut: Callable[[list[float], int], tuple[int, ...]], costs: list[float], parts: int,
               no_cut_at: tuple[int, ...]) -> tuple[int, ...]:
    """``cut(costs, parts)`` over units instead of layers: the layers on either side of each
    boundary in ``no_cut_at`` joined into one unit whose cost is their sum, the units' boundaries
    then mapped back to the layers'."""
    starts = [k for k in range(len(costs)) if k not in no_cut_at] + [len(costs)]
    units = [sum(costs[a:b]) for a, b in zip(starts, starts[1:])]
    return tuple(starts[b] for b in cut(units, parts))


def balanced_v_cuts(costs: list[float], ranks: int, *, no_cut_at: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Boundaries ``(0, b1, ..., len(costs))`` of ``2·ranks`` contiguous, non-empty ranges for a V
    schedule, where device set ``s`` runs range ``s`` and range ``2·ranks − 1 − s`` (zb-v, dualpipe-v):
    the largest sum of a device set's two ranges is made small, not each range's (a heavy head on
    the last range would otherwise be paired with a first range as full as itself). A binary
    search on the bound, from :func:`balanced_cuts`' cut (feasible) down, with a check that walks
    the device sets from the outside in, keeping for each left cut the smallest right cut; none at a
    boundary of ``no_cut_at`` (:func:`over_units`)."""
    if no_cut_at:
        return over_units(balanced_v_cuts, costs, ranks, no_cut_at)
    n, parts = len(costs), 2 * ranks
    first = balanced_cuts(costs, parts)
    if parts >= n:
        return first
    prefix = [0.0, *accumulate(costs)]

    def load(cuts) -> float:
        return max(prefix[cuts[s + 1]] - prefix[cuts[s]] + prefix[cuts[parts - s]] - prefix[cuts[parts - 1 - s]]
                   for s in range(ranks))

    def cuts_for(bound: float) -> list[int] | None:
        states: dict[int, tuple[int, tuple]] = {0: (n, ())}  # left cut -> (smallest right cut, left and right cuts)
        for r in range(ranks):
            after = ranks - 1 - r  # device sets still to place inside
            found: dict[int, tuple[int, tuple]] = {}
            for i, (j, path) in sorted(states.items()):
                for i2 in range(i + 1, j):
                    budget = bound - (prefix[i2] - prefix[i])
                    if budget < 0:
                        break
                    j2 = i2 if not after else max(bisect_left(prefix, prefix[j] - budget, i2, j), i2 + 2 * after)
                    if j2 >= j or prefix[j] - prefix[j2] > budget or (not after and j2 != i2):
                        continue
                    if i2 not in found or j2 < found[i2][0]:
                        found[i2] = (j2, path + ((i2, j2),))
            states = found
            if not states:
                return None
        path = next(iter(states.values()))[1]
        return [0, *(i for i, _ in path), *(j for _, j in reversed(path[:-1])), n]

    best, low, high = list(first), max(max(costs), prefix[-1] / ranks), load(first)
    for _ in range(40):
        if high - low <= 1e-9 * high:
            break
        mid = (low + high) / 2
        found = cuts_for(mid)
        if found is None:
            low = mid
        else:
            high, best = load(found), found
    return tuple(best)

"""Compilation: a checked scenario turned into what every device does, once, with no SimPy.

The engine (``sim.engine.replay``) and the fast path (``sim.engine.fastpath``) replay the same
:class:`~sim.engine.workload.Workload`, so it is computed once, here:

* the lowered schedule IR (sends, receives and ``REDUCE_GRAD`` added if the plan's schedule
  is compute-only);
* for each device, its slice of every micro-batch (a stage's micro-batch is split over its
  replicas like ``torch.tensor_split``, ``sim.cost.split.sample_ranges``) and what each action
  costs it in time and memory (``sim.cost.compute.stage_cost``);
* the flows and the ports they cross (``sim.engine.flows``), the gradient all-reduces
  (``sim.engine.collectives``) and the collectives inside each replica's tensor- and
  context-parallel groups and FSDP's gathers (``sim.engine.groups``);
* with tensor or context parallelism every device holds its share of each layer
  (``sim.models.shard_model``): the costs, the bytes between stages and the gradients are
  that share's; a micro-batch splits over a stage's data-parallel replicas, and every device
  of a replica processes its replica's samples;
* the faults each device and port carries (stragglers, failures, jitter, slow links).

Devices that must behave identically are merged into classes (``sim.engine.symmetry``); with
``symmetric=False`` every device and port is its own class, which is slower but useful to
check the reduction.
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from sim.cost.comm import embedding_group_link
from sim.cost.compute import overlapped_pair_s, stage_cost
from sim.cost.split import sample_ranges
from sim.engine.collectives import allreduce_flows, build_collectives
from sim.engine.flows import (PortTable, flow_kinds, flow_paths, kinds_by_class, p2p_flows, port_split,
                              static_rates)
from sim.engine.gcpause import gc_paused
from sim.engine.groups import OVERLAPPED, build_group_collectives, group_flows
from sim.engine.classes import FaultView, Symmetry, group_members
from sim.engine.workload import (
    COMPUTE,
    GROUP,
    RECV,
    REDUCE,
    SEND,
    DeviceClass,
    Op,
    Workload,
)
from sim.core.faults import jitter_factors
from sim.input.scenario import Scenario
from sim.core.model_spec import ModelSpec
from sim.models import mfu_flop_per_sample, shard_model
from sim.core.parallelism import Recompute, Sharding
from sim.cost.memory import StateBytes
from sim.schedule.ir import ActionKind, OverlapFB, Schedule
from sim.schedule.passes import lower
from sim.schedule.plan_schedule import dapple_stage_policies, schedule_for_plan
from sim.core.summary import Parallelism

__all__ = ["WGRAD_STASH_FRACTION", "FaultView", "compile_workload", "compute_memory"]

WGRAD_STASH_FRACTION = 0.5
"""Share of a stage's stash a split backward keeps from I until W: the layer inputs that the
weight gradients need (Qi et al., ICLR'24, §2, Table 1 counts W's memory as about half of B's)."""


@gc_paused()
def compile_workload(scenario: Scenario, *, symmetric: bool = True, contention: bool = True,
                     optimistic: bool = False) -> Workload:
    """Compile ``scenario`` (which must have a plan) for replay.

    ``contention=False`` compiles for a contention-free replay (the fast path, the SimPy engine
    with ``contention=False``): its classes need only be exact without contention, which lets a
    fault split far fewer of them (``sim.engine.symmetry.refine_behaviour``). ``optimistic``
    (with contention and faults) compiles the classes of ``Symmetry.optimistic``: far fewer
    than the equitable ones, exact unless the SimPy replay raises ``Diverged``.
    """
    plan, cluster, model, training = scenario.plan, scenario.cluster, scenario.model, scenario.training
    assert plan is not None, "the caller checks that the scenario has a plan"
    schedule = schedule_for_plan(plan, training.num_microbatches,
                                 stage_policies=dapple_stage_policies(plan, model, cluster, training))
    if not schedule.is_lowered:
        schedule = lower(schedule)
    stage_ranks, groups = plan.stage_ranks, plan.device_groups
    whole, model = model, shard_model(model, plan.shard)
    devices = sorted(d for g in groups for d in g)
    rank_of = {d: r for r, g in enumerate(groups) for d in g}
    samples = {s: _replica_samples(plan, s, training.microbatch_size) for s in range(plan.num_stages)}
    stages_of_rank = [tuple(s for s, r in enumerate(stage_ranks) if r == rank) for rank in range(len(groups))]

    ar_flows, ar_latency = allreduce_flows(plan, model, cluster)
    g_flows, g_latency = group_flows(plan, model, cluster, samples)
    p2p = p2p_flows(plan, model, training.microbatch_size)
    flows = p2p + ar_flows + g_flows
    nic_ids = sorted({cluster.nic_of(d) for d in devices})
    faults = FaultView(scenario.faults, cluster, plan)
    paths = flow_paths(flows, cluster, faults)
    slices = {d: tuple(_slice(samples[s], d) for s in stages_of_rank[rank_of[d]]) for d in devices}
    sym = Symmetry(devices, nic_ids, flows, cluster, faults, rank_of, slices)
    # identical devices issue each operation together (``static_rates``), with or without the reduction
    optimistic = optimistic and contention and symmetric and faults.any
    if optimistic:
        device_class, card_class = sym.optimistic()
        # every device its own class (jitter drawn per device): nothing merged, nothing to check
        optimistic = max(device_class, default=-1) + 1 < len(devices)
        rates = static_rates(flows, paths, {d: device_class[i] for i, d in enumerate(devices)})
    elif contention:
        device_class, card_class = sym.equitable(with_faults=True)
        rates = static_rates(flows, paths, {d: device_class[i] for i, d in enumerate(devices)})
    else:
        device_class, rates = sym.behaviour(len(p2p), paths, group_members(plan, g_flows))
        card_class = list(range(len(nic_ids)))  # a contention-free replay never reads port loads
    if not symmetric:
        device_class, card_class = list(range(len(devices))), list(range(len(nic_ids)))
    class_of = {d: device_class[i] for i, d in enumerate(devices)}
    card_of = {n: card_class[i] for i, n in enumerate(nic_ids)}

    split = port_split(flows, paths, class_of, card_of) if optimistic else None
    ports = PortTable(cluster, class_of, card_of, devices, nic_ids, split)
    kinds = flow_kinds(flows, paths, rates, class_of, ports, by_rate=not contention, by_path=optimistic)
    members = defaultdict(list)
    for d in devices:
        members[class_of[d]].append(d)
    collectives = build_collectives(plan, model, kinds, class_of, ar_latency)
    group_colls, group_of = build_group_collectives(kinds, class_of, plan, g_latency)
    by_class = kinds_by_class(kinds)
    group_keys = defaultdict(list)
    for (label, cls), index in group_of.items():
        group_keys[cls].append((label, index))
    context = _Context(scenario=scenario, model=model, schedule=schedule, rank_of=rank_of,
                       stages_of_rank=stages_of_rank, samples=samples, kinds=kinds, collectives=collectives,
                       group_keys={cls: tuple(sorted(keys)) for cls, keys in group_keys.items()},
                       by_class=by_class, faults=faults, rank_texts={}, stage_costs={}, shared_ops={})
    classes = tuple(_device_class(index, tuple(members[index]), context) for index in range(len(members)))
    flop = mfu_flop_per_sample(whole)
    return Workload(
        name=scenario.name,
        schedule=schedule,
        num_microbatches=training.num_microbatches,
        global_batch_size=training.global_batch_size,
        classes=classes,
        kinds=tuple(kinds),
        port_classes=ports.classes(),
        collectives=tuple(collectives),
        group_collectives=tuple(group_colls),
        device_memory_bytes=cluster.device.memory_bytes,
        flop_per_iteration=flop * training.global_batch_size if flop else None,
        peak_flop_per_s=cluster.device.peak_flop_per_s_for(model.dtype),
        schedule_name=plan.schedule if plan.custom_schedule is None else "file",
        num_stages=plan.num_stages,
        recompute=plan.recompute is Recompute.FULL,
        parallelism=Parallelism(tensor=plan.tensor_parallel, context=plan.context_parallel, pipeline=len(groups),
                                data=max(plan.num_replicas(s) for s in range(plan.num_stages)),
                                sharding=plan.sharding.value, sequence_parallel=plan.sequence_parallel),
        tokens_per_sample=_tokens_per_sample(whole),
        contention=contention or not symmetric,
        optimistic=optimistic,
    )


def _replica_samples(plan, stage: int, microbatch_size: int) -> dict[int, tuple[int, int]]:
    """Device -> the samples of a micro-batch its replica processes (``sim.cost.split.sample_ranges``
    over the stage's data-parallel replicas; every device of a replica gets the replica's)."""
    replicas = plan.replicas(stage)
    ranges = sample_ranges(microbatch_size, tuple(range(len(replicas))))
    return {d: ranges[r] for r, replica in enumerate(replicas) for d in replica}


def _tokens_per_sample(model) -> int | None:
    """A transformer's sequence length (what ``tokens_per_s`` counts per sample)."""
    if model.preset is None or "seq_len" not in model.preset.values:
        return None
    return model.preset.values["seq_len"]


def _slice(ranges: dict[int, tuple[int, int]], device: int) -> int:
    start, end = ranges[device]
    return end - start


@dataclass(frozen=True, slots=True, kw_only=True)
class _Context:
    """What building one class's ops needs from the compilation (read-only)."""

    scenario: Scenario
    model: ModelSpec
    """One device's share of every layer."""
    schedule: Schedule
    rank_of: dict
    stages_of_rank: list
    samples: dict
    kinds: list
    collectives: list
    group_keys: dict
    """``class -> ((label, index), ...)`` of the class's group collectives, by label."""
    by_class: tuple
    faults: FaultView
    rank_texts: dict
    stage_costs: dict
    """``(stage, samples) -> StageCost``, filled as classes need them."""
    shared_ops: dict
    """``(ops, their durations)`` of the classes whose ops are alike (``_device_class``'s key),
    built once (a class with jitter scales a copy of the durations)."""

    def texts(self, rank: int) -> list[str]:
        """The text of each step of ``rank`` (``2F0``), made once for all its classes."""
        if rank not in self.rank_texts:
            self.rank_texts[rank] = [str(step) for step in self.schedule.ranks[rank]]
        return self.rank_texts[rank]


def _device_class(index: int, devices: tuple[int, ...], ctx: _Context) -> DeviceClass:
    plan, cluster = ctx.scenario.plan, ctx.scenario.cluster
    rank = ctx.rank_of[devices[0]]
    stages = ctx.stages_of_rank[rank]
    slices = tuple(_slice(ctx.samples[s], devices[0]) for s in stages)
    costs = {}
    for s, n in zip(stages, slices):
        if (s, n) not in ctx.stage_costs:  # the same for every class of the stage with this slice
            start, end = plan.stages[s].layers
            data = len(plan.gradient_groups(s)[0])
            ctx.stage_costs[(s, n)] = stage_cost(ctx.model, cluster.device, start, end, n, recompute=plan.recompute,
                                                 data_parallel=data, sharding=plan.sharding,
                                                 tied_link=embedding_group_link(plan, cluster))
        costs[s] = ctx.stage_costs[(s, n)]
    # The ops name this class's flow kinds and group collectives through slots (``DeviceClass.slots``,
    # ``DeviceClass.groups``), so classes whose links cost the same share one tuple of ops.
    out_kinds, in_kinds = ctx.by_class[0][index], ctx.by_class[1][index]
    links = sorted([("out", label) for label in out_kinds] + [("in", label) for label in in_kinds])
    kinds = ctx.kinds
    link_costs = tuple(
        (link, len(ks), sum(kinds[k].issue_s for k in ks), sum(kinds[k].receive_s for k in ks),
         sum(kinds[k].recv_bytes_per_device for k in ks))
        for link in links for ks in [(out_kinds if link[0] == "out" else in_kinds)[link[1]]]
    )
    group_keys = ctx.group_keys.get(index, ())
    key = (rank, slices, link_costs, tuple(label for label, _ in group_keys))
    shared = ctx.shared_ops.get(key)
    if shared is None:
        ops = _class_ops(rank, costs, link_costs, group_keys, ctx)
        compute = np.array([i for i, op in enumerate(ops) if op.code == COMPUTE], dtype=np.intp)
        shared = ctx.shared_ops[key] = ops, array("d", [op[5] for op in ops]), compute
    ops, durations, compute = shared
    jitter = ctx.faults.jitter_for(devices[0])
    if jitter is not None:  # the devices of a class draw the same factors (their signature has the key)
        durations = array("d", durations)
        np.frombuffer(durations, dtype=float)[compute] *= jitter_factors(jitter[0], jitter[1], len(compute))
    straggler, failure = ctx.faults.stragglers.get(devices[0]), ctx.faults.failures.get(devices[0])
    states = [costs[s].states for s in stages]
    return DeviceClass(
        index=index,
        devices=devices,
        rank=rank,
        stages=stages,
        samples=slices,
        ops=ops,
        durations=durations,
        slots=tuple(tuple((out_kinds if link[0] == "out" else in_kinds)[link[1]]) for link in links),
        groups=tuple(g for _, g in group_keys),
        static_bytes=sum(costs[s].static_bytes for s in stages),
        states=StateBytes(parameters=sum(x.parameters for x in states), gradients=sum(x.gradients for x in states),
                          optimizer=sum(x.optimizer for x in states)),
        optimizer_s=sum(costs[s].optimizer_s for s in stages),
        slowdown=straggler.slowdown if straggler else 1.0,
        slow_from_s=straggler.from_s if straggler else 0.0,
        fails_at_s=failure.at_s if failure else None,
    )


def _class_ops(rank: int, costs: dict, link_costs: tuple, group_keys: tuple, ctx: _Context) -> tuple[Op, ...]:
    """The ops of a class of ``rank`` whose stages cost ``costs``, with its links' costs and groups."""
    plan = ctx.scenario.plan
    slot_of = {link: slot for slot, (link, *_) in enumerate(link_costs)}
    cost_of = {link: rest for link, *rest in link_costs}
    group_slot = {label: slot for slot, (label, _) in enumerate(group_keys)}
    collective_of = {c.stage: c.index for c in ctx.collectives}
    templates: dict[tuple, list] = {}  # (stage, kind) -> the ops' fields but text and micro-batch
    ops = []

    def template(a) -> list:
        key = (a.stage, a.kind)
        if key not in templates:
            gather = costs[a.stage].param_bytes * (1 - 1 / len(plan.gradient_groups(a.stage)[0])) \
                if plan.sharding is Sharding.FULL else 0.0
            fields = _op_fields(a, costs[a.stage], plan.recompute is Recompute.FULL, slot_of, cost_of, collective_of)
            templates[key] = _with_groups(a, fields, group_slot, gather)
        return templates[key]

    efficiency = plan.overlap_efficiency
    rows: dict[tuple, list[tuple]] = {}  # template key -> each op's fields after the micro-batch
    for step, text in zip(ctx.schedule.ranks[rank], ctx.texts(rank)):
        if type(step) is OverlapFB:
            ops += _pair_ops(step, template(step.forward), template(step.backward), efficiency)
            continue
        key = (step.stage, step.kind)
        if key not in rows:
            rows[key] = [_op_row(fields) for fields in template(step)]
        mb = step.microbatch
        ops += [_new_tuple(Op, (code, text, stage, kind, mb) + rest) for code, stage, kind, rest in rows[key]]
    return tuple(ops)


_new_tuple = tuple.__new__  # an Op from its values in field order, without keyword parsing


def _op_row(fields: dict) -> tuple:
    """An op's fields as (code, stage, kind, the fields after the micro-batch in ``Op`` order)."""
    rest = tuple(fields.get(name, Op._field_defaults[name]) for name in Op._fields[5:])
    return fields["code"], fields["stage"], fields["kind"], rest


def _pair_ops(pair: OverlapFB, forward: list[dict], backward: list[dict], efficiency: float) -> list[Op]:
    """An overlapped pair as the ops of its forward, then those of its backward.

    Each part keeps its memory (the forward allocates its stash when the pair starts, the
    backward frees when the pair ends) and its group collectives; the two compute ops share
    the pair's time, ``sim.cost.compute.overlapped_pair_s`` (F + B − e·min(F, B)), in proportion to
    their own. The lowering pass has already put both parts' receives before the pair and
    their sends after it.
    """
    fwd_s = sum(f["duration_s"] for f in forward if f["code"] == COMPUTE)
    bwd_s = sum(f["duration_s"] for f in backward if f["code"] == COMPUTE)
    total = fwd_s + bwd_s
    scale = overlapped_pair_s(fwd_s, bwd_s, efficiency) / total if total > 0 else 1.0
    ops = []
    for part, fields_list in ((pair.forward, forward), (pair.backward, backward)):
        for fields in fields_list:
            if fields["code"] == COMPUTE and scale != 1.0:
                fields = {**fields, "duration_s": fields["duration_s"] * scale}
            ops.append(Op(text=str(part), microbatch=part.microbatch, **fields))
    return ops


def _with_groups(action, fields: dict, group_slot: dict, gather_bytes: float) -> list[dict]:
    """An action's op, preceded by its overlapped group collectives (the context-parallel ring,
    FSDP's gather) and followed by its blocking ones (tensor parallelism); a GROUP op names its
    collective by its slot in ``DeviceClass.groups``."""
    kind = action.kind
    if kind not in (ActionKind.F, ActionKind.B, ActionKind.I):
        return [fields]
    phase = "F" if kind is ActionKind.F else "B"
    before, after = [], []
    for name in ("FS", "CP", "TP"):
        slot = group_slot.get((name, action.stage, phase))
        if slot is None:
            continue
        op = dict(code=GROUP, collective=slot, overlap=name in OVERLAPPED, stage=action.stage, kind=kind)
        (before if name in OVERLAPPED else after).append(op)
    if gather_bytes and before:
        fields = {**fields, "gather_bytes": gather_bytes}
    return before + [fields] + after


def compute_memory(kind: ActionKind, cost, recompute: bool) -> tuple[float, float]:
    """(bytes a compute action allocates as it starts, bytes it frees as it ends) on one device:
    a forward keeps its stash; with full recompute the forward stashes its layers' inputs and
    the backward rebuilds one checkpointed segment at a time (``StageCost.rebuilt_bytes``: the
    largest segment's); a split backward frees ``1 − WGRAD_STASH_FRACTION`` of what it kept at
    I and the rest at W. The engine's ops and the planner's count before a replay
    (``planner.search.memory``) both read it."""
    kept = cost.rebuilt_bytes if recompute else cost.stash_bytes
    rebuilt = cost.rebuilt_bytes if recompute else 0.0
    extra = cost.stash_bytes if recompute else 0.0
    f = WGRAD_STASH_FRACTION
    if kind is ActionKind.F:
        return cost.stash_bytes, 0.0
    if kind is ActionKind.B:
        return rebuilt, kept + extra
    if kind is ActionKind.I:
        return rebuilt, (1 - f) * kept + extra
    return 0.0, f * kept  # W


def _op_fields(action, cost, recompute, slot_of, cost_of, collective_of) -> dict:
    """Time and memory of one action on one device (see the module docstring), as Op fields;
    ``slot_of``: the slot of each link (``("out" or "in", label)``), ``cost_of``: its (flows,
    issue seconds, receive seconds, received bytes per device)."""
    s, kind = action.stage, action.kind
    base = dict(stage=s, kind=kind)
    none = (0, 0.0, 0.0, 0.0)
    recv_f = cost_of.get(("in", ("F", s - 1)), none)[3]
    recv_b = cost_of.get(("in", ("B", s + 1)), none)[3]
    if kind in (ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W):
        alloc, free = compute_memory(kind, cost, recompute)
        if kind is ActionKind.F:
            return dict(code=COMPUTE, duration_s=cost.fwd_s, alloc_bytes=alloc, buffer_bytes=recv_f,
                        live_delta=1, **base)
        if kind is ActionKind.B:
            return dict(code=COMPUTE, duration_s=cost.bwd_s, alloc_bytes=alloc, free_bytes=free,
                        buffer_bytes=recv_b, live_delta=-1, **base)
        if kind is ActionKind.I:
            return dict(code=COMPUTE, duration_s=cost.bwd_s - cost.wgrad_s, alloc_bytes=alloc,
                        free_bytes=free, buffer_bytes=recv_b, **base)
        return dict(code=COMPUTE, duration_s=cost.wgrad_s, free_bytes=free, live_delta=-1, **base)
    if kind in (ActionKind.SEND_F, ActionKind.SEND_B):
        link = ("out", ("F" if kind is ActionKind.SEND_F else "B", s))
        count, issue_s = cost_of.get(link, none)[:2]
        return dict(code=SEND, flows=slot_of[link] if count else -1, duration_s=issue_s, **base)
    if kind in (ActionKind.RECV_F, ActionKind.RECV_B):
        link = ("in", ("F", s - 1) if kind is ActionKind.RECV_F else ("B", s + 1))
        count, _, receive_s = cost_of.get(link, none)[:3]
        return dict(code=RECV, flows=slot_of[link] if count else -1, duration_s=receive_s, **base)
    return dict(code=REDUCE, collective=collective_of.get(s, -1), **base)

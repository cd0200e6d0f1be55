"""Ops: what each action of a device's schedule costs it, in time, memory and links.

The compiler (``sim.engine.compile``) turns every step of a device class's rank of the
lowered schedule into ``sim.engine.workload.Op`` tuples, which every replay reads:

* a compute action (F, B, I, W) lasts its stage's ``sim.cost.compute.StageCost`` time on the
  class's slice of the micro-batch, allocates and frees what :func:`compute_memory` says, and
  names the receive buffer it reads;
* a send or a receive names its flow kinds through the class's slots (``DeviceClass.slots``)
  and lasts what issuing or receiving them costs; ``REDUCE_GRAD`` names its stage's
  gradient all-reduce;
* the group collectives of a replica (tensor parallelism and the experts' all-to-all blocking after an action, the
  context-parallel ring and FSDP's gather overlapped before it) surround the compute op;
* an overlapped forward-backward pair (``OVERLAP_F_B``) becomes its two parts, which share
  the pair's time (``sim.cost.compute.overlapped_pair_s``).

Ops of the same (stage, kind) differ only in text and micro-batch, so each is built once
from a template and stamped per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.core.parallelism import Recompute
from sim.cost.action_memory import compute_memory
from sim.cost.compute import overlapped_pair_s
from sim.cost.memory import HeldBytes
from sim.cost.overlap import contended_s, held_sms_s
from sim.engine.groups import OVERLAPPED
from sim.engine.workload import COMPUTE, DETACHED_S, GROUP, RECV, REDUCE, SEND, Op
from sim.schedule.ir import ActionKind, OverlapFB

__all__ = ["Pipelining", "class_ops"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Pipelining:
    """How a plan pipelines its collectives with its compute (``plan.overlap``, ``plan.fsdp``),
    as the compiler hands it to :func:`class_ops`; the defaults compile today's ops."""

    group_s: tuple[float, ...] = ()
    """Alone seconds of each group collective (``Workload.group_collectives``), when needed."""
    units: dict = field(default_factory=dict)
    """Stage -> FSDP units (``sim.cost.overlap.unit_count``) under ``sharding: full``: its gather is
    pipelined unit by unit with the action (lead: one unit's gather, tail: one unit's compute)."""
    tp_chunks: int = 0
    """Chunks of an overlapped tensor-parallel collective (``plan.overlap.tensor_parallel``: the
    tensor-parallel degree), 0 when it blocks the compute stream."""
    reshard_after_forward: bool = True
    """False: the backward keeps the forward's gathered parameters and does not gather again."""
    reductions: dict = field(default_factory=dict)
    """Stage -> ``(buckets, last bucket's alone seconds)`` of its bucketed gradient reduction."""
    every_microbatch: bool = False
    """A reduce-scatter after every backward (``plan.fsdp.reduce_every_microbatch`` under
    ``sharding: gradients|full`` with several micro-batches) rather than one at the end."""
    collective_of: dict = field(default_factory=dict)
    """Stage -> index of its gradient reduction in ``Workload.collectives`` (``every_microbatch``)."""
    final_gather: bool = False
    """With ``every_microbatch``: the end keeps a REDUCE op, ZeRO-2's all-gather of the updated
    parameters (``sharding: gradients``); ZeRO-3 has none (``full``)."""
    final_gather_of: dict = field(default_factory=dict)
    """Stage -> index in ``Workload.collectives`` of its final all-gather where it moves other bytes
    than its reduce-scatter (fp32 gradients: ``sim.engine.collectives.with_final_gather``);
    absent: the REDUCE op runs the reduce-scatter's collective again."""
    gather_buckets: dict = field(default_factory=dict)
    """Stage -> buckets of ZeRO-1/2's parameter all-gather (``plan.overlap.param_gather``), which
    runs beside the stage's first forward as a ``("PG", stage, "F")`` GROUP op, pipelined bucket
    by bucket (lead: one bucket's gather, tail: one bucket's forward); empty without it."""
    gather_ahead: bool = False
    """With ``gather_buckets``: a device's later chunks' gathers run beside its previous chunk's
    first forward (no lead, no tail) rather than before their own, as Megatron-Core's interleaved
    schedule launches them (``_with_param_gather``); only its first chunk's is pipelined."""
    expert_overlap: bool = False
    """The experts' all-to-alls (``EP``) run beside the action's compute rather than after it
    (``plan.overlap.expert_all_to_all``), uncut: the action ends when the longer of the two does."""
    overlap_slowdown: float = 0.0
    """The device's ``overlap_slowdown``: a compute op beside overlapped group collectives lasts
    ``sim.cost.overlap.contended_s`` of their alone seconds (``group_s``)."""
    prefetch: bool = True
    """FSDP's gathers (``FS``) run beside the compute, unit by unit; false (``plan.fsdp.prefetch``,
    DeepSpeed's ZeRO-3 before v0.6, ``sim.cost.zero3``): each blocks the compute stream before it."""
    expert_slowdown: float | None = None
    """The slowdown beside the overlapped all-to-all when ``plan.overlap.communication_sms`` is set
    (``sim.cost.overlap.communication_sms_slowdown``), in place of ``overlap_slowdown`` for it; None: not set."""
    held_share: dict = field(default_factory=dict)
    """(stage, "F" or "B") -> the share of that action's compute in its MoE blocks, over which the
    communication SMs are held (``sim.cost.compute.all_to_all_share``, ``sim.cost.overlap.held_sms_s``);
    filled with ``expert_slowdown``."""


def class_ops(plan, steps: tuple, texts: list[str], costs: dict, link_costs: tuple, group_keys: tuple,
              collectives: list, held: tuple[HeldBytes, ...] = (),
              pipelining: Pipelining = Pipelining()) -> tuple[Op, ...]:
    """The ops of a class that runs ``steps`` (its rank of the lowered schedule, ``texts``
    their text), whose stages cost ``costs`` (stage -> ``StageCost`` of its slice), with its
    links' costs (``(link, flows, issue s, receive s, received bytes)``), its group
    collectives ``((label, index), ...)``, the gradient all-reduces ``collectives``, what
    each stage's compute actions hold unsharded (``held``, by stage: ``sim.engine.memory.held_by_stage``)
    and how the collectives pipeline with the compute (``pipelining``)."""
    slot_of = {link: slot for slot, (link, *_) in enumerate(link_costs)}
    cost_of = {link: rest for link, *rest in link_costs}
    group_slot = {label: (slot, index) for slot, (label, index) in enumerate(group_keys)}
    collective_of = {c.stage: c.index for c in collectives}
    templates: dict[tuple, list] = {}  # (stage, kind) -> the ops' fields but text and micro-batch
    ops = []

    def template(a) -> list:
        key = (a.stage, a.kind)
        if key not in templates:
            gather = held[a.stage] if held else HeldBytes()
            fields = _op_fields(a, costs[a.stage], plan.recompute is Recompute.FULL, slot_of, cost_of, collective_of)
            templates[key] = _with_groups(a, fields, group_slot, gather, pipelining)
        return templates[key]

    efficiency = plan.overlap_efficiency
    rows: dict[tuple, list[tuple]] = {}  # template key -> each op's fields after the micro-batch
    for step, text in zip(steps, texts):
        if type(step) is OverlapFB:
            ops += _pair_ops(step, template(step.forward), template(step.backward), efficiency)
            continue
        key = (step.stage, step.kind)
        if key not in rows:
            rows[key] = [_op_row(fields) for fields in template(step)]
        mb = step.microbatch
        ops += [_new_tuple(Op, (code, text, stage, kind, mb) + rest) for code, stage, kind, rest in rows[key]]
    if pipelining.gather_buckets:  # first: the reductions name their backward by its index
        ops = _with_param_gather(ops, group_slot, pipelining)
    if pipelining.reductions or pipelining.every_microbatch:
        ops = _with_reductions(ops, pipelining)
    return tuple(ops)


def _with_param_gather(ops: list[Op], group_slot: dict, pipelining: Pipelining) -> list[Op]:
    """The ops with ZeRO-1/2's parameter all-gather before each stage's first forward compute,
    overlapped with it bucket by bucket (``sim.cost.overlap.pipelined_s``: the forward ends
    ``max(AG/K + F, AG + F/K)`` after the gather starts, alone).

    With ``gather_ahead``, a device's stages in the order of their first forwards (its model
    chunks) gather one ahead: the first chunk's as above, each later one's beside the previous
    chunk's first forward, wholly overlapped. Megatron-Core's interleaved schedule does so
    (NVIDIA/Megatron-LM ``megatron/core/pipeline_parallel/schedules.py`` at core_v0.9.0,
    ``forward_backward_pipelining_with_interleaving``: "Synchronize params for first two model
    chunks" at its start, then "launch param synchronization for next model chunk" at each
    chunk's first micro-batch, with ``--align-param-gather`` on by default in
    ``megatron/training/arguments.py``; each chunk's forward pre-hook only waits). The early
    gather is detached (``DETACHED_S``): its flows share the links and the compute beside it is
    slowed, but no compute op waits for it, the chunk's first forward coming a round of
    micro-batches later (assumed done by then: a gather longer than that round is not delayed)."""
    order = list(dict.fromkeys(op.stage for op in ops if op.code == COMPUTE and op.kind is ActionKind.F))
    ahead = dict(zip(order, order[1:])) if pipelining.gather_ahead else {}
    out: list[Op] = []
    seen: set[int] = set()
    for op in ops:
        s = op.stage
        if op.code == COMPUTE and op.kind is ActionKind.F and s not in seen:
            seen.add(s)
            own = s if not ahead or s == order[0] else None  # its own gather, pipelined with it
            gathers = [(g, g == own) for g in (own, ahead.get(s)) if g is not None and ("PG", g, "F") in group_slot]
            alone_s = [pipelining.group_s[group_slot[("PG", g, "F")][1]] for g, _ in gathers]
            for other_s in alone_s:
                op = op._replace(duration_s=contended_s(op.duration_s, other_s, pipelining.overlap_slowdown))
            for (g, pipelined), other_s in zip(gathers, alone_s):
                buckets = pipelining.gather_buckets.get(g, 1)
                out.append(Op(code=GROUP, text=f"{g}PARAM_GATHER{op.microbatch}", stage=g, kind=ActionKind.F,
                              microbatch=op.microbatch, collective=group_slot[("PG", g, "F")][0], overlap=True,
                              lead_s=other_s / buckets if pipelined else 0.0,
                              tail_s=op.duration_s / buckets if pipelined else DETACHED_S))
        out.append(op)
    return out


def _with_reductions(ops: list[Op], pipelining: Pipelining) -> list[Op]:
    """The ops with each stage's gradient reduction where the plan puts it: a reduce-scatter
    after every backward (``every_microbatch``), each bucketed inside it when the stage's
    reduction is (``reductions``: its REDUCE op names the backward as its ``source``)."""
    out: list[Op] = []
    last: dict[int, int] = {}  # stage -> index of its latest backward (B, or W when split)
    for op in ops:
        if op.code == REDUCE:
            s = op.stage
            if pipelining.every_microbatch:
                if pipelining.final_gather:  # ZeRO-2's all-gather of the updated parameters, not bucketed
                    out.append(op._replace(collective=pipelining.final_gather_of.get(s, op.collective)))
                continue
            if s in pipelining.reductions and s in last and op.collective >= 0:
                buckets, tail_s = pipelining.reductions[s]
                op = op._replace(source=last[s], buckets=buckets, tail_s=tail_s)
            out.append(op)
            continue
        out.append(op)
        if op.code == COMPUTE and op.kind in (ActionKind.B, ActionKind.W):
            last[op.stage] = len(out) - 1
            if pipelining.every_microbatch and op.stage in pipelining.collective_of:
                out.append(_scatter(op, len(out) - 1, pipelining))
    return out


def _scatter(backward: Op, index: int, pipelining: Pipelining) -> Op:
    """The reduce-scatter of one backward's gradients (op ``index``), bucketed inside it when
    the stage's reduction is."""
    s = backward.stage
    text = f"{s}REDUCE_SCATTER{backward.microbatch}"
    op = Op(code=REDUCE, text=text, stage=s, kind=ActionKind.REDUCE_GRAD, microbatch=backward.microbatch,
            collective=pipelining.collective_of[s])
    if s in pipelining.reductions:
        buckets, tail_s = pipelining.reductions[s]
        op = op._replace(source=index, buckets=buckets, tail_s=tail_s)
    return op


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


def _with_groups(action, fields: dict, group_slot: dict, held: HeldBytes, pipelining: Pipelining) -> list[dict]:
    """An action's op, preceded by its overlapped group collectives (the context-parallel ring,
    FSDP's gather, tensor parallelism when overlapped) and followed by its blocking ones
    (tensor parallelism); a GROUP op names its collective by its slot in ``DeviceClass.groups``.
    A collective pipelined in ``pieces`` with the compute (FSDP's units, tensor-parallel chunks)
    carries one piece's communication as its lead and one piece's compute as its tail
    (``sim.engine.rules.beside_bounds``; ``sim.cost.overlap.pipelined_s``). A forward holds
    ``held.forward_bytes`` while it runs, a backward (or its input-gradient half)
    ``held.backward_bytes`` (FSDP's units)."""
    kind = action.kind
    if kind not in (ActionKind.F, ActionKind.B, ActionKind.I):
        return [fields]
    phase = "F" if kind is ActionKind.F else "B"
    before, after, found_groups = [], [], []
    for name in ("FS", "CP", "TA", "TP", "EP"):
        found = group_slot.get((name, action.stage, phase))
        if found is None:
            continue
        if name == "FS" and phase == "B" and not pipelining.reshard_after_forward:
            continue  # the forward's gathered parameters are still there
        blocking_gather = name == "FS" and not pipelining.prefetch  # held before the compute, not beside it
        overlap = (name in OVERLAPPED and not blocking_gather) or (name == "TP" and pipelining.tp_chunks > 0) \
            or (name == "EP" and pipelining.expert_overlap)
        found_groups.append((name, *found, overlap))
    fields = _contended(fields, found_groups, pipelining)
    for name, slot, index, overlap in found_groups:
        op = dict(code=GROUP, collective=slot, overlap=overlap, stage=action.stage, kind=kind)
        pieces = pipelining.units.get(action.stage, 0) if name == "FS" else pipelining.tp_chunks if name == "TP" else 0
        if pieces and overlap:
            op.update(lead_s=pipelining.group_s[index] / pieces, tail_s=fields["duration_s"] / pieces)
        (before if overlap or blocking_gather else after).append(op)
    gather_bytes = held.forward_bytes if kind is ActionKind.F else held.backward_bytes
    if gather_bytes:
        fields = {**fields, "gather_bytes": gather_bytes}
    return before + [fields] + after


def _contended(fields: dict, found_groups: list, pipelining: Pipelining) -> dict:
    """The compute op's fields, its duration slowed beside its overlapped group collectives
    (``sim.cost.overlap.contended_s``): by the device's ``overlap_slowdown``, or for the experts'
    all-to-all by the communication SMs' share, held while the action's MoE blocks compute, when the
    plan sets one (``expert_slowdown``, ``held_share``, ``sim.cost.overlap.held_sms_s``)."""
    split = pipelining.expert_slowdown is not None
    duration = fields["duration_s"]
    if pipelining.overlap_slowdown:  # group_s is filled only when some slowdown needs it
        other_s = sum(pipelining.group_s[index] for name, _, index, overlap in found_groups
                      if overlap and not (split and name == "EP"))
        duration = contended_s(duration, other_s, pipelining.overlap_slowdown)
    if split:
        expert_s = sum(pipelining.group_s[index] for name, _, index, overlap in found_groups if overlap and name == "EP")
        phase = "F" if fields["kind"] is ActionKind.F else "B"  # I and W: the backward's share
        share = pipelining.held_share.get((fields["stage"], phase), 1.0)
        duration = held_sms_s(duration, expert_s, pipelining.expert_slowdown, share)
    return fields if duration == fields["duration_s"] else {**fields, "duration_s": duration}


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

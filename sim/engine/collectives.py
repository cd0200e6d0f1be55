"""Gradient all-reduce as flows: each stage's replicas sum their gradients through the ports.

After its last backward every replica of a stage holds a gradient of the stage's parameter
bytes; before the optimizer step they must agree on the sum. The compiler lays the
all-reduce out as *phases* of concurrent flows, one phase after another, with the byte
counts and ring steps of ``sim.cost.comm`` (the closed forms the planners use too):

* the stage's replicas all on one server: one phase, a ring all-reduce (phase 0);
* on several servers, hierarchical: a ring reduce-scatter inside each server (phase 0),
  a ring all-reduce of each GPU's shard across the servers through the NICs (phase 1), a
  ring all-gather inside each server (phase 2).

With tensor parallelism each tensor rank's devices (over the replicas and context ranks,
``PlanSpec.gradient_groups``) reduce their share; the groups run side by side in the same
phases. With ``sharding: optimizer`` or ``gradients`` the all-reduce becomes a reduce-scatter
of the gradients and an all-gather of the parameters (Megatron's distributed optimizer,
ZeRO-1/2), laid out as the all-reduce of the mean of their bytes (``gradient_sync_bytes``: less
than the gradients' where they are fp32 under 16-bit parameters; ZeRO-2's final all-gather
after a reduce-scatter every micro-batch is then a collective of its own, phases 3 to 5,
``with_final_gather``); with
``full`` only the reduce-scatter is left (the parameters are gathered per action,
``sim.engine.groups``), and with ``plan.fsdp.reduce_scatter: false`` that is an all-reduce again
(DeepSpeed v0.3's default); with ``plan.fsdp.path: flat`` a reduce-scatter (ZeRO-3's, or ZeRO-2's
every micro-batch) is one ring over the group (phase 1), every device's share through the ring's
slowest hop (``sim.cost.zero3``).

Flows are labelled ``("AR", stage, phase)``; each phase also carries its latency, one link
latency per ring step, which the replay adds after the phase's slowest flow. Every byte count,
step count and latency comes from ``sim.cost.comm`` (``gradient_sync_bytes``,
``hierarchical_allreduce``, ``inside_halves``, ``cross_server_flow_bytes``).
"""

from __future__ import annotations

from collections import defaultdict

from sim.core.parallelism import Sharding
from sim.cost.comm import (
    cross_server_flow_bytes,
    gradient_sync,
    gradient_sync_bytes,
    inside_halves,
    ring_collective,
    ring_flow_bytes,
)
from sim.cost.links import group_link
from sim.cost.tiers import group_crossing
from sim.cost.zero3 import reduced_as
from sim.engine.workload import Collective, FlowKind

__all__ = ["FINAL_GATHER_PHASE", "allreduce_flows", "build_collectives", "with_final_gather"]


def allreduce_flows(plan, model, cluster, *,
                    scatter_only: bool = False) -> tuple[list[tuple[int, int, tuple, float]], dict[tuple, float]]:
    """Ring inside a server; reduce-scatter, cross-server ring, all-gather across servers.

    Returns the flows ``(src, dst, label, bytes)`` and, per ``(stage, phase)``, the phase's
    latency: one link latency per ring step (``sim.cost.comm.ring_steps``), set by the
    widest server. ``scatter_only``: the collective is one reduce-scatter (a ZeRO-2/3 stage
    reduce-scatters every micro-batch's gradients; ZeRO-2's final all-gather runs the same
    bytes), laid out as ZeRO-3's: an all-reduce of half the bytes.
    """
    flows, latency = [], {}
    sharding = Sharding.FULL if scatter_only else plan.sharding
    flat = sharding is Sharding.FULL and plan.fsdp.path == "flat"  # one ring, as DeepSpeed ran it before v0.6
    sharding = reduced_as(sharding, plan.fsdp)  # DeepSpeed v0.3 all-reduces (plan.fsdp.reduce_scatter false)
    for s, stage in enumerate(plan.stages):
        experts = model.expert_param_bytes(*stage.layers)
        dense_bytes = model.stage_param_bytes(*stage.layers) - experts  # ZeRO-1/2 all-gathers these bytes
        grad_bytes = dense_bytes * model.grad_bytes_per_param_byte
        units = stage.layers[1] - stage.layers[0]  # FSDP2 units: one per layer (runtime.model.sharding)
        for group in plan.gradient_groups(s):
            if len(group) < 2:
                continue
            if flat:
                kind = "reduce-scatter" if sharding is Sharding.FULL else "all-reduce"
                _flat_ring(s, group, kind, grad_bytes, cluster, flows, latency)  # the whole gradient
                continue
            _group_allreduce(s, group, (grad_bytes, dense_bytes), sharding, units, cluster, flows, latency)
        if experts and len(plan.gradient_groups(s)[0]) > 1:
            # the routed experts' gradients over their expert-data-parallel groups (``sim.cost.experts``),
            # in the same reduction's phases: each phase as slow as its slower group's
            dense = dict(latency)
            expert_bytes = experts * model.grad_bytes_per_param_byte
            for group in plan.expert_data_groups(s):
                if len(group) > 1:
                    _group_allreduce(s, group, (expert_bytes, experts), sharding, units, cluster, flows, latency)
            latency.update({key: max(value, dense.get(key, 0.0)) for key, value in latency.items()})
    return flows, latency


_PHASE_NUMBERS = {(True, False): (0,), (False, True): (1,), (True, True): (0, 1, 2)}
"""The phase labels of ``hierarchical_allreduce``'s phases, by (a ring inside a server, a ring across)."""


def _group_allreduce(s: int, group, stage_bytes: tuple[float, float], sharding: Sharding, units: int, cluster,
                     flows: list, latency: dict) -> None:
    """One gradient group's ring (one server) or hierarchical (several) all-reduce of
    ``gradient_sync``'s phases (``stage_bytes``: the stage's gradient bytes and the parameter bytes
    ZeRO-1/2 all-gathers; ``units``: the stage's FSDP units, for measured collectives)."""
    stage_grad_bytes, param_bytes = stage_bytes
    grad_bytes = gradient_sync_bytes(stage_grad_bytes, sharding, param_bytes=param_bytes)
    by_node, per_node = defaultdict(list), cluster.devices_per_node
    for d in sorted(group):
        by_node[d // per_node].append(d)  # ``ClusterSpec.node_of``, inline: once per device of every group
    groups = [by_node[n] for n in sorted(by_node)]
    k, widest = len(groups), max(len(g) for g in groups)
    # on a fabric the servers' ring (each server's first member to the next's) crosses the tiers it climbs
    crossing = group_crossing(cluster, [g[0] for g in groups]) if cluster.fabric is not None and k > 1 else None
    phases = gradient_sync([len(g) for g in groups], stage_grad_bytes, sharding, cluster, units=units,
                           crossing=crossing, param_bytes=param_bytes)
    # the cross-server phase's bytes per GPU of the smallest server (NCCL's algorithm's on a fabric)
    across = phases[-2 if widest > 1 else -1].flow_bytes * min(len(g) for g in groups) \
        if crossing is not None else None
    for phase, cost in zip(_PHASE_NUMBERS[(widest > 1, k > 1)], phases):
        latency[(s, phase)] = cost.latency_s
    if k == 1:  # one ring: the phase's own flow bytes (the measured ones on a measured link)
        g = groups[0]
        flows += [(d, g[(i + 1) % widest], ("AR", s, 0), phases[0].flow_bytes) for i, d in enumerate(g)]
    elif widest > 1:
        for phase in (0, 2):  # a reduce-scatter before the servers' ring, an all-gather after it
            for g in groups:
                n = len(g)
                if n > 1:  # every member sends its ring neighbour the same bytes
                    nbytes = ring_flow_bytes(n, grad_bytes, cluster.intra_node, halves=inside_halves(k))
                    flows += [(d, g[(i + 1) % n], ("AR", s, phase), nbytes) for i, d in enumerate(g)]
    if k > 1 and widest == 1:  # one member per server (the usual data-parallel group): one ring across
        nbytes = cross_server_flow_bytes(k, grad_bytes, cluster, 1) if across is None else across
        ring = [g[0] for g in groups]
        flows += [(d, ring[(j + 1) % k], ("AR", s, 1), nbytes) for j, d in enumerate(ring)]
    elif k > 1:
        by_width = {}  # each GPU carries its 1/n shard of the cross-server ring: the bytes by server width
        for j, g in enumerate(groups):
            nxt = groups[(j + 1) % k]
            if len(g) not in by_width:
                by_width[len(g)] = cross_server_flow_bytes(k, grad_bytes, cluster, len(g)) if across is None \
                    else across / len(g)
            nbytes = by_width[len(g)]
            flows += [(d, nxt[i % len(nxt)], ("AR", s, 1), nbytes) for i, d in enumerate(g)]


def _flat_ring(s: int, group, kind: str, grad_bytes: float, cluster, flows: list, latency: dict) -> None:
    """One gradient group's reduce-scatter (or all-reduce, ``kind``) of ``grad_bytes`` as one ring
    over its members in order (``plan.fsdp.path: flat``, ``sim.cost.zero3``): each sends its
    neighbour the ring's ``(n−1)/n`` share per half at the link of the group (a NIC once it spans
    servers), phase 1."""
    ring = sorted(group)
    cost = ring_collective(kind, len(ring), grad_bytes, group_link(cluster, ring), cluster)
    latency[(s, 1)] = max(latency.get((s, 1), 0.0), cost.latency_s)
    flows += [(d, ring[(i + 1) % len(ring)], ("AR", s, 1), cost.flow_bytes) for i, d in enumerate(ring)]


FINAL_GATHER_PHASE = 3
"""The first phase number of ZeRO-2's final all-gather where it is a collective of its own
(``with_final_gather``): phases 3, 4, 5 stand for the reduce-scatter's 0, 1, 2."""


def with_final_gather(ar_flows: list, ar_latency: dict, param_bytes_per_grad_byte: float) -> tuple[list, dict]:
    """The reduction's flows and latencies with ZeRO-2's all-gather of the updated parameters after
    the last micro-batch's reduce-scatter (``plan.fsdp.reduce_every_microbatch``) as a collective of
    its own, where it moves other bytes than the reduce-scatter (``param_bytes_per_grad_byte`` > 0;
    0: unchanged, the reduce-scatter's collective runs it again): the reduce-scatter's layout,
    ports and latencies (labels ``("AR", stage, 3 + phase)``), each flow ``param_bytes_per_grad_byte``
    of its bytes (1/2 for fp32 gradients of a 16-bit model: DeepSpeed's ZeRO-2 gathers the 16-bit
    partitions, Rajbhandari et al. 2020, §5.2; ``sim.cost.comm.gradient_sync_bytes``)."""
    if not param_bytes_per_grad_byte:
        return ar_flows, ar_latency
    flows = [(src, dst, ("AR", label[1], FINAL_GATHER_PHASE + label[2]), nbytes * param_bytes_per_grad_byte)
             for src, dst, label, nbytes in ar_flows]
    latency = {(s, FINAL_GATHER_PHASE + phase): value for (s, phase), value in ar_latency.items()}
    return ar_flows + flows, {**ar_latency, **latency}


def build_collectives(plan, model, kinds: list[FlowKind], class_of,
                      latency: dict[tuple, float]) -> tuple[list[Collective], list[Collective]]:
    """One :class:`Collective` per stage with replicas: its phases' flow kinds, in phase order; and
    after them, indexed on, ZeRO-2's final all-gathers where they are collectives of their own
    (``with_final_gather``: phases from ``FINAL_GATHER_PHASE`` on), for the stages that have one."""
    by_label: dict[tuple, list[int]] = defaultdict(list)  # one pass over the kinds, not one per phase
    for k in kinds:
        if k.label[0] == "AR":
            by_label[k.label].append(k.index)
    reductions = _stage_collectives(plan, model, class_of, latency, by_label, 0, 0)
    return reductions, _stage_collectives(plan, model, class_of, latency, by_label, FINAL_GATHER_PHASE,
                                          len(reductions))


def _stage_collectives(plan, model, class_of, latency: dict, by_label: dict, first_phase: int,
                       first_index: int) -> list[Collective]:
    """The collectives of phases ``first_phase`` to ``first_phase + 2``, indexed from ``first_index``;
    a stage without such flows has none beyond the reductions (``first_phase`` 0)."""
    result = []
    if first_phase and not any(label[2] >= first_phase for label in by_label):
        return result
    for s, stage in enumerate(plan.stages):
        if len(plan.gradient_groups(s)[0]) < 2:
            continue
        phases = []
        for phase in range(first_phase, first_phase + 3):
            members = tuple(by_label.get(("AR", s, phase), ()))
            if members:
                phases.append((members, latency[(s, phase)]))
        if first_phase and not phases:
            continue
        participants = tuple(sorted({class_of[d] for d in stage.devices}))
        result.append(
            Collective(
                index=first_index + len(result),
                stage=s,
                participants=participants,
                phases=tuple(phases),
                bytes=model.param_bytes(*stage.layers),  # one device's share (tensor parallelism)
            )
        )
    return result

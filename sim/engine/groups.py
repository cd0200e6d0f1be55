"""Collectives inside a replica's groups, per action: tensor-parallel, context-parallel, FSDP.

A stage's forward or backward on one micro-batch also talks to the device's groups
(``sim.core.plan.PlanSpec``'s layout):

* **tensor parallelism** — the stage's layers' all-reduces (or, with sequence parallelism,
  all-gathers and reduce-scatters) over the ``tensor_parallel`` devices of the replica
  (``LayerSpec.tp_collectives``; Shoeybi et al. 2019, §3; Korthikanti et al. 2022, §4.2.2).
  They sit on the compute stream's critical path: the next layer needs their result;
* **context parallelism** — ring attention passes key/value blocks to the next device of
  the context-parallel group, c − 1 steps in the forward, keys, values and their gradients
  in the backward (``LayerSpec.cp_ring_bytes``; Liu et al. 2023; Megatron-Core). Each step's
  transfer overlaps the attention on the block that has arrived;
* **FSDP / ZeRO-3** (``sharding: full``) — every forward and every backward gathers the
  stage's parameters from the gradient group (the devices that hold the same parameters),
  prefetched ahead of the compute (FSDP2's ``fully_shard`` with ``reshard_after_forward``;
  Rajbhandari et al. 2020, §5.3); with ``plan.fsdp.path: flat`` one ring over the group
  whichever servers it spans, with ``plan.fsdp.prefetch: false`` blocking the compute, and with
  ``plan.fsdp.max_reuse_distance`` under full recompute a backward gathering a block's
  sub-modules again for the recompute (DeepSpeed's ZeRO-3 before v0.6, ``sim.cost.zero3``).

* **expert parallelism** — an MoE block's token dispatch and combine, all-to-alls over the
  stage's expert-parallel groups (``PlanSpec.expert_groups``), two in the forward and two in the
  backward (``LayerSpec.a2a_bytes``; ``sim.cost.comm.all_to_all``). Each member's share for the
  others of its server goes as one flow to its server neighbour, its share for the other
  servers as one flow through its NIC to the member of its rank on the next server: the bytes
  each port carries, as NCCL's grouped sends to every peer put on it. They block the compute
  stream after the action's compute, as Megatron-Core's dispatcher does without EP overlap;
  with ``plan.overlap.expert_all_to_all`` they run beside it (``sim.engine.ops``;
  ``sim.cost.overlap.exposed_beside_s``).

Each becomes ring flows through the same ports as the pipeline's traffic, labelled
``("TP" | "CP" | "FS", stage, "F" | "B")``, with the byte counts, steps and links of
``sim.cost.comm`` (``tensor_parallel_bytes_and_steps``, ``fsdp_gather``),
``sim.cost.context_comm.context_ring`` and ``sim.cost.links.group_link``, the planners' formulas too. A tensor-parallel or FSDP group
that spans servers with two or more members on a server takes NCCL's path instead
(``sim.cost.group_comm``): a ring inside each server, each GPU's share across the servers
through its own NIC, a ring inside each server again, as phases labelled
``(..., "F" | "B", phase)`` with ``phase`` the index in ``group_comm.PHASES``; each phase's
latency is its slowest group's. The context-parallel ring's flows already take their real
hops (NVLink inside a server, a NIC between servers). One
action's collectives of a kind are one collective of the summed bytes and latencies: the
same traffic on the same ports; the order of its pieces inside the action is not modelled.
Tensor-parallel collectives block the compute stream after the action's compute; the ring's
and FSDP's run beside it, and the action ends no earlier than they do.
"""

from __future__ import annotations

from collections import defaultdict

from sim.core.parallelism import Recompute, Sharding
from sim.cost.comm import (
    all_to_all,
    fsdp_gather,
    node_limited_fraction,
    tensor_parallel_bytes_and_steps,
    tensor_parallel_cost,
)
from sim.cost.context_comm import context_ring
from sim.cost.group_comm import (
    PHASES,
    across_bytes,
    add_volumes,
    is_hierarchical,
    spanning_phases,
    tensor_parallel_volumes,
    within_bytes,
)
from sim.cost.links import by_server, group_link
from sim.cost.tiers import group_crossing
from sim.cost.zero3 import regathered_bytes
from sim.engine.workload import Collective, FlowKind

__all__ = ["GROUP_LABELS", "OVERLAPPED", "build_group_collectives", "group_flows"]

GROUP_LABELS = ("TP", "CP", "FS", "PG", "EP", "TA")
"""Labels of group flows: tensor parallelism, the context-parallel ring, FSDP's gathers, and
ZeRO-1/2's parameter all-gather beside a stage's first forward (``plan.overlap.param_gather``,
flows made by ``sim.engine.compile``), the experts' all-to-alls, and the tensor-parallel
collectives beside a backward's column-parallel products (``plan.overlap.column_backward``)."""
OVERLAPPED = frozenset({"CP", "FS", "PG", "TA"})
"""Group collectives that run beside the compute (the others block it)."""


def _ring(devices: tuple[int, ...], label: tuple, nbytes: float) -> list[tuple[int, int, tuple, float]]:
    """Every device of a ring sends ``nbytes`` to the next one."""
    n = len(devices)
    return [(d, devices[(i + 1) % n], label, nbytes) for i, d in enumerate(devices)] if n > 1 and nbytes > 0 else []


def _spanning(servers: list[list[int]], label: tuple, volumes, cluster, flows: list, latency: dict) -> None:
    """A hierarchical group's flows, one phase after another (``sim.cost.group_comm``): a ring
    inside each server, then each GPU's shard to the GPU of its rank on the next server (its
    rail), then a ring inside each server; each phase's latency the slowest group's."""
    k, members = len(servers), [len(g) for g in servers]
    # on a fabric the servers' ring (each server's first member to the next's) crosses the tiers it climbs
    crossing = group_crossing(cluster, [g[0] for g in servers]) if cluster.fabric is not None else None
    phases = spanning_phases(volumes, members, cluster, crossing=crossing)
    for number, name in enumerate(PHASES):
        cost = phases.get(name)
        if cost is None:
            continue
        phase_label = (*label, number)
        latency[phase_label] = max(latency.get(phase_label, 0.0), cost.latency_s)
        if name == "across":
            # NCCL's protocol's bytes over the ring's on a fabric (``sim.cost.fabric_comm.fabric_calls_across``)
            factor = 1.0 if crossing is None else cost.bytes_per_device / across_bytes(volumes, k, min(members))[0]
            for j, g in enumerate(servers):
                nxt = servers[(j + 1) % k]
                nbytes = across_bytes(volumes, k, len(g))[0] / cluster.inter_node.collective_efficiency
                if crossing is not None:
                    nbytes *= factor
                flows += [(d, nxt[i % len(nxt)], phase_label, nbytes) for i, d in enumerate(g)]
        else:
            for g in servers:
                nbytes = within_bytes(volumes, len(g), name)[0] / cluster.intra_node.collective_efficiency
                flows += _ring(tuple(g), phase_label, nbytes)


def _tensor_parallel(layers, group, s: int, samples: int, full: bool, cluster, flows: list, latency: dict,
                     memo: dict, column: bool = False, again=None) -> None:
    """One tensor-parallel group's forward and backward collectives: the flat ring on one
    server (or one member per server), else hierarchical. ``memo`` holds what is the same for
    every group of the stage with the same samples, size and link (their bytes, steps and costs
    depend on the layers, not on which devices): computed once per stage, not once per group.
    ``column`` (``plan.overlap.column_backward``): the backward's column-parallel collectives
    (``TensorParallelCollective.beside``, and sequence parallelism's second gathers) leave the
    blocking ``TP`` backward for a ``TA`` collective beside the backward's compute. ``again``: the
    layers a full recompute runs again (``model.recompute_blocks_only``: the blocks), None: all."""
    servers = by_server(cluster, group)
    again = layers if again is None else again
    beside = False if column else None
    if is_hierarchical([len(g) for g in servers]):
        key = ("volumes", samples)
        if key not in memo:
            fwd = tensor_parallel_volumes(layers, "forward", samples)
            bwd = tensor_parallel_volumes(layers, "backward", samples, beside=beside)
            if full:  # the recomputed forward repeats the forward's collectives inside the backward
                bwd = add_volumes(bwd, fwd if again is layers else tensor_parallel_volumes(again, "forward", samples))
            async_ = tensor_parallel_volumes(layers, ("backward", "regather"), samples, beside=True) if column else {}
            memo[key] = fwd, bwd, async_
        fwd, bwd, async_ = memo[key]
        _spanning(servers, ("TP", s, "F"), fwd, cluster, flows, latency)
        _spanning(servers, ("TP", s, "B"), bwd, cluster, flows, latency)
        if async_:
            _spanning(servers, ("TA", s, "B"), async_, cluster, flows, latency)
        return
    t, link = len(group), group_link(cluster, group)
    key = ("flat", samples, t, link is cluster.intra_node)
    if key not in memo:
        fwd, fwd_steps = tensor_parallel_bytes_and_steps(layers, t, "forward", samples)
        bwd, bwd_steps = tensor_parallel_bytes_and_steps(layers, t, "backward", samples, beside=beside)
        if full:  # the recomputed forward repeats the forward's collectives inside the backward
            redo, redo_steps = (fwd, fwd_steps) if again is layers else \
                tensor_parallel_bytes_and_steps(again, t, "forward", samples)
            bwd, bwd_steps = bwd + redo, bwd_steps + redo_steps
        async_ = tensor_parallel_bytes_and_steps(layers, t, ("backward", "regather"), samples, beside=True) \
            if column else (0.0, 0)
        memo[key] = (tensor_parallel_cost(fwd, fwd_steps, link, cluster),
                     tensor_parallel_cost(bwd, bwd_steps, link, cluster),
                     tensor_parallel_cost(*async_, link, cluster) if async_[0] > 0 else None)
    forward, backward, beside_cost = memo[key]
    flows += _ring(group, ("TP", s, "F"), forward.flow_bytes) + _ring(group, ("TP", s, "B"), backward.flow_bytes)
    latency[("TP", s, "F")], latency[("TP", s, "B")] = forward.latency_s, backward.latency_s
    if beside_cost is not None:
        flows += _ring(group, ("TA", s, "B"), beside_cost.flow_bytes)
        latency[("TA", s, "B")] = beside_cost.latency_s


def _expert_all_to_all(groups, s: int, a2a_bytes: float, samples: int, full: bool, cluster, flows: list,
                       latency: dict, experts=None) -> None:
    """The all-to-alls of one stage's expert-parallel groups: dispatch and combine in the forward,
    their gradients in the backward (and the forward's again under full recompute)."""
    for phase, count in (("F", 2), ("B", 4 if full else 2)):
        label = ("EP", s, phase)
        for group in groups:
            servers = by_server(cluster, group)
            phases = all_to_all([len(g) for g in servers], count * a2a_bytes * samples, cluster,
                                across_fraction=node_limited_fraction(experts, len(servers)))
            for cost in phases:
                latency[label] = max(latency.get(label, 0.0), cost.latency_s)
                if cost.across_servers:
                    k = len(servers)
                    for j, g in enumerate(servers):
                        nxt = servers[(j + 1) % k]
                        flows += [(d, nxt[i % len(nxt)], label, cost.flow_bytes) for i, d in enumerate(g)]
                else:
                    for g in servers:
                        flows += _ring(tuple(g), label, cost.flow_bytes)


def group_flows(plan, model, cluster, samples: dict[int, dict[int, tuple[int, int]]]):
    """The group flows of every stage, ``(src, dst, label, bytes)``, and each label's latency.

    ``model`` is one device's share (``sim.models.shard_model``); ``samples[s][device]`` is the
    range of a micro-batch's samples the device's replica processes.
    """
    flows: list = []
    latency: dict = {}
    t, c = plan.tensor_parallel, plan.context_parallel
    full = plan.recompute is Recompute.FULL
    for s, stage in enumerate(plan.stages):
        layers = model.layers[stage.layers[0]:stage.layers[1]]
        again = [layer for layer in layers if layer.checkpoint_bytes is not None] if model.recompute_blocks_only else None
        if t > 1:
            memo: dict = {}
            for group in plan.tensor_groups(s):
                start, end = samples[s][group[0]]
                _tensor_parallel(layers, group, s, end - start, full, cluster, flows, latency, memo,
                                 plan.overlap.column_backward, again)
        if c > 1:
            ring = sum(layer.cp_ring_bytes for layer in layers)
            rings = sum(1 for layer in layers if layer.cp_ring_bytes > 0)  # each attention layer its own ring
            for group in plan.context_groups(s):
                start, end = samples[s][group[0]]
                forward, backward = context_ring(ring, end - start, c, group_link(cluster, group), cluster,
                                                 rings=rings)
                flows += _ring(group, ("CP", s, "F"), forward.flow_bytes)
                flows += _ring(group, ("CP", s, "B"), backward.flow_bytes)
                latency[("CP", s, "F")], latency[("CP", s, "B")] = forward.latency_s, backward.latency_s
        a2a = sum(layer.a2a_bytes for layer in layers)
        if plan.expert_parallel > 1 and a2a > 0:
            groups = plan.expert_groups(s)
            start, end = samples[s][groups[0][0]]
            _expert_all_to_all(groups, s, a2a, end - start, full, cluster, flows, latency, model.experts)
        if plan.sharding is Sharding.FULL:
            params = model.param_bytes(*stage.layers)
            # the backward's gathers: DeepSpeed v0.3 gathers a block again for the recompute (sim.cost.zero3)
            again = regathered_bytes(model, *stage.layers, max_reuse_distance=plan.fsdp.max_reuse_distance,
                                     full_recompute=full)
            for group in plan.gradient_groups(s):
                _fsdp_gathers(group, s, {"F": params, "B": params + again}, stage.layers[1] - stage.layers[0],
                              plan.fsdp.path, cluster, flows, latency)
    return flows, latency


def _fsdp_gathers(group, s: int, gathered: dict[str, float], units: int, path: str, cluster, flows: list,
                  latency: dict) -> None:
    """One gradient group's all-gathers of ``gathered[phase]`` bytes in its forward (``F``) and
    backward (``B``): on NCCL's path across servers, else one ring (``flat``: always, sim.cost.zero3)."""
    servers = by_server(cluster, group)
    if path == "hierarchical" and is_hierarchical([len(g) for g in servers]):
        for phase, nbytes in gathered.items():
            _spanning(servers, ("FS", s, phase), {"all-gather": (nbytes, 1)}, cluster, flows, latency)
        return
    # one member on each server, on a fabric: NCCL's ring over the tiers the group climbs
    crossing = group_crossing(cluster, list(group)) if cluster.fabric is not None \
        and len(servers) == len(group) > 1 else None
    for phase, nbytes in gathered.items():
        gather = fsdp_gather(len(group), nbytes, group_link(cluster, group), cluster, units=units,
                             crossing=crossing)  # FSDP2: a unit per layer
        flows += _ring(group, ("FS", s, phase), gather.flow_bytes)
        if crossing is None:
            latency[("FS", s, phase)] = gather.latency_s
        else:  # each group its own tiers: the slowest group's latency
            latency[("FS", s, phase)] = max(latency.get(("FS", s, phase), 0.0), gather.latency_s)


def build_group_collectives(kinds: list[FlowKind], class_of, plan, latency: dict[tuple, float]):
    """One :class:`Collective` per label and set of participating classes.

    Groups whose devices fall into the same classes behave identically and share one; a group
    with a straggler (its own classes) gets its own, so it slows only its replica. Returns the
    collectives and a map ``(label, class) -> collective index`` for the compiler's ops.
    """
    groups_of = {"TP": plan.tensor_groups, "CP": plan.context_groups, "FS": plan.gradient_groups,
                 "PG": plan.gradient_groups, "EP": plan.expert_groups, "TA": plan.tensor_groups}
    by_label: dict[tuple, list[FlowKind]] = defaultdict(list)  # by collective: a phase number dropped
    for k in kinds:
        if k.label[0] in GROUP_LABELS:
            by_label[k.label[:3]].append(k)
    result, index_of = [], {}
    for label in sorted(by_label, key=repr):
        name, s, _ = label
        seen: dict[tuple[int, ...], int] = {}
        by_source: dict[int, list[FlowKind]] = defaultdict(list)  # kinds by sending class, in kind order
        for k in by_label[label]:
            by_source[k.src_class].append(k)
        for group in groups_of[name](s):
            participants = tuple(sorted({class_of[d] for d in group}))
            if participants not in seen:
                own = sorted((k for p in participants for k in by_source.get(p, ())), key=lambda k: k.index)
                seen[participants] = len(result)
                result.append(Collective(index=len(result), stage=s, participants=participants,
                                         phases=_phases(own, latency), bytes=sum(k.bytes for k in own)))
            for p in participants:
                index_of[(label, p)] = seen[participants]
    return result, index_of


def _phases(own: list[FlowKind], latency: dict[tuple, float]) -> tuple[tuple[tuple[int, ...], float], ...]:
    """A group collective's phases: its kinds by flow label (one label, or one per phase number
    of a hierarchical collective, in phase order), each with its latency."""
    by_phase: dict[tuple, list[int]] = defaultdict(list)
    for k in own:
        by_phase[k.label].append(k.index)
    order = sorted(by_phase, key=lambda label: label[3:])
    return tuple((tuple(by_phase[label]), latency.get(label, 0.0)) for label in order)

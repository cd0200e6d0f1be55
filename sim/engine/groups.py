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
  Rajbhandari et al. 2020, §5.3).

Each becomes ring flows through the same ports as the pipeline's traffic, labelled
``("TP" | "CP" | "FS", stage, "F" | "B")``, with the byte counts, steps and links of
``sim.cost.comm`` (``tensor_parallel_bytes_and_steps``, ``context_ring``, ``fsdp_gather``) and
``sim.cost.links.group_link``, the planners' formulas too. One
action's collectives of a kind are one collective of the summed bytes and latencies: the
same traffic on the same ports; the order of its pieces inside the action is not modelled.
Tensor-parallel collectives block the compute stream after the action's compute; the ring's
and FSDP's run beside it, and the action ends no earlier than they do.
"""

from __future__ import annotations

from collections import defaultdict

from sim.core.parallelism import Recompute, Sharding
from sim.cost.comm import context_ring, fsdp_gather, tensor_parallel_bytes_and_steps, tensor_parallel_cost
from sim.cost.links import group_link
from sim.engine.workload import Collective, FlowKind

__all__ = ["GROUP_LABELS", "OVERLAPPED", "build_group_collectives", "group_flows"]

GROUP_LABELS = ("TP", "CP", "FS")
"""Labels of group flows: tensor parallelism, the context-parallel ring, FSDP's gathers."""
OVERLAPPED = frozenset({"CP", "FS"})
"""Group collectives that run beside the compute (the others block it)."""


def _ring(devices: tuple[int, ...], label: tuple, nbytes: float) -> list[tuple[int, int, tuple, float]]:
    """Every device of a ring sends ``nbytes`` to the next one."""
    n = len(devices)
    return [(d, devices[(i + 1) % n], label, nbytes) for i, d in enumerate(devices)] if n > 1 and nbytes > 0 else []


def group_flows(plan, model, cluster, samples: dict[int, dict[int, tuple[int, int]]]):
    """The group flows of every stage, ``(src, dst, label, bytes)``, and each label's latency.

    ``model`` is one device's share (``sim.models.shard_model``); ``samples[s][device]`` is the
    range of a micro-batch's samples the device's replica processes.
    """
    flows, latency = [], {}
    t, c = plan.tensor_parallel, plan.context_parallel
    full = plan.recompute is Recompute.FULL
    for s, stage in enumerate(plan.stages):
        layers = model.layers[stage.layers[0]:stage.layers[1]]
        if t > 1:
            for group in plan.tensor_groups(s):
                start, end = samples[s][group[0]]
                fwd, fwd_steps = tensor_parallel_bytes_and_steps(layers, t, "forward", end - start)
                bwd, bwd_steps = tensor_parallel_bytes_and_steps(layers, t, "backward", end - start)
                if full:  # the recomputed forward repeats the forward's collectives inside the backward
                    bwd, bwd_steps = bwd + fwd, bwd_steps + fwd_steps
                link = group_link(cluster, group)
                forward = tensor_parallel_cost(fwd, fwd_steps, link, cluster)
                backward = tensor_parallel_cost(bwd, bwd_steps, link, cluster)
                flows += _ring(group, ("TP", s, "F"), forward.flow_bytes) + _ring(group, ("TP", s, "B"), backward.flow_bytes)
                latency[("TP", s, "F")], latency[("TP", s, "B")] = forward.latency_s, backward.latency_s
        if c > 1:
            ring = sum(layer.cp_ring_bytes for layer in layers)
            for group in plan.context_groups(s):
                start, end = samples[s][group[0]]
                forward, backward = context_ring(ring, end - start, c, group_link(cluster, group), cluster)
                flows += _ring(group, ("CP", s, "F"), forward.flow_bytes)
                flows += _ring(group, ("CP", s, "B"), backward.flow_bytes)
                latency[("CP", s, "F")], latency[("CP", s, "B")] = forward.latency_s, backward.latency_s
        if plan.sharding is Sharding.FULL:
            params = model.param_bytes(*stage.layers)
            for group in plan.gradient_groups(s):
                gather = fsdp_gather(len(group), params, group_link(cluster, group), cluster)
                for phase in ("F", "B"):
                    flows += _ring(group, ("FS", s, phase), gather.flow_bytes)
                latency[("FS", s, "F")] = latency[("FS", s, "B")] = gather.latency_s
    return flows, latency


def build_group_collectives(kinds: list[FlowKind], class_of, plan, latency: dict[tuple, float]):
    """One :class:`Collective` per label and set of participating classes.

    Groups whose devices fall into the same classes behave identically and share one; a group
    with a straggler (its own classes) gets its own, so it slows only its replica. Returns the
    collectives and a map ``(label, class) -> collective index`` for the compiler's ops.
    """
    groups_of = {"TP": plan.tensor_groups, "CP": plan.context_groups, "FS": plan.gradient_groups}
    by_label: dict[tuple, list[FlowKind]] = defaultdict(list)
    for k in kinds:
        if k.label[0] in GROUP_LABELS:
            by_label[k.label].append(k)
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
                                         phases=((tuple(k.index for k in own), latency.get(label, 0.0)),),
                                         bytes=sum(k.bytes for k in own)))
            for p in participants:
                index_of[(label, p)] = seen[participants]
    return result, index_of

"""Compilation: a checked scenario turned into what every device does, once, with no SimPy.

The engine (``sim.engine.replay``) and the fast path (``sim.engine.fastpath``) replay the same
:class:`~sim.engine.workload.Workload`, so it is computed once, here:

* the lowered schedule IR, one device's share of every layer and each stage's cost come from
  the scenario's resolved plan (``Scenario.resolved``, ``sim.schedule.resolved``), built once
  for the reader, the planner and the compiler alike;
* for each device, its slice of every micro-batch (a stage's micro-batch is split over its
  replicas like ``torch.tensor_split``, ``sim.cost.split.sample_ranges``) and what each action
  costs it in time and memory (its ops, ``sim.engine.ops``);
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

from sim.core.faults import jitter_factors
from sim.core.parallelism import Recompute, Sharding
from sim.core.summary import Parallelism
from sim.cost.capacity import tokens_per_sample
from sim.cost.comm import pipeline_gather_s
from sim.cost.compute import all_to_all_share
from sim.cost.links import group_link
from sim.cost.memory import sum_state_bytes
from sim.cost.overlap import bucket_count, communication_sms_slowdown, unit_count
from sim.cost.split import sample_ranges
from sim.engine.classes import Symmetry, group_members
from sim.engine.collectives import allreduce_flows, build_collectives, with_final_gather
from sim.engine.fault_view import FaultView
from sim.engine.flows import (
    PortTable,
    flow_kinds,
    flow_paths,
    kinds_by_class,
    p2p_flows,
    port_split,
    static_rates,
)
from sim.engine.gcpause import gc_paused
from sim.engine.groups import build_group_collectives, group_flows
from sim.engine.memory import held_by_stage
from sim.engine.ops import Pipelining, class_ops
from sim.engine.rules import collective_alone_s
from sim.engine.tier_traffic import label_traffic
from sim.engine.workload import COMPUTE, DeviceClass, Workload
from sim.input.scenario import Scenario
from sim.models import mfu_flop_per_sample
from sim.schedule.ir import Schedule
from sim.schedule.resolved import ResolvedPlan

__all__ = ["FaultView", "compile_workload"]


@gc_paused()
def compile_workload(scenario: Scenario, *, symmetric: bool = True, contention: bool = True,
                     optimistic: bool = False) -> Workload:
    """Compile ``scenario`` (which must have a plan) for replay.

    The lowered schedule, one device's share of the model and the stage costs are the
    scenario's resolved plan (``Scenario.resolved``, ``sim.schedule.resolved``), built once.
    ``contention=False`` compiles for a contention-free replay (the fast path, the SimPy engine
    with ``contention=False``): its classes need only be exact without contention, which lets a
    fault split far fewer of them (``sim.engine.symmetry.refine_behaviour``). ``optimistic``
    (with contention and faults) compiles the classes of ``Symmetry.optimistic``: far fewer
    than the equitable ones, exact unless the SimPy replay raises ``Diverged``.
    """
    plan, cluster, training = scenario.plan, scenario.cluster, scenario.training
    assert plan is not None, "the caller checks that the scenario has a plan"
    resolved = scenario.resolved
    model, groups = resolved.model, plan.device_groups
    devices = sorted(d for g in groups for d in g)
    rank_of = {d: r for r, g in enumerate(groups) for d in g}
    samples = {s: _replica_samples(plan, s, training.microbatch_size) for s in range(plan.num_stages)}
    stages_of_rank = [tuple(s for s, r in enumerate(plan.stage_ranks) if r == rank) for rank in range(len(groups))]

    gathered = _param_gather(plan)
    ar_flows, ar_latency = allreduce_flows(plan, model, cluster,
                                           scatter_only=_every_microbatch(plan, training.num_microbatches) or gathered)
    final = _final_gather_ratio(plan, model, training.num_microbatches)  # ZeRO-2's own final all-gather
    ar_flows, ar_latency = with_final_gather(ar_flows, ar_latency, final)
    g_flows, g_latency = group_flows(plan, model, cluster, samples)
    if gathered:
        g_flows = g_flows + _gather_flows(ar_flows, 1.0 / model.grad_bytes_per_param_byte)
        g_latency = {**g_latency, **_gather_latency(ar_latency)}
    p2p = p2p_flows(plan, model, training.microbatch_size)
    flows = p2p + ar_flows + g_flows
    nic_ids = sorted({cluster.nic_of(d) for d in devices})
    faults = FaultView(scenario.faults, cluster, plan)
    table = flow_paths(flows, cluster, faults)  # every flow's ports, bandwidths and latency, as columns
    slices = {d: tuple(_slice(samples[s], d) for s in stages_of_rank[rank_of[d]]) for d in devices}
    sym = Symmetry(devices, nic_ids, table, cluster, faults, rank_of, slices)
    # identical devices issue each operation together (``static_rates``), with or without the reduction
    # (not over a fabric's modelled uplinks: ``port_split`` knows a flow's two ports only)
    optimistic = optimistic and contention and symmetric and faults.any and table.uplink is None
    if optimistic:
        device_class, card_class = sym.optimistic()
        # every device its own class (jitter drawn per device): nothing merged, nothing to check
        optimistic = max(device_class, default=-1) + 1 < len(devices)
        rates = static_rates(table, dict(zip(devices, device_class)))
    elif contention:
        device_class, card_class = sym.equitable(with_faults=True)
        rates = static_rates(table, dict(zip(devices, device_class)))
    else:
        device_class, rates = sym.behaviour(len(p2p), table, group_members(plan, g_flows))
        card_class = list(range(len(nic_ids)))  # a contention-free replay never reads port loads
    if not symmetric:
        device_class, card_class = list(range(len(devices))), list(range(len(nic_ids)))
    class_of = {d: device_class[i] for i, d in enumerate(devices)}
    card_of = {n: card_class[i] for i, n in enumerate(nic_ids)}

    split = port_split(flows, table.paths(), class_of, card_of) if optimistic else None
    ports = PortTable(cluster, class_of, card_of, devices, nic_ids, split, each_uplink=not symmetric)
    kinds = flow_kinds(table, rates, class_of, ports, by_rate=not contention, by_path=optimistic,
                       gather=_pipeline_gather(plan, cluster, p2p))
    collectives, finals = build_collectives(plan, model, kinds, class_of, ar_latency)
    group_colls, group_of = build_group_collectives(kinds, class_of, plan, g_latency)
    group_keys = defaultdict(list)
    for (label, cls), index in group_of.items():
        group_keys[cls].append((label, index))
    context = _Context(scenario=scenario, resolved=resolved, schedule=resolved.lowered, rank_of=rank_of,
                       stages_of_rank=stages_of_rank, samples=samples, kinds=kinds, collectives=collectives,
                       group_keys={cls: tuple(sorted(keys)) for cls, keys in group_keys.items()},
                       by_class=kinds_by_class(kinds), faults=faults, rank_texts={}, shared_ops={},
                       pipelining=_pipelining(plan, model, kinds, collectives, group_colls, training.num_microbatches,
                                              slowdown=cluster.device.overlap_slowdown, device=cluster.device,
                                              samples=samples, finals=finals),
                       held=held_by_stage(resolved))
    members = defaultdict(list)
    for d in devices:
        members[class_of[d]].append(d)
    classes = tuple(_device_class(index, tuple(members[index]), context) for index in range(len(members)))
    return _workload(scenario, resolved, classes=classes, kinds=kinds, ports=ports, collectives=collectives + finals,
                     group_collectives=group_colls, contention=contention or not symmetric, optimistic=optimistic,
                     traffic=label_traffic(table, cluster, faults) if cluster.fabric is not None else None)


def _workload(scenario: Scenario, resolved: ResolvedPlan, *, classes: tuple, kinds: list, ports: PortTable,
              collectives: list, group_collectives: list, contention: bool, optimistic: bool,
              traffic=None) -> Workload:
    """The workload of ``scenario``'s compiled classes, with the plan's headline figures."""
    plan, cluster, training, whole = scenario.plan, scenario.cluster, scenario.training, scenario.model
    flop = mfu_flop_per_sample(whole)
    return Workload(
        name=scenario.name,
        schedule=resolved.lowered,
        num_microbatches=training.num_microbatches,
        global_batch_size=training.global_batch_size,
        classes=classes,
        kinds=tuple(kinds),
        port_classes=ports.classes(),
        collectives=tuple(collectives),
        group_collectives=tuple(group_collectives),
        device_memory_bytes=cluster.device.memory_bytes,
        usable_memory_bytes=cluster.device.usable_memory_bytes,
        flop_per_iteration=flop * training.global_batch_size if flop else None,
        peak_flop_per_s=cluster.device.peak_flop_per_s_for(resolved.model.dtype),
        schedule_name=plan.schedule if plan.custom_schedule is None else "file",
        num_stages=plan.num_stages,
        recompute=plan.recompute is Recompute.FULL,
        parallelism=Parallelism(tensor=plan.tensor_parallel, context=plan.context_parallel,
                                pipeline=len(plan.device_groups),
                                data=max(plan.num_replicas(s) for s in range(plan.num_stages)),
                                sharding=plan.sharding.value, sequence_parallel=plan.sequence_parallel),
        tokens_per_sample=_tokens_per_sample(whole),
        contention=contention,
        optimistic=optimistic,
        fabric_traffic=traffic,
    )


def _every_microbatch(plan, num_microbatches: int) -> bool:
    """Whether each backward reduce-scatters its gradients (``plan.fsdp.reduce_every_microbatch``):
    under sharded gradients (ZeRO-2/3: DeepSpeed reduces at every micro-step, FSDP2 unless told
    ``set_requires_gradient_sync(False)``) with several micro-batches; ZeRO-1 and plain data
    parallelism accumulate locally and reduce once (DDP's ``no_sync``, Megatron-LM's ``main_grad``)."""
    return (plan.fsdp.reduce_every_microbatch and num_microbatches > 1
            and plan.sharding in (Sharding.GRADIENTS, Sharding.FULL))


def _final_gather_ratio(plan, model, num_microbatches: int) -> float:
    """Parameter bytes per gradient byte of ZeRO-2's final all-gather where it is a collective of
    its own (``sim.engine.collectives.with_final_gather``): after a reduce-scatter every
    micro-batch, with gradients in another dtype than the parameters; 0 where the
    reduce-scatter's collective runs it (the same bytes) or there is none."""
    ratio = 1.0 / model.grad_bytes_per_param_byte
    return ratio if _final_gather(plan, num_microbatches) and ratio != 1.0 else 0.0


def _final_gather(plan, num_microbatches: int) -> bool:
    """Whether ZeRO-2 ends with an all-gather of the updated parameters after reduce-scattering
    every micro-batch's gradients (ZeRO-3 has none; ``param_gather`` moves it beside the next forward)."""
    return _every_microbatch(plan, num_microbatches) and plan.sharding is Sharding.GRADIENTS and not _param_gather(plan)


def _param_gather(plan) -> bool:
    """Whether ZeRO-1/2's all-gather of the updated parameters runs beside each stage's first
    forward (``plan.overlap.param_gather``: Megatron-LM's ``--overlap-param-gather`` with its
    distributed optimizer: ``_make_forward_pre_hook`` in megatron/core/distributed/
    distributed_data_parallel.py waits for a bucket's all-gather before a module uses it, and the
    bucket group's ``finish_param_sync`` (param_and_grad_buffer.py) dispatches the next one): the
    gradient reduction keeps only its reduce-scatter. One simulated iteration stands for the
    steady state, the gather launched after the previous step. No effect under ``none``
    (nothing gathered) or ``full`` (FSDP gathers by unit)."""
    return plan.overlap.param_gather and plan.sharding in (Sharding.OPTIMIZER, Sharding.GRADIENTS)


def _gather_flows(ar_flows: list, param_bytes_per_grad_byte: float) -> list:
    """The parameter all-gather's flows: the reduce-scatter's layout (as ZeRO-2's final all-gather),
    labelled ``("PG", stage, "F", phase)`` for the first forward, each carrying the parameters'
    bytes, ``param_bytes_per_grad_byte`` of the gradients' (1/2 for fp32 gradients of a 16-bit
    model). Megatron-Core gathers the 16-bit parameters, not the gradients it reduced: the
    distributed optimizer's ``_all_gather_base`` runs on a bucket's ``param_data``, allocated in
    ``param_dtype`` (the model's; ``grad_data`` is in ``grad_dtype``, fp32 under bf16:
    megatron/core/optimizer/distrib_optimizer.py ``_dispatch_gather_model_params`` and
    megatron/core/distributed/param_and_grad_buffer.py ``ParamAndGradBuffer`` at core_r0.8.0)."""
    return [(src, dst, ("PG", label[1], "F", label[2]), nbytes * param_bytes_per_grad_byte)
            for src, dst, label, nbytes in ar_flows]


def _gather_latency(ar_latency: dict) -> dict:
    """Each all-gather phase's latency: its reduce-scatter phase's (``allreduce_flows`` keys them ``(stage, phase)``)."""
    return {("PG", s, "F", phase): latency for (s, phase), latency in ar_latency.items()}


def _pipelining(plan, model, kinds: list, collectives: list, group_colls: list, num_microbatches: int, *,
                slowdown: float, device, samples: dict, finals: list = ()) -> Pipelining:
    """How the plan pipelines its collectives with its compute (``sim.engine.ops.Pipelining``);
    ``slowdown``: the device's ``overlap_slowdown``, which needs every group collective's alone time;
    ``device``: its SMs, which ``plan.overlap.communication_sms`` shares out, and the MoE blocks'
    share of each stage's compute on its replicas' ``samples`` (``all_to_all_share``), over which
    they are held."""
    units, reductions = {}, {}
    if plan.sharding is Sharding.FULL:
        units = {s: unit_count(stage.layers[1] - stage.layers[0], plan.fsdp.unit_layers)
                 for s, stage in enumerate(plan.stages)}
    buckets_of = {}
    for coll in collectives:
        stage = plan.stages[coll.stage]
        grad_bytes = model.stage_param_bytes(*stage.layers) * model.grad_bytes_per_param_byte
        buckets_of[coll.stage] = bucket_count(grad_bytes, plan.overlap.bucket_bytes)
        if plan.overlap.grad_reduce:
            reductions[coll.stage] = (buckets_of[coll.stage], collective_alone_s(kinds, coll) / buckets_of[coll.stage])
    every, gathered = _every_microbatch(plan, num_microbatches), _param_gather(plan)
    tp_chunks = plan.tensor_parallel if plan.overlap.tensor_parallel and plan.tensor_parallel > 1 else 0
    sms = plan.overlap.communication_sms
    expert_slowdown = communication_sms_slowdown(device.sm_count, sms) if sms and plan.overlap.expert_all_to_all else None
    held_share = {}
    if expert_slowdown is not None:
        for s, stage in enumerate(plan.stages):
            first, last = samples[s][min(samples[s])]
            share = all_to_all_share(model, device, *stage.layers, last - first)
            held_share[(s, "F")], held_share[(s, "B")] = share
    needed = units or tp_chunks or gathered or slowdown > 0 or expert_slowdown is not None
    group_s = tuple(collective_alone_s(kinds, g) for g in group_colls) if needed else ()
    return Pipelining(group_s=group_s, units=units, tp_chunks=tp_chunks,
                      reshard_after_forward=plan.fsdp.reshard_after_forward, reductions=reductions,
                      every_microbatch=every, collective_of={c.stage: c.index for c in collectives},
                      final_gather=_final_gather(plan, num_microbatches),
                      final_gather_of={c.stage: c.index for c in finals},
                      gather_buckets=buckets_of if gathered else {},
                      gather_ahead=gathered and plan.schedule == "interleaved" and plan.custom_schedule is None,
                      expert_overlap=plan.overlap.expert_all_to_all, overlap_slowdown=slowdown,
                      prefetch=plan.fsdp.prefetch, expert_slowdown=expert_slowdown, held_share=held_share)


def _pipeline_gather(plan, cluster, p2p):
    """The pipeline transfers' labels and the all-gather each receiver runs over its tensor group
    after one (``plan.overlap.pipeline_gather``, ``sim.cost.comm.pipeline_gather_s``), or None:
    not asked, one tensor rank, or sequence parallelism (its activations are already split)."""
    t = plan.tensor_parallel
    if not plan.overlap.pipeline_gather or t <= 1 or plan.sequence_parallel or not p2p:
        return None
    link = group_link(cluster, plan.device_groups[0][:t])
    return frozenset(label for _, _, label, _ in p2p), lambda share: pipeline_gather_s(share, t, link)


def _replica_samples(plan, stage: int, microbatch_size: int) -> dict[int, tuple[int, int]]:
    """Device -> the samples of a micro-batch its replica processes (``sim.cost.split.sample_ranges``
    over the stage's data-parallel replicas; every device of a replica gets the replica's)."""
    replicas = plan.replicas(stage)
    ranges = sample_ranges(microbatch_size, tuple(range(len(replicas))))
    return {d: ranges[r] for r, replica in enumerate(replicas) for d in replica}


def _tokens_per_sample(model) -> int | None:
    """A transformer's sequence length (what ``tokens_per_s`` counts per sample; one home:
    ``sim.cost.capacity.tokens_per_sample``, which ``training.tokens`` counts with too)."""
    return tokens_per_sample(model)


def _slice(ranges: dict[int, tuple[int, int]], device: int) -> int:
    start, end = ranges[device]
    return end - start


@dataclass(frozen=True, slots=True, kw_only=True)
class _Context:
    """What building one class's ops needs from the compilation (read-only)."""

    scenario: Scenario
    resolved: ResolvedPlan
    """The scenario's resolved plan: one device's share of every layer, the stage costs."""
    schedule: Schedule
    """The lowered schedule."""
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
    shared_ops: dict
    """``(ops, their durations)`` of the classes whose ops are alike (``_device_class``'s key),
    built once (a class with jitter scales a copy of the durations)."""
    pipelining: Pipelining
    """How the plan pipelines its collectives with its compute, for the ops."""
    held: tuple
    """What each stage's compute actions hold unsharded (``held_by_stage``), once per plan."""

    def texts(self, rank: int) -> list[str]:
        """The text of each step of ``rank`` (``2F0``), made once for all its classes."""
        if rank not in self.rank_texts:
            self.rank_texts[rank] = [str(step) for step in self.schedule.ranks[rank]]
        return self.rank_texts[rank]


def _device_class(index: int, devices: tuple[int, ...], ctx: _Context) -> DeviceClass:
    plan = ctx.scenario.plan
    rank = ctx.rank_of[devices[0]]
    stages = ctx.stages_of_rank[rank]
    slices = tuple(_slice(ctx.samples[s], devices[0]) for s in stages)
    costs = {s: ctx.resolved.stage_cost(s, n) for s, n in zip(stages, slices)}
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
    if ctx.pipelining.group_s:  # the ops' leads depend on their group collectives' times
        key += (tuple(ctx.pipelining.group_s[g] for _, g in group_keys),)
    shared = ctx.shared_ops.get(key)
    if shared is None:
        ops = class_ops(plan, ctx.schedule.ranks[rank], ctx.texts(rank), costs, link_costs, group_keys,
                        ctx.collectives, ctx.held, ctx.pipelining)
        compute = np.array([i for i, op in enumerate(ops) if op.code == COMPUTE], dtype=np.intp)
        shared = ctx.shared_ops[key] = ops, array("d", [op.duration_s for op in ops]), compute
    ops, durations, compute = shared
    jitter = ctx.faults.jitter_for(devices[0])
    if jitter is not None:  # the devices of a class draw the same factors (their signature has the key)
        durations = array("d", durations)
        np.frombuffer(durations, dtype=float)[compute] *= jitter_factors(jitter[0], jitter[1], len(compute))
    straggler, failure = ctx.faults.stragglers.get(devices[0]), ctx.faults.failures.get(devices[0])
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
        states=sum_state_bytes(costs[s].states for s in stages),
        optimizer_s=sum(costs[s].optimizer_s for s in stages),
        slowdown=straggler.slowdown if straggler else 1.0,
        slow_from_s=straggler.from_s if straggler else 0.0,
        fails_at_s=failure.at_s if failure else None,
    )

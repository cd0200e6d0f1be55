"""Analytic costs the planners search with: stage times, transfers, all-reduce and memory.

The search looks at far more candidates than it can replay, so it scores them with closed
forms computed from prefix sums over the layers (O(1) per stage). One ``CostTables`` holds
one *layout* of the model: the share of every layer that one device of a tensor-parallel
group of t and a context-parallel group of c holds (``sim.models.shard_model``, with
Megatron's sequence parallelism whenever t > 1), so every figure below is per device:

* a stage's forward and backward time for its slice of a micro-batch: prefix sums of the
  per-layer terms of ``sim.cost.compute.stage_time_s`` (``layer_times_s``, ``attention_core_s``;
  tabulated once per slice size), with what the recompute mode adds (``recompute_extra_s``: the
  forward again under ``full``, attention's core under ``selective``) and the action overhead,
  the stage's tensor-parallel collectives (on the critical path, as the engine's ``TP``
  flows: ring bytes over the tensor group's link plus a latency per ring step; a group
  across servers hierarchically, ``sim.cost.group_comm``), and the context-parallel ring
  and FSDP's unit-by-unit gathers, which run beside the compute as the engine replays the
  plan's overlap (``sim.cost.overlap``; :meth:`CostTables.actions`, ``reduction_tail_s``);
* a boundary's transfer time per micro-batch: latency + bytes / bandwidth, where the bytes
  are the cut's activations (each device's share) and the bandwidth is that of the ports
  carrying them in parallel (each receiving GPU's port inside a server; the receiving
  servers' NICs between servers);
* a stage's gradient all-reduce, alpha-beta (``sim.cost.comm``, as the engine's flows): ring
  inside a server, hierarchical across servers, for each of the t gradient groups (the t
  groups share the servers' NICs); ``sharding: full`` leaves only the reduce-scatter;
* a stage's memory per device: parameters, gradients and optimizer state as sharding leaves
  them (``sim.cost.memory.stage_state_bytes``, the engine's own number), plus the activations of
  the micro-batches alive at once (``planner.search.memory`` counts them from the schedule),
  each slice's from prefix sums of ``sim.cost.memory``'s per-layer terms (``layer_stash_bytes``,
  ``checkpoint_bytes``), the terms the engine's ``stage_activation_bytes`` sums;
* a stage's optimizer step (``sim.cost.compute.stage_optimizer_step_s``);
* an MoE stage's all-to-all, expert states and expert gradient reduction on the layout's
  expert-parallel degree (``planner.search.expert_costs``).

These are estimates for ranking; ``planner.search.memory`` checks memory with the engine's own
per-stage costs before a replay, and the fast path and the SimPy engine settle the choice.
"""

from __future__ import annotations

from itertools import accumulate

from planner.search.expert_costs import ExpertPricing
from planner.search.overlap_costs import ZERO_GATHERED, Action, OverlapPricing
from sim.core.overlap import FsdpSpec, OverlapSpec
from sim.core.parallelism import Recompute, Shard, Sharding
from sim.cost.comm import (
    HALVES,
    collective_s,
    fsdp_gather,
    gradient_sync,
    point_to_point_s,
    ring_bytes,
    ring_steps,
    tensor_parallel_bytes_and_steps,
)
from sim.cost.compute import (
    attention_core_s,
    layer_times_s,
    op_recompute_s,
    stage_optimizer_step_s,
    tied_copy_tensors,
)
from sim.cost.context_comm import context_ring_s
from sim.cost.fabric_comm import nominal_crossing
from sim.cost.group_comm import context_ring_flows_per_nic, is_hierarchical, spanning_phases, tensor_parallel_volumes
from sim.cost.links import busiest_nic_flows, contiguous_span, members_per_node, span_link
from sim.cost.memory import checkpoint_bytes, layer_stash_bytes
from sim.cost.zero3 import reduced_as
from sim.input.scenario import Scenario
from sim.models import shard_model

__all__ = ["Action", "CostTables", "ZERO_GATHERED"]  # Action and ZERO_GATHERED live in planner.search.overlap_costs




def _prefix(values) -> list[float]:
    return [0.0, *accumulate(values)]


class CostTables(OverlapPricing, ExpertPricing):
    """Prefix sums of one layout's per-device, per-sample costs on a cluster's device.

    ``tensor_parallel``, ``context_parallel`` and ``expert_parallel`` choose the layout; a
    measured profile has only the whole one (``shard_model`` raises ``SpecError`` for any other).
    """

    def __init__(self, scenario: Scenario, *, tensor_parallel: int = 1, context_parallel: int = 1,
                 expert_parallel: int = 1, overlap: OverlapSpec | None = None, fsdp: FsdpSpec | None = None) -> None:
        shard = Shard(tensor=tensor_parallel, context=context_parallel, sequence_parallel=tensor_parallel > 1,
                      expert=expert_parallel)
        model = shard_model(scenario.model, shard)
        cluster = scenario.cluster
        self.cluster = cluster
        self.model = model
        self.tensor_parallel, self.context_parallel = tensor_parallel, context_parallel
        # the plan's (``plan.overlap``, ``plan.fsdp``), by default the scenario's (its stack's), priced as replayed
        self.overlap = scenario.overlap if overlap is None else overlap
        self.fsdp = scenario.fsdp if fsdp is None else fsdp
        self.unit = tensor_parallel * context_parallel
        self._times: dict = {}  # per slice size (and selective-op's, keyed by mode and size)
        layers = model.layers
        # per-sample activation terms of sim.cost.memory, the ones stage_activation_bytes sums
        self._stash = {mode: _prefix(layer_stash_bytes(layer, mode) for layer in layers)
                       for mode in (Recompute.NONE, Recompute.SELECTIVE, Recompute.SELECTIVE_OP)}
        self._checkpoints = _prefix(checkpoint_bytes(model, k, first=False) for k in range(len(layers)))
        # full recompute of the blocks alone (model.recompute_blocks_only): the other layers keep their stash
        self._blocks_kept = _prefix(layer.stash_bytes if layer.checkpoint_bytes is None else layer.checkpoint_bytes
                                    for layer in layers)
        self._params = _prefix(layer.param_bytes for layer in layers)
        self._tensors = [0, *accumulate(layer.optimizer_tensors for layer in layers)]
        self._cp_ring = _prefix(layer.cp_ring_bytes for layer in layers)
        self._cp_rings = _prefix(1 if layer.cp_ring_bytes > 0 else 0 for layer in layers)  # layers with a ring
        t = tensor_parallel
        # per sample and layer, from the one home of the formulas (sim.cost.comm), the link by the
        # group's shape (t consecutive devices; sim.cost.links)
        # the backward's split under plan.overlap.column_backward: blocking, and beside its compute (engine's TA)
        selections = {"forward": ("forward", None), "backward": ("backward", False if self.overlap.column_backward else None)}
        if self.overlap.column_backward:
            selections["beside"] = (("backward", "regather"), True)
        # what a full recompute repeats of the forward's under model.recompute_blocks_only: the blocks' alone
        redo = [layer.checkpoint_bytes is not None or not model.recompute_blocks_only for layer in layers]
        if model.recompute_blocks_only:
            selections["redo"] = ("forward", None)
        self._tp = {
            key: tuple(_prefix(values) for values in zip(*(
                tensor_parallel_bytes_and_steps((layer,), t, phases, beside=beside) if key != "redo" or again
                else (0.0, 0) for layer, again in zip(layers, redo))))
            for key, (phases, beside) in selections.items()
        } if t > 1 else None
        self._tp_link = span_link(cluster, contiguous_span(cluster, t))
        self._tp_members = members_per_node(cluster, t)
        self._tp_kinds = {  # a group across servers: per-kind prefix sums of bytes and counts (sim.cost.group_comm)
            key: {kind: tuple(_prefix(values) for values in zip(*(
                      tensor_parallel_volumes((layer,), phases, beside=beside).get(kind, (0.0, 0))
                      if key != "redo" or again else (0.0, 0) for layer, again in zip(layers, redo))))
                  for kind in HALVES}
            for key, (phases, beside) in selections.items()
        } if t > 1 and is_hierarchical(self._tp_members) else None
        self._gathers: dict[int, tuple[float, float]] = {}  # per data_parallel: seconds per byte, latency
        self._fabric_gathers: dict[tuple[int, float], float] = {}  # on a fabric: seconds per (data_parallel, bytes)
        self._unit_link = span_link(cluster, contiguous_span(cluster, self.unit))
        self._allreduce: dict[tuple, tuple] = {}
        self._param_bytes: dict[tuple[int, int], float] = {}  # memoised: the searches ask for the same stages often
        self._static: dict[tuple, float] = {}
        self._memo: dict[tuple, object] = {}  # the overlap pricing's actions and tails, and the optimizer steps
        self.scores: dict = {}
        """Candidates' closed-form scores on these tables (``planner.search.ranking.analytic_score``), memoised."""
        self.grad_factor = model.grad_bytes_per_param_byte
        self.num_layers = model.num_layers
        self._init_experts(expert_parallel)

    def _table(self, samples: int) -> tuple[list[float], ...]:
        """Prefix sums of the per-layer (forward, backward, attention core) seconds on ``samples``
        samples: ``sim.cost.compute.stage_time_s``'s terms."""
        if samples not in self._times:  # per slice size (kernel times are not linear in it)
            device, dtype = self.cluster.device, self.model.dtype
            times = [layer_times_s(layer, device, dtype, samples) for layer in self.model.layers]
            again = [attention_core_s(layer, device, dtype, samples) for layer in self.model.layers]
            self._times[samples] = (_prefix(t[0] for t in times), _prefix(t[1] for t in times), _prefix(again))
            # the blocks' forward, what full recompute runs again under model.recompute_blocks_only
            self._times[("blocks", samples)] = _prefix(t[0] if layer.checkpoint_bytes is not None else 0.0
                                                       for t, layer in zip(times, self.model.layers))
        return self._times[samples]

    def recomputed_forward_s(self, start: int, end: int, samples: int) -> float:
        """Forward seconds of layers ``[start, end)`` that full recompute runs again: all of them, or
        the blocks alone under ``model.recompute_blocks_only`` (``sim.cost.compute.stage_time_s``)."""
        fwd = self._table(samples)[0]
        if not self.model.recompute_blocks_only:
            return fwd[end] - fwd[start]
        blocks = self._times[("blocks", samples)]
        return blocks[end] - blocks[start]

    def recomputed_tensor_parallel_s(self, start: int, end: int, samples: int) -> float:
        """Seconds of the forward tensor-parallel collectives full recompute repeats in the backward:
        every layer's, or the blocks' alone under ``model.recompute_blocks_only``."""
        if self._tp is None:
            return 0.0
        return self._tp_s("redo" if "redo" in self._tp else "forward", start, end, samples)

    def _op_again(self, samples: int) -> list[float]:
        """Prefix sums of what selective-op runs again per layer (``sim.cost.compute.op_recompute_s``)."""
        key = ("selective-op", samples)
        if key not in self._times:
            device, dtype = self.cluster.device, self.model.dtype
            self._times[key] = _prefix(op_recompute_s(layer, device, dtype, samples) for layer in self.model.layers)
        return self._times[key]

    def compute_s(self, start: int, end: int, samples: int, recompute: Recompute | bool = Recompute.NONE,
                  *, data_parallel: int = 1, sharding: Sharding = Sharding.NONE) -> tuple[float, float]:
        """(forward, backward) seconds of layers ``[start, end)`` on ``samples`` samples, the
        recompute mode's extra work and the layout's collectives included, as the engine replays
        an action (:meth:`actions`)."""
        if self._tp is None and self.context_parallel == 1 and self._a2a is None and end > start \
                and not (sharding is Sharding.FULL and data_parallel > 1):
            # nothing runs beside or after the compute: the actions' times without building them
            f, b, overhead = self.own_compute_s(start, end, samples, Recompute.of(recompute))
            return f + overhead, b + overhead
        f, b = self.actions(start, end, samples, recompute, data_parallel=data_parallel, sharding=sharding)
        return f.total_s, b.total_s

    def tensor_parallel_s(self, start: int, end: int, samples: int) -> tuple[float, float]:
        """(forward, backward) seconds of layers ``[start, end)``'s tensor-parallel collectives on
        ``samples`` samples, on the compute stream's critical path (``sim.cost.comm.collective_s``
        over the link t consecutive devices cross; the engine's ``TP`` flows)."""
        if self._tp is None:
            return 0.0, 0.0
        return self._tp_s("forward", start, end, samples), self._tp_s("backward", start, end, samples)

    def tensor_parallel_beside_s(self, start: int, end: int, samples: int) -> float:
        """Seconds of layers ``[start, end)``'s backward collectives that run beside the backward's
        compute under ``plan.overlap.column_backward`` (the engine's ``TA``; ``sim.cost.tensor_comm``),
        0 without it; ``tensor_parallel_s``'s backward then leaves them out."""
        return self._tp_s("beside", start, end, samples) if self._tp is not None and "beside" in self._tp else 0.0

    def _tp_s(self, key: str, start: int, end: int, samples: int) -> float:
        """Seconds of one of the ``_tp`` selections of layers ``[start, end)`` on ``samples`` samples."""
        if self._tp_kinds is not None:
            return self._spanning_s(self._tp_kinds[key], start, end, samples)
        nbytes, steps = self._tp[key]
        return collective_s((nbytes[end] - nbytes[start]) * samples, steps[end] - steps[start], self._tp_link)

    def _spanning_s(self, kinds: dict, start: int, end: int, samples: int) -> float:
        """Seconds of layers ``[start, end)``'s collectives of one phase over a tensor group across
        servers: ``sim.cost.group_comm.spanning_phases`` of their per-kind bytes and counts."""
        volumes = {kind: ((b[end] - b[start]) * samples, int(n[end] - n[start])) for kind, (b, n) in kinds.items()
                   if n[end] > n[start]}
        return sum(p.seconds for p in spanning_phases(volumes, self._tp_members, self.cluster).values())

    def context_ring_s(self, start: int, end: int, samples: int) -> tuple[float, float]:
        """(forward, backward) seconds of ring attention's blocks for layers ``[start, end)`` on
        ``samples`` samples (``sim.cost.context_comm.context_ring_s``; the backward sends twice the bytes),
        inside a server when the replica's unit fits in one; across servers each step waits for its
        crossing hop, whose NIC the t rings' crossing hops share (``group_comm.context_ring_flows_per_nic``)."""
        c, link = self.context_parallel, self._unit_link
        if c <= 1:
            return 0.0, 0.0
        nbytes = (self._cp_ring[end] - self._cp_ring[start]) * samples
        rings = int(self._cp_rings[end] - self._cp_rings[start])
        if link is self.cluster.intra_node:
            return context_ring_s(nbytes, c, link, rings=rings), context_ring_s(2 * nbytes, c, link, rings=rings)
        flows = context_ring_flows_per_nic(self.cluster, self.tensor_parallel)
        return (context_ring_s(nbytes, c, link, flows_per_port=flows, rings=rings),
                context_ring_s(2 * nbytes, c, link, flows_per_port=flows, rings=rings))

    def gather_s(self, start: int, end: int, data_parallel: int, extra_bytes: float = 0.0) -> float:
        """FSDP's all-gather of the stage's parameters over its gradient group (the
        ``data_parallel × c`` shards), per action (``sim.cost.comm.fsdp_gather``), across servers
        when the stage's ``data_parallel`` units do not fit in one; ``extra_bytes`` more gathered
        (a backward's second gathers, ``sim.cost.zero3.regathered_bytes``)."""
        nbytes = self.param_bytes(start, end) + extra_bytes
        n = data_parallel * self.context_parallel
        members = members_per_node(self.cluster, n, self.tensor_parallel)
        fabric = self.cluster.fabric is not None
        if self.fsdp.path == "hierarchical" and is_hierarchical(members) and fabric:
            # NCCL's protocol depends on the size: priced at the stage's bytes (sim.cost.fabric_comm)
            key = (data_parallel, nbytes)
            if key not in self._fabric_gathers:
                flows = busiest_nic_flows(self.cluster, min(members) * self.tensor_parallel)
                phases = spanning_phases({"all-gather": (key[1], 1)}, members, self.cluster, flows_per_nic=flows)
                self._fabric_gathers[key] = sum(p.seconds for p in phases.values())
            return self._fabric_gathers[key]
        if self.fsdp.path == "hierarchical" and is_hierarchical(members):  # NCCL's path (sim.cost.group_comm)
            cached = self._gathers.get(data_parallel)
            if cached is None:  # the t gradient groups' cross-server flows share the NICs
                flows = busiest_nic_flows(self.cluster, min(members) * self.tensor_parallel)
                phases = spanning_phases({"all-gather": (1.0, 1)}, members, self.cluster, flows_per_nic=flows).values()
                cached = self._gathers[data_parallel] = (sum(p.flow_bytes / p.rate_bytes_per_s for p in phases),
                                                         sum(p.latency_s for p in phases))
            return nbytes * cached[0] + cached[1]
        link = span_link(self.cluster, contiguous_span(self.cluster, data_parallel * self.unit))
        if link.collectives is not None:  # measured: FSDP2's calls, one per layer (sim.cost.measured_comm)
            return fsdp_gather(n, nbytes, link, self.cluster, units=end - start).seconds
        if fabric and n > 1 and len(members) == n:  # one member a server: NCCL's ring over the tiers it climbs
            return fsdp_gather(n, nbytes, link, self.cluster,
                               crossing=nominal_crossing(self.cluster, n)).seconds
        return collective_s(ring_bytes(n, nbytes, halves=1), ring_steps(n, halves=1), link)

    def param_bytes(self, start: int, end: int) -> float:
        """Parameter bytes a stage of layers ``[start, end)`` holds (a tied embedding's copy included,
        ``ModelSpec.stage_param_bytes``)."""
        found = self._param_bytes.get((start, end))
        if found is None:
            found = self._param_bytes[(start, end)] = \
                self._params[end] - self._params[start] + self.model.tied_copy_bytes(start, end)
        return found

    def static_bytes(self, start: int, end: int, data_parallel: int = 1, sharding: Sharding = Sharding.NONE) -> float:
        """Parameters, gradients and optimizer state of layers ``[start, end)`` on one device,
        over ``data_parallel`` replicas (times the context-parallel degree: they hold the same):
        ``sim.cost.memory.stage_state_bytes``, the engine's and ``dapple-sim check``'s number."""
        key = (start, end, data_parallel, sharding)
        found = self._static.get(key)
        if found is None:
            found = self._static[key] = self.state_bytes(start, end, data_parallel, sharding)
        return found

    def stash_bytes(self, start: int, end: int, samples: int, *, recompute: Recompute | bool) -> float:
        """Activations one micro-batch slice keeps until its backward (``sim.cost.memory``'s
        ``stage_activation_bytes`` from prefix sums of its terms: under full recompute each
        segment's checkpoint, the stage's first layer opening one)."""
        recompute = Recompute.of(recompute)
        if end <= start:
            return 0.0
        if recompute is Recompute.FULL and self.model.recompute_blocks_only:
            return (self._blocks_kept[end] - self._blocks_kept[start]) * samples
        if recompute is Recompute.FULL:
            head = checkpoint_bytes(self.model, start, first=True)  # the stage opens a segment
            return (self._checkpoints[end] - self._checkpoints[start + 1] + head) * samples
        prefix = self._stash[recompute]
        return (prefix[end] - prefix[start]) * samples

    def transfer_s(self, boundary: int, microbatch_size: int, receivers: int, nodes: int, intra: bool) -> float:
        """One micro-batch's activations (or gradients) across cut ``boundary``.

        ``receivers`` replicas (units of t·c devices) on ``nodes`` servers receive in parallel,
        each device its slice's share (``sim.engine.flows.p2p_flows``), point to point
        (``sim.cost.comm.point_to_point_s``): inside one server each through its own port;
        between servers through the receiving server's NICs, as many flows on the busiest as
        ``sim.cost.links.busiest_nic_flows`` says.
        """
        nbytes = self.model.boundary_bytes[boundary] * microbatch_size
        if nbytes == 0:
            return 0.0
        c = self.cluster
        if intra:
            return point_to_point_s(nbytes / receivers, c.intra_node)
        flows = busiest_nic_flows(c, -(-receivers // nodes) * self.unit)
        return point_to_point_s(nbytes / receivers, c.inter_node, flows_per_port=flows)

    def allreduce_s(self, start: int, end: int, per_node: int, nodes: int, sharding: Sharding = Sharding.NONE, *,
                    span: int | None = None, factor: float | None = None) -> float:
        """Gradient synchronisation of layers ``[start, end)`` over ``per_node`` replicas on each of
        ``nodes`` servers (``sim.cost.comm.gradient_sync``, the engine's layout): each of the t
        gradient groups has ``per_node × c`` devices per server, and the t groups' cross-server
        flows share the servers' NICs. The phases' seconds are linear in the bytes, so they are
        worked out once per shape and scaled; on a fabric NCCL's algorithm depends on the size, and
        the tiers crossed on the ``span`` of consecutive servers the group lies in (default ``nodes``:
        ``sim.cost.fabric_comm.nominal_crossing``). ``factor``: bytes moved per parameter byte (default
        the gradients', ``grad_factor``; 1 for ZeRO-1/2's all-gather of the 16-bit parameters); under
        ``optimizer``/``gradients`` the sync's all-gather moves the parameters' bytes, not ``factor``'s."""
        factor = self.grad_factor if factor is None else factor
        members = per_node * self.context_parallel
        if members * nodes <= 1:
            return 0.0
        flat = sharding is Sharding.FULL and self.fsdp.path == "flat"
        sharding = reduced_as(sharding, self.fsdp)  # all-reduced under reduce_scatter false (sim.cost.zero3)
        if self._experts[-1]:  # an MoE layout: the experts reduce over their own groups (expert_costs)
            key = ("moe", start, end, members, nodes, sharding, factor)
            found = self._allreduce.get(key)
            if found is None:
                found = self._allreduce[key] = self.moe_reduce_s(start, end, members, nodes, sharding, factor)
            return found
        if flat:  # one ring over the group (sim.cost.zero3)
            n, link = members * nodes, self.cluster.inter_node if nodes > 1 else self.cluster.intra_node
            nbytes, halves = self.param_bytes(start, end) * factor, 1 if sharding is Sharding.FULL else 2
            return collective_s(ring_bytes(n, nbytes, halves=halves), ring_steps(n, halves=halves), link)
        measured = self.cluster.intra_node.collectives is not None and nodes == 1  # measured: per-unit calls
        if measured or (self.cluster.fabric is not None and nodes > 1):  # NCCL's algorithm depends on the size
            flows = busiest_nic_flows(self.cluster, members * self.tensor_parallel)
            crossing = None if measured else nominal_crossing(self.cluster, span or nodes)
            phases = gradient_sync([members] * nodes, self.param_bytes(start, end) * factor, sharding,
                                   self.cluster, units=end - start, flows_per_nic=None if measured else flows,
                                   crossing=crossing, param_bytes=self.param_bytes(start, end))
            return sum(p.seconds for p in phases)
        # ZeRO-1/2 all-gathers the parameters' bytes, 1/factor of a gradient byte (gradient_sync_bytes)
        gather = 1.0 / factor if sharding in ZERO_GATHERED else 1.0
        key = (members, nodes, sharding is Sharding.FULL, gather)  # what the layout depends on
        cached = self._allreduce.get(key)
        if cached is None:
            flows = busiest_nic_flows(self.cluster, members * self.tensor_parallel)
            phases = gradient_sync([members] * nodes, 1.0, sharding, self.cluster, flows_per_nic=flows,
                                   param_bytes=gather)
            cached = self._allreduce[key] = (sum(p.flow_bytes / p.rate_bytes_per_s for p in phases),
                                             sum(p.latency_s for p in phases))
        return self.param_bytes(start, end) * factor * cached[0] + cached[1]

    def optimizer_s(self, start: int, end: int, data_parallel: int = 1, sharding: Sharding = Sharding.NONE) -> float:
        """Optimizer step of layers ``[start, end)`` (``sim.cost.compute.stage_optimizer_step_s``):
        sharded states step 1/(replicas × c) of the parameters."""
        key = ("optimizer", start, end, data_parallel, sharding)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._optimizer_s(start, end, data_parallel, sharding)
        return found

    def _optimizer_s(self, start: int, end: int, data_parallel: int, sharding: Sharding) -> float:
        tensors = self._tensors[end] - self._tensors[start] + tied_copy_tensors(self.model, start, end)
        stepped = self.stepped_bytes(start, end, data_parallel, sharding)
        return stage_optimizer_step_s(self.model, self.cluster.device, stepped,
                                      tensors, data_parallel=data_parallel * self.context_parallel, sharding=sharding,
                                      fp32_shards=self.fsdp.fp32_shards, buffer_bytes=self.param_bytes(start, end))

    @staticmethod
    def slice_of(microbatch_size: int, replicas: int) -> int:
        """Samples of the largest replica slice, the first (the stage waits for it; ``sim.cost.split.split_samples``)."""
        return -(-microbatch_size // replicas)  # the first slice of ``split_samples``: the ceiling

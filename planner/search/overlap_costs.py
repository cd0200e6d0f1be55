"""How the planner's tables price a plan's overlap, as the engine replays it (a mixin of
``planner.search.costs.CostTables``).

An action's compute beside the collectives a stack pipelines with it (FSDP's unit-by-unit
gathers, tensor-parallel chunks, the context ring), a stage's bucketed gradient reduction and
the reduce-scatters of every micro-batch under sharded gradients, and ZeRO-1/2's parameter
all-gather moved into the first forward (``plan.overlap.param_gather``): each with the closed
forms of ``sim.cost.overlap``, the engine's own rules (``sim.engine.rules.beside_bounds``,
``reduce_issue_s``), so that a one-stage plan is priced as the fast path replays it
(``tests/test_one_home_overlap.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.parallelism import Recompute, Sharding
from sim.cost.compute import action_overhead_s, recompute_extra_s
from sim.cost.overlap import (
    beside_action_s,
    bucket_count,
    contended_s,
    queued_reductions_end_s,
    reduce_end_s,
    unit_count,
)
from sim.cost.zero3 import regathered_bytes

__all__ = ["Action", "OverlapPricing", "ZERO_GATHERED"]

ZERO_GATHERED = (Sharding.OPTIMIZER, Sharding.GRADIENTS)
"""Shardings whose parameters are all-gathered after the optimizer step (ZeRO-1/2), the
gather ``plan.overlap.param_gather`` moves into the next forward."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One forward or backward action of a stage as the engine replays it, seconds from its start."""

    lead_s: float
    """When its compute starts: after the first piece of the collectives pipelined with it."""
    compute_s: float
    """Its compute's own duration (the action overhead included)."""
    end_s: float
    """When its compute ends: no earlier than the collectives beside it allow."""
    after_s: float
    """Its blocking collectives after the compute: tensor parallelism's, an MoE stage's all-to-all."""

    @property
    def total_s(self) -> float:
        """The action's seconds on the compute stream."""
        return self.end_s + self.after_s


_IDLE = Action(lead_s=0.0, compute_s=0.0, end_s=0.0, after_s=0.0)



class OverlapPricing:
    """The overlap-pricing methods of ``CostTables`` (which holds the tables they read)."""

    def actions(self, start: int, end: int, samples: int, recompute: Recompute | bool = Recompute.NONE,
                *, data_parallel: int = 1, sharding: Sharding = Sharding.NONE,
                first_gather: tuple[float, int] = (0.0, 0)) -> tuple[Action, Action]:
        """:meth:`_actions`, memoised (the searches price the same stages many times)."""
        key = ("actions", start, end, samples, Recompute.of(recompute), data_parallel, sharding, first_gather)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._actions(start, end, samples, recompute, data_parallel=data_parallel,
                                                    sharding=sharding, first_gather=first_gather)
        return found

    def _actions(self, start: int, end: int, samples: int, recompute: Recompute | bool = Recompute.NONE,
                 *, data_parallel: int = 1, sharding: Sharding = Sharding.NONE,
                 first_gather: tuple[float, int] = (0.0, 0)) -> tuple[Action, Action]:
        """The forward and backward :class:`Action` of layers ``[start, end)`` on ``samples`` samples.

        As the engine's ops (``sim.engine.ops._with_groups``): the compute (with its action
        overhead) runs beside the context ring and FSDP's gather, the gather pipelined unit by
        unit (``plan.fsdp.unit_layers``; none in the backward without ``reshard_after_forward``)
        and the tensor-parallel collectives in t chunks under ``plan.overlap.tensor_parallel``
        (``sim.cost.overlap.beside_action_s``), else after the compute on its stream, but for the
        backward's column-parallel ones under ``plan.overlap.column_backward``, beside it uncut.
        ``first_gather``: ``(alone seconds, buckets)`` of a collective the forward also runs beside
        it, the stage's first forward's parameter all-gather (:meth:`param_gather_s`)."""
        if end <= start:
            return _IDLE, _IDLE
        recompute = Recompute.of(recompute)
        f, b, overhead = self.own_compute_s(start, end, samples, recompute)
        tp_f = tp_b = column_b = 0.0
        if self._tp is not None and samples:
            tp_f, tp_b = self.tensor_parallel_s(start, end, samples)
            tp_b += self.recomputed_tensor_parallel_s(start, end, samples) if recompute is Recompute.FULL else 0.0
            column_b = self.tensor_parallel_beside_s(start, end, samples)
        beside_f, beside_b = [], []
        if self.context_parallel > 1 and samples:
            cp_f, cp_b = self.context_ring_s(start, end, samples)
            beside_f.append((cp_f, 0))
            beside_b.append((cp_b, 0))
        if column_b > 0:  # plan.overlap.column_backward: beside the backward's compute, uncut (engine's TA)
            beside_b.append((column_b, 0))
        block_f = block_b = 0.0  # gathers that hold the compute stream (plan.fsdp.prefetch false)
        if sharding is Sharding.FULL and data_parallel > 1:
            gather = (self.gather_s(start, end, data_parallel), unit_count(end - start, self.fsdp.unit_layers))
            if self.fsdp.prefetch:
                beside_f.append(gather)
            else:
                block_f = gather[0]
            if self.fsdp.reshard_after_forward:
                again = regathered_bytes(self.model, start, end, max_reuse_distance=self.fsdp.max_reuse_distance,
                                         full_recompute=recompute is Recompute.FULL)  # sim.cost.zero3
                if again:
                    gather = (self.gather_s(start, end, data_parallel, again), gather[1])
                if self.fsdp.prefetch:
                    beside_b.append(gather)
                else:
                    block_b = gather[0]
        if first_gather[0] > 0:
            beside_f.append(first_gather)
        ep_f, ep_b = self.all_to_all_s(start, end, samples, recompute)  # after the compute (engine's EP)
        return (self._action(f + overhead, tp_f, beside_f, ep_f, block_f),
                self._action(b + overhead, tp_b, beside_b, ep_b, block_b))

    def own_compute_s(self, start: int, end: int, samples: int, recompute: Recompute) -> tuple[float, float, float]:
        """(forward, backward, action overhead) seconds of layers ``[start, end)``'s own compute on
        ``samples`` samples, the recompute mode's extra work in the backward (``stage_time_s``'s
        terms), before any collective."""
        fwd, bwd, again = self._table(samples)
        if recompute is Recompute.SELECTIVE_OP:  # what the mode runs again
            again = self._op_again(samples)
        overhead = action_overhead_s(self.cluster.device, samples, end - start)  # as stage_time_s
        f = fwd[end] - fwd[start]
        redo = self.recomputed_forward_s(start, end, samples) if recompute is Recompute.FULL else f
        b = bwd[end] - bwd[start] + recompute_extra_s(recompute, redo, again[end] - again[start])
        return f, b, overhead

    def param_gather_s(self, start: int, end: int, per_node: int, nodes: int) -> tuple[float, int]:
        """``(alone seconds, buckets)`` of ZeRO-1/2's parameter all-gather of layers ``[start, end)``
        that ``plan.overlap.param_gather`` runs beside the stage's first forward (``(0, 0)``
        without the flag): the reduce-scatter's layout with the parameters' bytes (not the
        gradients': Megatron-Core gathers the 16-bit ``param_data``), as the engine's gather
        (``sim.engine.compile._gather_flows``), in the gradient buckets (Megatron-LM's buckets hold both)."""
        if not self.overlap.param_gather:
            return 0.0, 0
        seconds = self.allreduce_s(start, end, per_node, nodes, Sharding.FULL, factor=1.0)
        return seconds, bucket_count(self.param_bytes(start, end) * self.grad_factor, self.overlap.bucket_bytes)

    def first_forward_extra_s(self, start: int, end: int, samples: int, recompute: Recompute | bool = Recompute.NONE,
                              *, per_node: int, nodes: int, data_parallel: int = 1,
                              sharding: Sharding = Sharding.NONE) -> float:
        """What the stage's first forward takes longer than the others: the part of ZeRO-1/2's
        parameter all-gather (``plan.overlap.param_gather``) it does not hide. Exact for one
        stage; in a pipeline each stage's first forward is on the fill, and the planners add
        every stage's (an estimate: a later stage's may hide behind the wait for its input)."""
        if sharding not in ZERO_GATHERED:
            return 0.0
        gather = self.param_gather_s(start, end, per_node, nodes)
        if gather[0] <= 0:
            return 0.0
        plain = self.actions(start, end, samples, recompute, data_parallel=data_parallel, sharding=sharding)[0]
        first = self.actions(start, end, samples, recompute, data_parallel=data_parallel, sharding=sharding,
                             first_gather=gather)[0]
        return first.total_s - plain.total_s

    def reduction_tail_s(self, start: int, end: int, samples: int, recompute: Recompute | bool = Recompute.NONE,
                         *, per_node: int, nodes: int, data_parallel: int = 1, sharding: Sharding = Sharding.NONE,
                         num_microbatches: int = 1, span: int | None = None) -> float:
        """:meth:`_reduction_tail_s`, memoised (``span``: :meth:`allreduce_s`'s, on a fabric)."""
        key = ("tail", start, end, samples, Recompute.of(recompute), per_node, nodes, data_parallel, sharding,
               num_microbatches, span)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._reduction_tail_s(
                start, end, samples, recompute, per_node=per_node, nodes=nodes, data_parallel=data_parallel,
                sharding=sharding, num_microbatches=num_microbatches, span=span)
        return found

    def _reduction_tail_s(self, start: int, end: int, samples: int, recompute: Recompute | bool = Recompute.NONE,
                          *, per_node: int, nodes: int, data_parallel: int = 1, sharding: Sharding = Sharding.NONE,
                          num_microbatches: int = 1, span: int | None = None) -> float:
        """Seconds from the stage's last backward's end to the end of its gradient reduction, as
        the engine replays ``plan.overlap.grad_reduce`` and ``plan.fsdp.reduce_every_microbatch``:
        one :meth:`allreduce_s` after the backward; in buckets, the last one bucket after the
        backward's compute (``sim.cost.overlap.reduce_end_s``); a reduce-scatter after every
        backward (ZeRO-2/3, several micro-batches) queued on one stream
        (``sim.cost.overlap.queued_reductions_end_s`` with the backwards a forward and a backward
        apart: exact for one stage, an estimate in a pipeline, whose period is the slowest
        stage's), then ZeRO-2's all-gather unless ``param_gather`` moves it into the next forward."""
        every = (self.fsdp.reduce_every_microbatch and num_microbatches > 1
                 and sharding in (Sharding.GRADIENTS, Sharding.FULL))  # as sim.engine.compile._every_microbatch
        gathered = self.overlap.param_gather and sharding in ZERO_GATHERED
        scatter = every or gathered  # the REDUCE keeps only the reduce-scatter
        reduce_s = self.allreduce_s(start, end, per_node, nodes, Sharding.FULL if scatter else sharding, span=span)
        if reduce_s <= 0 or not (self.overlap.grad_reduce or every):
            return reduce_s
        forward, backward = self.actions(start, end, samples, recompute, data_parallel=data_parallel, sharding=sharding)
        if self.overlap.grad_reduce:
            buckets = bucket_count(self.param_bytes(start, end) * self.grad_factor, self.overlap.bucket_bytes)
            first = reduce_end_s(lead_s=backward.lead_s, compute_s=backward.compute_s, end_s=backward.end_s,
                                 reduce_s=reduce_s, buckets=buckets)
        else:  # each reduce-scatter follows its backward's compute, before its tensor-parallel collectives
            first = backward.end_s + reduce_s
        if every:
            first = queued_reductions_end_s(first, reduce_s, forward.total_s + backward.total_s, num_microbatches)
        tail = max(0.0, first - backward.total_s)
        if every and not gathered and sharding is Sharding.GRADIENTS:
            # ZeRO-2's all-gather of the updated (16-bit) parameters after the last reduce-scatter, on the
            # same stream: the reduce-scatter's layout with the parameters' bytes (sim.engine.collectives)
            tail += self.allreduce_s(start, end, per_node, nodes, Sharding.FULL, span=span, factor=1.0)
        return tail

    def _action(self, compute_s: float, tp_s: float, beside: list, ep_s: float = 0.0, block_s: float = 0.0) -> Action:
        """One action: its compute beside ``beside``, its tensor-parallel collectives ``tp_s`` after
        it or, overlapped, beside it in t chunks; an MoE stage's all-to-all ``ep_s`` after it
        (``sim.engine.ops._with_groups``: TP, then EP); a blocking gather ``block_s`` before the
        compute (``plan.fsdp.prefetch`` false: the engine holds the stream for it) delays it whole."""
        if self.overlap.tensor_parallel and tp_s:
            beside, tp_s = [*beside, (tp_s, self.tensor_parallel)], 0.0
        if not beside:
            return Action(lead_s=block_s, compute_s=compute_s, end_s=block_s + compute_s, after_s=tp_s + ep_s)
        # compute slows beside its collectives (sim.engine.ops._with_groups stretches the op alike)
        compute_s = contended_s(compute_s, sum(c for c, _ in beside), self.cluster.device.overlap_slowdown)
        lead, end = beside_action_s(compute_s, tuple(beside))
        return Action(lead_s=block_s + lead, compute_s=compute_s, end_s=block_s + end, after_s=tp_s + ep_s)

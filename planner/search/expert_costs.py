"""How the planner's tables price an MoE stage on its expert-parallel degree, as the engine
replays it (a mixin of ``planner.search.costs.CostTables``).

A layout (t, c, e) holds one device's share of every layer with e-way expert parallelism
(``sim.models.shard_model`` with ``Shard(expert=e)``: count/e local experts, their grouped GEMMs
timed on the busiest rank's tokens by ``sim.models.moe.moe_block``), so a stage's compute comes
from the same per-layer terms as the engine's (``layer_times_s``). Beside it:

* the token dispatch and combine: ``sim.cost.comm.all_to_all_s`` of the stage's
  ``LayerSpec.a2a_bytes`` over an expert-parallel group of e consecutive devices (Megatron-Core's
  fold with ETP 1: ``PlanSpec.expert_groups``; ``sim.cost.links.members_per_node``), twice in the
  forward and twice in the backward (four under full recompute), each action's after its compute
  on the compute stream (the engine's ``EP`` group collective, ``sim.engine.groups``);
* the model states: the dense part over the data-parallel group (r·c devices), the routed
  experts over the expert-data-parallel group (t·c·r/e devices): ``sim.cost.experts.moe_state_bytes``
  and ``stepped_param_bytes``, the engine's (``sim.cost.compute.stage_cost``);
* the gradient reduction: the dense gradients over the data-parallel group and the experts'
  over the expert-data-parallel groups, in the same phases (``sim.engine.collectives``: each
  phase as slow as its slower group's flow, which shares its port with the other group's and so
  runs at half the port's rate, as the engine's flows do), both ``sim.cost.comm.gradient_sync``.

A dense layout (e = 1) has no all-to-all and no expert bytes: every method here then gives what
the tables gave without it.
"""

from __future__ import annotations

from itertools import accumulate

from sim.core.parallelism import Recompute, Sharding
from sim.cost.comm import all_to_all_s, gradient_sync, node_limited_fraction
from sim.cost.experts import moe_state_bytes, stepped_param_bytes
from sim.cost.links import busiest_nic_flows, members_per_node

__all__ = ["ExpertPricing"]


def _phase_numbers(phases) -> tuple[int, ...]:
    """The engine's labels of ``hierarchical_allreduce``'s phases (``sim.engine.collectives``):
    0 a ring inside a server (or the reduce-scatter), 1 the ring across, 2 the all-gather inside."""
    if len(phases) == 3:
        return 0, 1, 2
    return tuple(1 if p.across_servers else 0 for p in phases)


class ExpertPricing:
    """The expert-parallel methods of ``CostTables`` (which holds the tables they read)."""

    def _init_experts(self, expert_parallel: int) -> None:
        """Prefix sums of the layout's all-to-all payload and routed-expert bytes per layer."""
        self.expert_parallel = expert_parallel
        layers = self.model.layers
        self._experts = [0.0, *accumulate(layer.expert_param_bytes for layer in layers)]
        moe = expert_parallel > 1 and any(layer.a2a_bytes for layer in layers)
        self._a2a = [0.0, *accumulate(layer.a2a_bytes for layer in layers)] if moe else None
        self._ep_members = members_per_node(self.cluster, expert_parallel)
        self._across = node_limited_fraction(self.model.experts, len(self._ep_members))

    def expert_bytes(self, start: int, end: int) -> float:
        """Routed-expert parameter bytes of layers ``[start, end)`` on one device (``ModelSpec.expert_param_bytes``)."""
        return self._experts[end] - self._experts[start]

    def expert_data_parallel(self, data_parallel: int) -> int:
        """Devices holding the same routed experts in a stage of ``data_parallel`` replicas:
        t·c·replicas / e (``PlanSpec.expert_data_groups``; at least 1)."""
        return max(1, self.unit * data_parallel // self.expert_parallel)

    def all_to_all_s(self, start: int, end: int, samples: int,
                     recompute: Recompute = Recompute.NONE) -> tuple[float, float]:
        """(forward, backward) seconds of layers ``[start, end)``'s dispatch and combine on
        ``samples`` samples: one all-to-all of 2 payloads in the forward, 2 in the backward (4
        under full recompute, which dispatches again), as the engine's ``EP`` collective."""
        if self._a2a is None or end <= start or not samples:
            return 0.0, 0.0
        payload = (self._a2a[end] - self._a2a[start]) * samples
        again = 4 if recompute is Recompute.FULL else 2
        return (all_to_all_s(self._ep_members, 2 * payload, self.cluster, across_fraction=self._across),
                all_to_all_s(self._ep_members, again * payload, self.cluster, across_fraction=self._across))

    def state_bytes(self, start: int, end: int, data_parallel: int, sharding: Sharding) -> float:
        """Parameters, gradients and optimizer state of one device: ``moe_state_bytes`` (the dense
        part over r·c devices, the experts over t·c·r/e)."""
        d = data_parallel * self.context_parallel
        return moe_state_bytes(self.model, self.param_bytes(start, end), self.expert_bytes(start, end),
                               data_parallel=d, expert_data_parallel=self.expert_data_parallel(data_parallel),
                               sharding=sharding, fp32_shards=self.fsdp.fp32_shards).total

    def stepped_bytes(self, start: int, end: int, data_parallel: int, sharding: Sharding) -> float:
        """The parameter bytes ``stage_optimizer_step_s`` is given (``sim.cost.experts.stepped_param_bytes``)."""
        return stepped_param_bytes(self.param_bytes(start, end), self.expert_bytes(start, end),
                                   data_parallel=data_parallel * self.context_parallel,
                                   expert_data_parallel=self.expert_data_parallel(data_parallel), sharding=sharding)

    def moe_reduce_s(self, start: int, end: int, members: int, nodes: int, sharding: Sharding,
                     factor: float | None = None) -> float:
        """Gradient synchronisation of an MoE stage: the dense gradients over ``members`` devices a
        server on ``nodes`` servers, the experts' over their expert-data-parallel groups
        (``members·t/e`` a server), phase by phase the slower of the two (``sim.engine.collectives``);
        ``factor``: bytes per parameter byte (default the gradients', ``grad_factor``)."""
        factor = self.grad_factor if factor is None else factor
        experts = self.expert_bytes(start, end)
        flows = busiest_nic_flows(self.cluster, members * self.tensor_parallel)
        dense_bytes = self.param_bytes(start, end) - experts  # ZeRO-1/2 all-gathers these bytes
        dense = gradient_sync([members] * nodes, dense_bytes * factor, sharding, self.cluster, flows_per_nic=flows,
                              param_bytes=dense_bytes)
        times: dict[int, tuple[float, float]] = {}
        for number, phase in zip(_phase_numbers(dense), dense):
            times[number] = (phase.flow_bytes / phase.rate_bytes_per_s, phase.latency_s)
        per_node = members * self.tensor_parallel // self.expert_parallel
        if experts and per_node * nodes > 1:
            spread = [per_node] * nodes if per_node else [1] * (members * self.tensor_parallel * nodes
                                                                // self.expert_parallel)
            phases = gradient_sync(spread, experts * factor, sharding, self.cluster, flows_per_nic=flows,
                                   param_bytes=experts)
            for number, phase in zip(_phase_numbers(phases), phases):
                alone = phase.flow_bytes / phase.rate_bytes_per_s
                if number in times:  # both groups' flows leave every port of the phase, sharing it as
                    # processor sharing (sim.engine.flow_table, Kleinrock 1967): the last ends at their sum
                    flow, latency = times[number]
                    times[number] = (flow + alone, max(latency, phase.latency_s))
                else:
                    times[number] = (alone, phase.latency_s)
        return sum(flow + latency for flow, latency in times.values())

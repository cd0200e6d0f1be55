"""Analytic costs the planners search with: stage times, transfers, all-reduce and memory.

The search looks at far more candidates than it can replay, so it scores them with closed
forms computed from prefix sums over the layers (O(1) per stage):

* a stage's forward and backward time for its slice of a micro-batch (the cost model of
  ``sim.cost``, tabulated once per slice size);
* a boundary's transfer time per micro-batch: latency + bytes / bandwidth, where the bytes
  are the cut's activations for the whole micro-batch and the bandwidth is that of the
  ports carrying it in parallel (each receiving GPU's port inside a server; the receiving
  servers' NICs between servers);
* a stage's gradient all-reduce, alpha-beta (``sim.collectives``, as the engine's flows): ring
  inside a server, hierarchical (reduce-scatter, cross-server ring on each shard through the
  NICs, all-gather) across servers;
* a stage's memory per device: parameters, gradients and optimizer state, plus the
  activations of the micro-batches alive at once (``min(S−i, M)`` under DAPPLE, ``M`` under
  GPipe), or only stage inputs with recompute.

These are estimates for ranking; the fast path and the SimPy engine settle the choice.
"""

from __future__ import annotations

from itertools import accumulate

from sim.collectives import hierarchical_allreduce_s
from sim.cost import layer_times_s, optimizer_step_s, split_samples
from sim.input.scenario import Scenario

__all__ = ["CostTables"]


class CostTables:
    """Prefix sums of a model's per-sample costs on a cluster's device."""

    def __init__(self, scenario: Scenario) -> None:
        model, cluster = scenario.model, scenario.cluster
        self.cluster = cluster
        self.model = model
        self._times: dict[int, tuple[list[float], list[float]]] = {}
        self._stash = [0.0, *accumulate(layer.stash_bytes for layer in model.layers)]
        self._params = [0.0, *accumulate(layer.param_bytes for layer in model.layers)]
        self._tensors = [0, *accumulate(layer.optimizer_tensors for layer in model.layers)]
        self.state_factor = 1.0 + model.grad_bytes_per_param_byte + model.optimizer_state_bytes_per_param_byte
        self.num_layers = model.num_layers

    def compute_s(self, start: int, end: int, samples: int) -> tuple[float, float]:
        """(forward, backward) seconds of layers ``[start, end)`` on ``samples`` samples."""
        if samples not in self._times:  # prefix sums per slice size (kernel times are not linear in it)
            times = [layer_times_s(layer, self.cluster.device, self.model.dtype, samples) for layer in self.model.layers]
            self._times[samples] = ([0.0, *accumulate(t[0] for t in times)], [0.0, *accumulate(t[1] for t in times)])
        fwd, bwd = self._times[samples]
        overhead = self.cluster.device.action_overhead_s if end > start else 0.0  # as sim.cost.stage_cost
        return fwd[end] - fwd[start] + overhead, bwd[end] - bwd[start] + overhead

    def param_bytes(self, start: int, end: int) -> float:
        """Parameter bytes a stage of layers ``[start, end)`` holds (a tied embedding's copy included,
        ``ModelSpec.stage_param_bytes``)."""
        return self._params[end] - self._params[start] + self.model.tied_copy_bytes(start, end)

    def static_bytes(self, start: int, end: int) -> float:
        """Parameters, gradients and optimizer state of layers ``[start, end)``."""
        return self.param_bytes(start, end) * self.state_factor

    def stash_bytes(self, start: int, end: int, samples: int, *, recompute: bool) -> float:
        """Activations one micro-batch slice keeps until its backward."""
        if recompute:
            return self.model.boundary_bytes[start] * samples
        return (self._stash[end] - self._stash[start]) * samples

    def transfer_s(self, boundary: int, microbatch_size: int, receivers: int, nodes: int, intra: bool) -> float:
        """One micro-batch's activations (or gradients) across cut ``boundary``.

        ``receivers`` GPUs on ``nodes`` servers receive in parallel; inside one server each
        has its port, between servers the receiving servers' NICs carry it.
        """
        nbytes = self.model.boundary_bytes[boundary] * microbatch_size
        if nbytes == 0:
            return 0.0
        c = self.cluster
        if intra:
            return c.intra_node.latency_s + nbytes / (receivers * c.intra_node.bandwidth_bytes_per_s)
        return c.inter_node.latency_s + nbytes / (nodes * c.nics_per_node * c.inter_node.bandwidth_bytes_per_s)

    def allreduce_s(self, start: int, end: int, per_node: int, nodes: int) -> float:
        """Gradient all-reduce of layers ``[start, end)`` over ``per_node`` GPUs on each of ``nodes`` servers."""
        return hierarchical_allreduce_s(self.param_bytes(start, end) * self.model.grad_bytes_per_param_byte,
                                        per_node, nodes, self.cluster)

    def optimizer_s(self, start: int, end: int) -> float:
        """Optimizer step of layers ``[start, end)`` (``sim.cost.optimizer_step_s``)."""
        copy = 1 if self.model.tied_copy_bytes(start, end) > 0 else 0
        return optimizer_step_s(self.cluster.device, self.model.optimizer, self.model.dtype,
                                self.param_bytes(start, end), self._tensors[end] - self._tensors[start] + copy,
                                implementation=self.model.optimizer_implementation, grad_dtype=self.model.grad_dtype)

    @staticmethod
    def slice_of(microbatch_size: int, replicas: int) -> int:
        """Samples of the largest replica slice, the first (the stage waits for it; ``sim.cost.split_samples``)."""
        return split_samples(microbatch_size, replicas)[0]

"""What ``dapple-sim check`` reports, as types: a scenario described before anything runs.

A ``Description`` is the check's result: the model and cluster in a few numbers, and for a
scenario with a plan a ``PlanDescription``: how the plan cuts the model (``StageDescription``:
layers, replicas, each replica's slice of a micro-batch, its forward and backward per
micro-batch) and what every device holds at rest (``DeviceDescription``: parameters,
gradients and optimizer state before any activation, ``sim.cost.memory.stage_state_bytes``
summed over the device's stages). ``sim.app.check.describe`` builds it; ``to_json`` turns it
into ``check --json``'s JSON, once, at the edge; ``sim.app.check.format_description`` reads it
for people.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.core.parallelism import Recompute
from sim.cost.memory import HeldBytes, StateBytes
from sim.cost.tiers import Crossing, crossing_text
from sim.input.stack import StackValue
from sim.models.vocab import VocabPadding

__all__ = ["Description", "DeviceDescription", "ModelDescription", "ParallelismDescription", "PlanDescription",
           "StageDescription"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelDescription:
    """The model in a line."""

    name: str
    """Display name (``gpt-1.3b``)."""
    source: str
    """Where it came from (a profile path or a preset description)."""
    param_bytes: float
    """Parameter bytes of the whole model, each counted once, bytes."""
    dtype: str
    """Training dtype of parameters and activations."""
    optimizer: str
    """Optimizer name (``adam``)."""
    attention: str | None = None
    """The attention kernel a generated transformer runs (``flash``, ``sdpa``, ``unfused``); None for a
    model without one (a measured profile, mlp, vgg), which the JSON then leaves out."""
    vocab_padding: VocabPadding | None = None
    """The vocabulary and its padded sizes at t = 1 and at the plan's tensor degree
    (``sim.models.vocab``); None without a vocabulary. The JSON has it only where padding is added."""
    parameters: Any = None
    """A mixture of experts' parameters by kind (``sim.models.moe.ParameterCounts``); None for a
    dense model, which the JSON then leaves out."""

    def to_json(self) -> dict[str, Any]:
        kernel = {} if self.attention is None else {"attention": self.attention}
        if self.parameters is not None:  # a mixture of experts: its parameters by kind
            counts = self.parameters
            kernel["parameters"] = {"total": counts.total, "dense": counts.dense, "routed_experts": counts.routed,
                                    "active_per_token": counts.active}
        padding = self.vocab_padding
        vocab = {"vocab_padding": padding.to_json()} if padding is not None and padding.is_padded else {}
        return {"name": self.name, "source": self.source, "param_bytes": self.param_bytes, "dtype": self.dtype,
                "optimizer": self.optimizer, **kernel, **vocab}


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelismDescription:
    """The plan's degrees, as ``sim.core.plan.PlanSpec`` has them."""

    tensor: int
    """Tensor-parallel degree t."""
    context: int
    """Context-parallel degree c."""
    pipeline: int
    """Pipeline ranks (distinct device sets)."""
    sequence_parallel: bool
    """Megatron's sequence parallelism on the tensor-parallel groups."""
    sharding: str
    """ZeRO sharding of the model states (``none``, ``optimizer``, ``gradients``, ``full``)."""
    data: int
    """Most data-parallel replicas of any stage."""
    expert: int = 1
    """Expert-parallel degree EP (the JSON has it, and ``expert_tensor``, only above 1)."""
    expert_tensor: int = 1
    """Expert-tensor-parallel degree ETP."""

    def to_json(self) -> dict[str, Any]:
        experts = {"expert": self.expert, "expert_tensor": self.expert_tensor} \
            if self.expert > 1 or self.expert_tensor > 1 else {}
        return {"tensor": self.tensor, "context": self.context, "pipeline": self.pipeline,
                "sequence_parallel": self.sequence_parallel, "sharding": self.sharding, "data": self.data, **experts}


@dataclass(frozen=True, slots=True, kw_only=True)
class StageDescription:
    """One stage: its layers, its replicas and what one replica costs per micro-batch."""

    stage: int
    """Stage index."""
    layers: tuple[int, int]
    """Layers ``[start, end)``."""
    devices: tuple[int, ...]
    """Its devices, in the plan's order."""
    replicas: int
    """Data-parallel replicas a micro-batch splits over."""
    samples_per_replica: tuple[int, ...]
    """Each replica's slice of a micro-batch, samples (``sim.cost.split.split_samples``)."""
    param_bytes: float
    """Parameter bytes one device holds (its tensor-parallel share, a tied copy included)."""
    fwd_s: float
    """Forward of the largest slice, seconds (``sim.cost.compute.stage_cost``)."""
    bwd_s: float
    """Backward of the largest slice, recompute included, seconds."""
    stash_bytes_per_microbatch: float
    """Activations the largest slice keeps until its backward, bytes."""
    states: StateBytes
    """Memory at rest of one of its devices by kind (``sim.cost.memory.stage_state_bytes``)."""
    held: HeldBytes = HeldBytes()
    """What one of its devices holds unsharded beside its states while a forward or a backward
    runs (ZeRO-2/3, FSDP by unit: ``sim.cost.memory.stage_held_bytes``), bytes."""

    @property
    def memory_at_rest_bytes(self) -> float:
        """Parameters + gradients + optimizer state of one of its devices, bytes."""
        return self.states.total

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "layers": list(self.layers), "devices": list(self.devices),
                "replicas": self.replicas, "samples_per_replica": list(self.samples_per_replica),
                "param_bytes": self.param_bytes, "fwd_s": self.fwd_s, "bwd_s": self.bwd_s,
                "stash_bytes_per_microbatch": self.stash_bytes_per_microbatch,
                "memory_at_rest_bytes": self.memory_at_rest_bytes,
                **({"unsharded_forward_bytes": self.held.forward_bytes,
                    "unsharded_backward_bytes": self.held.backward_bytes}
                   if self.held.forward_bytes or self.held.backward_bytes else {})}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceDescription:
    """One device of the plan and what it holds at rest."""

    device: int
    """Global device index."""
    node: int
    """The server it sits in."""
    stages: tuple[int, ...]
    """The stages it runs, in stage order."""
    memory_at_rest_bytes: float
    """Its stages' memory at rest (``StageDescription.memory_at_rest_bytes``) summed in stage
    order, bytes: the engine's ``DeviceClass.static_bytes``."""
    by_kind: StateBytes
    """The same by kind, each kind summed over its stages (the engine's memory breakdown)."""
    fits_at_rest: bool
    """Whether ``memory_at_rest_bytes`` fits the device's usable memory."""

    def to_json(self) -> dict[str, Any]:
        kinds = self.by_kind
        return {"device": self.device, "node": self.node, "stages": list(self.stages),
                "memory_at_rest_bytes": self.memory_at_rest_bytes,
                "memory_at_rest_by_kind_bytes": {"parameters": kinds.parameters, "gradients": kinds.gradients,
                                                 "optimizer": kinds.optimizer},
                "fits_at_rest": self.fits_at_rest}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanDescription:
    """A scenario's plan: schedule, degrees, stages and devices."""

    schedule: str
    """Schedule name, or ``file:PATH`` for a schedule file."""
    schedule_params: tuple[tuple[str, object], ...]
    """The schedule's parameters, (name, value) pairs."""
    recompute: Recompute
    """Recompute mode."""
    num_stages: int
    """Stages of the plan."""
    parallelism: ParallelismDescription
    """Its degrees."""
    group_spans: tuple[tuple[str, str], ...]
    """(group kind, ``inside one server`` or ``across servers``) for each kind of group the plan has."""
    stages: tuple[StageDescription, ...]
    """Every stage, in order."""
    devices: tuple[DeviceDescription, ...]
    """Every device the plan uses, by index."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Description:
    """What ``dapple-sim check`` reports about a scenario."""

    name: str
    """Scenario name."""
    num_layers: int
    """Layers of the model."""
    num_devices: int
    """Devices of the cluster."""
    nodes: int
    """Servers."""
    devices_per_node: int
    """Devices per server."""
    device: str
    """Device name."""
    device_memory_bytes: float
    """Memory of one device, bytes."""
    device_usable_memory_bytes: float
    """What tensors may fill on one device (``DeviceSpec.usable_memory_bytes``: its memory less
    ``memory_reserved``), bytes; the fit verdicts compare with it."""
    device_defaults: tuple[tuple[str, str], ...]
    """(key, value used) for each custom-device key the file left to its default."""
    model: ModelDescription
    """The model."""
    global_batch_size: int
    """Samples per iteration."""
    microbatch_size: int
    """Samples per micro-batch."""
    num_microbatches: int
    """Micro-batches per iteration."""
    plan: PlanDescription | None
    """The plan; None when the planner is to choose one."""
    warnings: tuple[str, ...]
    """Things allowed but probably unintended, one sentence each."""
    stack: str = "none"
    """The training stack the scenario names (``sim.input.stack``)."""
    stack_values: tuple[StackValue, ...] = ()
    """The defaults that stack set (keys the file left open), each with its citation."""
    run_keys: tuple[tuple[str, str], ...] = ()
    """``(dotted key, value used)`` of the run's keys (``sim.input.run_section``) when the scenario
    sets a run length or a ``reliability`` section; the JSON's ``run_keys`` only then."""
    fabric: str = ""
    """The cluster's switch tiers in a line (``sim.core.fabric``); empty without a fabric."""
    placement: tuple[tuple[str, Crossing], ...] = ()
    """Where each kind of the plan's traffic goes on the fabric (``sim.cost.tiers.plan_crossings``);
    empty without a fabric or a plan. The JSON's ``fabric`` only with a fabric."""
    collectives: tuple[str, ...] = ()
    """NCCL's algorithm for each stage's gradient message across servers on a fabric
    (``sim.app.check.gradient_algorithms``); empty without a fabric."""

    def to_json(self) -> dict[str, Any]:
        """``check --json``'s JSON (the keys of a plan only with one; ``stack`` only with one)."""
        info: dict[str, Any] = {
            "name": self.name, "num_layers": self.num_layers, "num_devices": self.num_devices, "nodes": self.nodes,
            "devices_per_node": self.devices_per_node, "device": self.device,
            "device_memory_bytes": self.device_memory_bytes,
            "device_usable_memory_bytes": self.device_usable_memory_bytes,
            "device_defaults": [key for key, _ in self.device_defaults],
            "device_default_values": dict(self.device_defaults), "model": self.model.to_json(),
            "global_batch_size": self.global_batch_size, "microbatch_size": self.microbatch_size,
            "num_microbatches": self.num_microbatches, "schedule": None, "num_stages": None, "stages": [],
            "devices": [], "warnings": list(self.warnings),
        }
        plan = self.plan
        if plan is not None:
            info.update(schedule=plan.schedule, schedule_params=dict(plan.schedule_params),
                        recompute=plan.recompute.to_json(), num_stages=plan.num_stages,
                        parallelism=plan.parallelism.to_json(), group_spans=dict(plan.group_spans),
                        stages=[s.to_json() for s in plan.stages], devices=[d.to_json() for d in plan.devices])
        if self.stack != "none":
            info["stack"] = {"name": self.stack, "set": [v.to_json() for v in self.stack_values]}
        if self.run_keys:
            info["run_keys"] = dict(self.run_keys)
        if self.fabric:
            info["fabric"] = {"tiers": self.fabric, "placement": {
                kind: {"tier": c.name, "oversubscription": c.oversubscription,
                       "bandwidth_bytes_per_s": c.bandwidth_bytes_per_s, "text": crossing_text(kind, c)}
                for kind, c in self.placement}, "collectives": list(self.collectives)}
        return info

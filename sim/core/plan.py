"""Plans: which layers each stage owns, which devices replicate it, and the schedule.

A plan is a list of stages. Each ``StageSpec`` owns a contiguous, half-open range of layers
and a set of devices, its replicas; replica counts may differ between stages (DAPPLE's
"15:1" plans), and a uniform DP x PP grid is the special case where they do not. Each
micro-batch is split over a stage's replicas and re-joined for the next stage; a stage's
gradients are all-reduced among its replicas after its last backward.

The distinct device sets, in order of first use, are the pipeline *ranks* of the schedule
IR. With ``interleaved`` a device set runs several stages (model chunks): stage ``s`` runs
on device set ``s mod R``.

Inside a stage, devices are laid out as in Megatron-LM: tensor-parallel groups of
``tensor_parallel`` consecutive ids (innermost), then context-parallel groups, then the
data-parallel replicas; a stage's device count is replicas × ``context_parallel`` ×
``tensor_parallel``, and DAPPLE's uneven replica counts per stage stay. ``sharding`` says how
data parallelism shards the model states (ZeRO-1/2/3, FSDP) and ``recompute`` what a block
keeps for its backward (``sim.core.parallelism``).

``PlanSpec.__post_init__`` checks what a plan alone can get wrong; ``check_plan`` checks it
against a model's layer count and a cluster's device count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.core.errors import SpecError
from sim.core.overlap import FsdpSpec, OverlapSpec
from sim.core.parallelism import Recompute, Shard, Sharding
from sim.schedule.generators import LOOPED_SCHEDULES, V_SCHEDULES
from sim.schedule.vshape import v_stage_ranks

if TYPE_CHECKING:
    from sim.schedule.ir import Schedule

__all__ = ["StageSpec", "PlanSpec", "check_plan"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSpec:
    """A contiguous range of layers and the devices that each hold a replica of it."""

    layers: tuple[int, int]
    """Half-open layer range ``(start, end)``: ``(0, 27)`` is layers 0 to 26."""
    devices: tuple[int, ...]
    """Global device ids of the replicas; a micro-batch is split evenly across them."""

    def __post_init__(self) -> None:
        if len(self.layers) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in self.layers):
            raise SpecError("layers", f"must be two integers [start, end], got {list(self.layers)!r}")
        start, end = self.layers
        if start < 0 or end <= start:
            raise SpecError("layers", f"must satisfy 0 <= start < end, got [{start}, {end}]")
        if not self.devices:
            raise SpecError("devices", "a stage needs at least one device")
        for device in self.devices:
            if isinstance(device, bool) or not isinstance(device, int) or device < 0:
                raise SpecError("devices", f"device ids are integers >= 0, got {device!r}")
        if len(set(self.devices)) != len(self.devices):
            raise SpecError("devices", f"lists a device twice: {list(self.devices)}")

    @property
    def num_replicas(self) -> int:
        return len(self.devices)

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSpec:
    """Stages, and the schedule that orders their forwards and backwards."""

    stages: tuple[StageSpec, ...]
    """Pipeline stages in model order. With ``interleaved``, stage ``s`` shares its devices
    with stage ``s + R`` (R = number of distinct device groups): each group runs v chunks."""
    schedule: str = "dapple"
    """Schedule generator name (``gpipe``, ``dapple``, ``1f1b``, ``interleaved``, ``zb-h1``),
    or ``file`` when ``custom_schedule`` comes from a hand-written ``schedule_file``."""
    schedule_params: tuple[tuple[str, object], ...] = ()
    """Extra parameters of the generator as sorted (name, value) pairs, e.g. ``(("policy", "2(s-i)-1"),)``."""
    recompute: Recompute = Recompute.NONE
    """What a stage keeps for its backward: everything (``none``), all but attention's s×s
    tensors (``selective``), or only its input, running the forward again (``full``)."""
    schedule_file: str | None = None
    """Path of a hand-written schedule (one line per rank), if the plan names one."""
    custom_schedule: Schedule | None = None
    """The parsed, checked hand-written schedule."""
    tensor_parallel: int = 1
    """t: devices of a tensor-parallel group (consecutive ids inside each replica)."""
    sequence_parallel: bool = False
    """Megatron-style sequence parallelism over the tensor-parallel group (needs t > 1)."""
    context_parallel: int = 1
    """c: devices of a context-parallel (ring attention) group inside each replica."""
    sharding: Sharding = Sharding.NONE
    """How data parallelism shards parameters, gradients and optimizer states."""
    overlap_efficiency: float = 0.0
    """e in [0, 1]: how much of the shorter part of an overlapped forward-backward pair
    (``dualpipe-v``'s ``OVERLAP_F_B``) hides under the longer; the pair takes F + B − e·min(F, B)
    (``sim.cost.compute.overlapped_pair_s``). 0: the two share the device (F + B); 1: max(F, B)."""
    overlap: OverlapSpec = OverlapSpec()
    """Which collectives run beside compute (``sim.core.overlap``): the gradient reduction in
    buckets, ZeRO's parameter all-gather, tensor-parallel collectives."""
    fsdp: FsdpSpec = FsdpSpec()
    """How ZeRO-2/3 and FSDP gather parameters (by unit) and reduce gradients (per micro-batch or once)."""
    expert_parallel: int = 1
    """EP: devices of an expert-parallel group, over which an MoE block's routed experts split
    (``expert_groups``)."""
    expert_tensor_parallel: int = 1
    """ETP: devices that split each routed expert's width (innermost in the expert layout)."""

    def __post_init__(self) -> None:
        if not self.stages:
            raise SpecError("stages", "a plan needs at least one stage")
        if not isinstance(self.recompute, Recompute):
            raise SpecError("recompute", f"must be one of {', '.join(r.value for r in Recompute)}, got {self.recompute!r}")
        if not isinstance(self.sharding, Sharding):
            raise SpecError("sharding", f"must be one of {', '.join(s.value for s in Sharding)}, got {self.sharding!r}")
        for key in ("tensor_parallel", "context_parallel", "expert_parallel", "expert_tensor_parallel"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(key, f"must be an integer >= 1, got {value!r}")
        e = self.overlap_efficiency
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0.0 <= e <= 1.0:
            raise SpecError("schedule.overlap_efficiency", f"must be a number in [0, 1], got {e!r}")
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise SpecError("sequence_parallel", "needs tensor_parallel > 1 (it splits the sequence over that group)")
        group = self.group_size
        for index, stage in enumerate(self.stages):
            if len(stage.devices) % group:
                raise SpecError(
                    f"stages[{index}].devices",
                    f"{len(stage.devices)} devices are not a multiple of context_parallel × tensor_parallel = {group}; "
                    f"give a multiple of {group} (replicas × {self.context_parallel} × {self.tensor_parallel})",
                )
        experts = self.expert_parallel * self.expert_tensor_parallel
        for index, stage in enumerate(self.stages):
            if len(stage.devices) % experts:
                n = len(stage.devices)
                fits = max(k for k in range(1, self.expert_parallel + 1) if n % (k * self.expert_tensor_parallel) == 0)
                raise SpecError("expert_parallel", f"expert_parallel {self.expert_parallel} × expert_tensor_parallel "
                                                   f"{self.expert_tensor_parallel} does not divide stage {index}'s {n} "
                                                   f"devices; use expert_parallel {fits}")
        used: dict[int, tuple[int, ...]] = {}
        for group in self.device_groups:
            for device in group:
                if device in used:
                    raise SpecError(
                        "stages",
                        f"device {device} is in two different device sets {list(used[device])} and {list(group)}; "
                        "a device belongs to one stage (or, with interleaved, to identical sets)",
                    )
                used[device] = group

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def group_size(self) -> int:
        """Devices of one data-parallel replica: ``context_parallel × tensor_parallel``."""
        return self.context_parallel * self.tensor_parallel

    @property
    def shard(self) -> Shard:
        """One device's share of every layer."""
        return Shard(tensor=self.tensor_parallel, context=self.context_parallel,
                     sequence_parallel=self.sequence_parallel, expert=self.expert_parallel,
                     expert_tensor=self.expert_tensor_parallel)

    def replicas(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """The data-parallel replicas of a stage, each its ``group_size`` devices in layout order
        (tensor-parallel rank innermost, then context-parallel rank)."""
        devices, n = self.stages[stage].devices, self.group_size
        return tuple(devices[i:i + n] for i in range(0, len(devices), n))

    def num_replicas(self, stage: int) -> int:
        """Data-parallel replicas of a stage (its devices over ``group_size``)."""
        return len(self.stages[stage].devices) // self.group_size

    def tensor_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """The stage's tensor-parallel groups: ``tensor_parallel`` consecutive devices each."""
        devices, t = self.stages[stage].devices, self.tensor_parallel
        return tuple(devices[i:i + t] for i in range(0, len(devices), t))

    def context_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """The stage's context-parallel groups: in each replica, the devices of one tensor rank."""
        t = self.tensor_parallel
        return tuple(replica[k::t] for replica in self.replicas(stage) for k in range(t))

    def gradient_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """Devices that hold the same parameters and sum their gradients: one group per tensor
        rank, over every replica and context rank (Megatron's data-parallel group with context
        parallelism folded in)."""
        t, devices = self.tensor_parallel, self.stages[stage].devices
        return tuple(devices[k::t] for k in range(t))

    def expert_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """The stage's expert-parallel groups, which exchange tokens in an MoE block's all-to-all.

        Megatron-Core re-folds a stage's t × c × replicas devices for the expert layers as
        ETP × EP × expert-data-parallel, ETP innermost (``megatron/core/parallel_state.py``,
        ``RankGenerator(tp=expert_tensor_parallel_size, ep=expert_model_parallel_size, dp=...,
        order="tp-ep-dp-pp")``): local rank r = etp + ETP·(ep + EP·edp), so an EP group is the
        devices of one (etp, edp), ETP apart."""
        devices, etp, ep = self.stages[stage].devices, self.expert_tensor_parallel, self.expert_parallel
        span = etp * ep
        return tuple(devices[base + k:base + span:etp] for base in range(0, len(devices), span) for k in range(etp))

    def expert_data_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """Devices that hold the same routed experts and sum their gradients: one group per
        (etp, ep) rank, over the stage's devices / (EP × ETP) expert-data-parallel ranks."""
        devices, span = self.stages[stage].devices, self.expert_tensor_parallel * self.expert_parallel
        return tuple(devices[k::span] for k in range(span))

    @property
    def params(self) -> dict[str, object]:
        return dict(self.schedule_params)

    @property
    def device_groups(self) -> tuple[tuple[int, ...], ...]:
        """Distinct device sets in order of first use: one per pipeline rank."""
        seen: dict[tuple[int, ...], None] = {}
        for stage in self.stages:
            seen.setdefault(tuple(sorted(stage.devices)), None)
        return tuple(seen)

    @property
    def stage_ranks(self) -> tuple[int, ...]:
        """The pipeline rank (index into ``device_groups``) of every stage."""
        index = {group: rank for rank, group in enumerate(self.device_groups)}
        return tuple(index[tuple(sorted(stage.devices))] for stage in self.stages)

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(sorted(d for group in self.device_groups for d in group))


def check_plan(plan: PlanSpec, *, num_layers: int, num_devices: int) -> None:
    """Check ``plan`` against a model of ``num_layers`` layers and a cluster of ``num_devices``.

    Raises ``SpecError`` keyed by the stage (``stages[1].layers``) for: a layer range that
    leaves a gap, overlaps the previous one, or runs past the model; more stages than layers;
    device ids out of range; an interleaved plan whose stages do not cycle over the ranks.
    """
    if plan.num_stages > num_layers:
        raise SpecError("stages", f"{plan.num_stages} stages for a model of {num_layers} layers; use at most {num_layers}")
    expected_start = 0
    for index, stage in enumerate(plan.stages):
        start, end = stage.layers
        if start != expected_start:
            problem = "leaves a gap after" if start > expected_start else "overlaps"
            raise SpecError(
                f"stages[{index}].layers",
                f"[{start}, {end}] {problem} the previous stage's end {expected_start}; start at {expected_start}",
            )
        if end > num_layers:
            raise SpecError(f"stages[{index}].layers", f"[{start}, {end}] runs past the model's {num_layers} layers")
        for device in stage.devices:
            if device >= num_devices:
                raise SpecError(
                    f"stages[{index}].devices",
                    f"device {device} does not exist; the cluster has devices 0 to {num_devices - 1}",
                )
        expected_start = end
    if expected_start != num_layers:
        raise SpecError(
            f"stages[{plan.num_stages - 1}].layers",
            f"the last stage ends at layer {expected_start} but the model has {num_layers} layers; end at {num_layers}",
        )
    ranks = plan.stage_ranks
    num_ranks = len(plan.device_groups)

    if plan.schedule in V_SCHEDULES and ranks != v_stage_ranks(num_ranks):
        raise SpecError(
            "stages",
            f"{plan.schedule} runs two chunks per device set in a V: stage s on device set s and stage "
            f"2R-1-s on it too, so {num_ranks} device sets take {2 * num_ranks} stages in the order "
            f"{list(v_stage_ranks(num_ranks))}; the stages use device sets in the order {list(ranks)}",
        )
    looped = plan.schedule in LOOPED_SCHEDULES
    if plan.schedule not in V_SCHEDULES and plan.schedule != "file":
        if any(rank != index % num_ranks for index, rank in enumerate(ranks)):
            raise SpecError(
                "stages",
                f"stages reuse device sets in the order {list(ranks)}; stage s must run on device set s mod {num_ranks}",
            )
        if num_ranks != plan.num_stages and not looped:
            shared = ", ".join(sorted((LOOPED_SCHEDULES | V_SCHEDULES) - {"interleaved"}))
            raise SpecError(
                "stages",
                f"stages share devices, which only the interleaved schedule (or {shared}, or a schedule_file) "
                f"supports, not {plan.schedule!r}",
            )

"""How a training stack hides communication behind compute, and how FSDP/ZeRO-3 gathers by unit.

Frameworks do not run their collectives after the compute that feeds them; they launch them as
soon as their inputs exist, on their own CUDA streams, and let the next compute run beside
them. What a plan overlaps is part of the plan (``plan.overlap`` and ``plan.fsdp`` in a
scenario; a ``stack`` sets them as that stack does):

* ``grad_reduce`` — the data-parallel gradient reduction (all-reduce, or ZeRO's
  reduce-scatter) runs in buckets of ``bucket_bytes`` launched as the last backward produces
  them (torch DDP's ``bucket_cap_mb``, Megatron-LM's ``--overlap-grad-reduce``, FSDP2's
  per-unit reduce-scatter);
* ``reduce_after_flush`` — without ``grad_reduce``, a rank's reductions wait for its last
  backward, all its stages' one after another (Megatron-LM), rather than each stage's after its
  own last backward (torch.distributed.pipelining);
* ``paired_exchange`` — an interleaved schedule's steady (forward, backward) steps exchange with
  both neighbours at once after the backward, as Megatron-LM 2021's interleaved loop did
  (``sim.schedule.passes.lower``);
* ``pipeline_gather`` — a pipeline transfer split over the tensor ranks is all-gathered by its
  receivers before their compute (Megatron-LM's scatter/gather, SC21 §4.1);
* ``param_gather`` — ZeRO-1/2's parameter all-gather after the optimizer step runs during the
  next forward (Megatron-LM's ``--overlap-param-gather``);
* ``tensor_parallel`` — the tensor-parallel all-gathers and reduce-scatters run beside the
  GEMMs that consume or produce them (Megatron-LM's ``--tp-comm-overlap``, torch's AsyncTP);
* ``column_backward`` — a column-parallel linear's backward collectives (its input gradient's
  all-reduce, or reduce-scatter and the second all-gather of its input under sequence
  parallelism) run beside its input- and weight-gradient products (Megatron-LM 2022's
  ``LinearWithGradAccumulationAndAsyncCommunication``, ``sim.cost.tensor_comm``);
* ``expert_all_to_all`` — an MoE block's token dispatch and combine run on the communication
  stream while compute runs (DeepSeek-V3's DualPipe pairs a forward chunk's all-to-all with
  another micro-batch's backward compute, DeepSeek-AI 2024, arXiv 2412.19437v2, §3.2.1;
  Megatron-LM's ``--overlap-moe-expert-parallel-comm``, its combined-1F1B schedule pairing the
  forward of micro-batch i+1 with the backward of micro-batch i layer by layer): only the
  all-to-all longer than the compute beside it is exposed (``sim.cost.overlap.exposed_beside_s``);
  ``communication_sms`` of the device's ``sm_count`` SMs run the dispatch and combine kernels
  meanwhile (DeepSeek-V3's 20 of 132, §3.2.2), the MoE blocks beside them on the rest for as long
  as they compute (``sim.cost.overlap.communication_sms_slowdown``, ``held_sms_s``, in place of the
  device's ``overlap_slowdown``);

and, under ``sharding: full`` (``FsdpSpec``), parameters are gathered one unit of
``unit_layers`` layers at a time, the next unit prefetched, and freed after use when
``reshard_after_forward`` (FSDP2's ``fully_shard``; Rajbhandari et al. 2020, §5.3).

DeepSpeed's ZeRO-3 before v0.6 (the SC21 comparison, Narayanan et al. 2021, Table 2, ran it in
early 2021) is four settings away from FSDP2 (``sim.cost.zero3`` says what each rests on):
``max_reuse_distance`` (``stage3_max_reuse_distance``: under full recompute a backward gathers a
block again for the recompute), ``reduce_scatter: false`` (its gradients all-reduced),
``path: flat`` (each collective one ring over the data-parallel group, as ZeRO's per-device
cost counts it) and ``max_live_parameters`` (``stage3_max_live_parameters``: the gathered
parameters capped, one sub-module at a time, not two whole blocks); its gathers are prefetched
one sub-module ahead, as FSDP2's one unit ahead (``prefetch: false`` blocks the compute instead).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.errors import SpecError

__all__ = ["DDP_BUCKET_BYTES", "FSDP_PATHS", "FsdpSpec", "OverlapSpec"]

FSDP_PATHS = ("hierarchical", "flat")
"""How a sharded group's all-gathers and reduce-scatters cross servers (``FsdpSpec.path``)."""

DDP_BUCKET_BYTES = 25 * 2**20
"""torch DDP's default gradient bucket, ``bucket_cap_mb=25`` (torch.nn.parallel.DistributedDataParallel)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OverlapSpec:
    """Which collectives run beside compute rather than after it."""

    grad_reduce: bool = False
    """The gradient all-reduce or reduce-scatter runs in buckets during the last backward."""
    param_gather: bool = False
    """ZeRO-1/2's parameter all-gather runs during the next iteration's forward."""
    tensor_parallel: bool = False
    """Tensor-parallel collectives run beside the GEMMs next to them."""
    bucket_bytes: float = DDP_BUCKET_BYTES
    """Bytes of gradients per bucket of the overlapped reduction."""
    reduce_after_flush: bool = False
    """Without ``grad_reduce``: a rank's gradient reductions all wait for its last backward (the
    pipeline's flush), one model chunk after another, as Megatron-LM's ``train_step`` runs them
    after ``forward_backward_func`` (``sim.schedule.passes.lower``); false: each stage's starts
    after its own last backward (torch.distributed.pipelining). The two differ only where a rank
    holds several stages (interleaved and V schedules). Ignored with ``grad_reduce``, whose
    buckets run during each stage's last backward."""
    paired_exchange: bool = False
    """Interleaved schedules only: a steady-state forward's output leaves after the backward that
    follows it, beside that backward's gradient, and that backward's gradient arrives before the
    forward starts: one blocking ``send_forward_backward_recv_forward_backward`` per (F, B) step,
    as Megatron-LM's interleaved schedule ran it in 2021 (NVIDIA/Megatron-LM megatron/schedules.py
    at 6fd7818; ``sim.schedule.passes.lower``); false: each part sends and receives on its own
    (torch.distributed.pipelining, and Megatron-LM's non-interleaved 1F1B)."""
    pipeline_gather: bool = False
    """Under tensor parallelism without sequence parallelism: each receiving stage all-gathers a
    pipeline transfer over its tensor group before the compute that reads it, the other half of
    the 1/t split the flows already send (Megatron-LM's scatter/gather, SC21 §4.1;
    ``sim.cost.comm.pipeline_gather_s``); false: the split is sent and the gather not charged."""
    expert_all_to_all: bool = False
    """The experts' dispatch and combine all-to-alls run beside the compute (``sim.engine.ops``)."""
    column_backward: bool = False
    """A column-parallel linear's backward collectives run beside its products, the row-parallel
    ones' still blocking (``sim.cost.tensor_comm``: Megatron-LM at cfd2e21, megatron/mpu/layers.py,
    ``async_op=True``); false: all of the backward's block the compute stream after it."""
    communication_sms: int = 0
    """SMs the overlapped all-to-all's kernels hold (DeepSeek-V3 §3.2.2: 20 of the H800's 132),
    dedicated to them while the MoE blocks beside them compute (DualPipe's SM ratio, §3.2.1), which
    run on the rest (``sim.cost.overlap.held_sms_s``); 0: the device's generic ``overlap_slowdown``
    applies to the all-to-all as to every overlapped collective."""

    def __post_init__(self) -> None:
        for key in ("grad_reduce", "param_gather", "tensor_parallel", "reduce_after_flush", "paired_exchange",
                    "pipeline_gather", "expert_all_to_all", "column_backward"):
            if not isinstance(getattr(self, key), bool):
                raise SpecError(key, f"must be true or false, got {getattr(self, key)!r}")
        c = self.communication_sms
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise SpecError("communication_sms", f"must be an integer >= 0, got {c!r}")
        b = self.bucket_bytes
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not b > 0 or b != b or b == float("inf"):
            raise SpecError("bucket_size", f"must be a positive size such as 25MiB, got {b!r}")

    def to_json(self) -> dict:
        extra = {"expert_all_to_all": True} if self.expert_all_to_all else {}  # absent at its default: dense outputs unchanged
        if self.communication_sms:
            extra["communication_sms"] = self.communication_sms
        if self.reduce_after_flush:  # absent at its default: outputs of plans without it unchanged
            extra["reduce_after_flush"] = True
        if self.paired_exchange:  # absent at its default, as reduce_after_flush
            extra["paired_exchange"] = True
        if self.pipeline_gather:
            extra["pipeline_gather"] = True
        if self.column_backward:  # absent at its default, as reduce_after_flush
            extra["column_backward"] = True
        return {"grad_reduce": self.grad_reduce, "param_gather": self.param_gather,
                "tensor_parallel": self.tensor_parallel, "bucket_size": f"{self.bucket_bytes:.17g}B",  # read back by parse_bytes
                **extra}


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpSpec:
    """How ZeRO-2/3 and FSDP move parameters and gradients."""

    unit_layers: int = 1
    """Layers per FSDP unit (one ``fully_shard`` call): 1, a transformer block, as torchtitan wraps."""
    reshard_after_forward: bool = True
    """Free a unit's gathered parameters after its forward and gather them again for its
    backward (FSDP2's default), rather than keeping them until the backward."""
    reduce_every_microbatch: bool = True
    """Under sharded gradients (ZeRO-2/3), reduce-scatter each micro-batch's gradients (DeepSpeed,
    FSDP2's default) rather than accumulating them unsharded until the last micro-batch
    (FSDP2's ``set_requires_gradient_sync(False)``: less traffic, more memory)."""
    prefetch: bool = True
    """Gather the next unit while the current one computes (FSDP2, ``sim.cost.overlap.pipelined_s``);
    false: every gather blocks the compute stream, exposed whole (DeepSpeed ZeRO-3 before v0.6,
    ``sim.cost.zero3``)."""
    path: str = "hierarchical"
    """``hierarchical``: across servers a gather or reduce-scatter takes NCCL's path
    (``sim.cost.group_comm``); ``flat``: one ring over the group, every device's whole share
    through the slowest hop, its NIC (``sim.cost.zero3``)."""
    max_live_parameters: float | None = None
    """DeepSpeed's ``stage3_max_live_parameters`` (elements): gathered parameters are capped at it
    plus the running sub-module's (``sim.cost.zero3.capped_held_bytes``); None: FSDP's two units."""
    max_reuse_distance: float | None = None
    """DeepSpeed's ``stage3_max_reuse_distance`` (elements): under full recompute each block's
    backward gathers its sub-modules twice, for the recompute and again for the backward, except
    the trailing ones fewer than this many elements are used between (``sim.cost.zero3.regathered_bytes``);
    None: FSDP's one gather per unit per backward."""
    reduce_scatter: bool = True
    """ZeRO-3's gradients (and ZeRO-2's every micro-batch) are reduce-scattered (FSDP2); false:
    all-reduced, each device keeping its shard (DeepSpeed v0.3's ZeRO-3 by default,
    ``sim.cost.zero3.reduced_as``)."""
    fp32_shards: bool = False
    """Under ``sharding: full`` with 16-bit parameters, the sharded parameters are kept in fp32 and
    are the optimizer's weights, the 16-bit copy existing only gathered (FSDP2's
    ``MixedPrecisionPolicy``: "FSDP does not require any extra memory to keep a high-precision copy
    of the parameters for the optimizer step", ``param_dtype`` the unsharded parameter's dtype):
    4 bytes a parameter at rest and no separate master copy, the step in fp32
    (``sim.cost.memory.model_state_bytes``); false: a 16-bit shard beside an fp32 master in the
    optimizer state (DeepSpeed's ZeRO-3)."""

    def __post_init__(self) -> None:
        u = self.unit_layers
        if isinstance(u, bool) or not isinstance(u, int) or u < 1:
            raise SpecError("unit_layers", f"must be an integer >= 1, got {u!r}")
        for key in ("reshard_after_forward", "reduce_every_microbatch", "prefetch", "fp32_shards", "reduce_scatter"):
            if not isinstance(getattr(self, key), bool):
                raise SpecError(key, f"must be true or false, got {getattr(self, key)!r}")
        if self.path not in FSDP_PATHS:
            raise SpecError("path", f"must be one of {', '.join(FSDP_PATHS)}, got {self.path!r}")
        for key in ("max_live_parameters", "max_reuse_distance"):
            m = getattr(self, key)
            if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 < m < float("inf")):
                raise SpecError(key, f"must be a positive number of parameters such as 1e9, got {m!r}")

    def to_json(self) -> dict:
        # DeepSpeed's keys only when set: FSDP plans' outputs stay as they were
        extra = {key: value for key, value, default in (("prefetch", self.prefetch, True),
                                                        ("path", self.path, "hierarchical"),
                                                        ("max_live_parameters", self.max_live_parameters, None),
                                                        ("max_reuse_distance", self.max_reuse_distance, None),
                                                        ("reduce_scatter", self.reduce_scatter, True),
                                                        ("fp32_shards", self.fp32_shards, False))
                 if value != default}
        return {"unit_layers": self.unit_layers, "reshard_after_forward": self.reshard_after_forward,
                "reduce_every_microbatch": self.reduce_every_microbatch, **extra}

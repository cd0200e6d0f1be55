"""The model as the simulator sees it: an ordered list of layers, per sample.

* ``LayerSpec`` — one layer's parameter bytes, the bytes it hands on and keeps for its
  backward, and its cost: measured times (a profile) or FLOPs and kernels (a generator).
* ``ModelSpec`` — the layers in execution order (profile order or generator order), with the
  bytes that cross each possible cut between two stages. All per-layer sizes and times are
  per *sample*; the cost model scales them to a micro-batch. A generated model also keeps
  the generator and parameters that built it (``ModelPreset``), so nothing needs the
  scenario file again to build it for real, and, for one device of a tensor- or
  context-parallel group, the share it holds (``shard``).

Specs check themselves in ``__post_init__`` and raise ``SpecError`` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.core.errors import SpecError
from sim.core.specs import (
    ATTENTION_KERNELS,
    DTYPE_BYTES,
    OPTIMIZER_IMPLEMENTATIONS,
    non_negative,
    optimizer_state_factor,
)

__all__ = ["LayerSpec", "ModelPreset", "ModelSpec"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSpec:
    """One layer of a model; sizes and times are per sample."""

    name: str
    """Name from the profile or the generator (``block_3``, ``embedding``)."""
    param_bytes: float
    """Bytes of this layer's parameters (gradients take as many)."""
    output_bytes: float
    """Bytes of this layer's output for one sample."""
    stash_bytes: float
    """Bytes this layer keeps from its forward until its backward, for one sample."""
    fwd_s: float | None = None
    """Measured forward time for one sample, seconds (from a profile); None if costed from FLOPs."""
    bwd_s: float | None = None
    """Measured backward time for one sample, seconds; None if costed from FLOPs."""
    fwd_flop: float = 0.0
    """Forward FLOPs for one sample."""
    bwd_flop: float = 0.0
    """Backward FLOPs for one sample (input and weight gradients together)."""
    wgrad_fraction: float = 0.5
    """Share of the backward that computes weight gradients (zero-bubble schedules' W), [0, 1]."""
    kernels: tuple = ()
    """Forward kernels (``sim.cost.kernels.KernelSpec``) of a generated layer; when present the
    cost model times them one by one instead of dividing ``fwd_flop`` by a single rate."""
    param_tensors: int | None = None
    """Parameter tensors (weights, biases) the optimizer steps one by one; None: two (a weight
    and a bias) for a layer with parameters, as a measured profile does not say."""
    checkpoint_bytes: float | None = None
    """What it keeps per sample under full recompute: its input, checkpointed (Korthikanti et al.
    2022, Table 2: 2sbh per transformer block, 2sbh/t with sequence parallelism); None: the bytes
    of the cut before it (``ModelSpec.boundary_bytes``)."""
    selective_stash_bytes: float | None = None
    """What it stashes per sample under selective recompute (Korthikanti et al. 2022, §5: all but
    attention's s×s tensors); None: the same as ``stash_bytes`` (nothing to recompute)."""
    tp_collectives: tuple = ()
    """Tensor-parallel collectives of its forward and backward per sample
    (``sim.cost.comm.TensorParallelCollective``), as one device of its group runs them."""
    cp_ring_bytes: float = 0.0
    """Bytes per sample each device of a context-parallel group passes to its ring neighbour in
    the forward (key and value blocks; the backward passes twice as many)."""
    expert_param_bytes: float = 0.0
    """The part of ``param_bytes`` that is this device's share of an MoE block's routed experts
    (``sim.models.moe``): reduced and sharded over the expert-data-parallel group, not the
    data-parallel one. 0 for a dense layer."""
    a2a_bytes: float = 0.0
    """An MoE block's all-to-all payload per sample on one device: the routed copies of its tokens,
    tokens × top_k × hidden × element bytes, before the (EP − 1)/EP that leaves the device
    (``sim.cost.comm.all_to_all_s``); dispatch and combine each move it, forward and backward."""
    backward_workspace_bytes: float = 0.0
    """Bytes per sample its backward allocates beside its stash and frees before it ends (eager
    cross-entropy's fp32 gradients: ``sim.cost.kernels.eager_loss_workspace_bytes``); 0: none."""
    allocator_cached_bytes: float = 0.0
    """Bytes per sample the caching allocator keeps reserved but not allocated while its backward
    runs: a freed block its backward's larger requests cannot reuse (eager cross-entropy's 16-bit
    logits, ``sim.cost.reserved.eager_logits_cached_bytes``); what a reserved-memory reading
    adds to the live peak. 0: none."""

    def __post_init__(self) -> None:
        for key in ("param_bytes", "output_bytes", "stash_bytes", "fwd_flop", "bwd_flop", "cp_ring_bytes",
                    "expert_param_bytes", "a2a_bytes", "backward_workspace_bytes", "allocator_cached_bytes"):
            non_negative(key, getattr(self, key))
        if (self.fwd_s is None) != (self.bwd_s is None):
            raise SpecError("fwd_s", "give both forward and backward times, or neither")
        if self.fwd_s is not None:
            non_negative("fwd_s", self.fwd_s)
            non_negative("bwd_s", self.bwd_s)
        elif self.fwd_flop == 0 and self.bwd_flop == 0 and self.param_bytes > 0:
            raise SpecError("fwd_flop", f"layer {self.name!r} has parameters but neither times nor FLOPs")
        if not 0 <= self.wgrad_fraction <= 1:
            raise SpecError("wgrad_fraction", f"must be in [0, 1], got {self.wgrad_fraction!r}")
        if self.param_tensors is not None and (isinstance(self.param_tensors, bool) or self.param_tensors < 0):
            raise SpecError("param_tensors", f"must be an integer >= 0, got {self.param_tensors!r}")

    @property
    def is_measured(self) -> bool:
        return self.fwd_s is not None

    @property
    def selective_stash(self) -> float:
        """Bytes per sample it keeps under selective recompute."""
        return self.stash_bytes if self.selective_stash_bytes is None else self.selective_stash_bytes

    @property
    def optimizer_tensors(self) -> int:
        """Tensors the optimizer steps for this layer (``param_tensors`` with its default)."""
        if self.param_tensors is not None:
            return self.param_tensors
        return 2 if self.param_bytes > 0 else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPreset:
    """The generator a built-in model came from, with every parameter it was built with."""

    name: str
    """Generator name, a key of ``sim.models.MODEL_PRESETS`` (``gpt``, ``bert``, ``mlp``, ``vgg``)."""
    params: tuple[tuple[str, Any], ...]
    """(parameter, value) pairs sorted by name: every parameter of the generator, defaults
    filled in and computed ones (``ffn_hidden``, ``input_size``) resolved, so that
    ``build_model(name, **values)`` builds the same model again."""

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("preset", "must not be empty")
        keys = [pair[0] for pair in self.params]
        if keys != sorted(set(keys)):
            raise SpecError("params", f"must be (name, value) pairs sorted by unique name, got names {keys}")
        for key, value in self.params:
            if not isinstance(value, (bool, int, float, str, type(None))):
                raise SpecError(key, f"must be a number, a string or a boolean, got {value!r}")

    @property
    def values(self) -> dict[str, Any]:
        """The parameters as keywords for ``sim.models.build_model``."""
        return dict(self.params)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """An ordered list of layers and what crosses each possible cut between stages."""

    name: str
    """Display name (``bert-48``, ``gpt-1.3b``)."""
    layers: tuple[LayerSpec, ...]
    """Layers in execution order; a stage owns a contiguous range of them."""
    boundary_bytes: tuple[float, ...]
    """Per sample, bytes that cross a cut just before layer ``k`` (``len(layers) + 1`` entries).

    Entry 0 is the model input; entry ``len(layers)`` is 0. For a chain it is the previous
    layer's output; for a DAG it is every tensor produced before the cut and consumed after it.
    """
    dtype: str = "fp32"
    """Training dtype of parameters and activations: fp32, tf32, fp16 or bf16."""
    optimizer: str = "adam"
    """Optimizer whose state is kept per parameter: sgd, momentum, adam, adamw."""
    optimizer_implementation: str = "fused"
    """How its step runs: ``fused``, ``foreach`` or ``for-loop`` (``sim.core.specs.OPTIMIZER_IMPLEMENTATIONS``)."""
    grad_dtype: str | None = None
    """Dtype gradients are accumulated and reduced in; None: the parameters' dtype. ``fp32`` with
    16-bit parameters is Megatron-LM's ``main_grad`` (``--accumulate-allreduce-grads-in-fp32``)."""
    moment_dtype: str | None = None
    """Dtype of the optimizer's state tensors (Adam's two moments); None: fp32. ``bf16`` is
    DeepSeek-V3's (§3.3.3; ``sim.core.specs.optimizer_state_factor``). Memory only: the step's
    bytes (``sim.cost.optimizer``) are counted with fp32 state."""
    grad_accumulation: str = "fused"
    """Where the micro-batches' weight gradients are summed (``sim.cost.optimizer``):
    ``fused`` in the weight-gradient product (Megatron-LM's gradient-accumulation fusion), or
    ``separate``, an element-wise add per micro-batch after the first (autograd's ``AccumulateGrad``)."""
    recompute_blocks_only: bool = False
    """Under full recompute only the transformer blocks (layers with ``checkpoint_bytes``) are
    checkpointed and run again; the other layers (embedding, head, loss) keep their stash and run
    once (Megatron-LM's ``ParallelTransformer._checkpointed_forward``). False: a stage's other
    layers are one checkpointed segment, run again too (Chen et al. 2016, §3)."""
    grad_passes: tuple[str, ...] = ()
    """Element-wise passes over the gradients around the step (``sim.cost.optimizer.GRAD_PASSES``:
    ``zero``, ``divide``, ``unscale``, ``norm``, Megatron-LM's), in the step's time; empty: none."""
    tied_layers: tuple[int, int] | None = None
    """(embedding, reader) layer indices of the token table's two users: a head tied to the
    embedding, or an untied model's ``mtp`` layer (``sim.models.mtp``); None: the embedding alone."""
    tied_bytes: float = 0.0
    """Bytes of the tied matrix (one device's share), counted once, in the embedding's layer."""
    source: str = ""
    """Where the model came from (a profile path or a preset description)."""
    preset: ModelPreset | None = None
    """The generator and parameters of a built-in model (``sim.models``), which the runtime
    builds as torch modules; None for a measured profile."""
    shard: Any = None
    """The share of every layer one device holds (``sim.core.parallelism.Shard``) when the layers are
    one device's of a tensor- or context-parallel group (``sim.models.shard_model``); None: whole."""
    attention: str | None = None
    """How a generated transformer's attention runs, one of ``sim.core.specs.ATTENTION_KERNELS``
    (``flash``, ``sdpa``, ``unfused``: its blocks' kernels and stash, ``sim.cost.kernels``); None
    for a model without attention blocks (a measured profile, mlp, vgg)."""
    experts: Any = None
    """The experts of a generated transformer's MoE blocks (``sim.core.experts.ExpertSpec``); None: dense."""
    mla: Any = None
    """A generated transformer's multi-head latent attention (``sim.core.mla.MlaSpec``); None:
    multi-head (or grouped-query) attention."""
    gemm_dtype: str | None = None
    """``fp8``: a generated transformer's blocks run their weighted products on FP8 tensor cores
    (``sim.models.precision``); None: in ``dtype``."""
    mtp_depth: int = 0
    """DeepSeek-V3's multi-token-prediction modules after a generated transformer's last block,
    as the layer ``mtp`` before its ``head`` (``sim.models.mtp``); 0: none."""
    fp8_activations: bool = False
    """A generated transformer's blocks stash as DeepSeek-V3's FP8 framework does (FP8-cached
    products' and SwiGLU inputs, norms recomputed: ``sim.models.precision``); False: in ``dtype``."""
    kernels: str = "fused"
    """How a generated transformer's element-wise work runs (``model.kernels``, one of
    ``sim.cost.kernels.KERNEL_MODES``): ``fused`` kernels (Megatron-LM) or PyTorch's ``eager`` ones
    (torchtitan without ``torch.compile``; Llama only). A measured profile keeps ``fused``."""

    def __post_init__(self) -> None:
        if not self.layers:
            raise SpecError("layers", "a model needs at least one layer")
        if len(self.boundary_bytes) != len(self.layers) + 1:
            raise SpecError(
                "boundary_bytes",
                f"needs {len(self.layers) + 1} entries (one per cut), got {len(self.boundary_bytes)}",
            )
        for k, value in enumerate(self.boundary_bytes):
            non_negative(f"boundary_bytes[{k}]", value)
        optimizer_state_factor(self.optimizer, self.dtype, self.moment_dtype)  # raises on unknown names
        if self.optimizer_implementation not in OPTIMIZER_IMPLEMENTATIONS:
            raise SpecError("optimizer.implementation", f"unknown implementation {self.optimizer_implementation!r}; "
                                                        f"valid: {', '.join(OPTIMIZER_IMPLEMENTATIONS)}")
        if self.grad_dtype is not None and self.grad_dtype not in DTYPE_BYTES:
            raise SpecError("optimizer.grad_dtype", f"unknown dtype {self.grad_dtype!r}; valid: {', '.join(sorted(DTYPE_BYTES))}")
        if self.grad_accumulation not in ("fused", "separate"):  # sim.cost.optimizer.GRAD_ACCUMULATION_MODES
            raise SpecError("optimizer.grad_accumulation", f"unknown mode {self.grad_accumulation!r}; valid: fused, separate")
        if not isinstance(self.recompute_blocks_only, bool):
            raise SpecError("recompute_blocks_only", f"must be true or false, got {self.recompute_blocks_only!r}")
        unknown = sorted(set(self.grad_passes) - {"zero", "divide", "unscale", "norm", "nan_check"})  # GRAD_PASSES
        if unknown or len(set(self.grad_passes)) != len(self.grad_passes):
            raise SpecError("optimizer.grad_passes", f"got {list(self.grad_passes)!r}; each at most once of: zero, divide, "
                                                     "unscale, norm, nan_check")
        non_negative("tied_bytes", self.tied_bytes)
        if self.attention is not None and self.attention not in ATTENTION_KERNELS:
            raise SpecError("attention", f"unknown kernel {self.attention!r}; valid: {', '.join(ATTENTION_KERNELS)}")
        if self.kernels not in ("eager", "fused"):  # sim.cost.kernels.KERNEL_MODES (core imports no cost module)
            raise SpecError("kernels", f"unknown mode {self.kernels!r}; valid: eager, fused")
        if self.tied_layers is not None and not all(0 <= k < len(self.layers) for k in self.tied_layers):
            raise SpecError("tied_layers", f"must name two of the {len(self.layers)} layers, got {self.tied_layers!r}")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def no_cut_at(self) -> tuple[int, ...]:
        """Layer boundaries no stage may start at (boundary k lies between layers k − 1 and k): with
        multi-token prediction the head's, since the ``mtp`` layer stays on the head's stage
        (``sim.models.mtp.check_mtp_stage``); () otherwise."""
        return (len(self.layers) - 1,) if self.mtp_depth else ()

    @property
    def cut_points(self) -> tuple[int, ...]:
        """Every layer boundary a stage may start or end at, 0 and ``num_layers`` included (all but
        ``no_cut_at``)."""
        return tuple(k for k in range(len(self.layers) + 1) if k not in self.no_cut_at)

    @property
    def optimizer_state_bytes_per_param_byte(self) -> float:
        return optimizer_state_factor(self.optimizer, self.dtype, self.moment_dtype)

    @property
    def grad_bytes_per_param_byte(self) -> float:
        """Gradient bytes per parameter byte: 2 for fp32 gradients of 16-bit parameters, else 1."""
        return DTYPE_BYTES[self.grad_dtype or self.dtype] / DTYPE_BYTES[self.dtype]

    def param_bytes(self, start: int = 0, end: int | None = None) -> float:
        """Parameter bytes of layers ``[start, end)``, each counted once (a tied matrix in the embedding)."""
        return sum(layer.param_bytes for layer in self.layers[start:end])

    def expert_param_bytes(self, start: int = 0, end: int | None = None) -> float:
        """The routed experts' share of ``param_bytes(start, end)`` (``LayerSpec.expert_param_bytes``)."""
        return sum(layer.expert_param_bytes for layer in self.layers[start:end])

    def tied_ends(self, start: int, end: int) -> int:
        """How many ends of a tied embedding layers ``[start, end)`` hold: 0, 1 or 2."""
        if self.tied_layers is None:
            return 0
        return sum(start <= k < end for k in self.tied_layers)

    def tied_copy_bytes(self, start: int, end: int) -> float:
        """Bytes of the tied matrix's second copy that layers ``[start, end)`` hold: the head's
        (an untied model's ``mtp`` layer's) stage keeps its own when the embedding is on another
        stage (Megatron-LM's last stage
        allocates ``word_embeddings`` and keeps it in step through the embedding group's
        all-reduce, ``_allreduce_embedding_grads``); 0 when both ends share the stage."""
        if self.tied_layers is None or self.tied_ends(start, end) != 1:
            return 0.0
        return self.tied_bytes if start <= self.tied_layers[1] < end else 0.0

    def stage_param_bytes(self, start: int, end: int) -> float:
        """Parameter bytes a stage of layers ``[start, end)`` holds: ``param_bytes`` plus a tied copy."""
        return self.param_bytes(start, end) + self.tied_copy_bytes(start, end)

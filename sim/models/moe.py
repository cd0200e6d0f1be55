"""MoE blocks: a transformer block whose MLP is a router and experts (``sim.core.experts``).

An MoE block is the dense block's attention and norms, the dense MLP replaced by the router, the
``count`` routed experts of which each token uses ``top_k``, and ``shared`` always-on experts
(Megatron-Core's ``MoELayer``: ``TopKRouter``, ``MoEAlltoAllTokenDispatcher``, ``GroupedMLP`` and
``SharedExpertMLP``; DeepSeek-V3, §2.1.2). ``moe_block`` builds it from the dense block built with
the shared experts as its MLP (width shared × ffn_hidden, tensor-parallel as a dense MLP is) or,
without shared experts, from the dense block less its MLP.

One device of a plan with t-way tensor, c-way context, EP-way expert and ETP-way expert-tensor
parallelism holds count/EP routed experts, each split ETP ways along its width, and dispatches its
s/(c·t) tokens (Megatron-Core splits a replica's tokens over its tensor ranks, sequence
parallelism's layout) to their top_k experts: ``a2a_bytes`` = s/(c·t) · top_k · h · e per sample.
Averaged over the stage, a device's local experts then see, per sample of its replica,

    rows = s · top_k · EP · ETP / (count · t · c)

tokens each (the EP·ETP devices of a group hold EP·ETP/(t·c) replicas' tokens; ETP ranks see the
same tokens), which keeps a device's expert FLOPs at top_k/count of all the experts' work over
t·c, whatever EP. The busiest rank has ``ExpertSpec.rank_imbalance(EP)`` times the mean, capped
by the capacity factor; the device waits for it, so its kernels are timed on the busiest rank's
rows while its FLOPs (MFU's count) are the mean's.

Grouped GEMM: the local experts' products run as one grouped launch per projection
(Megatron-Core's ``--moe-grouped-gemm``, ``GroupedMLP``), each expert an (rows × h) by
(h × width) product; its efficiency is that of the per-expert M (``KernelSpec.rows``: ``rows``
per sample), so small per-expert batches lose efficiency through ``DeviceSpec.matmul_half_dim``.
Tokens are permuted before and unpermuted after the experts, and the router's top-k, softmaxes
and auxiliary loss run after its gating product: memory-bound kernels, listed pass by pass as
Megatron-Core launches them at tag core_v0.9.0 (``router_kernels``, ``permute_kernels``,
``unpermute_kernels``), each at least the host's issue time (``sim.cost.compute.kernel_time_s``).

What the block stashes (per sample, one device), counted from what autograd saves: the permuted
tokens (the first projection's input), the first projection's output (the activation's input)
and the activation's output (the second projection's input), the experts' outputs (the
weighted combine's input), all on the busiest rank's rows, plus the router's fp32 probabilities
and its int64 top-k indices.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.core.errors import SpecError
from sim.core.experts import ExpertSpec
from sim.core.model_spec import LayerSpec, ModelSpec
from sim.core.parallelism import Shard
from sim.core.specs import DTYPE_BYTES
from sim.cost.kernels import FP32_BYTES, KernelSpec

__all__ = ["busy_rows", "DISPATCH_COUNTS", "MLP_KERNELS", "ParameterCounts", "check_experts", "forward_only_kernels",
           "moe_block", "parameter_counts", "permute_kernels", "router_kernels", "strip_mlp", "unpermute_kernels"]

MLP_KERNELS = frozenset({"mlp_up", "gelu", "swiglu", "mlp_down", "silu", "swiglu_mul"})
"""The dense MLP's kernels (``sim.cost.kernels.transformer_block``, fused and eager), which an MoE
block without shared experts does not run."""
INDEX_BYTES = 8
"""Bytes of a top-k index (``torch.topk``'s int64 indices)."""


def check_experts(experts: ExpertSpec, shard: Shard, num_blocks: int, hidden_divisible: bool = True) -> None:
    """Megatron-Core's constraints on the expert degrees: EP divides the routed experts, ETP their
    width; EP with tensor parallelism needs sequence parallelism (its ``TransformerConfig``)."""
    experts.check_blocks(num_blocks)
    if experts.count % shard.expert:
        near = max(k for k in range(1, shard.expert + 1) if experts.count % k == 0)
        raise SpecError("expert_parallel", f"{shard.expert} does not divide the {experts.count} routed experts; "
                                           f"use a divisor of {experts.count} such as {near}")
    if experts.ffn_hidden % shard.expert_tensor:
        raise SpecError("expert_tensor_parallel", f"{shard.expert_tensor} does not divide experts.ffn_hidden "
                                                  f"{experts.ffn_hidden}; use 1 or a divisor of it")
    if experts.shared and experts.ffn_hidden % shard.tensor:
        raise SpecError("tensor_parallel", f"{shard.tensor} does not divide experts.ffn_hidden {experts.ffn_hidden} "
                                           "of the shared experts; choose a divisor")
    if shard.expert > 1 and shard.tensor > 1 and not shard.sequence_parallel:
        raise SpecError("sequence_parallel", "expert_parallel with tensor_parallel needs sequence_parallel: true "
                                             "(Megatron-Core's requirement)")


def strip_mlp(layer: LayerSpec, *, params: float, flop: float, stash: float, tensors: int) -> LayerSpec:
    """``layer`` without its dense MLP, whose ``params`` (per device, elements times bytes),
    forward ``flop``, ``stash`` bytes and parameter ``tensors`` are given."""
    kernels = tuple(k for k in layer.kernels if k.name not in MLP_KERNELS)
    return replace(layer, param_bytes=layer.param_bytes - params, fwd_flop=layer.fwd_flop - flop,
                   bwd_flop=layer.bwd_flop - 2 * flop, stash_bytes=layer.stash_bytes - stash,
                   selective_stash_bytes=layer.selective_stash - stash, kernels=kernels,
                   param_tensors=(layer.param_tensors or 0) - tensors)


def busy_rows(experts: ExpertSpec, shard: Shard, seq_len: int) -> float:
    """Rows one of the busiest rank's experts runs per sample (module docstring): the mean
    ``s·top_k·EP·ETP/(count·t·c)`` times ``rank_imbalance``, less what capacity drops."""
    rows = seq_len * experts.top_k * shard.expert * shard.expert_tensor / (experts.count * shard.tensor * shard.context)
    load = experts.rank_imbalance(shard.expert)
    return rows * load * experts.kept_fraction(load)


def router_kernels(tokens: float, count: int, top_k: int, d: int, *, unfused: bool) -> tuple[KernelSpec, ...]:
    """The top-k router's kernels after its gating product, on ``tokens`` tokens: fused, one pass
    over the fp32 scores; ``unfused`` (``ExpertSpec.permute``), as Megatron-Core trains with the
    auxiliary loss (NVIDIA/Megatron-LM at tag core_v0.9.0, ``router.py``
    ``TopKRouter.aux_loss_load_balancing``, ``moe_utils.py`` ``topk_softmax_with_capacity`` and
    ``switch_load_balancing_loss_func``), each one launch forward and one backward: ``torch.topk``
    of the logits (backward: a scatter into zeros), the softmax of the k scores in fp32 and its
    cast back (``.type_as``), the softmax of all ``count`` logits in fp32 (the loss's
    probabilities), then the loss: their sum over the tokens, its product with the tokens per
    expert, the sum and the scale (backward: ``MoEAuxLossAutoScaler``'s ``ones_like × scale`` and
    the products' gradients). The launches without a backward are ``forward_only_kernels``'s."""
    logits, scores = tokens * count, tokens * top_k
    if not unfused:
        return (KernelSpec(name="router_topk", bytes=2 * FP32_BYTES * tokens * count),)
    return (
        KernelSpec(name="router_topk", bytes=d * logits + (d + INDEX_BYTES) * scores, bwd_bytes=d * (logits + scores)),
        KernelSpec(name="router_softmax", bytes=(d + FP32_BYTES) * scores, bwd_bytes=(d + 2 * FP32_BYTES) * scores),
        KernelSpec(name="router_cast", bytes=(d + FP32_BYTES) * scores),
        KernelSpec(name="router_aux_softmax", bytes=(d + FP32_BYTES) * logits,
                   bwd_bytes=(d + 2 * FP32_BYTES) * logits),
        KernelSpec(name="router_aux_sum", bytes=FP32_BYTES * (logits + count)),
        *(KernelSpec(name=f"router_aux_{step}", bytes=3 * FP32_BYTES * count) for step in ("mul", "total", "scale")),
    )


DISPATCH_COUNTS = ("histc", "input_splits_sum", "input_splits_copy", "counts_all_gather", "local_counts",
                   "output_splits_sum", "output_splits_copy", "output_splits_tp_sum", "output_splits_tp_copy",
                   "local_tokens_sum", "local_tokens_copy")
"""The forward-only launches of ``MoEAlltoAllTokenDispatcher.preprocess`` (core_v0.9.0) with EP or TP
above 1: the ``histc`` of the indices, the input splits' sum and host copy, the all-gather of the
counts over the group, the local experts' slice, and the sums and host copies of the output splits,
of the tensor-parallel splits and of the local experts' tokens."""


def forward_only_kernels(tokens: float, count: int, top_k: int, *, spread: bool, unfused: bool) -> tuple[KernelSpec, ...]:
    """Launches of Megatron-Core v0.9's router and dispatcher without a backward (``unfused``; none
    fused): the router's ``histc`` of the top-k indices and the loss tracker's two updates
    (``save_to_aux_losses_tracker``), the dispatcher's counts (``DISPATCH_COUNTS`` when ``spread``
    over EP or TP ranks, else its ``histc`` and one host copy), and the host's wait at
    ``torch.cuda.current_stream().synchronize()`` before the all-to-all (the split sizes must reach
    the host): the device, drained, idles while the host issues the next kernel, one issue time."""
    if not unfused:
        return ()
    counts = DISPATCH_COUNTS if spread else DISPATCH_COUNTS[:1] + ("local_tokens_copy",)
    indices, small = INDEX_BYTES * tokens * top_k, 2 * INDEX_BYTES * count
    names = ("router_histc", "router_tracker_scale", "router_tracker_add") + tuple(f"dispatch_{c}" for c in counts)
    return tuple(KernelSpec(name=name, bytes=indices if name.endswith("histc") else small, backward=False)
                 for name in names) + (KernelSpec(name="dispatch_sync", backward=False),)


def permute_kernels(tokens: float, top_k: int, h: int, d: int, *, unfused: bool) -> tuple[KernelSpec, ...]:
    """The copy of a device's ``tokens`` tokens into their ``top_k`` copies grouped by expert: fused,
    one pass reading the tokens and writing the copies; ``unfused``, Megatron-Core's ``permute``
    (``moe_utils.py`` at core_v0.9.0): ``torch.argsort`` of the flattened
    indices and their floor division by k (one launch here, backward: the input gradient's
    ``torch.zeros``), then ``moe_gather``, a ``torch.gather`` reading and writing every copy
    (backward: ``scatter_add_`` of the copies' gradients, each add reading and writing its row)."""
    copies = d * tokens * top_k * h
    if not unfused:
        return (KernelSpec(name="moe_permute", bytes=d * h * (tokens + tokens * top_k)),)
    return (
        KernelSpec(name="moe_permute_sort", bytes=2 * INDEX_BYTES * tokens * top_k, bwd_bytes=d * tokens * h),
        KernelSpec(name="moe_permute_gather", bytes=2 * copies, bwd_bytes=3 * copies),
    )


def unpermute_kernels(tokens: float, top_k: int, h: int, d: int, *, unfused: bool) -> tuple[KernelSpec, ...]:
    """The weighted combine of the copies back into the tokens: fused, one pass reading the copies
    and writing the tokens; ``unfused``, Megatron-Core's ``unpermute`` with the router's
    probabilities (``moe_utils.py`` at core_v0.9.0), four memory passes forward: ``moe_scatter``'s ``torch.zeros`` of the k copies,
    its ``scatter_add_`` (reads each copy, reads and writes its row), the product with the
    probabilities and the sum over the k copies; four backward: the gradient times the
    probabilities, the gradient times the copies and its sum over the width (the probabilities'
    gradient) and ``moe_scatter``'s backward, a ``torch.gather``. Copies are ``tokens·top_k``
    rows of width ``h``, ``d`` bytes an element; the output ``tokens`` rows."""
    copies, out = d * tokens * top_k * h, d * tokens * h
    if not unfused:
        return (KernelSpec(name="moe_unpermute", bytes=d * h * (tokens * top_k + tokens)),)
    return (
        KernelSpec(name="moe_unpermute_zeros", bytes=copies, bwd_bytes=out + copies),
        KernelSpec(name="moe_unpermute_scatter", bytes=3 * copies, bwd_bytes=2 * copies),
        KernelSpec(name="moe_unpermute_probs", bytes=2 * copies, bwd_bytes=out + 2 * copies),
        KernelSpec(name="moe_unpermute_sum", bytes=copies + out, bwd_bytes=copies),
    )


def moe_block(layer: LayerSpec, experts: ExpertSpec, shard: Shard, *, seq_len: int, hidden: int, d: int,
              gated: bool, bias: bool) -> LayerSpec:
    """``layer`` (a dense block without the routed experts, see the module docstring) with the
    router and this device's routed experts added: parameters, FLOPs, kernels, stash, all-to-all."""
    s, h, t, c = seq_len, hidden, shard.tensor, shard.context
    ep, etp, b = shard.expert, shard.expert_tensor, 1 if bias else 0
    local = experts.count // ep
    width = experts.ffn_hidden // etp
    up = 2 * width if gated else width
    pointwise = s / c / (t if shard.sequence_parallel else 1)  # the router runs on the tokens a device holds
    tokens = s / (c * t)  # the tokens a device dispatches (module docstring)
    rows = s * experts.top_k * ep * etp / (experts.count * t * c)
    busy = busy_rows(experts, shard, seq_len)
    unfused = experts.permute == "unfused"
    mean = rows * experts.kept_fraction(1.0)
    expert_params = local * (h * up + width * h + b * (up + h))
    router_params = h * experts.count
    product = h * up + width * h  # multiply-adds per token of one expert
    flop = 2 * pointwise * h * experts.count + 2 * local * mean * product
    kernels = (
        KernelSpec(name="router", flop=2 * pointwise * h * experts.count, rows=pointwise, cols=experts.count,
                   inner=h, bytes=d * pointwise * (h + experts.count), fixed_bytes=d * h * experts.count, weights=True),
        *router_kernels(pointwise, experts.count, experts.top_k, d, unfused=unfused),
        *forward_only_kernels(pointwise, experts.count, experts.top_k, spread=ep > 1 or t > 1, unfused=unfused),
        *permute_kernels(tokens, experts.top_k, h, d, unfused=unfused),
        KernelSpec(name="experts_up", flop=2 * local * busy * h * up, rows=busy, cols=up, inner=h,
                   bytes=d * local * busy * (h + up), fixed_bytes=d * local * h * up, weights=True),
        KernelSpec(name="experts_act", bytes=(3 if gated else 2) * d * local * busy * width),
        KernelSpec(name="experts_down", flop=2 * local * busy * width * h, rows=busy, cols=h, inner=width,
                   bytes=d * local * busy * (width + h), fixed_bytes=d * local * width * h, weights=True),
        *unpermute_kernels(tokens, experts.top_k, h, d, unfused=unfused),
    )
    stash = d * local * busy * (h + up + width + h) + pointwise * experts.count * FP32_BYTES \
        + pointwise * experts.top_k * INDEX_BYTES
    expert_bytes = float(expert_params * d)
    return replace(
        layer,
        param_bytes=layer.param_bytes + expert_bytes + router_params * d,
        expert_param_bytes=expert_bytes,
        param_tensors=(layer.param_tensors or 0) + 1 + 2 * (1 + b),  # the router; grouped weights (and biases)
        fwd_flop=layer.fwd_flop + flop,
        bwd_flop=layer.bwd_flop + 2 * flop,
        stash_bytes=layer.stash_bytes + stash,
        selective_stash_bytes=layer.selective_stash + stash,
        kernels=layer.kernels + kernels,
        a2a_bytes=tokens * experts.top_k * h * d * experts.kept_fraction(1.0),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ParameterCounts:
    """A model's parameters by kind (counts, not bytes), as model cards quote them."""

    total: float
    """Every parameter (a tied matrix once)."""
    routed: float
    """The routed experts' (``LayerSpec.expert_param_bytes``)."""
    active: float
    """What one token runs through: the dense rest and top_k/count of the routed experts."""

    @property
    def dense(self) -> float:
        """Everything but the routed experts: attention, norms, routers, shared experts, embedding, head."""
        return self.total - self.routed


def parameter_counts(model: ModelSpec) -> ParameterCounts:
    """``model``'s (the whole model's, not one device's) parameters by kind."""
    width = DTYPE_BYTES[model.dtype]
    total, routed = model.param_bytes() / width, model.expert_param_bytes() / width
    share = model.experts.top_k / model.experts.count if model.experts is not None else 1.0
    return ParameterCounts(total=total, routed=routed, active=total - routed + routed * share)

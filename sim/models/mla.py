"""A transformer block with multi-head latent attention (``sim.core.mla.MlaSpec``) in place of
multi-head attention: its parameters, FLOPs, kernels and stash.

``mla_block`` takes the block built with multi-head attention (the MLP or the experts left as
they are) and replaces what its attention holds, computes and stashes, per sample of s tokens,
a heads of widths d_qk = d_h + d_h^R (queries and keys) and d_v (values), DeepSeek-V3 §2.1.1:

* parameters: ``MlaSpec.projection_params`` and the two latents' RMSNorms (d'_c + d_c; "additional
  RMSNorm layers after the compressed latent vectors", §4.2) instead of QKV and the output
  projection;
* forward FLOPs: 2s per projection weight, and the scores and attention over values,
  2·s²·a·(d_qk + d_v) (4s²h for multi-head attention of a·d_v = h; the causal mask not
  subtracted, as ``sim.models.transformer`` counts it);
* kernels: the down-projections (q_down h → d'_c, kv_down h → d_c + d_h^R) and their norms, the
  up-projections (q_up d'_c → a·d_qk, kv_up d_c → a·(d_h + d_v)), the rotary embedding and the
  copies that assemble the queries and keys (``_assembly``, below), one fused attention on
  d_qk-wide queries and keys and d_v-wide values, and the output projection a·d_v → h;
* stash, as DeepSeek-V3 trains it: "we recompute all RMSNorm operations and MLA up-projections
  during back-propagation" (§3.2.3), so a block keeps the down-projections' input (e·sh), the
  latents (e·s·(d'_c + d_c + d_h^R), what the recomputed up-projections read), the attention
  output (e·s·a·d_v, also the output projection's input) and the log-sum-exp (4·a·s), not the
  queries, keys and values (e·s·a·(2·d_qk + d_v)) that multi-head attention's count keeps.
  The latents' norms and the up-projections run again in the backward (``KernelSpec.recomputed``:
  their forward time added to it, ``sim.cost.compute.layer_times_s``; about 2% of DeepSeek-V3's
  block, 0.11 GFLOP a token of its 5.7 forward and backward).

Assembling the queries and keys (``_assembly``): the up-projections' outputs are split, not
ready for the attention. Both the frameworks run, per block (deepseek-ai/DeepSeek-V3
``inference/model.py`` at 1ea5a1a, ``MLA.forward``; NVIDIA/Megatron-LM
``megatron/core/transformer/multi_latent_attention.py`` at 13f8f52,
``MLASelfAttention.get_query_key_value_tensors``): the rotary embedding on the queries' rope part
(a·d_h^R an element of a token) and on the key's shared one (d_h^R), then ``torch.cat`` of each
query's no-rope and rope parts into a·d_qk, and of each key's no-rope part with the shared rope
part broadcast to every head (``expand``, a view) into a·d_qk. Each is a memory-bound pass
(``sim.cost.kernels``' element-wise pricing), its bytes from the shapes in ``e``-byte elements:

* ``mla_rope_q``: reads and writes s·a·d_h^R (one fused kernel, Megatron-Core's
  ``apply_rope_fusion``); backward the same on the gradient;
* ``mla_rope_k``: reads and writes s·d_h^R; backward, the broadcast's gradient summed over the
  heads (reads s·a·d_h^R, writes s·d_h^R) and the rotation's (reads and writes s·d_h^R);
* ``mla_q_cat``: reads s·a·(d_h + d_h^R), writes s·a·d_qk; backward, the split's gradient joins
  the two parts' gradients into q's (the same bytes; the cat's own gradient is views);
* ``mla_k_cat``: reads s·a·d_h + s·d_h^R, writes s·a·d_qk; backward, the split of kv_up's output
  joins the keys' and values' gradients into its own (reads and writes s·a·(d_h + d_v)).

They follow the up-projections, whose outputs are not stashed, so they run again in the backward
(``recomputed``; Megatron-Core checkpoints them together, ``qkv_up_proj_and_rope_apply``). On
DeepSeek-V3's block (4,096 tokens, 128 heads) 0.34 ms forward on an H800, 1.1 ms with the
recompute and the backward.

Modelled without tensor or context parallelism (DeepSeek-V3 uses neither, §3.2) and with a fused
attention only; other plans are refused.
"""

from __future__ import annotations

from dataclasses import replace

from sim.core.errors import SpecError
from sim.core.mla import MlaSpec
from sim.core.model_spec import LayerSpec
from sim.core.parallelism import Shard
from sim.cost.kernels import CAUSAL_WORK_FRACTION, LSE_BYTES, KernelSpec

__all__ = ["mla_attention_flop", "mla_block", "mla_stash_bytes"]

_REPLACED = frozenset({"qkv", "attention", "proj"})
"""The multi-head attention kernels an MLA block replaces (``sim.cost.kernels.transformer_block``)."""


def _projection(name: str, m: float, n: float, k: float, d: int) -> KernelSpec:
    """An (m × k) by (k × n) product with a weight, per sample (``sim.cost.kernels``' convention)."""
    return KernelSpec(name=name, flop=2 * m * n * k, rows=m, cols=n, inner=k, bytes=d * (m * k + m * n),
                      fixed_bytes=d * k * n, weights=True)


def mla_attention_flop(mla: MlaSpec, seq_len: int, heads: int) -> float:
    """Forward FLOPs per sample of the scores and attention over values: 2·s²·a·(d_qk + d_v)."""
    return 2.0 * seq_len * seq_len * heads * (mla.qk_head_dim + mla.v_head_dim)


def mla_stash_bytes(mla: MlaSpec, seq_len: int, hidden: int, heads: int, d: int) -> float:
    """What an MLA block's attention stashes per sample (module docstring): the input, the
    latents, the output and the log-sum-exp."""
    s = seq_len
    latents = mla.q_lora_rank + mla.kv_lora_rank + mla.rope_head_dim
    return d * s * (hidden + latents + heads * mla.v_head_dim) + LSE_BYTES * heads * s


def _assembly(mla: MlaSpec, s: int, a: int, d: int) -> tuple[KernelSpec, ...]:
    """The rotary embeddings and copies that make the attention's queries and keys from the
    up-projections' outputs, per sample (module docstring), each run again in the backward."""
    rope, nope, qk, v = mla.rope_head_dim, mla.nope_head_dim, mla.qk_head_dim, mla.v_head_dim
    return (
        KernelSpec(name="mla_rope_q", bytes=2 * d * s * a * rope, bwd_bytes=2 * d * s * a * rope, recomputed=True),
        KernelSpec(name="mla_rope_k", bytes=2 * d * s * rope, bwd_bytes=d * s * a * rope + 3 * d * s * rope,
                   recomputed=True),
        KernelSpec(name="mla_q_cat", bytes=2 * d * s * a * qk, bwd_bytes=2 * d * s * a * qk, recomputed=True),
        KernelSpec(name="mla_k_cat", bytes=d * s * (a * nope + rope + a * qk), bwd_bytes=2 * d * s * a * (nope + v),
                   recomputed=True),
    )


def _kernels(mla: MlaSpec, s: int, h: int, a: int, d: int, attention: str, causal: bool) -> tuple[KernelSpec, ...]:
    """The MLA kernels of one block (module docstring), in the order they run."""
    qk, v = mla.qk_head_dim, mla.v_head_dim
    queries, keys, values = d * s * a * qk, d * s * a * qk, d * s * a * v
    output, lse = d * s * a * v, LSE_BYTES * s * a
    fused = KernelSpec(name="attention", flop=mla_attention_flop(mla, s, a) * (CAUSAL_WORK_FRACTION if causal else 1.0),
                       bytes=queries + keys + values + output + lse,
                       bwd_bytes=2 * (queries + keys + values) + 2 * output + lse, fused_attention=attention)
    return (
        _projection("mla_q_down", s, mla.q_lora_rank, h, d),
        KernelSpec(name="mla_q_norm", bytes=2 * d * s * mla.q_lora_rank, recomputed=True),
        replace(_projection("mla_q_up", s, a * qk, mla.q_lora_rank, d), recomputed=True),
        _projection("mla_kv_down", s, mla.kv_lora_rank + mla.rope_head_dim, h, d),
        KernelSpec(name="mla_kv_norm", bytes=2 * d * s * mla.kv_lora_rank, recomputed=True),
        replace(_projection("mla_kv_up", s, a * (mla.nope_head_dim + v), mla.kv_lora_rank, d), recomputed=True),
        *_assembly(mla, s, a, d),
        fused,
        _projection("proj", s, h, a * v, d),
    )


def mla_block(layer: LayerSpec, mla: MlaSpec, shard: Shard, *, seq_len: int, hidden: int, heads: int,
              kv_heads: int, d: int, bias: bool, attention: str, causal: bool) -> LayerSpec:
    """``layer``, a block built with multi-head attention of ``heads`` heads (``kv_heads`` of
    keys and values) over ``hidden``, with MLA's attention instead (module docstring)."""
    if shard.tensor > 1 or shard.context > 1:
        key = "tensor_parallel" if shard.tensor > 1 else "context_parallel"
        raise SpecError(key, "model.mla is modelled without tensor or context parallelism (DeepSeek-V3 uses "
                             "neither); set 1, or remove model.mla")
    if attention == "unfused":
        raise SpecError("attention", "model.mla is modelled with a fused attention; set model.attention: flash")
    s, h, a, b = seq_len, hidden, heads, 1 if bias else 0
    h_kv = kv_heads * h // a
    mha_params = h * (h + 2 * h_kv) + b * (h + 2 * h_kv) + h * h + b * h
    mla_params = mla.projection_params(h, a) + mla.q_lora_rank + mla.kv_lora_rank
    mha_flop = 2 * s * (h * (h + 2 * h_kv) + h * h) + 4 * s * s * h
    mla_flop = 2 * s * mla.projection_params(h, a) + mla_attention_flop(mla, s, a)
    mha_stash = d * s * (3 * h + 2 * h_kv)  # QKV input, Q, K, V, output (sim.cost.memory.block_activation_bytes)
    stash = mla_stash_bytes(mla, s, h, a, d) - LSE_BYTES * a * s - mha_stash  # the log-sum-exp is in both
    kernels: list[KernelSpec] = []
    for k in layer.kernels:
        if k.name == "qkv":
            kernels += _kernels(mla, s, h, a, d, attention, causal)
        elif k.name not in _REPLACED:
            kernels.append(k)
    delta = mla_flop - mha_flop
    return replace(layer, param_bytes=layer.param_bytes + (mla_params - mha_params) * d,
                   param_tensors=(layer.param_tensors or 0) + 5,  # five weights and two norms for two weights
                   fwd_flop=layer.fwd_flop + delta, bwd_flop=layer.bwd_flop + 2 * delta,
                   stash_bytes=layer.stash_bytes + stash, selective_stash_bytes=layer.selective_stash + stash,
                   kernels=tuple(kernels))

"""Multi-head latent attention (MLA) in torch: keys and values from a low-rank latent.

The simulator's MLA block (``sim.models.mla``, widths ``sim.core.mla.MlaSpec``) as an
``nn.Module``, DeepSeek-V3 (arXiv 2412.19437) §2.1.1, eqs. 1–11, for a hidden state h_t:

* keys and values (eqs. 1–5): the latent c_KV = W^DKV h (width d_c, ``kv_lora_rank``) and the
  decoupled rotary key k^R = RoPE(W^KR h) (width d_h^R, ``rope_head_dim``, one shared by every
  head) in one down-projection ``wkv_a`` (h → d_c + d_h^R); then c_KV's RMSNorm (``kv_norm``, "additional
  RMSNorm layers after the compressed latent vectors", §4.2) and one up-projection ``wkv_b``
  (d_c → heads·(d_h + d_v)) to each head's no-rope key k^C (d_h, ``nope_head_dim``) and value
  (d_v, ``v_head_dim``); a head's key is [k^C; k^R];
* queries (eqs. 6–9): the latent c_Q = W^DQ h (``wq_a``, h → d'_c, ``q_lora_rank``), its RMSNorm
  (``q_norm``), and ``wq_b`` (d'_c → heads·(d_h + d_h^R)) to each head's q^C and q^R, the latter
  rotated; a head's query is [q^C; q^R];
* attention (eqs. 10–11): causal softmax(q·k / √(d_h + d_h^R))·v per head, then ``wo``
  (heads·d_v → h).

The layout and names are DeepSeek's ``MLA`` class with a query latent (``inference/model.py`` in
deepseek-ai/DeepSeek-V3 at 9b4e978, its ``attn_impl: naive`` branch) and torchtitan's
``Attention`` (``torchtitan/models/deepseek_v3/model.py`` at b5bcd76): no biases, the softmax
scale (d_h + d_h^R)^−1/2. Rotary is ``runtime.model.layers``' rotate-half form (DeepSeek and
torchtitan rotate interleaved pairs as complex numbers: the same rotation on permuted channels).

**What is stashed.** DeepSeek-V3 "recompute[s] all RMSNorm operations and MLA up-projections
during back-propagation" (§3.2.3), and the simulator counts a block's attention stash so
(``sim.models.mla.mla_stash_bytes``): the down-projections' input, the latents, the attention
output. Here the norms, up-projections, rotary and the attention core run under
``torch.utils.checkpoint`` (non-reentrant) from the two down-projections' outputs, so autograd
keeps exactly those; the attention's log-sum-exp is rebuilt with the rest (the simulator counts
it, 4 bytes a head and token).

The simulator models MLA without tensor or context parallelism and refuses those plans when the
scenario loads; data and pipeline parallelism, sharding and recompute run it as any layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from runtime.model.layers import rotate
from sim.core.mla import MlaSpec

__all__ = ["LatentAttention"]

NORM_EPS = 1e-6
"""The latents' RMSNorm epsilon (DeepSeek's ``RMSNorm`` default, ``inference/model.py``)."""


class LatentAttention(nn.Module):
    """Causal multi-head latent attention of ``heads`` heads over ``hidden`` (module docstring).

    ``positions`` (as ``runtime.model.layers.Attention``'s): the tokens' global indices for the
    rotary parts (None: ``0 .. s-1``)."""

    def __init__(self, hidden: int, heads: int, mla: MlaSpec) -> None:
        super().__init__()
        self.heads, self.mla = heads, mla
        self.wq_a = nn.Linear(hidden, mla.q_lora_rank, bias=False)
        self.q_norm = nn.RMSNorm(mla.q_lora_rank, eps=NORM_EPS)
        self.wq_b = nn.Linear(mla.q_lora_rank, heads * mla.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(hidden, mla.kv_lora_rank + mla.rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(mla.kv_lora_rank, eps=NORM_EPS)
        self.wkv_b = nn.Linear(mla.kv_lora_rank, heads * (mla.nope_head_dim + mla.v_head_dim), bias=False)
        self.wo = nn.Linear(heads * mla.v_head_dim, hidden, bias=False)
        self.positions: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, s, _ = x.shape
        # the latents are what the backward keeps; everything up to the attention output runs again
        out = checkpoint(self._up_and_attend, self.wq_a(x), self.wkv_a(x), use_reentrant=False)
        return self.wo(out.transpose(1, 2).reshape(n, s, -1))

    def _up_and_attend(self, q_latent: torch.Tensor, kv_latent: torch.Tensor) -> torch.Tensor:
        """The norms, the up-projections, rotary and the attention core, from c_Q and [c_KV; W^KR h]:
        ``(n, heads, s, d_v)``."""
        mla, a = self.mla, self.heads
        n, s, _ = q_latent.shape
        q = self.wq_b(self.q_norm(q_latent)).view(n, s, a, mla.qk_head_dim).transpose(1, 2)
        q_nope, q_rope = q.split([mla.nope_head_dim, mla.rope_head_dim], dim=-1)
        kv, k_rope = kv_latent.split([mla.kv_lora_rank, mla.rope_head_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(kv)).view(n, s, a, mla.nope_head_dim + mla.v_head_dim).transpose(1, 2)
        k_nope, v = kv.split([mla.nope_head_dim, mla.v_head_dim], dim=-1)
        k_rope = rotate(k_rope.unsqueeze(1), self.positions).expand(n, a, s, mla.rope_head_dim)
        q = torch.cat([q_nope, rotate(q_rope, self.positions)], dim=-1)
        k = torch.cat([k_nope, k_rope], dim=-1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/√(d_h + d_h^R)

"""Transformer layers in torch, laid out so that tensor parallelism can cut them as Megatron does.

``sim.models.transformer`` describes GPT and Llama as an embedding, identical blocks and a
head; these are the same layers as ``nn.Module``s. Each block is an ``attention`` and an
``mlp`` submodule whose matrices are separate ``nn.Linear``s (queries, keys and values each
their own, as torchtitan's ``Attention`` has ``wq``, ``wk``, ``wv``), so that
``runtime.model.tensor_parallel`` can split them column- and row-wise over a tensor-parallel group
with torch's ``ColwiseParallel`` and ``RowwiseParallel`` (a fused QKV matrix would split
across the three). Reshapes use ``-1`` for the head count, so the same code runs on a
device's share of the heads.

* GPT (Radford et al., GPT-2, 2019, §2.3): token and learned position embeddings; pre-LN
  blocks (LayerNorm, causal attention, projection, LayerNorm, GELU MLP, two residuals); a
  head with a final LayerNorm and a bias-free projection to the vocabulary.
* Llama (Touvron et al. 2023; Dubey et al. 2024): token embedding only; RMSNorm; rotary
  position embeddings (Su et al. 2021, "RoFormer", §3.4.2, rotate-half form, base 10000);
  grouped-query attention with ``kv_heads`` key and value heads (Ainslie et al. 2023);
  SwiGLU MLP ``w2(silu(w1 x) * w3 x)`` (Shazeer 2020); no biases.

No dropout anywhere, so runs are deterministic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Embedding", "LMHead", "TransformerBlock", "lm_loss", "make_norm", "rotate"]

ROPE_BASE = 10000.0
"""Base of the rotary embedding's frequencies (RoFormer, §3.4.2; Llama 1 and 2)."""


class Embedding(nn.Module):
    """Token ids ``(n, s)`` -> hidden states ``(n, s, h)``: token plus, for GPT, a learned
    position embedding.

    ``scatter`` (set by ``runtime.model.tensor_parallel`` under sequence parallelism) cuts the
    position embedding to this device's part of the sequence, as the token embedding's
    reduce-scatter already did. ``positions`` (set by ``runtime.model.context_parallel``): the
    global indices of the tokens this device holds (None: ``0 .. s-1``).
    """

    def __init__(self, vocab: int, seq_len: int, hidden: int, *, positions: bool) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq_len, hidden) if positions else None
        self.scatter = None
        self.positions: torch.Tensor | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.token(ids)
        if self.position is None:
            return x
        table = self.position(_positions(self.positions, ids.shape[1], ids.device))
        return x + (table if self.scatter is None else self.scatter(table))


def _positions(positions: torch.Tensor | None, s: int, device: torch.device) -> torch.Tensor:
    """The global indices of a part of the sequence (context parallelism), or ``0 .. s-1``."""
    return torch.arange(s, device=device) if positions is None else positions


def rotate(x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE in rotate-half form on ``(n, heads, s, head_dim)``, at the tokens' global positions."""
    s, dim = x.shape[-2], x.shape[-1]
    inverse = 1.0 / ROPE_BASE ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    angles = torch.outer(_positions(positions, s, x.device).float(), inverse)
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).to(x.dtype) for f in (torch.cos, torch.sin))
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Causal self-attention with separate query, key, value and output matrices.

    ``positions`` and ``core`` are replaced under context parallelism
    (``runtime.model.context_parallel``: the rank's global token indices, ring attention)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, *, bias: bool, rotary: bool) -> None:
        super().__init__()
        self.head_dim, self.groups, self.rotary = hidden // heads, heads // kv_heads, rotary
        kv_width = kv_heads * self.head_dim
        self.q = nn.Linear(hidden, hidden, bias=bias)
        self.k = nn.Linear(hidden, kv_width, bias=bias)
        self.v = nn.Linear(hidden, kv_width, bias=bias)
        self.out = nn.Linear(hidden, hidden, bias=bias)
        self.positions: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, s, _ = x.shape
        q, k, v = (m(x).view(n, s, -1, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v))
        if self.rotary:
            q, k = rotate(q, self.positions), rotate(k, self.positions)
        attention = self.core(q, k, v)
        return self.out(attention.transpose(1, 2).reshape(n, s, -1))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core, softmax(QKᵀ/√d)·V under the causal mask, on ``(n, heads, s, head_dim)``
        (what ``recompute: selective`` runs again: ``runtime.model.recompute``)."""
        if self.groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
            k, v = (t.repeat_interleave(self.groups, dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class MLP(nn.Module):
    """GPT's ``fc_2(gelu(fc_1 x))``, or Llama's SwiGLU ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, hidden: int, ffn_hidden: int, *, gated: bool) -> None:
        super().__init__()
        bias = not gated
        self.w1 = nn.Linear(hidden, ffn_hidden, bias=bias)
        self.w3 = nn.Linear(hidden, ffn_hidden, bias=False) if gated else None
        self.w2 = nn.Linear(ffn_hidden, hidden, bias=bias)
        self.adds_bias = True
        """Whether ``w2``'s bias is added here: False on a routed expert's expert-tensor ranks but
        the first, whose partial outputs the reduce-scatter sums (``runtime.model.experts``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = F.gelu(self.w1(x)) if self.w3 is None else F.silu(self.w1(x)) * self.w3(x)
        if not self.adds_bias:  # an FP8 product (runtime.model.fp8) has its own product without the bias
            return self.w2.unbiased(inner) if hasattr(self.w2, "unbiased") else F.linear(inner, self.w2.weight)
        return self.w2(inner)


def make_norm(hidden: int, llama: bool) -> nn.Module:
    """GPT's LayerNorm or Llama's RMSNorm."""
    return nn.RMSNorm(hidden, eps=1e-5) if llama else nn.LayerNorm(hidden)


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attention(norm_1 x)``, then ``+ mlp(norm_2 ·)``; ``mlp`` replaces
    the dense MLP (an MoE block's router and experts), ``attention`` the multi-head attention
    (multi-head latent attention, ``runtime.model.mla.LatentAttention``)."""

    def __init__(self, hidden: int, heads: int, ffn_hidden: int, *, kv_heads: int | None = None,
                 llama: bool = False, mlp: nn.Module | None = None, attention: nn.Module | None = None) -> None:
        super().__init__()
        self.norm_1 = make_norm(hidden, llama)
        self.attention = Attention(hidden, heads, kv_heads or heads, bias=not llama, rotary=llama) \
            if attention is None else attention
        self.norm_2 = make_norm(hidden, llama)
        self.mlp = MLP(hidden, ffn_hidden, gated=llama) if mlp is None else mlp
        """The dense MLP, or a mixture of experts (``runtime.model.experts.MoE``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm_1(x))
        return x + self.mlp(self.norm_2(x))


class LMHead(nn.Module):
    """Final norm, projection to the vocabulary without bias, mean cross-entropy over every token.

    With tied embeddings the projection matrix is the embedding's token table: ``tie``
    points the head at the embedding's ``nn.Embedding`` without registering it here (its bytes
    belong to the embedding, as in ``sim.models``), and the head reads the module's weight at
    each call, so that it uses whatever parameter that module holds then: the DTensor that
    tensor parallelism put there, or the gathered weight FSDP2 swaps in for a forward
    (torchtitan ties after parallelizing for the same reason: ``models/qwen3/infra/parallelize.py``,
    "Enable weight tying after applying parallelisms"). A head on another stage than the
    embedding gets its own copy instead (``untie_copy``), kept equal by summing both gradients
    (Narayanan et al., SC'21, keep the same second copy on the last stage).

    ``gather`` (set by ``runtime.model.tensor_parallel``) turns the normed hidden states into
    the replicated DTensor a tied projection onto the vocabulary-sharded table needs.
    """

    def __init__(self, hidden: int, vocab: int, *, tied: bool, llama: bool = False) -> None:
        super().__init__()
        self.norm = make_norm(hidden, llama)
        self.proj = None if tied else nn.Linear(hidden, vocab, bias=False)
        self._tied: tuple[nn.Module, ...] = ()  # a tuple, so the module does not register it
        self.gather = None

    def tie(self, table: nn.Module) -> None:
        """Project with ``table.weight`` (the embedding's ``nn.Embedding``), read at each call."""
        self._tied = (table,)

    @property
    def borrowed(self) -> tuple[nn.Parameter, ...]:
        """Parameters this head uses but the embedding owns (its tied token matrix)."""
        return tuple(table.weight for table in self._tied)

    def untie_copy(self, weight: torch.Tensor) -> None:
        """Hold a registered copy of the embedding's token matrix (head on its own stage)."""
        self.proj = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            self.proj.weight.copy_(weight)
        self._tied = ()

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(self.norm(x))

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Normed hidden states -> logits over the (padded) vocabulary."""
        if self.proj is not None:
            return self.proj(x)
        return F.linear(x if self.gather is None else self.gather(x), self._tied[0].weight)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return lm_loss(self.logits(x), labels)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token, computed in fp32 (on vocabulary-sharded logits
    too, inside ``torch.distributed.tensor.parallel.loss_parallel``)."""
    return F.cross_entropy(logits.float().flatten(0, -2), labels.flatten())

"""Ring attention: exact causal attention over a sequence cut across a context-parallel group.

With context parallelism each of the c devices of a group holds 1/c of the sequence
(``runtime.model.context_parallel``: Megatron-LM's load-balanced cut into 2c chunks, rank r
holding chunks r and 2c−1−r). Its queries need every earlier key, so the key/value blocks
travel around the group as a ring (Liu, Zaharia and Abbeel 2023, "Ring Attention with
Blockwise Transformers", §3): at step i a rank holds the block of rank r−i, sends it on to
r+1 and receives the next from r−1 while it computes, c steps in all.

**Online softmax.** The blocks' partial results merge exactly with FlashAttention's recurrence
(Dao et al. 2022, §3.1; Milakov and Gimelshein 2018): a block gives its softmax-weighted
values ``o_b`` (normalised within the block) and its rows' log-sum-exp ``l_b`` of the scores;
two partial results merge as

    l = log(e^{l_1} + e^{l_2}),   o = o_1 · e^{l_1 − l} + o_2 · e^{l_2 − l}

(``merge``), which is the softmax over the union of their keys. A rank keeps only its output
and ``l`` (no s×s scores), as TransformerEngine's ``AttnFuncWithCPAndKVP2P`` does, which
Megatron-Core's ``TEDotProductAttention`` runs with ``cp_comm_type="p2p"``
(``megatron/core/extensions/transformer_engine.py``).

**Causal masks per block pair.** A query chunk a and a key chunk b (global chunk indices) are
fully visible when b < a, causal on the diagonal when b = a, and skipped when b > a
(``chunk_mask``); under the load-balanced cut every rank computes the same number of
visible pairs at every step, which is why Megatron cuts that way.

**Backward** (FlashAttention-2's, Dao 2023, Algorithm 2): the key/value blocks go around the
ring again; each block's scores are recomputed, ``P = exp(S − l)`` from the saved ``l``, and
with ``D = rowsum(dO ∘ O)``: ``dV = Pᵀ dO``, ``dS = P ∘ (dO Vᵀ − D)``, ``dQ = dS K / √d``,
``dK = dSᵀ Q / √d``. A block's dK/dV travels with it, each rank adding its part, and reaches
its owner after c hops. Arithmetic runs in fp32; grouped-query attention expands the key/value
heads only inside a block (the ring carries ``kv_heads``), summing their gradients back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["Ring", "chunk_mask", "merge", "ring_attention"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Ring:
    """A context-parallel group as a ring of point-to-point neighbours."""

    ranks: tuple[int, ...]
    """Global ranks of the group in context-rank order (rank i sends to i+1, receives from i−1)."""
    index: int
    """This device's context rank (its place in ``ranks``)."""
    group: object = None
    """The group's ``torch.distributed`` process group (None: the default group)."""

    @property
    def size(self) -> int:
        return len(self.ranks)

    def chunks(self, rank: int) -> tuple[int, int]:
        """The global chunk indices context rank ``rank`` holds: r and 2c−1−r."""
        return rank, 2 * self.size - 1 - rank

    def shift(self, tensor: torch.Tensor, tag: int):
        """Send ``tensor`` to the next rank and receive the previous rank's; returns a callable
        that waits and gives the received tensor (the tensor itself on a ring of one). ``tag``
        keeps the blocks (0) and their travelling gradients (1) apart, which are in flight at once."""
        if self.size == 1:
            return lambda: tensor
        received = torch.empty_like(tensor)
        nxt, prev = self.ranks[(self.index + 1) % self.size], self.ranks[(self.index - 1) % self.size]
        ops = [dist.P2POp(dist.isend, tensor.contiguous(), nxt, self.group, tag),
               dist.P2POp(dist.irecv, received, prev, self.group, tag)]
        works = dist.batch_isend_irecv(ops)

        def wait() -> torch.Tensor:
            for work in works:
                work.wait()
            return received
        return wait


def chunk_mask(query_chunk: int, key_chunk: int) -> str | None:
    """How query chunk a sees key chunk b under the causal mask: ``full`` (b < a),
    ``causal`` (b = a, the diagonal) or None (b > a: nothing)."""
    if key_chunk < query_chunk:
        return "full"
    return "causal" if key_chunk == query_chunk else None


def merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor,
          block_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial softmax results over disjoint keys as one (the online-softmax recurrence);
    ``lse`` may be −inf (nothing seen yet) where ``block_lse`` is finite."""
    new = torch.logaddexp(lse, block_lse)
    return out * torch.exp(lse - new).unsqueeze(-1) + block_out * torch.exp(block_lse - new).unsqueeze(-1), new


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        above = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(above, float("-inf"))
    return s


def _expand(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _fold(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Sum an expanded head dimension's gradient back onto the key/value heads."""
    if groups == 1:
        return t
    n, heads, length, dim = t.shape
    return t.view(n, heads // groups, groups, length, dim).sum(2)


def _halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two chunks a rank holds, along the sequence (dim 2 of ``(n, heads, s, d)``)."""
    return tuple(t.chunk(2, dim=2))


def _visible(ring: Ring, src: int):
    """(query half, key half, mask) of every visible pair while holding ``src``'s block."""
    mine, theirs = ring.chunks(ring.index), ring.chunks(src)
    return [(a, b, mask) for a in (0, 1) for b in (0, 1) if (mask := chunk_mask(mine[a], theirs[b])) is not None]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring: Ring):
        dtype, groups = q.dtype, q.shape[1] // k.shape[1]
        q, k, v = q.float(), k.float(), v.float()
        scale = 1.0 / math.sqrt(q.shape[-1])
        qs = _halves(q)
        outs = [torch.zeros_like(half) for half in qs]
        lses = [torch.full(half.shape[:-1], float("-inf"), device=q.device) for half in qs]
        kv = torch.stack([k, v])
        for step in range(ring.size):
            src = (ring.index - step) % ring.size
            pending = ring.shift(kv, 0) if step < ring.size - 1 else None
            ks, vs = _halves(kv[0]), _halves(kv[1])
            for a, b, mask in _visible(ring, src):
                s = _scores(qs[a], _expand(ks[b], groups), mask == "causal", scale)
                block_lse = torch.logsumexp(s, dim=-1)
                block_out = torch.matmul(torch.exp(s - block_lse.unsqueeze(-1)), _expand(vs[b], groups))
                outs[a], lses[a] = merge(outs[a], lses[a], block_out, block_lse)
            if pending is not None:
                kv = pending()
        out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.groups, ctx.scale, ctx.dtype = ring, groups, scale, dtype
        return out.to(dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        ring, groups, scale = ctx.ring, ctx.groups, ctx.scale
        grad_out = grad_out.float()
        qs, dos, lses = _halves(q), _halves(grad_out), _halves(lse.unsqueeze(-1))
        deltas = _halves((grad_out * out).sum(-1, keepdim=True))
        dqs = [torch.zeros_like(half) for half in qs]
        kv, travelling = torch.stack([k, v]), None
        for step in range(ring.size):
            src = (ring.index - step) % ring.size
            pending = ring.shift(kv, 0) if step < ring.size - 1 else None
            ks, vs = _halves(kv[0]), _halves(kv[1])
            mine = torch.zeros_like(kv)  # this rank's part of src's dK, dV
            dks, dvs = _halves(mine[0]), _halves(mine[1])
            for a, b, mask in _visible(ring, src):
                key, value = _expand(ks[b], groups), _expand(vs[b], groups)
                p = torch.exp(_scores(qs[a], key, mask == "causal", scale) - lses[a])
                dvs[b].add_(_fold(torch.matmul(p.transpose(-2, -1), dos[a]), groups))
                ds = p * (torch.matmul(dos[a], value.transpose(-2, -1)) - deltas[a])
                dqs[a].add_(torch.matmul(ds, key) * scale)
                dks[b].add_(_fold(torch.matmul(ds.transpose(-2, -1), qs[a]) * scale, groups))
            if travelling is not None:  # the previous ranks' parts of src's gradient
                mine += travelling()
            travelling = ring.shift(mine, 1)
            if pending is not None:
                kv = pending()
        dkv = travelling()  # after c hops: this rank's own block, every rank's part summed
        dq = torch.cat(dqs, dim=2)
        return dq.to(ctx.dtype), dkv[0].to(ctx.dtype), dkv[1].to(ctx.dtype), None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring) -> torch.Tensor:
    """Causal softmax(QKᵀ/√d)·V over the whole sequence of ``ring``'s group, for this rank's
    queries; ``q`` ``(n, heads, s/c, d)``, ``k`` and ``v`` ``(n, kv_heads, s/c, d)``, each the
    rank's two load-balanced chunks in order (``runtime.model.context_parallel``)."""
    return _RingAttention.apply(q, k, v, ring)

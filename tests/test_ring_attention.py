"""Ring attention's pieces in one process: the online-softmax merge, the causal masks per chunk
pair, Megatron-LM's load-balanced cut, and the whole function on a ring of one against
``torch.softmax`` attention (forward and backward, fp32)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from runtime.model.context_parallel import sequence_positions  # noqa: E402
from runtime.model.ring_attention import Ring, chunk_mask, merge, ring_attention  # noqa: E402


def _softmax_attention(q, k, v, causal=True):
    """softmax(QKᵀ/√d)·V written out, the causal mask j ≤ i."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def test_merging_two_blocks_is_the_softmax_over_their_union():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    scores = q @ k.transpose(-2, -1)  # 5 keys: blocks of 2 and 3
    parts = []
    for block in (slice(0, 2), slice(2, 5)):
        lse = torch.logsumexp(scores[..., block], dim=-1)
        parts.append((torch.softmax(scores[..., block], dim=-1) @ v[..., block, :], lse))
    start = (torch.zeros_like(parts[0][0]), torch.full(parts[0][1].shape, float("-inf"), dtype=torch.float64))
    out, lse = merge(*merge(*start, *parts[0]), *parts[1])
    assert torch.allclose(out, torch.softmax(scores, dim=-1) @ v, atol=1e-12)
    assert torch.allclose(lse, torch.logsumexp(scores, dim=-1), atol=1e-12)


def test_a_chunk_sees_earlier_chunks_whole_its_own_causally_and_no_later_one():
    assert [chunk_mask(2, b) for b in range(4)] == ["full", "full", "causal", None]


def test_the_load_balanced_cut_gives_rank_r_chunks_r_and_2c_minus_1_minus_r():
    # seq 16, c = 2: chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert sequence_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert sequence_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    # every rank attends over as many causal (query, key) pairs: (sum of positions + s/c) alike
    sums = [int(sequence_positions(24, 3, r).sum()) for r in range(3)]
    assert sums == [sums[0]] * 3


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_a_ring_of_one_is_causal_softmax_attention_forward_and_backward(kv_heads):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 8, 6, generator=g, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, 8, 6, generator=g, requires_grad=True) for _ in range(2))
    out = ring_attention(q, k, v, Ring(ranks=(0,), index=0))
    groups = 4 // kv_heads
    expected = _softmax_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1))
    assert torch.allclose(out, expected, atol=1e-6)
    grad = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-5)


def test_ring_attention_keeps_q_k_v_its_output_and_one_log_sum_exp_per_row_not_the_scores():
    # what the backward needs, written out: q, k, v and the output (n·heads·s·d fp32 each, k and v
    # with the key/value heads), the log-sum-exp (n·heads·s fp32); an s × s tensor would be 8·8 per head
    from runtime.measure.memory import SavedTensorMeter

    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 8, 6, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, 8, 6, generator=g, requires_grad=True) for _ in range(2))
    meter = SavedTensorMeter()
    with meter.watching():
        out = ring_attention(q, k, v, Ring(ranks=(0,), index=0))
    assert meter.current_bytes == 4 * (2 * 4 * 8 * 6 * 2 + 2 * 2 * 8 * 6 * 2 + 2 * 4 * 8)
    out.sum().backward()  # the backward frees them
    assert meter.current_bytes == 0

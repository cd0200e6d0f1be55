"""The interleaved generator runs Megatron-LM's interleaved 1F1B order, the code SC21's runs used.

NVIDIA/Megatron-LM ``megatron/schedules.py`` at 6fd7818 (2021-04-03),
``forward_backward_pipelining_with_interleaving``: rank r of p with v model chunks and m
micro-batches runs ``W = min((p − r − 1)·2 + (v − 1)·p, m·v)`` forwards (all m·v when m = p),
then ``m·v − W`` steady steps of one forward then one backward, then the remaining backwards.
Its k-th forward is chunk ``(k mod p·v) div p`` (``get_model_chunk_id``), its k-th backward
chunk ``v − 1 −`` that, and each chunk takes its micro-batches in order; chunk c of rank r is
virtual stage ``c·p + r``. The reference below is that loop, written out. Every SC21 and
Korthikanti et al. 2022 interleaved scenario (``scenarios/published/``) has m ≠ p, where the
generator (torch's ``ScheduleInterleaved1F1B`` order, ``sim.schedule.looped.interleaved``) and
Megatron-LM agree; at m = p Megatron-LM runs every forward first and torch's order does not, so
that case is left out."""

from __future__ import annotations

import pytest

from sim.schedule import generate
from sim.schedule.ir import ActionKind


def _megatron_2021_order(p: int, v: int, m: int, r: int) -> list[str]:
    total = m * v
    warmup = total if m == p else min((p - r - 1) * 2 + (v - 1) * p, total)

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    next_mb = {("F", c): 0 for c in range(v)} | {("B", c): 0 for c in range(v)}

    def step(kind: str, k: int) -> str:
        c = chunk(k, kind == "F")
        mb = next_mb[(kind, c)]
        next_mb[(kind, c)] += 1
        return f"{c * p + r}{kind}{mb}"

    order = [step("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [step("F", k + warmup), step("B", k)]
    order += [step("B", k) for k in range(total - warmup, total)]
    return order


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 28), (12, 4, 24), (8, 2, 48),
                                           (5, 3, 10), (3, 4, 9),
                                           (12, 4, 96), (35, 3, 280), (8, 3, 64)])
def test_interleaved_is_megatron_2021_order(p: int, v: int, m: int) -> None:
    schedule = generate("interleaved", p, m, chunks=v)
    for r, actions in enumerate(schedule.ranks):
        ours = [str(a) for a in actions if a.kind in (ActionKind.F, ActionKind.B)]
        assert ours == _megatron_2021_order(p, v, m, r), f"rank {r}"


def test_the_reference_reproduces_the_small_example() -> None:
    # test_generators.test_interleaved_small_example, rank 0 of 2 with 2 chunks and 4 micro-batches:
    # W = (2 − 0 − 1)·2 + (2 − 1)·2 = 4 forwards, then 4 steady (F, B) steps, then 4 backwards
    assert " ".join(_megatron_2021_order(2, 2, 4, 0)) == "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3"

"""Compiling at scale does no per-pair work: split-concat pairs only overlapping replicas.

No test here measures time; each would run for minutes (or hours) if the work were quadratic
again, and checks the result against a brute-force reference on small inputs.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import synthetic_scenario
from sim.cost.split import sample_overlaps, sample_ranges
from sim.engine.compile import compile_workload
from sim.engine.flows import p2p_flows


def _every_pair(microbatch_size, senders, receivers):
    """The definition: every sender against every receiver, the non-empty overlaps kept."""
    send, recv = sample_ranges(microbatch_size, senders), sample_ranges(microbatch_size, receivers)
    return [(s, r, max(a0, b0), min(a1, b1)) for s, (a0, a1) in send.items() for r, (b0, b1) in recv.items()
            if min(a1, b1) > max(a0, b0)]


@settings(max_examples=200, deadline=None)
@given(microbatch_size=st.integers(1, 60), senders=st.integers(1, 40), receivers=st.integers(1, 40))
def test_sample_overlaps_is_every_overlapping_pair_in_order(microbatch_size, senders, receivers):
    a, b = tuple(range(100, 100 + senders)), tuple(range(7, 7 + 3 * receivers, 3))
    assert sample_overlaps(microbatch_size, a, b) == _every_pair(microbatch_size, a, b)


def test_sample_overlaps_of_32768_replicas_is_a_merge():
    """2 x 32,768 replicas: 32,768 pairs, not 10^9 comparisons."""
    n = 32768
    pairs = sample_overlaps(2 * n, tuple(range(n)), tuple(range(n, 2 * n)))
    assert pairs == [(i, n + i, 2 * i, 2 * i + 2) for i in range(n)]
    uneven = sample_overlaps(3 * n, tuple(range(n)), tuple(range(n, n + 3 * n // 4)))
    assert len(uneven) < 2 * n and {src for src, *_ in uneven} == set(range(n))


def test_two_stages_of_4096_replicas_compile_to_one_class_each():
    scenario = synthetic_scenario(fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0], replicas=[4096, 4096], microbatches=2,
                                  boundary_bytes=1e6)
    assert len(p2p_flows(scenario.plan, scenario.model, scenario.training.microbatch_size)) == 2 * 4096
    assert len(compile_workload(scenario).classes) == 2

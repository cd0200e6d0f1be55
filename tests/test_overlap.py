"""Overlapped collectives (``plan.overlap``, ``plan.fsdp``) on every replay, against closed forms.

The closed forms are ``sim.cost.overlap``'s, written out here: a bucketed gradient reduction
ends ``max(B/K + C, B + C/K)`` after its backward starts; an action pipelined with its
collective in U pieces takes ``max(G/U + A, G + A/U)``. Each case runs on the rule book's
worked example (``tests/test_rules.py``: stage 0's B0 runs 9–12 s) and must give one timeline
on every replay (SimPy with and without contention, synchronous, fast path, vectorised).
"""

from __future__ import annotations

import dataclasses

import pytest
from test_rules import EXAMPLE, _assert_all, _example, _replays, _timeline, _with_group, _with_ops

from conftest import synthetic_scenario
from sim.core.overlap import FsdpSpec, OverlapSpec
from sim.core.parallelism import Sharding
from sim.cost import overlap
from sim.engine import rules
from sim.engine.compile import compile_workload
from sim.engine.exposure import exposure_s, union
from sim.engine.replay import simulate
from sim.engine.workload import COMPUTE, DETACHED_S, REDUCE, Collective


def _bucketed(reduce_s: float, buckets: int):
    """The example with stage 0's gradients reduced (``reduce_s`` alone) in ``buckets`` during B0."""
    w = _example()
    ops = list(w.classes[0].ops)
    assert ops[3].text == "0B0" and ops[4].code == REDUCE
    ops[4] = ops[4]._replace(collective=0, source=3, buckets=buckets, tail_s=reduce_s / buckets)
    return _with_ops(w, 0, ops, collectives=(
        Collective(index=0, stage=0, participants=(0,), phases=(((), reduce_s),), bytes=0.0),))


def test_the_closed_forms():
    assert overlap.bucket_count(100.0, 25.0) == 4 and overlap.bucket_count(101.0, 25.0) == 5
    assert overlap.bucket_count(0.0, 25.0) == 1
    assert overlap.unit_count(80, 1) == 80 and overlap.unit_count(5, 2) == 3
    assert overlap.bucketed_reduce_end_s(3.0, 1.5, 3) == 3.0 + 0.5  # hidden: B + C/K
    assert overlap.bucketed_reduce_end_s(3.0, 6.0, 3) == 1.0 + 6.0  # link-bound: B/K + C
    assert overlap.pipelined_s(4.0, 2.0, 4) == 4.0 + 0.5  # G + A/U
    assert overlap.pipelined_s(1.0, 2.0, 4) == 0.25 + 2.0  # G/U + A
    # tensor parallelism's exposed time, max(c - g, 0) + min(c, g)/t
    assert overlap.exposed_pipelined_s(4.0, 2.0, 4) == 2.0 + 2.0 / 4
    assert overlap.exposed_pipelined_s(1.0, 2.0, 4) == 1.0 / 4


def test_a_bucketed_reduction_hidden_behind_a_long_enough_backward():
    # B0 runs 9-12 (B = 3), K = 3, C = 1.5: the reduction starts at 9 + B/K = 10, and the
    # optimizer waits only for the last bucket after the backward: 12 + C/K = 12.5
    timeline = EXAMPLE[:4] + [("0REDUCE_GRAD", 10.0, 12.5)] + EXAMPLE[5:]
    assert 9.0 + overlap.bucketed_reduce_end_s(3.0, 1.5, 3) == 12.5
    _assert_all(_bucketed(1.5, 3), timeline + [("optimizer", 12.5, 12.5), ("optimizer", 8.0, 8.0)])


def test_a_communication_bound_bucketed_reduction():
    # C = 6 > B: it ends at B_start + B/K + C = 9 + 1 + 6 = 16
    timeline = EXAMPLE[:4] + [("0REDUCE_GRAD", 10.0, 16.0)] + EXAMPLE[5:]
    assert 9.0 + overlap.bucketed_reduce_end_s(3.0, 6.0, 3) == 16.0
    _assert_all(_bucketed(6.0, 3), timeline + [("optimizer", 16.0, 16.0), ("optimizer", 8.0, 8.0)])


def _pipelined(gather_s: float, pieces: int):
    """The example with a ``gather_s`` collective before F0 (2 s) pipelined in ``pieces``."""
    w = _with_group(overlap=True)
    ops = list(w.classes[0].ops)
    ops[0] = ops[0]._replace(lead_s=gather_s / pieces, tail_s=2.0 / pieces)
    groups = (Collective(index=0, stage=0, participants=(0,), phases=(((), gather_s),), bytes=0.0),)
    return _with_ops(w, 0, ops, group_collectives=groups)


@pytest.mark.parametrize("gather_s, start, end", [(4.0, 1.0, 4.5), (1.0, 0.25, 2.25)])
def test_fsdp_by_unit_and_overlapped_tensor_parallelism(gather_s, start, end):
    # G = 4, A = 2, U = 4: F0 starts after one unit (1) and ends G + A/U = 4.5;
    # G = 1: after one unit (0.25), ending G/U + A = 2.25
    assert end == (start + 2.0 if gather_s < 2.0 else gather_s + 0.5)
    assert overlap.pipelined_s(gather_s, 2.0, 4) == end
    shift = end - 2.0
    later = [(n, 0.0 if n == "1RECV_F0" else s + shift, e + shift) for n, s, e in EXAMPLE]
    timeline = [("0G0", 0.0, gather_s), ("0F0", start, end)] + later[1:]
    optimizer = [("optimizer", 12.0 + shift, 12.0 + shift), ("optimizer", 8.0 + shift, 8.0 + shift)]
    _assert_all(_pipelined(gather_s, 4), timeline + optimizer)


# --- compiled plans -----------------------------------------------------------------------------


def _data_parallel(microbatches: int = 1, **plan_fields):
    """One stage on two replicas (1 sample each): F 1 s, B 2 s, 4 MB of parameters."""
    scenario = synthetic_scenario(fwd_s=[1.0], bwd_s=[2.0], replicas=[2], microbatches=microbatches,
                                  param_bytes=4e6, intra_bandwidth=4e6, stash_bytes=0.0)
    return dataclasses.replace(scenario, plan=dataclasses.replace(scenario.plan, **plan_fields))


def _all_replays_agree(workload):
    timelines = {name: _timeline(workload, records) for name, records in _replays(workload).items()}
    first = timelines["fast"]
    assert all(t == first for t in timelines.values()), timelines
    return first


def test_a_compiled_bucketed_reduction_equals_the_closed_form():
    w = compile_workload(_data_parallel(overlap=OverlapSpec(grad_reduce=True, bucket_bytes=1e6)))
    ops = w.classes[0].ops
    reduce = next(op for op in ops if op.code == REDUCE)
    backward = ops[reduce.source]
    assert backward.text == "0B0" and reduce.buckets == 4
    timeline = dict((name, (s, e)) for name, s, e in _all_replays_agree(w))
    c = rules.collective_alone_s(w.kinds, w.collectives[0])
    assert c > 0.5  # comparable to the backward: neither case trivially
    b_start, b_end = timeline["0B0"]
    assert b_end - b_start == 2.0
    assert timeline["optimizer"][0] == pytest.approx(b_start + overlap.bucketed_reduce_end_s(2.0, c, 4))


def test_every_microbatch_reduce_scatters_each_backward():
    plan = dict(sharding=Sharding.GRADIENTS)
    every = compile_workload(_data_parallel(4, **plan))
    once = compile_workload(_data_parallel(4, **plan, fsdp=FsdpSpec(reduce_every_microbatch=False)))
    reduces = [op for op in every.classes[0].ops if op.code == REDUCE]
    # four reduce-scatters, one after each backward, and ZeRO-2's all-gather at the end
    assert [op.microbatch for op in reduces] == [0, 1, 2, 3, None]
    assert [op.code for op in once.classes[0].ops].count(REDUCE) == 1

    def flow_bytes(w):
        return sum(k.bytes for k in w.kinds if k.label[0] == "AR")
    # each is half the all-reduce's traffic (a reduce-scatter, or the all-gather): 5/2 of it in all
    assert flow_bytes(every) == flow_bytes(once) / 2
    _all_replays_agree(every)
    full = compile_workload(_data_parallel(4, sharding=Sharding.FULL))
    assert [op.microbatch for op in full.classes[0].ops if op.code == REDUCE] == [0, 1, 2, 3]  # no all-gather
    # one micro-batch: reduced once, as before
    assert [op.code for op in compile_workload(_data_parallel(1, **plan)).classes[0].ops].count(REDUCE) == 1


def test_bucketed_every_microbatch_reduce_scatters_start_inside_their_backward():
    w = compile_workload(_data_parallel(2, sharding=Sharding.FULL,
                                        overlap=OverlapSpec(grad_reduce=True, bucket_bytes=1e6)))
    ops = w.classes[0].ops
    times = dict((name, (s, e)) for name, s, e in _all_replays_agree(w))
    for op in ops:
        if op.code == REDUCE:
            b = ops[op.source]
            assert b.code == COMPUTE and b.microbatch == op.microbatch
            assert times[op.text][0] == pytest.approx(times[b.text][0] + 2.0 / op.buckets)


@pytest.mark.parametrize("sharding", [Sharding.OPTIMIZER, Sharding.GRADIENTS])
def test_param_gather_runs_beside_the_first_forward(sharding):
    """``plan.overlap.param_gather`` (ZeRO-1/2): the REDUCE keeps only the reduce-scatter and the
    all-gather runs beside each stage's first forward in K buckets: F0 ends
    max(AG/K + F, AG + F/K) after the gather starts (F = 1 s here)."""
    flags = dict(sharding=sharding, overlap=OverlapSpec(param_gather=True, bucket_bytes=1e6))
    w = compile_workload(_data_parallel(2, **flags))
    off = compile_workload(_data_parallel(2, sharding=sharding, fsdp=FsdpSpec(reduce_every_microbatch=False)))
    ops = w.classes[0].ops
    gathers = [op for op in ops if op.text.startswith("0PARAM_GATHER")]
    assert len(gathers) == 1 and gathers[0].overlap and ops[ops.index(gathers[0]) + 1].text == "0F0"
    g = rules.collective_alone_s(w.kinds, w.group_collectives[w.classes[0].groups[gathers[0].collective]])
    buckets = 4  # 4 MB of gradients in 1 MB buckets
    assert gathers[0].lead_s == pytest.approx(g / buckets) and gathers[0].tail_s == 1.0 / buckets
    # the all-gather moves the reduce-scatter's bytes, which is half the all-reduce's
    reduce_bytes = sum(k.bytes for k in off.kinds if k.label[0] == "AR")
    assert sum(k.bytes for k in w.kinds if k.label[0] == "PG") == pytest.approx(reduce_bytes / 2)
    times = dict((name, (s, e)) for name, s, e in _all_replays_agree(w))
    start = times[gathers[0].text][0]
    assert times["0F0"][1] - start == pytest.approx(overlap.pipelined_s(g, 1.0, buckets))
    assert times["0F0"][1] - start == pytest.approx(max(g / buckets + 1.0, g + 1.0 / buckets))
    assert "0F1" in times and not any(name.startswith("0PARAM_GATHER1") for name in times)  # first forward only


@pytest.mark.parametrize("sharding", [Sharding.OPTIMIZER, Sharding.GRADIENTS])
@pytest.mark.parametrize("microbatches", [1, 3])
def test_param_gather_is_never_slower(sharding, microbatches):
    """With the gather beside the first forward an iteration is at most as long as with it
    after the reduce-scatter, for a data-parallel plan (shorter when the reduction was not
    bucketed: the forward hides most of the gather)."""
    def iteration(**overlap_fields):
        scenario = _data_parallel(microbatches, sharding=sharding, overlap=OverlapSpec(**overlap_fields))
        return _summary(compile_workload(scenario)).iteration_time_s
    for grad_reduce in (False, True):
        on = iteration(param_gather=True, grad_reduce=grad_reduce, bucket_bytes=1e6)
        off = iteration(param_gather=False, grad_reduce=grad_reduce, bucket_bytes=1e6)
        assert on <= off * (1 + 1e-12)
        if not grad_reduce:  # the all-gather after the last backward was all exposed
            assert on < off


def test_interleaved_param_gather_runs_a_chunk_ahead():
    """Megatron-Core's interleaved schedule (core_v0.9.0 ``schedules.py``: "launch param
    synchronization for next model chunk") gathers a device's next chunk beside its previous
    chunk's first forward: on rank 0 (stages 0 and 2) both gathers run beside 0F0, stage 0's
    pipelined in its 4 buckets (0F0 still ends max(AG/K + F, AG + F/K) after it starts), stage
    2's detached; 2F0 then waits only for its input and the compute stream."""
    scenario = synthetic_scenario(fwd_s=[1.0] * 4, bwd_s=[2.0] * 4, replicas=[2, 2], ranks=[0, 1, 0, 1],
                                  schedule="interleaved", params={"chunks": 2}, microbatches=2,
                                  param_bytes=4e6, intra_bandwidth=4e6, stash_bytes=0.0)
    w = compile_workload(dataclasses.replace(scenario, plan=dataclasses.replace(
        scenario.plan, sharding=Sharding.OPTIMIZER, overlap=OverlapSpec(param_gather=True, bucket_bytes=1e6))))
    ops = w.classes[0].ops
    texts = [op.text for op in ops]
    first = texts.index("0F0")
    own, ahead = ops[first - 2], ops[first - 1]
    assert (own.text, ahead.text) == ("0PARAM_GATHER0", "2PARAM_GATHER0") and own.overlap and ahead.overlap
    g = rules.collective_alone_s(w.kinds, w.group_collectives[w.classes[0].groups[own.collective]])
    assert own.lead_s == pytest.approx(g / 4) and own.tail_s == 1.0 / 4
    assert ahead.lead_s == 0.0 and ahead.tail_s == DETACHED_S
    assert [t for t in texts if "PARAM_GATHER" in t] == ["0PARAM_GATHER0", "2PARAM_GATHER0"]
    timelines = {name: _timeline(w, records) for name, records in _replays(w).items()}
    alone = [timelines[name] for name in ("simpy-nc", "vector", "fast")]
    shared = [timelines[name] for name in ("simpy", "synchronous")]  # the two gathers share one link
    assert all(t == alone[0] for t in alone) and all(t == shared[0] for t in shared)
    before = texts[:texts.index("2F0")]
    for timeline, gather_s in ((alone[0], g), (shared[0], 2 * g)):
        times = dict((name, (s, e)) for name, s, e in timeline)
        start = times["0PARAM_GATHER0"][0]
        assert times["2PARAM_GATHER0"][1] - start == pytest.approx(gather_s)
        assert times["0F0"][1] - start == pytest.approx(max(gather_s / 4 + 1.0, gather_s + 1.0 / 4))
        stream_free = max(times[t][1] for t, op in zip(before, ops) if op.code == COMPUTE)
        assert times["2F0"][0] == pytest.approx(max(stream_free, times["2RECV_F0"][1]))


def test_param_gather_needs_zero_1_or_2():
    for sharding in (Sharding.NONE, Sharding.FULL):
        w = compile_workload(_data_parallel(2, sharding=sharding, overlap=OverlapSpec(param_gather=True)))
        assert not any(op.text.startswith("0PARAM_GATHER") for op in w.classes[0].ops)
        assert not any(k.label[0] == "PG" for k in w.kinds)


# --- exposed communication ------------------------------------------------------------------------


def test_exposure_of_intervals():
    assert union([(3.0, 4.0), (0.0, 2.0), (1.0, 2.5), (5.0, 5.0)]) == [(0.0, 2.5), (3.0, 4.0)]
    # 3.5 s of communication, 1.5 s of it under compute (1-2, 3-3.5)
    assert exposure_s([(0.0, 2.5), (3.0, 4.0)], [(1.0, 2.0), (3.0, 3.5)]) == (3.5, 2.0)


def _summary(workload):
    return simulate(workload, contention=False).summarize()


def test_exposed_communication_is_zero_when_hidden_and_c_when_nothing_overlaps():
    # hidden: C = 1.5 in 3 buckets under B0 (9-12): runs 10-12.5, of which 12-12.5 is exposed (C/K)
    device = _summary(_bucketed(1.5, 3)).device(0)
    assert device.communication_s == 2.5 and device.exposed_communication_s == 0.5
    assert device.overlap_fraction == 1 - 0.5 / 2.5
    # a ring-like collective (no lead, no tail) of 1 s beside F0's 2 s is wholly hidden; 4 s is not
    hidden = _with_group(overlap=True)
    hidden = dataclasses.replace(hidden, group_collectives=(
        Collective(index=0, stage=0, participants=(0,), phases=(((), 1.0),), bytes=0.0),))
    device = _summary(hidden).device(0)
    assert device.communication_s == 1.0 and device.exposed_communication_s == 0.0
    assert device.overlap_fraction == 1.0
    device = _summary(_with_group(overlap=True)).device(0)
    assert device.communication_s == 4.0 and device.exposed_communication_s == 2.0  # F0 busy 0-2 of 0-4
    w = _example()
    ops = list(w.classes[0].ops)
    ops[4] = ops[4]._replace(collective=0)  # not bucketed: C = 1.5 after B0, nothing beside it
    plain = _with_ops(w, 0, ops, collectives=(
        Collective(index=0, stage=0, participants=(0,), phases=(((), 1.5),), bytes=0.0),))
    summary = _summary(plain)
    assert summary.device(0).exposed_communication_s == 1.5 and summary.device(0).overlap_fraction == 0.0
    assert summary.exposed_communication_s == 1.5  # the worst device
    assert summary.to_json()["devices"][0]["exposed_communication_s"] == 1.5

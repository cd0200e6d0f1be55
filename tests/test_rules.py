"""The rule book (``sim.engine.rules``) as a specification: each rule alone, then on every replay.

Tiny workloads, exact timelines: a two-stage pipeline with one micro-batch, F 2 s and B 3 s
per stage, 10 bytes stashed per F and a 4-byte boundary over a 4 B/s link (1 s a flow), the
docstring's worked example. Every replay (SimPy on its own clock with and without contention,
the synchronous SimPy replay, the fast path and its vectorised form) must give the same
``(op, start, end)`` list and the same memory events.
"""

from __future__ import annotations

import dataclasses

from conftest import synthetic_scenario
from sim.engine import rules
from sim.engine.compile import compile_workload
from sim.engine.fastpath import _PlanState
from sim.engine.replay import simulate
from sim.engine.vector import vector_records
from sim.engine.workload import COMPUTE, GROUP, RECV, REDUCE, SEND, Collective, Op
from sim.schedule.ir import ActionKind

A, BUF = rules.ACTIVATIONS, rules.BUFFERS


def _op(code=COMPUTE, **fields) -> Op:
    return Op(code=code, text="x", stage=0, kind=ActionKind.F, microbatch=0, **fields)


# --- each rule alone -----------------------------------------------------------------------------


def test_every_code_has_one_rule_and_only_compute_ops_touch_memory():
    assert sorted(rules.RULES) == [COMPUTE, SEND, RECV, REDUCE, GROUP]
    assert [rules.RULES[c].stream for c in (COMPUTE, SEND, RECV, REDUCE, GROUP)] == \
        ["compute", "send", "compute", "collective", "group"]
    assert [c for c, rule in rules.RULES.items() if rule.memory] == [COMPUTE]
    full = dict(alloc_bytes=1.0, free_bytes=1.0, buffer_bytes=1.0, gather_bytes=1.0)
    assert rules.memory_events(_op(SEND, **full)) == ((), ())


def test_which_ops_hold_the_compute_stream():
    assert rules.blocks_compute(_op(COMPUTE))
    assert rules.blocks_compute(_op(RECV))
    assert not rules.blocks_compute(_op(SEND, duration_s=1.0))  # only its issue cost
    assert not rules.blocks_compute(_op(REDUCE))
    assert rules.blocks_compute(_op(GROUP, overlap=False))  # Megatron's all-reduce
    assert not rules.blocks_compute(_op(GROUP, overlap=True))  # ring attention, FSDP's gathers


def test_memory_alloc_at_start_frees_at_end_and_gathers_only_while_it_runs():
    op = _op(alloc_bytes=2.0, free_bytes=1.0, buffer_bytes=3.0, gather_bytes=5.0)
    assert rules.memory_events(op) == (((A, 2.0), (BUF, 5.0)), ((BUF, -5.0), (A, -1.0), (BUF, -3.0)))
    # held before: 1 byte of stash, 3 of received input; after: its own 2 of stash, nothing gathered
    assert rules.memory_after(op, (1.0, 3.0)) == (2.0, 0.0)
    assert rules.memory_after(_op(alloc_bytes=10.0), (0.0, 0.0)) == (10.0, 0.0)  # F0 of the example


def test_time_rules():
    assert rules.stretched_s(2.0, 1.0, 1.5, 1.0) == 3.0  # starts when the device has slowed
    assert rules.stretched_s(2.0, 0.5, 1.5, 1.0) == 2.0  # starts before
    assert rules.compute_end(1.0, 2.0) == 3.0
    assert rules.compute_end(1.0, 2.0, 5.0) == 5.0  # an overlapped collective ends after it
    assert rules.compute_end(1.0, 2.0, 2.5) == 3.0
    assert rules.send_start_s(2.0, 3.0) == 3.0  # the SEND before it has not left yet
    assert rules.recv_end_s(2.0, 9.0, 0.5) == 9.5  # its data arrives late
    assert rules.recv_end_s(2.0, 1.0, 0.5) == 2.5  # already in
    assert rules.after_group(1.0, 0.0, 4.0, True) == (1.0, 4.0)
    assert rules.after_group(1.0, 0.0, 4.0, False) == (4.0, 0.0)
    assert rules.collective_times([1.0, 3.0], 2.0) == (3.0, 5.0)  # the last issue starts it
    assert rules.collective_times([1.0, 3.0], 2.0, [4.0, 0.0]) == (4.0, 6.0)  # the previous all-reduce
    assert rules.optimizer_start_s(5.0, 7.0) == 7.0


# --- on every replay -----------------------------------------------------------------------------


def _example(**kw):
    scenario = synthetic_scenario(fwd_s=[2.0, 2.0], bwd_s=[3.0, 3.0], microbatches=1, microbatch_size=1,
                                  boundary_bytes=4.0, intra_bandwidth=4.0, stash_bytes=10.0, **kw)
    return compile_workload(scenario)


def _replays(workload) -> dict[str, list]:
    """Each replay's records, one ``Recorder`` per class."""
    out = {
        "simpy": simulate(workload).records,
        "simpy-nc": simulate(workload, contention=False).records,
        "synchronous": simulate(workload, run_ahead=False).records,
        "vector": vector_records(workload),
    }
    state = _PlanState(workload)
    state.run()
    out["fast"] = state.records
    return out


def _timeline(workload, records) -> list[tuple]:
    """``(op, start, end)`` of every op of every class, then the optimizer steps."""
    rows = [(op.text, *rec.op_times[i]) for cls, rec in zip(workload.classes, records) for i, op in enumerate(cls.ops)]
    return rows + [("optimizer", *rec.optimizer) for rec in records]


def _ledgers(records) -> list[tuple]:
    """Each class's memory events, sorted: ``(activations, buffers)`` of ``(time, delta)``."""
    return [(sorted(zip(map(float, r.memory.times), map(float, r.memory.deltas))),
             sorted(zip(map(float, r.buffers.times), map(float, r.buffers.deltas)))) for r in records]


def _with_ops(workload, c: int, ops: list[Op], **fields):
    """``workload`` with class ``c`` running ``ops`` (durations their own ``duration_s``)."""
    classes = list(workload.classes)
    classes[c] = dataclasses.replace(classes[c], ops=tuple(ops), durations=[op.duration_s for op in ops])
    return dataclasses.replace(workload, classes=tuple(classes), **fields)


def _assert_all(workload, timeline, ledgers=None):
    for name, records in _replays(workload).items():
        assert _timeline(workload, records) == timeline, name
        if ledgers is not None:
            assert _ledgers(records) == ledgers, name


EXAMPLE = [
    # stage 0: F0, its activations leave (1 s on the send stream), it waits for B0's gradient
    ("0F0", 0.0, 2.0), ("0SEND_F0", 2.0, 3.0), ("0RECV_B0", 2.0, 9.0), ("0B0", 9.0, 12.0),
    ("0REDUCE_GRAD", 12.0, 12.0),
    # stage 1: waits for F0's activations (in at 3), runs F0 and B0, sends the gradient back
    ("1RECV_F0", 0.0, 3.0), ("1F0", 3.0, 5.0), ("1B0", 5.0, 8.0), ("1SEND_B0", 8.0, 9.0),
    ("1REDUCE_GRAD", 8.0, 8.0),
]


def test_the_worked_example_on_every_replay():
    w = _example()
    optimizer = [("optimizer", 12.0, 12.0), ("optimizer", 8.0, 8.0)]  # sgd over no parameters: 0 s
    ledgers = [
        ([(0.0, 10.0), (12.0, -10.0)], [(9.0, 4.0), (12.0, -4.0)]),  # the gradient in at 9, freed by B0
        ([(3.0, 10.0), (8.0, -10.0)], [(3.0, 4.0), (5.0, -4.0)]),  # the activations in at 3, freed by F0
    ]
    _assert_all(w, EXAMPLE + optimizer, ledgers)


def test_a_late_recv_waits_then_pays_its_receive_cost():
    # taking the gradient in costs stage 0 half a second once it has arrived at 9
    w = _example()
    ops = list(w.classes[0].ops)
    ops[2] = ops[2]._replace(duration_s=0.5)
    timeline = [("0F0", 0.0, 2.0), ("0SEND_F0", 2.0, 3.0), ("0RECV_B0", 2.0, 9.5), ("0B0", 9.5, 12.5),
                ("0REDUCE_GRAD", 12.5, 12.5)] + EXAMPLE[5:]
    _assert_all(_with_ops(w, 0, ops), timeline + [("optimizer", 12.5, 12.5), ("optimizer", 8.0, 8.0)])


def _with_group(overlap: bool, gather_bytes: float = 0.0):
    """The example with stage 0 joining a 4 s collective of its own group before F0."""
    w = _example()
    ops = list(w.classes[0].ops)
    group = Op(code=GROUP, text="0G0", stage=0, kind=ActionKind.F, microbatch=0, collective=0, overlap=overlap)
    ops = [group, ops[0]._replace(gather_bytes=gather_bytes)] + ops[1:]
    w = _with_ops(w, 0, ops, group_collectives=(
        Collective(index=0, stage=0, participants=(0,), phases=(((), 4.0),), bytes=0.0),))
    classes = list(w.classes)
    classes[0] = dataclasses.replace(classes[0], groups=(0,))
    return dataclasses.replace(w, classes=tuple(classes))


def _later(by: float) -> list:
    """The example's times ``by`` seconds later, but for stage 1 reaching its RECV_F0 at 0."""
    return [(n, 0.0 if n == "1RECV_F0" else s + by, e + by) for n, s, e in EXAMPLE]


def test_an_overlapped_group_collective_that_ends_after_its_compute_delays_the_next_op():
    # the collective runs 0-4 beside F0 (2 s): F0 ends at 4, everything after it 2 s later
    timeline = [("0G0", 0.0, 4.0), ("0F0", 0.0, 4.0)] + _later(2.0)[1:]
    _assert_all(_with_group(overlap=True), timeline + [("optimizer", 14.0, 14.0), ("optimizer", 10.0, 10.0)])


def test_a_blocking_group_collective_holds_the_compute_stream():
    # Megatron's all-reduce: F0 starts once it has ended, at 4
    timeline = [("0G0", 0.0, 4.0)] + _later(4.0)
    _assert_all(_with_group(overlap=False), timeline + [("optimizer", 16.0, 16.0), ("optimizer", 12.0, 12.0)])


def test_fsdp_gathered_parameters_are_held_only_while_their_action_runs():
    w = _with_group(overlap=True, gather_bytes=5.0)
    for name, records in _replays(w).items():
        activations, buffers = _ledgers(records)[0]
        assert buffers == [(0.0, 5.0), (4.0, -5.0), (11.0, 4.0), (14.0, -4.0)], name
        assert activations == [(0.0, 10.0), (14.0, -10.0)], name

"""The rule book: what each op of a compiled workload does to a device's streams and memory.

A compiled device class (``sim.engine.workload.DeviceClass``) is a list of ops, each with a
code (``COMPUTE``, ``SEND``, ``RECV``, ``REDUCE``, ``GROUP``). Four replays read them: the
SimPy replay with each device on its own clock (``sim.engine.replay``), the synchronous SimPy
replay device failures use (``sim.engine.synchronous``), the contention-free fast path
(``sim.engine.fastpath``) and its numpy form (``sim.engine.vector``). They differ in how they
wait (SimPy events, a ready list, arrays of clocks), not in what an op does: that is said once,
here, as a table of effects per code (:data:`RULES`) and small pure functions the replays call.

**Streams.** A device has a compute stream that runs its ops in list order, a send stream
(its SENDs' flows, one SEND after the other in issue order), a collective stream (its
gradient all-reduces, one after the other) and its group collectives (one action's
tensor-parallel, context-parallel or FSDP collective inside its replica's group):

* ``COMPUTE`` occupies the compute stream for its duration (:func:`stretched_s`: times the
  straggler factor when it starts at or after the device slows down); it ends no earlier than
  the overlapping group collectives issued before it (:func:`compute_end`);
* ``SEND`` puts its flows on the send stream: they leave when the stream is free
  (:func:`send_start_s`), each takes its bytes over its rate alone (:func:`flow_alone_s`) and
  arrives one latency later; the compute stream goes on at once, or after its issue cost
  (``duration_s``, a link that charges the sender, gloo on a CPU);
* ``RECV`` holds the compute stream until the last of its flows has arrived, then for its
  receive cost (``duration_s``) (:func:`recv_end_s`);
* ``GROUP`` joins one action's collective, which starts when the last member of the group
  has issued it (:func:`collective_times`); with ``overlap`` it runs beside the next compute
  op (ring attention, FSDP's prefetched gathers, overlapped tensor parallelism), otherwise the
  compute stream waits for it (Megatron's tensor-parallel all-reduces) (:func:`after_group`).
  An overlapped one pipelined with its compute carries two numbers (:func:`beside_bounds`):
  the compute starts no earlier than the collective's start plus ``lead_s`` (the first
  piece it needs) and ends no earlier than the collective's end plus ``tail_s`` (the last
  piece's compute), which gives ``sim.cost.overlap.pipelined_s`` exactly when alone;
* ``REDUCE`` issues the stage's gradient all-reduce (or reduce-scatter) without holding the
  compute stream; it starts when every replica has issued it and has finished its previous
  one (:func:`collective_times` with the collective stream's free times); the optimizer step
  waits for the compute stream and the last of them (:func:`optimizer_start_s`). In buckets
  (``source`` ≥ 0) it is issued when its backward's first bucket is full and ends no earlier
  than the latest participant's backward end plus its last bucket (``tail_s``)
  (:func:`reduce_issue_s`), which gives ``sim.cost.overlap.bucketed_reduce_end_s`` exactly
  when alone. Several REDUCE ops of one stage (a reduce-scatter per micro-batch) are told
  apart by their micro-batch.

**Memory.** Two ledgers per device, activations (the stash) and communication buffers. Only
compute ops change them (:data:`MEMORY`): ``alloc_bytes`` is allocated when the op starts;
``free_bytes`` (its stash) and ``buffer_bytes`` (the received input or gradient it consumes)
are freed when it ends; FSDP's ``gather_bytes`` are held only while it runs. Arriving flows
add their receive bytes to the buffer ledger when they arrive (the receive side posts its
buffers ahead, as ``batch_isend_irecv`` does). ``live_delta`` counts live micro-batches:
+1 at an F, −1 at the B or W that frees it (``sim.engine.memory.peak_live_microbatches``).

**A worked example** (``tests/test_rules.py`` replays it on every replay). Stage 0 of a
two-stage pipeline runs one micro-batch: ``F0`` (2 s, stashes 10 bytes), ``SEND_F0`` (its
4-byte activations over a 4 B/s link: 1 s alone, no latency), ``RECV_B0`` and ``B0`` (3 s,
frees the stash and the received gradient). Stage 1 gets the activations at 3 s, runs its F0
(3–5) and B0 (5–8) and sends the gradient back (8–9)::

    op        stream    start  end   activations      buffers
    F0        compute   0      2     +10 at 0
    SEND_F0   send      2      3                                  (compute goes on at 2)
    RECV_B0   compute   2      9                      +4 at 9     (the gradient arrives late)
    B0        compute   9      12    -10 at 12        -4 at 12

so :func:`memory_after` of ``F0`` from ``(0, 0)`` is ``(10, 0)`` and the device peaks at
14 bytes from 9 s to 12 s. Had ``RECV_B0`` a receive cost of 0.5 s, B0 would run 9.5–12.5;
had an overlapping 4 s group collective been issued before F0, F0 would end at 4.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sim.engine.workload import COMPUTE, GROUP, RECV, REDUCE, SEND, Op

__all__ = [
    "ACTIVATIONS",
    "BUFFERS",
    "MEMORY",
    "RULES",
    "Hold",
    "Rule",
    "after_group",
    "beside_bounds",
    "blocks_compute",
    "box_numbers",
    "collective_alone_s",
    "collective_duration_s",
    "collective_times",
    "compute_end",
    "flow_alone_s",
    "memory_after",
    "memory_events",
    "memory_plan",
    "optimizer_start_s",
    "recv_end_s",
    "reduce_issue_s",
    "send_start_s",
    "steps",
    "stretched_s",
]

ACTIVATIONS, BUFFERS = 0, 1
"""The two memory ledgers of a device: stashed activations, communication buffers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Hold:
    """Bytes an op's field holds in one ledger, from when to when."""

    field: str
    """The ``Op`` field that gives the bytes (``alloc_bytes``, ...)."""
    ledger: int
    """``ACTIVATIONS`` or ``BUFFERS``."""
    at_start: bool
    """Allocated when the op starts (else the bytes were allocated earlier: by an earlier op,
    or by an arriving flow)."""
    at_end: bool
    """Freed when the op ends (else a later op frees them)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """What ops of one code do."""

    code: int
    name: str
    stream: str
    """The stream it occupies: ``compute``, ``send``, ``collective`` or ``group``."""
    holds_compute: str
    """How long it holds the compute stream: ``duration`` (its time, and the overlapping
    collectives before it), ``issue`` (its issue cost only), ``arrival`` (until its flows are
    in, then its receive cost), ``unless-overlap`` (until its collective ends, unless it
    overlaps the next compute) or ``none``."""
    memory: tuple[Hold, ...] = ()
    """Its memory effects, in the order the replays record them in each ledger."""


MEMORY = (
    Hold(field="alloc_bytes", ledger=ACTIVATIONS, at_start=True, at_end=False),
    Hold(field="gather_bytes", ledger=BUFFERS, at_start=True, at_end=True),
    Hold(field="free_bytes", ledger=ACTIVATIONS, at_start=False, at_end=True),
    Hold(field="buffer_bytes", ledger=BUFFERS, at_start=False, at_end=True),
)
"""A compute op's memory effects (the only ops with any)."""

RULES = {
    COMPUTE: Rule(code=COMPUTE, name="COMPUTE", stream="compute", holds_compute="duration", memory=MEMORY),
    SEND: Rule(code=SEND, name="SEND", stream="send", holds_compute="issue"),
    RECV: Rule(code=RECV, name="RECV", stream="compute", holds_compute="arrival"),
    REDUCE: Rule(code=REDUCE, name="REDUCE", stream="collective", holds_compute="none"),
    GROUP: Rule(code=GROUP, name="GROUP", stream="group", holds_compute="unless-overlap"),
}
"""The rule of each op code."""


def blocks_compute(op: Op) -> bool:
    """Whether the compute stream waits for ``op`` to end (beyond an issue cost)."""
    hold = RULES[op.code].holds_compute
    return hold in ("duration", "arrival") or (hold == "unless-overlap" and not op.overlap)


# --- memory ------------------------------------------------------------------------------------

MemoryEvents = tuple[tuple[tuple[int, float], ...], tuple[tuple[int, float], ...]]
"""``(at start, at end)``: the ``(ledger, bytes delta)`` an op records at each end."""


def memory_events(op: Op) -> MemoryEvents:
    """What ``op`` records in each ledger when it starts and when it ends."""
    start, end = [], []
    for hold in RULES[op.code].memory:
        nbytes = getattr(op, hold.field)
        if nbytes:
            if hold.at_start:
                start.append((hold.ledger, nbytes))
            if hold.at_end:
                end.append((hold.ledger, -nbytes))
    return tuple(start), tuple(end)


def memory_plan(ops: Sequence[Op]) -> tuple[MemoryEvents, ...]:
    """:func:`memory_events` of each op, computed once per op list."""
    return tuple(memory_events(op) for op in ops)


def steps(ops: Sequence[Op]) -> tuple[tuple, ...]:
    """What the scalar replays' hot loops read of each op, bound once per op list (classes
    share theirs): ``(code, microbatch, flows, duration_s, alloc_bytes, gather_bytes,
    free_bytes, buffer_bytes)``. Unpacking one tuple costs less than reading an ``Op``'s fields
    by name one by one (a ``_tuplegetter`` call each) on a loop run millions of times.

    Those loops apply :data:`MEMORY` unrolled, field by field in its order (a loop over
    :func:`memory_events` per op costs them ~8%); ``tests/test_rules.py`` holds every replay's
    ledgers to :func:`memory_events`, so a rule changed here and not there fails it."""
    return tuple((op.code, op.microbatch, op.flows, op.duration_s, op.alloc_bytes, op.gather_bytes,
                  op.free_bytes, op.buffer_bytes) for op in ops)


def memory_after(op: Op, held: tuple[float, float]) -> tuple[float, float]:
    """Bytes held in each ledger ``(activations, buffers)`` once ``op`` has ended, from ``held``
    before it started (arriving flows apart)."""
    after = list(held)
    for events in memory_events(op):
        for ledger, delta in events:
            after[ledger] += delta
    return after[0], after[1]


# --- time ----------------------------------------------------------------------------------------


def stretched_s(duration_s: float, start_s: float, slowdown: float, slow_from_s: float) -> float:
    """An action's seconds on a straggler: ``slowdown`` times longer when it starts at or after
    ``slow_from_s`` (``DeviceClass.slowdown``; the replays skip the product when it is 1)."""
    return duration_s * slowdown if start_s >= slow_from_s else duration_s


def compute_end(start_s: float, duration_s: float, overlapped_end_s: float = 0.0) -> float:
    """A compute op's end: its duration after its start, and no earlier than the overlapping
    collectives issued before it (``overlapped_end_s``, their latest end; 0 for none)."""
    end = start_s + duration_s
    return overlapped_end_s if overlapped_end_s > end else end


def send_start_s(ready_s: float, stream_free_s: float) -> float:
    """When a SEND's flows leave: once issued and once the SENDs before it have left."""
    return stream_free_s if stream_free_s > ready_s else ready_s


def recv_end_s(ready_s: float, arrival_s: float, cost_s: float) -> float:
    """A RECV's end: once the compute stream reaches it and its last flow is in, plus its
    receive cost (``cost_s``, already stretched for a straggler at the later of the two)."""
    return (arrival_s if arrival_s > ready_s else ready_s) + cost_s


def after_group(clock_s: float, overlapped_end_s: float, end_s: float, overlap: bool) -> tuple[float, float]:
    """``(compute clock, latest overlapping end)`` after a GROUP op whose collective ends at
    ``end_s``: an overlapping one delays only the next compute op (:func:`compute_end`), a
    blocking one holds the compute stream until it ends."""
    if overlap:
        return clock_s, end_s if end_s > overlapped_end_s else overlapped_end_s
    return (end_s if end_s > clock_s else clock_s), overlapped_end_s


def beside_bounds(start_floor_s: float, end_floor_s: float, start_s: float, end_s: float,
                  lead_s: float, tail_s: float) -> tuple[float, float]:
    """``(earliest start, earliest end)`` of the next compute op after an overlapped GROUP op
    whose collective runs ``start_s``–``end_s``, from those the GROUP ops before it set: it
    starts ``lead_s`` after the collective does (when ``lead_s`` > 0) and ends ``tail_s``
    after it ends."""
    if lead_s > 0 and start_s + lead_s > start_floor_s:
        start_floor_s = start_s + lead_s
    end = end_s + tail_s
    return start_floor_s, end if end > end_floor_s else end_floor_s


def reduce_issue_s(clock_s: float, source_start_s: float, source_s: float, buckets: int, bucketed: bool) -> float:
    """When a REDUCE op is issued: when the compute stream reaches it, or, in buckets, when its
    backward (started at ``source_start_s``, ``source_s`` of compute) has filled the first of
    its ``buckets``."""
    return source_start_s + source_s / buckets if bucketed else clock_s


def collective_times(issued_s: Iterable[float], duration_s: float,
                     free_s: Iterable[float] = (), floor_s: float = -float("inf")) -> tuple[float, float]:
    """``(start, end)`` of a collective without contention: it starts when its last member has
    issued it and (an all-reduce) every member's collective stream is free (``free_s``); it
    ends no earlier than ``floor_s`` (a bucketed reduction: its last bucket after the last
    backward, :func:`reduce_issue_s`)."""
    start = max(max(issued_s), max(free_s, default=-float("inf")))
    end = start + duration_s
    return start, floor_s if floor_s > end else end


def optimizer_start_s(clock_s: float, collectives_free_s: float) -> float:
    """The optimizer step starts when the compute stream and the last all-reduce have ended."""
    return max(clock_s, collectives_free_s)


def flow_alone_s(kind) -> float:
    """Seconds one flow of ``kind`` (``FlowKind``) takes when nothing else shares its ports."""
    return kind.bytes / kind.static_rate_bytes_per_s if kind.bytes > 0 else 0.0


def collective_duration_s(workload, collective) -> float:
    """A collective alone: each phase lasts its slowest flow plus one latency per ring step."""
    return collective_alone_s(workload.kinds, collective)


def collective_alone_s(kinds, collective) -> float:
    """:func:`collective_duration_s` from the flow kinds alone (what the compiler has)."""
    total = 0.0
    for members, latency in collective.phases:
        total += max((flow_alone_s(kinds[k]) for k in members), default=0.0) + latency
    return total


def box_numbers(kinds, num_microbatches: int) -> tuple[list[int], int]:
    """Mailboxes as ints: per flow kind, ``box * num_microbatches`` (add a micro-batch to get
    the mailbox its flows arrive in and its RECV waits on; −1 for all-reduce kinds), and the
    number of boxes. A box is one (receiving class, direction, stage) (``sim.engine.workload.mailbox``)."""
    stride, boxes = max(num_microbatches, 1), {}
    numbers = [boxes.setdefault((k.dst_class, k.label[0], k.label[1]), len(boxes)) * stride
               if k.label[0] in ("F", "B") else -1 for k in kinds]
    return numbers, len(boxes)

"""Workload: what every device of a plan does and through which ports, ready to replay.

The engine (``sim.engine.replay``) and the fast path (``sim.engine.fastpath``) replay the same
thing, compiled once by ``sim.engine.compile.compile_workload``. This module holds its types:

* :class:`DeviceClass`: devices that run the same actions at the same times (replicas of a
  stage with the same slices and neighbours, ``sim.engine.symmetry``), with their
  :class:`Op` list: the lowered IR actions with what each costs in time and memory;
* :class:`FlowKind`: the real flows with one label between two device classes
  (split-concat activations and gradients, all-reduce phases; ``sim.engine.flows``), each
  crossing :class:`PortClass` es with a weight;
* :class:`Collective`: one stage's gradient all-reduce as phases of flow kinds
  (``sim.engine.collectives``), or one action's collective inside a replica's group: the
  tensor-parallel all-reduces (or sequence-parallel gathers and scatters) that block the
  compute stream, the context-parallel ring's key/value blocks and FSDP's parameter
  gathers that overlap it (``GROUP`` ops);
* :func:`mailbox`: where the replay counts a point-to-point flow's arrival, the one key both
  the sending and the receiving side use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sim.core.summary import Parallelism
from sim.cost.memory import StateBytes
from sim.schedule.ir import ActionKind, Schedule

__all__ = [
    "COMPUTE",
    "DETACHED_S",
    "SEND",
    "RECV",
    "REDUCE",
    "GROUP",
    "Collective",
    "DeviceClass",
    "FlowKind",
    "Op",
    "PortClass",
    "Workload",
    "mailbox",
    "recv_mailbox",
]

COMPUTE, SEND, RECV, REDUCE, GROUP = 0, 1, 2, 3, 4
"""Op codes: run on the compute stream, issue flows, wait for flows, join an all-reduce, join
a collective of the device's group for one action (blocking, or overlapping the next compute);
what each does is said once, in ``sim.engine.rules``."""
DETACHED_S = float("-inf")
"""``Op.tail_s`` of an overlapped GROUP op whose collective no compute op waits for: it runs
beside the compute (its flows share the links) and ends when it ends."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PortClass:
    """Ports that carry the same load at all times (one or more real ports)."""

    index: int
    name: str
    """``out``/``in`` (a GPU's intra-node port) or ``nic-out``/``nic-in``, with a member id."""
    bandwidth_bytes_per_s: float
    size: int
    """Number of real ports in the class."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowKind:
    """Real flows with the same label between the same two device classes."""

    index: int
    label: tuple
    """``("F", s)`` activations of stage s to s+1, ``("B", s)`` gradients of stage s to s−1,
    ``("AR", s, phase)`` an all-reduce phase of stage s."""
    src_class: int
    dst_class: int
    bytes: float
    """Bytes of one real flow (per micro-batch for point-to-point flows)."""
    latency_s: float
    ports: tuple[tuple[int, float], ...]
    """(port class, real flows of this kind on each port of that class)."""
    static_rate_bytes_per_s: float
    """Rate when only the operation it belongs to runs (no contention from others)."""
    send_bytes_per_device: float
    recv_bytes_per_device: float
    issue_s: float = 0.0
    """Seconds the flows of this kind hold up each sending device's compute stream
    (``LinkSpec.send_issue_s`` of each real flow it sends)."""
    receive_s: float = 0.0
    """Seconds the flows of this kind cost each receiving device's compute stream
    (``LinkSpec.recv_overhead_s`` per real flow it receives)."""
    sibling: int = -1
    """Kinds with one sibling id are the flows of one label between two classes that cross
    different port classes (``sim.engine.flows.flow_kinds`` with ``by_path``): the classes are
    exact only while they leave together, which the replay checks; −1 for the others."""


class Op(NamedTuple):
    """One action of a device class, ready to replay; what it does is the rule book's
    (``sim.engine.rules``: which stream, when its memory is allocated and freed).

    A named tuple rather than a frozen dataclass: a plan compiles to hundreds of thousands of
    them in the planner's inner loop, and a tuple is built several times faster. Read its
    fields by name (``op.alloc_bytes``): on Python 3.11 that costs what ``op[6]`` does.
    """

    code: int
    """COMPUTE, SEND, RECV, REDUCE or GROUP."""
    text: str
    """The IR action (``2F0``)."""
    stage: int
    kind: ActionKind
    microbatch: int | None
    duration_s: float = 0.0
    """COMPUTE: its time; SEND: how long issuing it holds up the compute stream; RECV: what
    taking its data in costs the compute stream once it has arrived."""
    alloc_bytes: float = 0.0
    """Bytes allocated when the action starts (stash, recomputed activations)."""
    free_bytes: float = 0.0
    """Activation bytes freed when it ends (its stash, recomputed activations)."""
    buffer_bytes: float = 0.0
    """Receive-buffer bytes it consumes, freed when it ends (its input or output gradient)."""
    live_delta: int = 0
    """+1 when a micro-batch's activations become live (F), −1 when they die (B or W)."""
    flows: int = -1
    """SEND: the slot (``DeviceClass.slots``) of the flow kinds to start; RECV: of the flow kinds
    to wait for; −1 for none. Ops name their class's links through slots so that classes whose
    links cost the same share one tuple of ops."""
    collective: int = -1
    """REDUCE: index of the all-reduce in ``Workload.collectives``, or −1 when the stage has one
    replica; GROUP: the slot (``DeviceClass.groups``) of its collective."""
    overlap: bool = False
    """GROUP: the collective runs beside the next compute op, which ends no earlier than it
    (ring attention, FSDP's prefetched gathers); otherwise the compute stream waits for it
    (Megatron's tensor-parallel collectives)."""
    gather_bytes: float = 0.0
    """COMPUTE: bytes of gathered parameters it holds while it runs (FSDP), freed when it ends."""
    lead_s: float = 0.0
    """GROUP with ``overlap``: the next compute op starts no earlier than the collective's start
    plus this (the first FSDP unit's or tensor-parallel chunk's communication, which it needs
    first); 0: it need not wait for the collective to start (the ring's first block is local)."""
    tail_s: float = 0.0
    """GROUP with ``overlap``: the next compute op ends no earlier than the collective's end plus
    this (its last unit's or chunk's compute); ``DETACHED_S``: no compute op waits for it (a
    gather launched a chunk ahead). REDUCE: the reduction ends no earlier than the latest
    participant's ``source`` end plus this (its last bucket alone, ``C/K``)."""
    source: int = -1
    """REDUCE in buckets (``plan.overlap.grad_reduce``): the index of the backward op whose
    gradients it reduces; it is issued when that op's first bucket is full, its start plus
    its duration over ``buckets``. −1: issued when the compute stream reaches it."""
    buckets: int = 1
    """REDUCE in buckets: how many (``sim.cost.overlap.bucket_count``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceClass:
    """Devices that run the same actions at the same times; one represents all."""

    index: int
    devices: tuple[int, ...]
    rank: int
    stages: tuple[int, ...]
    samples: tuple[int, ...]
    """Samples of each micro-batch each of its stages processes on one device."""
    ops: tuple[Op, ...]
    """Its actions in order (shared by the classes whose ops are alike; see ``durations``)."""
    durations: Sequence[float]
    """Seconds of each op (its ``duration_s``, times the class's jitter factors for compute ops):
    what the replays read."""
    slots: tuple[tuple[int, ...], ...]
    """Flow kinds of each link slot its SEND and RECV ops name (``Op.flows``)."""
    groups: tuple[int, ...]
    """Index in ``Workload.group_collectives`` of each group slot its GROUP ops name."""
    static_bytes: float
    """Parameters, gradients and optimizer state held at rest, per device."""
    states: StateBytes
    """``static_bytes`` by kind (parameters, gradients, optimizer state)."""
    optimizer_s: float
    """Optimizer step over the parameters of its stages (``sim.cost.compute.optimizer_step_s``)."""
    slowdown: float = 1.0
    """Straggler factor on compute actions that start at or after ``slow_from_s``."""
    slow_from_s: float = 0.0
    fails_at_s: float | None = None
    """When the (single) device of this class dies, if it does."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Collective:
    """One stage's gradient all-reduce: phases of concurrent flows, one after another."""

    index: int
    stage: int
    participants: tuple[int, ...]
    """Device classes taking part."""
    phases: tuple[tuple[tuple[int, ...], float], ...]
    """(flow kinds, latency steps in seconds) per phase."""
    bytes: float
    """Gradient bytes per device."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """Everything a replay needs; produced by :func:`sim.engine.compile.compile_workload`."""

    name: str
    schedule: Schedule
    """Lowered IR, one list per pipeline rank."""
    num_microbatches: int
    global_batch_size: int
    classes: tuple[DeviceClass, ...]
    kinds: tuple[FlowKind, ...]
    port_classes: tuple[PortClass, ...]
    collectives: tuple[Collective, ...]
    group_collectives: tuple[Collective, ...]
    """Per-action collectives of tensor- and context-parallel groups and FSDP (``GROUP`` ops)."""
    device_memory_bytes: float
    """Memory of one device, bytes (``DeviceSpec.memory_bytes``)."""
    flop_per_iteration: float | None
    """Model FLOPs of one iteration when the model's FLOPs are known (for MFU)."""
    peak_flop_per_s: float
    schedule_name: str
    num_stages: int
    recompute: bool
    parallelism: Parallelism
    tokens_per_sample: int | None = None
    """Tokens in one sample (the sequence length of a transformer), for ``tokens_per_s``."""
    contention: bool = True
    """The classes are exact with contention (``compile_workload(contention=True)``, or every
    device its own class); otherwise only a contention-free replay may run them."""
    optimistic: bool = False
    """The classes are exact with contention only while sibling kinds leave together
    (``compile_workload(optimistic=True)``): the SimPy replay checks it and raises
    ``sim.engine.replay.Diverged`` when they do not."""
    usable_memory_bytes: float | None = None
    """What tensors may fill on one device (``DeviceSpec.usable_memory_bytes``); None: all of
    ``device_memory_bytes``."""
    fabric_traffic: object | None = None
    """One execution of each flow label as bytes per fabric tier and link
    (``sim.engine.tier_traffic.LabelTraffic``), when the cluster has a fabric; else None."""

    @property
    def capacity_bytes(self) -> float:
        """The bytes past which a device is out of memory: ``usable_memory_bytes``, else all of it."""
        return self.device_memory_bytes if self.usable_memory_bytes is None else self.usable_memory_bytes

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(sorted(d for c in self.classes for d in c.devices))

    @property
    def num_devices(self) -> int:
        return sum(len(c.devices) for c in self.classes)


def mailbox(kind: FlowKind, microbatch: int) -> tuple[int, str, int, int]:
    """Where a point-to-point flow's arrival is counted: (receiving class, direction, stage, mb).

    ``stage`` is the receiving stage: s+1 for activations ``("F", s)``, s−1 for gradients
    ``("B", s)``; the RECV op that waits for them finds the same key with :func:`recv_mailbox`.
    """
    direction, stage = kind.label
    return (kind.dst_class, direction, stage + 1 if direction == "F" else stage - 1, microbatch)


def recv_mailbox(device_class: int, op: Op) -> tuple[int, str, int, int]:
    """The mailbox a RECV op of ``device_class`` waits on (the key :func:`mailbox` gives its flows)."""
    return (device_class, "F" if op.kind is ActionKind.RECV_F else "B", op.stage, op.microbatch)

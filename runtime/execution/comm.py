"""Split-concat between stages, message tags, and one process group per replica set.

A micro-batch of ``m`` samples is split over a stage's ``r`` replicas exactly as the
simulator splits it (``sim.cost.split.sample_ranges``: the first ``m mod r`` replicas take one more,
like ``torch.tensor_split``), in the order the plan lists the stage's devices. Between stage
s (senders) and s+1 (receivers), every sender ships every receiver the overlap of their
sample ranges; each receiver concatenates its pieces in sample order. Gradients travel the
same pieces backwards. With equal replica counts each sender has exactly one receiver.

Every message carries a tag that names its stage, micro-batch and direction, so that
receives can be posted before their sends without being matched to the wrong message
(gloo matches on source and tag; NCCL ignores tags and matches in issue order).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from runtime.model.models import local_tensor
from sim.core.errors import DappleError
from sim.core.plan import PlanSpec
from sim.cost.split import sample_overlaps, sample_ranges
from sim.schedule.ir import ActionKind, Schedule

__all__ = [
    "Piece",
    "all_reduce_grads",
    "ReplicaGroups",
    "check_message_order",
    "message_orders",
    "pieces_between",
    "sample_ranges",
    "tag",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Piece:
    """Samples ``[start, end)`` of a micro-batch that travel from ``src`` to ``dst``."""

    src: int
    dst: int
    start: int
    end: int


def pieces_between(microbatch_size: int, senders: tuple[int, ...], receivers: tuple[int, ...]) -> tuple[Piece, ...]:
    """Every non-empty overlap between a sender's and a receiver's samples
    (``sim.cost.split.sample_overlaps``, as the simulator's flows), in sample order."""
    pieces = [Piece(src=src, dst=dst, start=lo, end=hi)
              for src, dst, lo, hi in sample_overlaps(microbatch_size, senders, receivers)]
    return tuple(sorted(pieces, key=lambda p: p.start))


def tag(stage: int, microbatch: int, backward: bool, num_microbatches: int) -> int:
    """A tag unique to (sending stage, micro-batch, direction) within one step."""
    return (stage * num_microbatches + microbatch) * 2 + int(backward)


class ReplicaGroups:
    """A process group for each gradient group with more than one device (the gradient
    all-reduce: ``PlanSpec.gradient_groups``, a stage's devices of one tensor rank),
    and one for each embedding group of a tied embedding's two stages
    (``runtime.execution.holdings.tied_groups``). Every rank creates every group, in the same
    order, as ``torch.distributed.new_group`` requires; ``extra``: more device sets (an MoE
    block's, ``runtime.execution.expert_comm.device_sets``)."""

    def __init__(self, plan: PlanSpec, tied_groups: tuple[tuple[int, ...], ...] = (),
                 extra: tuple[tuple[int, ...], ...] = ()) -> None:
        self._groups: dict[tuple[int, ...], dist.ProcessGroup | None] = {}
        wanted = [tuple(sorted(group)) for s in range(plan.num_stages) for group in plan.gradient_groups(s)]
        wanted += [tuple(sorted(devices)) for devices in tied_groups]
        wanted += [tuple(sorted(devices)) for devices in extra]
        for devices in wanted:
            if devices not in self._groups:
                self._groups[devices] = dist.new_group(list(devices)) if len(devices) > 1 else None

    def group(self, devices: tuple[int, ...]) -> dist.ProcessGroup | None:
        """The group of ``devices`` (None for a single device: nothing to reduce)."""
        return self._groups[tuple(sorted(devices))]


def message_orders(plan: PlanSpec, lowered: Schedule, microbatch_size: int) -> dict[tuple[int, int], tuple[list, list]]:
    """For every (sender, receiver) device pair, the tags in the order the sender sends them
    and in the order the receiver posts their receives (each in its own action list).

    gloo matches a message to its receive by tag, NCCL by order alone: on NCCL the two
    orders must be equal.
    """
    orders: dict[tuple[int, int], tuple[list, list]] = {}
    num_mb = lowered.num_microbatches

    def note(src: int, dst: int, message_tag: int, side: int) -> None:
        orders.setdefault((src, dst), ([], []))[side].append(message_tag)

    def pieces(first: int) -> list[Piece]:
        """Stage ``first`` to ``first + 1``: every position of a replica talks to the same position."""
        return [p for at in range(plan.group_size)
                for p in pieces_between(microbatch_size, tuple(r[at] for r in plan.replicas(first)),
                                        tuple(r[at] for r in plan.replicas(first + 1)))]

    for actions in lowered.ranks:
        for a in actions:
            s, m = a.stage, a.microbatch
            if a.kind is ActionKind.SEND_F or a.kind is ActionKind.RECV_F:
                first = s if a.kind is ActionKind.SEND_F else s - 1
                side = 0 if a.kind is ActionKind.SEND_F else 1
                for p in pieces(first):
                    note(p.src, p.dst, tag(first, m, False, num_mb), side)
            elif a.kind is ActionKind.SEND_B or a.kind is ActionKind.RECV_B:
                later = s if a.kind is ActionKind.SEND_B else s + 1
                side = 0 if a.kind is ActionKind.SEND_B else 1
                for p in pieces(later - 1):
                    note(p.dst, p.src, tag(later, m, True, num_mb), side)
    return orders


def check_message_order(plan: PlanSpec, lowered: Schedule, microbatch_size: int) -> None:
    """Raise ``DappleError`` if some device pair would receive messages in another order than
    they are sent (fine on gloo, which matches tags; wrong on NCCL)."""
    for (src, dst), (sent, received) in sorted(message_orders(plan, lowered, microbatch_size).items()):
        if sent != received:
            raise DappleError(
                f"schedule {lowered.name!r}: device {dst} receives messages from device {src} in another order "
                "than they are sent; NCCL matches messages by order, so run this schedule with --backend gloo"
            )


def all_reduce_grads(params: list[torch.nn.Parameter], group, timeout: timedelta) -> None:
    """Sum the gradients of ``params`` over ``group`` in one flat buffer; plain gradients
    become views of it, a DTensor's local shard gets the sum copied back (its gradient keeps
    its placement)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [local_tensor(p.grad) for p in params]  # a DTensor's shard: this tensor rank's part
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group, async_op=True).wait(timeout)
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        if g is p.grad:
            p.grad = flat[offset:offset + n].view_as(g)
        else:
            g.copy_(flat[offset:offset + n].view_as(g))
        offset += n

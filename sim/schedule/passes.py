"""Passes: plain functions that turn one schedule IR into another.

A generator says only what each rank computes. Before a rank can run stage s's forward
for micro-batch m, the activation has to travel from the rank of stage s−1; before the
backward, the gradient has to travel back from stage s+1; after a stage's last backward
its gradients are all-reduced among its replicas. :func:`lower` writes those steps into
the lists, with torch.distributed.pipelining's meaning:

- ``sSEND_Fm`` right after F(s,m) when stage s+1 lives on another rank, and
  ``sRECV_Fm`` right before F(s,m) when stage s−1 lives on another rank;
- ``sSEND_Bm`` right after B or I of (s,m) when stage s−1 lives on another rank, and
  ``sRECV_Bm`` right before B or I of (s,m) when stage s+1 lives on another rank;
- ``sREDUCE_GRAD`` right after the stage's last B or W (and after that action's send, so
  the all-reduce never delays a neighbour), as torch.distributed.pipelining reduces each stage
  after its last backward; with ``reduce_after_flush``, every stage's ``REDUCE_GRAD`` at the end
  of its rank's list instead, lowest stage first, as Megatron-LM all-reduces each model chunk
  after the whole pipeline schedule has run (``sim.core.overlap.OverlapSpec.reduce_after_flush``);
- with ``paired_exchange`` (Megatron-LM 2021's interleaved schedule, only on the ``interleaved``
  generator's schedules), a steady-state forward followed by a backward on the same rank sends
  its output after that backward, beside the backward's own send, and that backward's
  receive moves before the forward: the 2021 loop runs F, then B, then one blocking
  ``send_forward_backward_recv_forward_backward`` that sends both and receives the next step's
  input and gradient (NVIDIA/Megatron-LM megatron/schedules.py at 6fd7818, 2021-04-03,
  ``forward_backward_pipelining_with_interleaving``; its 1F1B loop sends right after each
  part, as the default does);
- an overlapped pair ``(0F7;7B3)OVERLAP_F_B`` is one step: the receives of both parts go
  right before it (the forward's first), their sends right after it, as torch's
  ``_add_send_recv`` issues them.

A hand-off between two stages on the same rank — V-shaped placement's stage S−1 to stage S,
or any interleaved chunk boundary that stays on one device — is local: no send, no receive.

Sends are non-blocking and a receive blocks until its send was issued, so the lowered
schedule waits on exactly what the compute schedule waited on: lowering a deadlock-free
compute schedule yields a deadlock-free one. (torch's own ``_add_send_recv`` instead places
each receive where a rank-by-rank simulation first issues its send; ours sits right before
its consumer, which is what a contention-free replay needs.)

:func:`strip_communication` undoes it, so ``strip_communication(lower(s)) == s`` for a
compute-only ``s`` and ``lower(lower(s)) == lower(s)``.
"""

from __future__ import annotations

from dataclasses import replace

from sim.schedule.ir import COMPUTE_KINDS, Action, ActionKind, OverlapFB, Schedule, Step

__all__ = ["lower", "strip_communication"]

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


def strip_communication(schedule: Schedule) -> Schedule:
    """Keep only compute steps (drop sends, receives and ``REDUCE_GRAD``)."""
    ranks = tuple(tuple(a for a in acts if _is_compute(a)) for acts in schedule.ranks)
    return replace(schedule, ranks=ranks)


def _is_compute(step: Step) -> bool:
    return type(step) is OverlapFB or step.kind in COMPUTE_KINDS


def lower(schedule: Schedule, *, reduce_after_flush: bool = False, paired_exchange: bool = False) -> Schedule:
    """Add sends, receives and gradient reductions to a (compute) schedule; with
    ``reduce_after_flush`` each rank's reductions follow its last action (the pipeline's flush);
    with ``paired_exchange`` an interleaved schedule's steady (F, B) steps exchange as one
    (module docstring)."""
    compute = strip_communication(schedule)
    last_grad = _flush_positions(compute) if reduce_after_flush else _last_weight_grad_positions(compute)
    paired = paired_exchange and compute.name == "interleaved"
    ranks = tuple(
        _lower_rank(rank, acts, compute, last_grad, paired) for rank, acts in enumerate(compute.ranks)
    )
    return replace(schedule, ranks=ranks)


def _last_weight_grad_positions(schedule: Schedule) -> dict[tuple[int, int], list[int]]:
    """(rank, index) of each stage's last B or W → the stages whose last one it is."""
    last: dict[int, tuple[int, int]] = {}
    for rank, acts in enumerate(schedule.ranks):
        for index, step in enumerate(acts):
            for a in step.parts:
                if a.kind is B or a.kind is W:
                    last[a.stage] = (rank, index)
    at: dict[tuple[int, int], list[int]] = {}
    for stage, pos in sorted(last.items()):
        at.setdefault(pos, []).append(stage)
    return at


def _flush_positions(schedule: Schedule) -> dict[tuple[int, int], list[int]]:
    """(rank, index of its last step) → every stage with a B or W on that rank, lowest first:
    Megatron-LM's ``train_step`` runs ``allreduce_gradients`` for each model chunk in order once
    ``forward_backward_func`` has returned (NVIDIA/Megatron-LM megatron/training.py at 6fd7818,
    2021-04-03, lines 376-381), so no reduction starts before the rank's last backward."""
    at: dict[tuple[int, int], list[int]] = {}
    for rank, acts in enumerate(schedule.ranks):
        stages = sorted({a.stage for step in acts for a in step.parts if a.kind is B or a.kind is W})
        if stages:
            at[(rank, len(acts) - 1)] = stages
    return at


def _single(step: Step | None, kind: ActionKind) -> Action | None:
    """The step's one action when it is a lone ``kind`` (not an overlapped pair), else None."""
    return step.parts[0] if step is not None and len(step.parts) == 1 and step.parts[0].kind is kind else None


def _lower_rank(
    rank: int, acts: tuple[Step, ...], schedule: Schedule, last_grad: dict[tuple[int, int], list[int]],
    paired: bool = False,
) -> tuple[Step, ...]:
    owner = schedule.stage_ranks
    last_stage = schedule.num_stages - 1
    out: list[Step] = []
    held: list[Action] = []  # a paired forward's sends, issued after the backward after it
    received: set[Action] = set()  # a paired backward's receive, issued before its forward
    for index, step in enumerate(acts):
        sends, held = held, []
        nxt = _single(acts[index + 1], B) if paired and index + 1 < len(acts) and _single(step, F) else None
        if nxt is not None and nxt.stage < last_stage and owner[nxt.stage + 1] != owner[nxt.stage]:
            recv = Action(stage=nxt.stage, kind=ActionKind.RECV_B, microbatch=nxt.microbatch)
            out.append(recv)
            received.add(recv)
        for a in step.parts:
            s, m = a.stage, a.microbatch
            if a.kind is F:
                if s > 0 and owner[s - 1] != owner[s]:
                    out.append(Action(stage=s, kind=ActionKind.RECV_F, microbatch=m))
                if s < last_stage and owner[s + 1] != owner[s]:
                    sends.append(Action(stage=s, kind=ActionKind.SEND_F, microbatch=m))
            elif a.kind is B or a.kind is I:
                recv = Action(stage=s, kind=ActionKind.RECV_B, microbatch=m)
                if s < last_stage and owner[s + 1] != owner[s] and recv not in received:
                    out.append(recv)
                if s > 0 and owner[s - 1] != owner[s]:
                    sends.append(Action(stage=s, kind=ActionKind.SEND_B, microbatch=m))
        out.append(step)
        if nxt is not None:
            sends, held = [], sends
        out += sends
        for s in last_grad.get((rank, index), ()):
            out.append(Action(stage=s, kind=ActionKind.REDUCE_GRAD, microbatch=None))
    return tuple(out)

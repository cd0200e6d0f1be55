"""The IR executor: one process per device runs its pipeline rank's lowered action list.

Every device (torch rank = global device id) belongs to one device set of the plan, i.e.
one pipeline rank of the schedule IR, and runs exactly that rank's lowered list
(``sim.schedule.passes.lower``), in order, once per training step:

* ``F``: the stage's layers on this replica's slice of the micro-batch; the last stage adds
  the loss, scaled by ``slice_samples / global_batch_size``;
* ``B``: the full backward; ``I``: the input gradient only (``torch.autograd.grad`` on
  the stage input, keeping the graph); ``W``: the weight gradient from the kept graph
  (zero-bubble's split backward; a stage whose input needs no gradient does all in W);
* ``SEND_F``/``SEND_B``: non-blocking sends of the split-concat pieces (``runtime.execution.comm``);
  ``RECV_F``/``RECV_B``: wait for the pieces, posted up to ``lookahead`` receives early;
* ``REDUCE_GRAD``: all-reduce (sum) of the stage's gradients among the devices that hold
  the same parameters (``PlanSpec.gradient_groups``: one tensor rank over the replicas);
  DTensor gradients first take their parameter's placement (``settle_grads``); with
  ``sharding: full`` or ``gradients`` FSDP2 has reduce-scattered them (each backward's, or the last's).

With tensor parallelism every device of a replica runs the same action list on the
replica's samples; its stage modules are cut over the device set's mesh
(``runtime.model.tensor_parallel``), the messages carry its 1/t of the sequence, and the whole step
runs inside ``loss_parallel`` (the head's loss on vocabulary-sharded logits). With context
parallelism each context rank runs them on its tokens of every sequence and its messages carry
1/t of those (``runtime.model.context_parallel``); its loss is scaled by 1/c. The loss is
counted on each context rank's first tensor rank.

After the list, a tied embedding split across stages sums its two copies' gradients, and
one optimizer step runs. Each action's start and end (seconds after a barrier at the step's
start) form a trace in the simulator's event-row format (``sim.core.events.EventRow``, in its JSON).
``runtime.measure.trace`` writes such rows as a Chrome/Perfetto trace laid out as the simulator's,
and as its ``events.csv``.

With ``recompute`` a forward keeps only its stage input and the backward runs it again
(Chen et al., 2016, §3). Any exception, including a communication timeout, is re-raised as
``ActionError`` naming the rank and the action.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from runtime.execution.comm import ReplicaGroups, all_reduce_grads, check_message_order, tag
from runtime.execution.expert_comm import (
    attach_expert_groups,
    device_sets,
    fsdp_expert_mesh,
    gather_width_grads,
    optimizer_buckets,
    reduce_expert_grads,
    split_dense,
)
from runtime.execution.holdings import LocalStage, hold_stages, position
from runtime.execution.p2p import Mailbox
from runtime.execution.status import StatusBoard
from runtime.execution.types import ActionError, ExecOptions, StepRecord
from runtime.measure.memory import SavedTensorMeter
from runtime.model.config import RunnableScenario
from runtime.model.context_parallel import context_batch, context_tokens
from runtime.model.models import input_dtype, local_tensor, sample_shape, synthetic_batch
from runtime.model.sharding import FSDP_SHARDINGS, RankOptimizer, state_bytes
from runtime.model.tensor_parallel import loss_parallel_if, settle_grads, stage_mesh
from sim.core.events import EventRow
from sim.core.parallelism import Recompute, Sharding
from sim.schedule.ir import Action, ActionKind

__all__ = ["ActionError", "ExecOptions", "RankExecutor", "StepRecord"]

K = ActionKind
_STREAM = {K.SEND_F: "send", K.SEND_B: "send", K.RECV_F: "recv", K.RECV_B: "recv", K.REDUCE_GRAD: "allreduce"}


@dataclass(slots=True)
class _Slot:
    """Tensors of one (stage, micro-batch) between its forward and its backward."""

    inp: torch.Tensor | None = None
    out: torch.Tensor | None = None
    grad_out: torch.Tensor | None = None
    grad_in: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    kept: Any = None
    """With recompute: the meter's token for the stashed input."""


class RankExecutor:
    """One rank's share of a plan: its stage modules, optimizer and lowered action list."""

    def __init__(self, runnable: RunnableScenario, options: ExecOptions, device: torch.device,
                 status: StatusBoard | None = None) -> None:
        self.runnable, self.options, self.device, self.status = runnable, options, device, status
        scenario, plan = runnable.scenario, runnable.plan
        self.rank = dist.get_rank()
        self.microbatch_size = scenario.training.microbatch_size
        self.num_mb = scenario.training.num_microbatches
        self.batch = scenario.training.global_batch_size
        schedule = scenario.resolved.lowered  # the simulator's, K_i policies included (sim.schedule.resolved)
        if dist.get_backend() == "nccl":
            check_message_order(plan, schedule, self.microbatch_size)
        groups = plan.device_groups
        self.pipeline_rank = next(r for r, g in enumerate(groups) if self.rank in g)
        # an overlapped forward-backward pair (dualpipe-v) runs its parts one after the other on
        # one device, as torch's runtime does when it cannot overlap them
        self.actions: tuple[Action, ...] = tuple(part for step in schedule.ranks[self.pipeline_rank]
                                                 for part in step.parts)
        self._labels = [(str(a), a.kind.value, _STREAM.get(a.kind, "compute")) for a in self.actions]
        self.recompute, self.reduce_each = plan.recompute is Recompute.FULL, plan.fsdp.reduce_every_microbatch
        self.timeout = timedelta(seconds=options.timeout_s)
        self.tensor_parallel, self.sharding = plan.tensor_parallel, plan.sharding
        self.mesh = None
        if plan.group_size > 1 or plan.sharding is not Sharding.NONE:
            self.mesh = stage_mesh(plan, self.rank, device.type)
        at, self.context_parallel = position(plan, self.rank), plan.context_parallel
        self.counts_loss = at % plan.tensor_parallel == 0  # a tensor group's first device; context ranks' sum
        self.sequence = context_tokens(plan, at, runnable.model.values.get("seq_len", 0), device)  # mlp: none
        held = hold_stages(runnable, self.rank, seed=options.seed, device=device, mesh=self.mesh,
                           expert_mesh=fsdp_expert_mesh(plan, self.rank, device.type, runnable.model.experts))
        self.stages, self.tied_devices, self.tied_param = held.stages, held.tied_devices, held.tied_param
        self.groups = ReplicaGroups(plan, held.tied_groups, device_sets(plan, runnable.model))
        attach_expert_groups(self.stages, plan, self.rank, self.groups)
        unique = {id(p): p for st in self.stages.values() for p in st.params}
        self.params = list(unique.values())
        gradient_groups = {s: self.groups.group(self._gradient_group(s)) for s in self.stages}
        self.optimizer = RankOptimizer.build(
            scenario.model.optimizer, options.lr,
            optimizer_buckets(self.stages, plan, self.rank, self.groups, gradient_groups), plan.sharding)
        # stage -> index of its last B or W on this rank (FSDP's gradient sync when it accumulates unsharded)
        self.last_backward = {a.stage: i for i, a in enumerate(self.actions) if a.kind in (K.B, K.W)}
        gathered = (lambda: [p for st in self.stages.values() for p in st.module.parameters()]) \
            if plan.sharding in FSDP_SHARDINGS else None
        self.meter = SavedTensorMeter(self.params, current=gathered, count_gathered=plan.sharding is Sharding.GRADIENTS)
        # gloo: activations and gradients on connections of their own (see runtime.execution.p2p)
        directions = (dist.new_group(), dist.new_group()) if device.type == "cpu" else (None, None)
        self.mailbox = Mailbox(self.actions, self._envelopes, device=device, timeout=self.timeout,
                               lookahead=options.lookahead, groups=directions)

    # --- one step -------------------------------------------------------------------------

    def step(self, step: int, *, keep_grads: bool = False, count_activations: bool = False) -> StepRecord:
        """Run the action list once, then the optimizer; ``step`` picks the data."""
        dev, opts = self.device, self.options
        self.counting = count_activations and opts.track_memory
        self.optimizer.zero_grad()
        needs_data = any(st.index == 0 or st.module.is_last for st in self.stages.values())
        batch = synthetic_batch(self.runnable.model, self.batch, step=step, seed=opts.seed, device=dev) if needs_data else None
        if batch is not None and self.sequence is not None:  # this context rank's tokens and labels
            batch = context_batch(batch, self.sequence, self.runnable.model.mtp_depth)
        self.slots: dict[tuple[int, int], _Slot] = {}
        self.loss = torch.zeros((), dtype=torch.float32, device=dev)
        self.meter.reset_peak()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        rows: list[dict[str, Any]] = []
        if dev.type == "cpu":
            # gloo: open the mailbox before the step's barrier; receives posted right after it
            # contend with the barrier's own traffic in gloo's transport and can hold a rank
            # back for milliseconds on a small host (a run has no such barrier). On GPUs they
            # stay after it: NCCL kernels of two communicators must not wait on each other.
            self.mailbox.start()
        _barrier(dev)
        t0 = time.perf_counter()
        if dev.type != "cpu":
            self.mailbox.start()
        with loss_parallel_if(self.tensor_parallel):
            rows += self._actions(step, t0, batch)
        start = time.perf_counter()
        try:
            self.mailbox.drain()
            self._reduce_tied()
        except Exception as exc:
            raise ActionError(self.rank, "REDUCE_TIED", step, exc) from exc
        if self.tied_devices and self.rank in self.tied_devices:
            rows.append(_row(self.rank, min(self.stages), "REDUCE_TIED", None, "REDUCE_TIED", "allreduce",
                             start - t0, time.perf_counter() - t0))
        grads = self._named_grads() if keep_grads else None
        start = time.perf_counter()
        self.optimizer.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        end = time.perf_counter()
        rows.append(_row(self.rank, min(self.stages), "OPTIM", None, "OPTIM", "compute", start - t0, end - t0))
        self.slots.clear()
        return StepRecord(
            time_s=end - t0, loss=float(self.loss), state_bytes=state_bytes(self.params, self.optimizer),
            peak_activation_bytes=float(self.meter.peak_bytes) if self.counting else None,
            allocator_peak_bytes=float(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None,
            rows=rows, grads=grads, gathered_bytes=self.meter.peak_gathered_bytes if self.counting else 0,
        )

    def _actions(self, step: int, t0: float, batch) -> list[dict[str, Any]]:
        """Run this rank's action list once; its trace rows."""
        rows, dev = [], self.device
        for index, action in enumerate(self.actions):
            text, kind, stream = self._labels[index]
            if self.status is not None:
                self.status.set(step, text)
            start = time.perf_counter()
            try:
                self._maybe_fail(step, text)
                self._run(index, action, batch)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
            except Exception as exc:
                raise ActionError(self.rank, text, step, exc) from exc
            rows.append(_row(self.rank, action.stage, kind, action.microbatch, text, stream, start - t0,
                             time.perf_counter() - t0))
        return rows

    def _gradient_group(self, s: int) -> tuple[int, ...]:
        """The devices that sum stage ``s``'s gradients with this rank."""
        return next(g for g in self.runnable.plan.gradient_groups(s) if self.rank in g)

    def _maybe_fail(self, step: int, text: str) -> None:
        fail = self.options.fail_at
        if fail is None or step != 0 or fail[0] != self.rank or fail[1] != text:
            return
        if fail[2] == "exit":
            os._exit(17)  # a rank that dies without a word, as a crash or the OOM killer would
        if fail[2] in ("term", "stop"):  # stopped from outside, or frozen (a hung driver, a debugger)
            os.kill(os.getpid(), signal.SIGTERM if fail[2] == "term" else signal.SIGSTOP)
            return
        raise RuntimeError("injected fault (--fail-at)")

    def _run(self, index: int, action: Action, batch) -> None:
        self._index = index
        kind, s, m = action.kind, action.stage, action.microbatch
        if kind is K.F:
            self._forward(s, m, batch)
        elif kind is K.B:
            self._backward(s, m, inputs_only=False, weights_only=False)
        elif kind is K.I:
            self._backward(s, m, inputs_only=True, weights_only=False)
        elif kind is K.W:
            self._backward(s, m, inputs_only=False, weights_only=True)
        elif kind is K.SEND_F:
            slot, st = self.slots[(s, m)], self.stages[s]
            out = slot.out.detach()
            for piece in st.send_f:
                self.mailbox.send(out[piece.start - st.start:piece.end - st.start], piece.dst,
                                  tag(s, m, False, self.num_mb), forward=True)
        elif kind is K.SEND_B:
            slot, st = self.slots[(s, m)], self.stages[s]
            for piece in st.send_b:
                self.mailbox.send(slot.grad_in[piece.start - st.start:piece.end - st.start], piece.src,
                                  tag(s, m, True, self.num_mb), forward=False)
            slot.grad_in = None
            self._maybe_drop(s, m)
        elif kind is K.RECV_F:
            self.slots.setdefault((s, m), _Slot()).inp = self.mailbox.receive(index)
        elif kind is K.RECV_B:
            self.slots[(s, m)].grad_out = self.mailbox.receive(index)
        elif kind is K.REDUCE_GRAD:
            self._reduce(s)

    # --- compute --------------------------------------------------------------------------

    def _stage_input(self, s: int, m: int, batch) -> torch.Tensor:
        st = self.stages[s]
        if s == 0:
            first = m * self.microbatch_size + st.start
            return batch[0][first:first + st.size]
        if st.local_prev:
            x = self.slots[(s - 1, m)].out.detach()
        else:
            x = self.slots[(s, m)].inp
        return x.requires_grad_(x.is_floating_point())

    def _forward(self, s: int, m: int, batch) -> None:
        st = self.stages[s]
        slot = self.slots.setdefault((s, m), _Slot())
        slot.inp = self._stage_input(s, m, batch)
        if st.module.is_last:
            first = m * self.microbatch_size + st.start
            slot.labels = batch[1][first:first + st.size]
        if self.recompute:
            with torch.no_grad():
                slot.out = self._apply(st, slot)
            if self.counting:
                slot.kept = self.meter.hold(slot.inp)
        else:
            slot.out = self._apply_watched(st, slot)
        if st.module.is_last and self.counts_loss:
            self.loss += slot.out.detach().float()

    def _apply(self, st: LocalStage, slot: _Slot) -> torch.Tensor:
        if st.module.is_last:
            # a mean over this rank's 1/c of the tokens: the context ranks' gradients sum to the whole mean's
            loss = st.module(slot.inp, slot.labels) * (st.size / (self.batch * self.context_parallel))
            return local_tensor(loss)  # a replicated DTensor under tensor parallelism
        return st.module(slot.inp)

    def _apply_watched(self, st: LocalStage, slot: _Slot) -> torch.Tensor:
        if not self.counting:
            return self._apply(st, slot)
        with self.meter.watching():
            return self._apply(st, slot)

    def _backward(self, s: int, m: int, *, inputs_only: bool, weights_only: bool) -> None:
        st, slot = self.stages[s], self.slots[(s, m)]
        if st.local_next and slot.grad_out is None:  # the next stage ran on this rank
            following = self.slots[(s + 1, m)]
            slot.grad_out, following.grad_in = following.grad_in, None
            self._maybe_drop(s + 1, m)
        if self.recompute and not weights_only:
            slot.out = self._apply_watched(st, slot)
            slot.kept = None
        out, grad = slot.out, (None if st.module.is_last else slot.grad_out)
        needs_input = slot.inp.requires_grad
        if self.sharding in FSDP_SHARDINGS and not inputs_only:  # every micro-batch's, or the last's (plan.fsdp)
            st.module.set_requires_gradient_sync(self.reduce_each or self.last_backward[s] == self._index)
        if inputs_only:
            if needs_input:
                (slot.grad_in,) = torch.autograd.grad(out, [slot.inp], grad, retain_graph=True)
            return
        if weights_only:
            torch.autograd.backward(out, grad, inputs=st.weights)
        else:
            torch.autograd.backward(out, grad)
            if needs_input:
                slot.grad_in = slot.inp.grad
        slot.out = slot.grad_out = slot.inp = slot.labels = None
        self._maybe_drop(s, m)

    def _maybe_drop(self, s: int, m: int) -> None:
        """Forget (s, m) once its backward is done and its input gradient has been handed on."""
        slot = self.slots[(s, m)]
        if slot.out is None and slot.grad_in is None:
            del self.slots[(s, m)]

    # --- communication ------------------------------------------------------------------

    def _envelopes(self, action: Action) -> list:
        """The receives behind a ``RECV_F``/``RECV_B``: one per split-concat piece."""
        s, m, st = action.stage, action.microbatch, self.stages[action.stage]
        plan, model = self.runnable.plan, self.runnable.model
        if action.kind is K.RECV_F:
            cut, message_tag = plan.stages[s].layers[0], tag(s - 1, m, False, self.num_mb)
            peers = [(piece.src, piece) for piece in st.recv_f]
        else:
            cut, message_tag = plan.stages[s].layers[1], tag(s + 1, m, True, self.num_mb)
            peers = [(piece.dst, piece) for piece in st.recv_b]
        shape, dtype = sample_shape(model, cut), input_dtype(model, cut)
        if plan.group_size > 1:  # each device sends its 1/t of its context rank's 1/c of the sequence
            shape = (shape[0] // plan.group_size, *shape[1:])
        return [(peer, (piece.end - piece.start, *shape), dtype, message_tag) for peer, piece in peers]

    def _reduce(self, s: int) -> None:
        st = self.stages[s]
        if self.tensor_parallel > 1:
            settle_grads(st.params)
        if self.runnable.model.experts is not None:  # routed experts and routers: their own groups
            reduce_expert_grads(st, self.runnable.plan, self.rank, self.groups, self.timeout)
        group = self.groups.group(self._gradient_group(s))
        if self.sharding in FSDP_SHARDINGS and self.context_parallel > 1:  # FSDP2 summed the replicas' parts
            all_reduce_grads(st.params, self.mesh["context"].get_group(), self.timeout)
        if group is None or self.sharding in FSDP_SHARDINGS:
            return
        params = [p for p in split_dense(st.params) if p is not self.tied_param]
        all_reduce_grads(params, group, self.timeout)

    def _reduce_tied(self) -> None:
        if not self.tied_devices or self.rank not in self.tied_devices:
            return
        all_reduce_grads([self.tied_param], self.groups.group(self.tied_devices), self.timeout)

    def _named_grads(self) -> dict[str, torch.Tensor]:
        grads = {}
        for st in self.stages.values():
            for name, p in st.module.named_parameters():
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                if isinstance(grad, DTensor):  # a collective over the mesh: every rank gathers, in order
                    grad = grad.full_tensor()
                grads[name] = grad.detach()
        if self.runnable.plan.expert_tensor_parallel > 1:  # on the device: NCCL gathers only there
            gather_width_grads(self.stages, grads)
        return {name: grad.to("cpu", copy=True) for name, grad in grads.items()}


def _barrier(device: torch.device) -> None:
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def _row(device: int, stage: int, kind: str, microbatch: int | None, action: str, stream: str,
         start_s: float, end_s: float) -> dict[str, Any]:
    """A measured action as the simulator's ``EventRow``, in its JSON: rows travel between ranks
    and into the run's summary as JSON."""
    return EventRow(device=device, stage=stage, kind=kind, microbatch=microbatch, action=action, stream=stream,
                    start_s=start_s, end_s=end_s).to_json()


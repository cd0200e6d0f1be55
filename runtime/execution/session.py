"""A training run on every rank, gathered into one summary on rank 0.

``run_session`` is what each process calls once ``torch.distributed`` is initialised: build
this rank's stages, run ``warmup_steps + steps`` steps, then gather every rank's times,
peak memory and trace rows on rank 0. The iteration time of a step is the slowest rank's
(from the barrier at the step's start to the end of its optimizer step); the reported
median is over the measured steps only, and the trace rows are those of the step whose time
is the median. Saved activations are counted in the first step
(every step saves the same tensors; the timed steps then run without hooks). Each device's
memory is also reported by the simulator's kinds (``memory_breakdown_bytes``: parameters,
gradients and optimizer state as this device stores them, its shards under tensor
parallelism and sharding, and the peak of its saved activations), next to the plan's
degrees (``parallelism``). With ``check`` the first step's gradients (before the optimizer
touches them, gathered to full tensors) and loss are compared with ``runtime.validation.grad_check``'s
reference.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from runtime.execution.executor import ExecOptions, RankExecutor
from runtime.execution.status import StatusBoard
from runtime.model.config import RunnableScenario
from runtime.model.fp8 import check_rtol
from runtime.model.models import num_layers
from runtime.validation.grad_check import compare_grads, drop_groups, reference_step, token_servers
from sim.models.vocab import vocab_padding

__all__ = ["SessionOptions", "run_session"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionOptions:
    """What a run does besides executing the plan."""

    steps: int = 5
    """Measured steps (their median is the iteration time)."""
    warmup_steps: int = 1
    """Steps run first and left out of the times (the first one is the checked one)."""
    check: bool = False
    """Compare the first step's loss and gradients with the single-process reference."""
    rtol: float = 1e-5
    """Relative tolerance of the check."""
    execution: ExecOptions = field(default_factory=ExecOptions)
    """How each rank executes (seed, memory tracking, timeouts, injected faults)."""


def run_session(
    runnable: RunnableScenario, options: SessionOptions, device: torch.device, *, status: StatusBoard | None = None,
    between: Callable[[int], None] | None = None, slices: int = 1,
) -> dict[str, Any] | None:
    """Run the plan on this rank; rank 0 returns the summary, the others None.

    With ``between``, the measured steps are cut into ``slices`` runs of consecutive steps
    (as even as they divide) and ``between(k)`` is called on every rank before slice k:
    ``dapple-run validate`` profiles there, so that profile and run take turns.
    """
    executor = RankExecutor(runnable, options.execution, device, status)
    records = []
    starts = [] if between is None else [options.warmup_steps + options.steps * k // slices for k in range(slices)]
    for step in range(options.warmup_steps + options.steps):
        if step in starts:
            if status is not None:
                status.set(step, "profiling")  # what a launcher's progress bar shows meanwhile
            between(starts.index(step))
        records.append(executor.step(step, keep_grads=options.check and step == 0, count_activations=step == 0))
    mine = {
        "rank": executor.rank,
        "stages": sorted(executor.stages),
        "times_s": [r.time_s for r in records],
        "losses": [r.loss for r in records],
        **_memory(records),
        "rows_by_step": [r.rows for r in records],
        "grads": records[0].grads,
    }
    gathered: list[Any] | None = [None] * dist.get_world_size() if executor.rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if executor.rank != 0:
        return None
    return _summary(runnable, options, gathered, device)


def _memory(records: list) -> dict[str, Any]:
    """Peak memory of one rank: the allocator's on a GPU; on a CPU the largest static bytes
    (parameters, gradients, optimizer state) plus the peak of the counted activations. By
    kind (``memory_breakdown_bytes``, the simulator's keys): the model states this device
    stores at the end of its fullest step and the peak of the counted activations, the parameters
    with those FSDP2 held gathered at that peak under ``sharding: gradients`` (ZeRO-2's whole
    parameters: ``runtime.measure.memory``); receive buffers and a ``full`` unit gathered while it
    runs are not counted (``buffers`` is None)."""
    counted = [r.peak_activation_bytes for r in records if r.peak_activation_bytes is not None]
    activations = max(counted) if counted else None
    states = dict(max((r.state_bytes for r in records), key=lambda kinds: sum(kinds.values())))
    states["parameters"] += max(r.gathered_bytes for r in records)
    if records[0].allocator_peak_bytes is not None:
        peak = max(r.allocator_peak_bytes for r in records)
    else:
        peak = None if activations is None else sum(states.values()) + activations
    breakdown = {**{kind: float(value) for kind, value in states.items()}, "activations": activations, "buffers": None}
    return {"peak_memory_bytes": peak, "peak_activation_bytes": activations, "memory_breakdown_bytes": breakdown}


def _vocabulary(runnable: RunnableScenario) -> dict[str, Any] | None:
    """The vocabulary the run built its table and head with, as ``dapple-sim check`` shows it
    (``sim.models.vocab.vocab_padding`` at the plan's tensor degree); None without one (mlp)."""
    padding = vocab_padding(runnable.scenario.model, runnable.plan.tensor_parallel)
    if padding is None:
        return None
    assert padding.padded_at_tensor == runnable.model.padded_vocab  # the one formula, both sides
    return {**padding.to_json(), "text": padding.text()}


def _summary(runnable: RunnableScenario, options: SessionOptions, ranks: list[dict], device) -> dict[str, Any]:
    scenario, plan = runnable.scenario, runnable.plan
    steps = options.warmup_steps + options.steps
    step_times = [max(r["times_s"][k] for r in ranks) for k in range(steps)]
    measured = step_times[options.warmup_steps:]
    losses = [sum(r["losses"][k] for r in ranks) for k in range(steps)]
    median = statistics.median(measured) if measured else None
    # the trace shows the step of median time (one noisy step would mislead the comparison)
    order = sorted(range(options.warmup_steps, steps), key=lambda k: step_times[k])
    typical = order[len(order) // 2] if order else steps - 1
    summary: dict[str, Any] = {
        "name": scenario.name,
        "schedule": plan.schedule,
        "num_stages": plan.num_stages,
        "num_microbatches": scenario.training.num_microbatches,
        "microbatch_size": scenario.training.microbatch_size,
        "global_batch_size": scenario.training.global_batch_size,
        "recompute": plan.recompute.to_json(),
        "parallelism": {"tensor": plan.tensor_parallel, "sequence_parallel": plan.sequence_parallel,
                        "context": plan.context_parallel, "pipeline": len(plan.device_groups),
                        "expert": plan.expert_parallel,
                        "data": max(plan.num_replicas(s) for s in range(plan.num_stages)),
                        "sharding": plan.sharding.value},
        "vocabulary": _vocabulary(runnable),
        "backend": dist.get_backend(),
        "device_type": device.type,
        "world_size": len(ranks),
        "warmup_steps": options.warmup_steps,
        "iteration_times_s": measured,
        "median_iteration_time_s": median,
        "throughput_samples_per_s": scenario.training.global_batch_size / median if median else None,
        "losses": losses,
        "devices": [
            {"device": r["rank"], "stages": r["stages"], "peak_memory_bytes": r["peak_memory_bytes"],
             "peak_activation_bytes": r["peak_activation_bytes"], "memory_breakdown_bytes": r["memory_breakdown_bytes"]}
            for r in sorted(ranks, key=lambda r: r["rank"])
        ],
        "events_step": typical,
        "events_step_time_s": step_times[typical],
        "events": sorted((row for r in ranks for row in r["rows_by_step"][typical]),
                         key=lambda e: (e["device"], e["start_s"], e["end_s"])),
    }
    if options.check:
        reference = reference_step(runnable.model, scenario.training.global_batch_size, step=0,
                                   seed=options.execution.seed, device=device, drop_groups=_drop_groups(runnable),
                                   token_servers=_token_servers(runnable))
        grad_rtol = check_rtol(runnable.model, options.rtol)
        comparison = compare_grads(runnable.model, [r["grads"] for r in ranks], reference, rtol=grad_rtol)
        loss_ok = abs(losses[0] - reference.loss) <= options.rtol * abs(reference.loss)
        summary.update(
            loss=losses[0],
            reference_loss=reference.loss,
            max_abs_grad_diff=comparison.max_abs_grad_diff,
            max_rel_grad_diff=comparison.max_rel_grad_diff,
            worst_grad=comparison.worst,
            grad_rtol=grad_rtol,
            check_passed=comparison.passed and loss_ok,
        )
    return summary


def _drop_groups(runnable: RunnableScenario) -> dict | None:
    """The plan's groups of tokens per MoE layer, for a reference that drops at capacity as the
    devices do (None when dropless)."""
    experts, training = runnable.model.experts, runnable.scenario.training
    if experts is None or experts.capacity_factor is None:
        return None
    return drop_groups(runnable.plan, microbatch_size=training.microbatch_size,
                       num_microbatches=training.num_microbatches, seq_len=runnable.model.values["seq_len"],
                       layers=range(num_layers(runnable.model)))


def _token_servers(runnable: RunnableScenario) -> dict | None:
    """Each token's server of every expert per MoE layer, for a reference that routes as the
    devices' expert-parallel groups do (None without node-limited routing)."""
    if not runnable.model.expert_servers:
        return None
    training = runnable.scenario.training
    return token_servers(runnable.plan, runnable.model, microbatch_size=training.microbatch_size,
                         num_microbatches=training.num_microbatches, seq_len=runnable.model.values["seq_len"])

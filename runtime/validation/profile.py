"""What ``dapple-run validate`` measures on every rank between runs of the plan's steps.

Each turn of the profile (``profile_slice``) times every layer, the optimizer step from
cold caches (``measure_optimizer``) and what each forward or backward action costs beyond
its layers (``measure_action_overhead``); ``runtime.validation.loop`` simulates each turn.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from runtime.model.config import RunnableScenario
from sim.cost.optimizer import optimizer_step_kernels
from sim.cost.split import split_samples

__all__ = ["CACHE_FLUSH_BYTES", "CPU_IDLE_S", "measure_action_overhead", "measure_optimizer", "profile_slice"]


CPU_IDLE_S = 0.5e-3
"""Seconds the CPU stage timing of ``measure_action_overhead`` sleeps before each action.
In a run a rank waits for its data between actions, and an action that starts after the
thread has slept runs slower than one right after another (the core and its caches have
gone to other work). On a 2-vCPU host this idle brought the timed actions from about 9%
to about 4% below the same actions in a run; a lone process on that host, with no other
rank keeping the machine busy, slows down far more after such a sleep (about 2x), which is
why the per-stage timing of ``benchmarks/gpu_stage_timing.py`` does not idle."""

CACHE_FLUSH_BYTES = 64 * 2**20
"""Bytes written between two timed optimizer steps: more than a CPU's last-level cache or a
GPU's L2, so every step starts cold, as in a run, where the step's forwards and backwards
have passed through the caches since the last one."""


def measure_optimizer(runnable: RunnableScenario, device, *, layers: list[int] | None = None,
                      repeats: int = 10) -> dict[str, float]:
    """Seconds of one optimizer step over ``layers`` (default: the whole model), each from
    cold caches (``CACHE_FLUSH_BYTES``), and the memory bandwidth that makes the simulator's
    charge match it.

    The simulator charges a step its bytes over the memory bandwidth
    (``sim.cost.compute.optimizer_step_kernels``; the measured scenario has no launch overhead).
    """
    # torch only where this runs: the command line and its checks before launch stay torch-free
    import torch

    # torch only where this runs: the command line and its checks before launch stay torch-free
    from runtime.model.models import build_layers, make_optimizer, num_layers

    indices = list(range(num_layers(runnable.model))) if layers is None else layers
    modules = build_layers(runnable.model, indices, seed=0, device=device)
    params = [p for module in modules.values() for p in module.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = make_optimizer(runnable.scenario.model.optimizer, params, lr=1e-3)
    scratch = torch.zeros(CACHE_FLUSH_BYTES // 4, dtype=torch.float32, device=device)
    times = []
    for index in range(repeats + 2):
        scratch.add_(1.0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index >= 2:
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    model = runnable.scenario.model
    step_bytes, _ = optimizer_step_kernels(model.optimizer, model.dtype, param_bytes)
    return {"optimizer_s": seconds, "implied_bandwidth_bytes_per_s": step_bytes / seconds}


def measure_action_overhead(runnable: RunnableScenario, stage: int, layers: list, device, *,
                            repeats: int = 3, tp_mesh=None, ring=None) -> list[float]:
    """Seconds a forward or backward action of ``stage`` costs beyond its layers' profiled
    times, one sample per repeat.

    The stage runs its rank's F and B actions of the plan's schedule with the stage's
    layers chained, an optimizer step between repeats and, on a CPU, an idle of
    ``CPU_IDLE_S`` before each action, as in a run (``runtime.measure.stage_timing``);
    what one pass of the action list takes beyond the sum of its layers' profiled forward and
    backward times (each layer timed alone, on warm caches), spread evenly over its
    actions, is one sample of the framework's fixed cost per action and of the layers'
    effect on each other's caches, the first forward's cold caches after the optimizer step
    included. The caller takes the median of the samples, which a moment when the host holds
    the process back does not move. Empty for plans whose stages share a rank (interleaved
    chunks). With ``tp_mesh`` (``ring``) the stage is one device's share, timed with its
    tensor-parallel group (context-parallel ring).
    """
    # torch only where this runs: the command line and its checks before launch stay torch-free
    from runtime.measure.stage_timing import time_stage

    plan, training = runnable.plan, runnable.scenario.training
    if len(plan.device_groups) != plan.num_stages:
        return []
    m = training.num_microbatches
    samples = split_samples(training.microbatch_size, plan.num_replicas(stage))[-1]  # the smallest slice
    start, end = plan.stages[stage].layers
    profiled = {"F": sum(layer.fwd_s / layer.batch_size for layer in layers[start:end]) * samples,
                "B": sum(layer.bwd_s / layer.batch_size for layer in layers[start:end]) * samples}
    params = dict(plan.schedule_params)
    decided = runnable.scenario.resolved.stage_policies
    if decided is not None:  # policy auto: the run's order, as the executor decides it
        params["policy"] = decided
    timed = time_stage(runnable, stage, plan.schedule, m, device, params=params, tp_mesh=tp_mesh, ring=ring,
                       repeats=repeats, idle_s=CPU_IDLE_S if device.type == "cpu" else 0.0)["actions"]
    per_pass = max(1, len(timed) // repeats)
    extra = [seconds - profiled[kind] for kind, seconds in timed]
    return [sum(extra[k:k + per_pass]) / per_pass for k in range(0, len(extra), per_pass)]


def profile_slice(runnable: RunnableScenario, device, batch: int, warmup: int, repeats: int,
                  tp_mesh=None, ring=None) -> dict[str, Any]:
    """One turn of the profile on this rank, all ranks together: every layer (a barrier
    before each, so that the ranks time the same layer at the same moment, sharing the
    machine's cores, caches and memory bandwidth as in the run), then the optimizer step
    over this rank's stages and their per-action overhead. With ``tp_mesh`` (this rank's
    tensor-parallel group) each layer and stage is one device's share, timed with its group
    (``runtime.validation.collapse``); with ``ring`` (this rank's context-parallel ring) one
    context rank's, its attention over the ring."""
    # torch only where this runs: the command line and its checks before launch stay torch-free
    import torch.distributed as dist

    from runtime.measure.profiler import mtp_holds_table_copy, profile_layer
    from runtime.model.models import num_layers

    layers, plan = [], runnable.plan
    for index in range(num_layers(runnable.model)):
        dist.barrier()
        layers.append(profile_layer(runnable.model, index, batch, device, warmup=warmup, repeats=repeats, seed=0,
                                    mesh=tp_mesh, sequence_parallel=plan.sequence_parallel,
                                    expert_parallel=plan.expert_parallel * plan.expert_tensor_parallel, ring=ring,
                                    recompute=plan.recompute, table_copy=mtp_holds_table_copy(runnable.model, plan)))
    rank = dist.get_rank()
    stages = [s for s, stage in enumerate(runnable.plan.stages) if rank in stage.devices]
    mine = [k for s in stages for k in range(*runnable.plan.stages[s].layers)]
    dist.barrier()
    optimizer = measure_optimizer(runnable, device, layers=mine, repeats=max(3, repeats))
    dist.barrier()
    overheads = [v for s in stages
                 for v in measure_action_overhead(runnable, s, layers, device, repeats=3, tp_mesh=tp_mesh, ring=ring)]
    dist.barrier()
    return {"layers": layers, "optimizer": optimizer, "overheads": overheads}

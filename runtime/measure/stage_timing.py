"""Single-device stage timing: measure every stage of a multi-stage plan on one GPU, to
validate the simulator's per-stage compute and memory.

A plan of S stages needs S devices to run, but each stage's work does not depend on what its
neighbours compute, only on the shapes they exchange. So one device can run every stage
in turn: build the stage's layers and optimizer, then run its rank's action list of the
schedule (F and B in the schedule's order) with synthetic inputs in place of the previous
stage's activations and synthetic gradients in place of the next stage's, with no
communication. Its compute time and its peak memory are exactly what that stage's device
would spend, minus the waiting.

``time_stage`` measures one stage; ``predict_stages`` asks the simulator for the same
numbers (per stage: the F and B time of one iteration, and peak memory); the script
``benchmarks/gpu_stage_timing.py`` prints them side by side for GPipe and DAPPLE at several
micro-batch counts. On a GPU peak memory is the allocator's; on a CPU (a dry run) it is the
counted parameters, gradients, optimizer state and saved activations.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import yaml

from runtime.measure.memory import SavedTensorMeter, static_bytes
from runtime.measure.profiler import mtp_holds_table_copy, profile_layers, write_profile
from runtime.model.config import RunnableScenario
from runtime.model.context_parallel import apply_context_parallel, sequence_positions
from runtime.model.models import (
    StageModule,
    build_layers,
    input_dtype,
    local_tensor,
    make_optimizer,
    num_layers,
    sample_shape,
    synthetic_batch,
)
from runtime.model.recompute import apply_selective
from runtime.model.tensor_parallel import loss_parallel_if, parallelize_stage
from sim.cost.split import split_samples
from sim.engine.run import run_scenario
from sim.input.plan_file import plan_to_dict
from sim.input.scenario import parse_scenario
from sim.report.analysis.validation import predicted_view
from sim.schedule.generators import generate
from sim.schedule.ir import ActionKind

__all__ = ["predict_stages", "profiled_scenario", "time_stage"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _boundary_shape(runnable: RunnableScenario, cut: int, context: int = 1) -> tuple[int, ...]:
    """One sample of the tensor a stage receives at ``cut`` (1/t of the sequence with tensor
    parallelism; of a context rank's 1/``context`` on a context-parallel ring)."""
    shape, t = sample_shape(runnable.model, cut), runnable.plan.tensor_parallel
    share = context * (t if cut > 0 else 1)
    return (shape[0] // share, *shape[1:])


def _stage_input(runnable: RunnableScenario, start: int, samples: int, step: int, device: torch.device, ring=None):
    inputs, labels = synthetic_batch(runnable.model, samples, step=step, seed=0, device=device)
    if ring is not None:  # the context rank's positions of the tokens and the labels
        held = sequence_positions(runnable.model.values["seq_len"], ring.size, ring.index).to(device)
        inputs, labels = inputs[:, held], labels[:, held]
    if start == 0:
        return inputs, labels
    generator = torch.Generator(device="cpu").manual_seed(1000 + step)
    x = torch.randn((samples, *_boundary_shape(runnable, start, 1 if ring is None else ring.size)), generator=generator)
    return x.to(device=device, dtype=input_dtype(runnable.model, start)).requires_grad_(True), labels


def _run_actions(module: StageModule, actions, make_input, make_grad, meter: SavedTensorMeter | None,
                 device: torch.device, idle_s: float) -> list[tuple[ActionKind, float]]:
    """F and B in order; inputs appear at their forward and gradients at their backward, as
    received data would (nothing else is held); the thread sleeps ``idle_s`` before each.
    Each action's kind and seconds, without the idle or the making of its synthetic input or
    gradient (in a run those arrive)."""
    outputs: dict[int, torch.Tensor] = {}
    times = []
    for action in actions:
        if idle_s:
            time.sleep(idle_s)
        m = action.microbatch
        if action.kind is ActionKind.F:
            x, labels = make_input(m)
            _sync(device)
            began = time.perf_counter()
            if meter is not None:
                with meter.watching():
                    outputs[m] = local_tensor(module(x, labels) if module.is_last else module(x))
            else:
                outputs[m] = local_tensor(module(x, labels) if module.is_last else module(x))
        else:
            out = outputs.pop(m)
            grad = None if module.is_last else make_grad(m)
            _sync(device)
            began = time.perf_counter()
            out.backward(grad)
            del out
        _sync(device)
        times.append((action.kind, time.perf_counter() - began))
    return times


def time_stage(
    runnable: RunnableScenario, stage: int, schedule: str, num_microbatches: int, device: torch.device,
    *, params: dict[str, Any] | None = None, repeats: int = 3, idle_s: float = 0.0, tp_mesh=None, ring=None,
) -> dict[str, float]:
    """Time and peak memory of ``stage`` running its rank's actions of ``schedule`` alone.

    Returns ``compute_s`` (median over ``repeats`` of the action list's time, no optimizer,
    nor the making of synthetic inputs and gradients),
    ``peak_memory_bytes`` (allocator peak on a GPU; counted on a CPU),
    ``peak_activation_bytes`` (counted saved activations, on any device) and ``actions``:
    each timed action's kind (``"F"`` or ``"B"``) and seconds, over all repeats, without
    the making of synthetic inputs and gradients. With ``idle_s`` the thread sleeps that
    long before each action, as a rank waiting for its data does in a run (its time is not
    counted). With ``tp_mesh`` (a 1D tensor-parallel mesh whose ranks all call this together)
    the stage is one device's share, as the executor holds it; with ``ring`` (a context-parallel
    ring whose ranks all call this together) one context rank's, its attention over the ring.
    """
    plan, training = runnable.plan, runnable.scenario.training
    start, end = plan.stages[stage].layers
    samples = split_samples(training.microbatch_size, plan.num_replicas(stage))[-1]  # the smallest slice
    module = StageModule(build_layers(runnable.model, range(start, end), seed=0, device=device),
                         is_last=end == num_layers(runnable.model))
    if tp_mesh is not None:  # one device's share; the group's other ranks time the stage with it
        parallelize_stage(module, tp_mesh, sequence_parallel=plan.sequence_parallel, first=start == 0)
    if ring is not None:  # after tensor parallelism, as the executor holds it
        apply_context_parallel(module, ring, runnable.model.values["seq_len"], device)
    apply_selective(module, plan.recompute)  # the run's checkpointed regions (runtime.execution.holdings)
    optimizer = make_optimizer(runnable.scenario.model.optimizer, list(module.parameters()), lr=1e-3)
    actions = [a for a in generate(schedule, plan.num_stages, num_microbatches, **(params or {})).ranks[stage]
               if a.kind in (ActionKind.F, ActionKind.B)]
    out_shape = (samples, *_boundary_shape(runnable, end, 1 if ring is None else ring.size)) if not module.is_last else None
    timings, peak, activations, each = [], 0.0, 0.0, []
    for step in range(repeats + 1):  # the first pass builds the optimizer state and warms up
        def make_input(m: int, step: int = step):
            return _stage_input(runnable, start, samples, step * num_microbatches + m, device, ring)

        def make_grad(m: int):
            return torch.randn(out_shape, device=device, dtype=input_dtype(runnable.model, end))

        meter = SavedTensorMeter(module.parameters()) if step == 0 else None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        _sync(device)
        with loss_parallel_if(1 if tp_mesh is None else tp_mesh.size()):
            times = _run_actions(module, actions, make_input, make_grad, meter, device, idle_s)
        elapsed = sum(seconds for _, seconds in times)
        if meter is not None:
            activations = float(meter.peak_bytes)
        if step > 0:
            timings.append(elapsed)
            each += [(kind.value, seconds) for kind, seconds in times]
            if device.type == "cuda":
                peak = max(peak, float(torch.cuda.max_memory_allocated(device)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    if device.type != "cuda":
        peak = float(static_bytes(list(module.parameters()), optimizer)) + activations
    timings.sort()
    return {"compute_s": timings[len(timings) // 2], "peak_memory_bytes": peak, "peak_activation_bytes": activations,
            "actions": each}


def profiled_scenario(runnable: RunnableScenario, device: torch.device, folder, *, overrides=None,
                      warmup: int = 3, repeats: int = 10):
    """``runnable``'s scenario on layers profiled on ``device`` (profile written into ``folder``),
    with ``overrides`` (dotted keys) applied to training and plan."""
    scenario, folder = runnable.scenario, Path(folder)
    fewest = min(scenario.plan.num_replicas(s) for s in range(scenario.plan.num_stages))
    batch = split_samples(scenario.training.microbatch_size, fewest)[-1]  # the smallest slice there
    layers = profile_layers(runnable.model, batch, device, warmup=warmup, repeats=repeats,
                            recompute=runnable.plan.recompute,
                            table_copy=mtp_holds_table_copy(runnable.model, runnable.plan))
    write_profile(layers, folder, device=device.type)
    plan = plan_to_dict(scenario.plan, scenario.training)
    cluster = scenario.cluster
    text = f"""
name: {scenario.name}-profiled
cluster:
  nodes: {cluster.nodes}
  devices_per_node: {cluster.devices_per_node}
  device: {{name: {cluster.device.name}, memory: {cluster.device.memory_bytes}B, peak_flops: {cluster.device.peak_flop_per_s}FLOP/s,
           peak_fp32_flops: {cluster.device.peak_fp32_flop_per_s}FLOP/s,
           memory_bandwidth: {cluster.device.memory_bandwidth_bytes_per_s}B/s}}
  intra_node: {{bandwidth: {cluster.intra_node.bandwidth_bytes_per_s}B/s, latency: {cluster.intra_node.latency_s}s}}
  inter_node: {{bandwidth: {cluster.inter_node.bandwidth_bytes_per_s}B/s, latency: {cluster.inter_node.latency_s}s}}
model: {{profile: profile.txt, profile_batch_size: {batch}, dtype: {scenario.model.dtype}, optimizer: {scenario.model.optimizer}}}
training: {{global_batch_size: {scenario.training.global_batch_size}, microbatch_size: {scenario.training.microbatch_size}}}
"""

    raw = yaml.safe_load(text)
    raw["plan"] = {k: plan[k] for k in ("schedule", "recompute", "stages")}
    return parse_scenario(yaml.safe_dump(raw), source=str(folder / "profiled.yaml"), base_dir=folder,
                          overrides=overrides)


def predict_stages(scenario, *, memory: str) -> list[dict[str, float]]:
    """Per stage (first device of each): the simulator's F+B seconds of one iteration and peak
    memory (``allocator``: everything; ``counted``: static bytes plus activations)."""

    result = run_scenario(scenario, engine="simpy")
    devices = {d.device: d for d in predicted_view(result, memory=memory).devices}
    return [{"compute_s": devices[stage.devices[0]].compute_s,
             "peak_memory_bytes": devices[stage.devices[0]].peak_memory_bytes} for stage in scenario.plan.stages]

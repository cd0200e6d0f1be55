"""The validation loop: profile → simulate → run → compare, for one scenario and plan.

``dapple-run validate`` proves (or disproves) the simulator on the machine at hand:

1. **profile** the model's layers on this device (forward and backward time, saved
   activations, parameters; one thread per CPU rank, as in a run), the links between two
   processes on the backend, the optimizer step, and what each forward or backward action
   costs beyond its layers (``measure_action_overhead``); write them as a scenario
   (``runtime.profile_run``), the device's memory bandwidth set to what the optimizer step
   achieves (the only memory-bound work the simulator charges it with) and its
   ``action_overhead`` to the measured one;
2. **simulate** that measured scenario with the SimPy engine;
3. **run** the same plan for real (torchrun, or local processes in tests);
4. **compare** per iteration, per stage, per action and per device (``sim.validation``).

The report is JSON-ready; ``write_report`` saves it with the predicted-over-measured Gantt
chart and the per-device memory chart.
"""

from __future__ import annotations

import json
import math
import time
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from runtime.config import RunnableScenario

__all__ = ["combine_rounds", "measure_optimizer", "profile_for_validation", "spawn_run", "validate", "write_report"]


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
    (``sim.cost.optimizer_step_kernels``; the measured scenario has no launch overhead).
    """
    import statistics

    import torch

    from runtime.models import build_layers, make_optimizer, num_layers
    from sim.cost import optimizer_step_kernels

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
                            repeats: int = 3) -> float | None:
    """Seconds a forward or backward action of ``stage`` costs beyond its layers' profiled times.

    The stage replays its rank's F and B actions of the plan's schedule with the stage's
    layers chained (``runtime.stage_replay``); what that takes beyond the sum of the layers'
    profiled times (each layer timed alone, on warm caches) is the framework's fixed cost
    per action and the layers' effect on each other's caches, spread evenly over the
    stage's 2·M actions. None for plans whose stages share a rank (interleaved chunks).
    """
    from runtime.stage_replay import replay_stage

    plan, training = runnable.plan, runnable.scenario.training
    if len(plan.device_groups) != plan.num_stages:
        return None
    m = training.num_microbatches
    samples = training.microbatch_size // plan.stages[stage].num_replicas
    start, end = plan.stages[stage].layers
    profiled = sum((layer.fwd_s + layer.bwd_s) / layer.batch_size for layer in layers[start:end]) * samples * m
    replayed = replay_stage(runnable, stage, plan.schedule, m, device, params=dict(plan.schedule_params),
                            repeats=repeats)["compute_s"]
    return (replayed - profiled) / (2 * m)


def _profile_worker(device, runnable: RunnableScenario, batch: int, warmup: int, repeats: int):
    import torch.distributed as dist

    from runtime.models import num_layers
    from runtime.profiler import profile_layer

    layers = []
    for index in range(num_layers(runnable.model)):  # every rank times the same layer at the same time
        dist.barrier()
        layers.append(profile_layer(runnable.model, index, batch, device, warmup=warmup, repeats=repeats, seed=0))
    rank = dist.get_rank()
    stages = [s for s, stage in enumerate(runnable.plan.stages) if rank in stage.devices]
    mine = [k for s in stages for k in range(*runnable.plan.stages[s].layers)]
    dist.barrier()
    optimizer = measure_optimizer(runnable, device, layers=mine, repeats=repeats)
    dist.barrier()
    overheads = [measure_action_overhead(runnable, s, layers, device) for s in stages]
    return layers, optimizer, overheads


def _concurrent_profile(runnable: RunnableScenario, *, nproc: int, backend: str, batch: int, warmup: int,
                        repeats: int, timeout: float):
    """Profile the layers on all ``nproc`` processes at once, as they will run: ranks share the
    machine's cores, caches and memory bandwidth, and a layer timed alone runs faster than it
    will in the run; a barrier before each layer keeps the ranks timing together. Each
    layer's time is the median over the ranks; each rank also times the optimizer step over
    its own stages' parameters and its stages' action overhead (``measure_action_overhead``),
    of which the median over ranks is kept (never below 0)."""
    import statistics
    from dataclasses import replace

    from runtime.launch import spawn

    results = spawn(_profile_worker, nproc, runnable, batch, warmup, repeats, backend=backend,
                    timeout_s=max(timeout, 600.0))
    layers = [
        replace(per_rank[0], fwd_s=statistics.median(p.fwd_s for p in per_rank),
                bwd_s=statistics.median(p.bwd_s for p in per_rank))
        for per_rank in zip(*(layers for layers, _, _ in results))
    ]
    # one bandwidth for every device: the one that gets the slowest rank's step right
    slowest = max((o for _, o, _ in results), key=lambda o: o["optimizer_s"])
    overheads = [v for _, _, values in results for v in values if v is not None]
    return layers, slowest, max(0.0, statistics.median(overheads)) if overheads else 0.0


def profile_for_validation(runnable: RunnableScenario, out: Path, *, nproc: int, backend: str, repeats: int,
                           timeout: float, warmup: int = 3) -> dict[str, Any]:
    """Profile links, then layers and the optimizer on all ranks at once; write the measured
    profile and scenario into ``out``; return what ``dapple-run profile`` returns, plus the
    optimizer measurement."""
    from runtime import profile_run
    from runtime.profiler import write_profile
    from sim.units import format_bandwidth, format_time

    plan, training = runnable.plan, runnable.scenario.training
    batch = math.ceil(training.microbatch_size / min(stage.num_replicas for stage in plan.stages))
    args = Namespace(backend=backend, batch_size=batch, warmup=warmup, repeats=repeats, no_links=False,
                     timeout=timeout)
    result = profile_run.profile_here(runnable, args, out)  # links, device, and a first profile
    layers, optimizer, action_overhead = _concurrent_profile(
        runnable, nproc=nproc, backend=backend, batch=batch, warmup=warmup, repeats=repeats, timeout=timeout)
    write_profile(layers, out, device=result["device"]["name"])
    scenario_path = Path(result["scenario"])
    doc = yaml.safe_load(scenario_path.read_text(encoding="utf-8"))
    doc["cluster"]["device"]["memory_bandwidth"] = format_bandwidth(optimizer["implied_bandwidth_bytes_per_s"], 6)
    doc["cluster"]["device"]["action_overhead"] = format_time(action_overhead, 6)
    scenario_path.write_text(
        "# The scenario on the layers, links, optimizer step and per-action overhead measured by\n"
        "# dapple-run validate (all timed on all ranks at once).\n"
        + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None),
        encoding="utf-8",
    )
    result["optimizer"] = optimizer
    result["action_overhead_s"] = action_overhead
    result["layers"] = [_as_dict(layer) for layer in layers]
    return result


def _as_dict(layer) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(layer)


def _session(device, runnable: RunnableScenario, steps: int, warmup: int, timeout: float):
    from runtime.executor import ExecOptions
    from runtime.session import SessionOptions, run_session

    return run_session(runnable, SessionOptions(steps=steps, warmup_steps=warmup,
                                                execution=ExecOptions(timeout_s=timeout)), device)


def spawn_run(runnable: RunnableScenario, *, nproc: int, backend: str, steps: int, warmup: int,
              timeout: float) -> dict[str, Any]:
    """Run the plan on ``nproc`` local processes (no torchrun); rank 0's summary."""
    from runtime.launch import spawn

    return spawn(_session, nproc, runnable, steps, warmup, timeout, backend=backend, timeout_s=timeout)[0]


def validate(
    runnable: RunnableScenario,
    *,
    nproc: int,
    backend: str,
    steps: int,
    out: Path,
    run: Callable[[], dict[str, Any]],
    repeats: int = 10,
    timeout: float = 45.0,
) -> dict[str, Any]:
    """Profile, simulate, ``run()`` and compare; the report (``sim.validation.compare``)."""
    from sim.report import run_scenario
    from sim.scenario import load_scenario
    from sim.validation import compare, predicted_view

    profile = profile_for_validation(runnable, out / "profile", nproc=nproc, backend=backend, repeats=repeats,
                                     timeout=timeout)
    measured_scenario = load_scenario(profile["scenario"])
    predicted = run_scenario(measured_scenario, engine="simpy")
    measured = run()
    memory = "allocator" if backend == "nccl" else "counted"
    return compare(
        predicted_view(predicted, memory=memory),
        measured,
        scenario=runnable.scenario.name,
        schedule=runnable.plan.schedule,
        backend=backend,
        nproc=nproc,
        steps=steps,
        memory=memory,
        profile={"batch_size": profile["batch_size"], "links": profile["links"], "optimizer": profile["optimizer"],
                 "action_overhead_s": profile["action_overhead_s"], "scenario": profile["scenario"]},
    )


def combine_rounds(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from several rounds of profile → simulate → run → compare.

    A machine whose speed drifts (a shared or virtual host) moves each round's profile and
    run apart by that drift; the median round says more than any one. The result is the
    round with the median iteration-time error (the upper middle one for an even count: its
    tables, events and charts), with ``rounds`` (each round's predicted and measured
    iteration time and error) and ``error.iteration_time_frac_median``.
    """
    import statistics

    ordered = sorted(range(len(reports)), key=lambda k: reports[k]["error"]["iteration_time_frac"])
    median_round = ordered[len(ordered) // 2]
    combined = dict(reports[median_round])
    combined["rounds"] = [{"round": k + 1, "predicted_s": r["predicted"]["iteration_time_s"],
                           "measured_s": r["measured"]["iteration_time_s"],
                           "iteration_time_frac": r["error"]["iteration_time_frac"]} for k, r in enumerate(reports)]
    combined["median_round"] = median_round + 1
    combined["error"] = {**combined["error"], "iteration_time_frac_median": statistics.median(
        r["error"]["iteration_time_frac"] for r in reports)}
    return combined


def write_report(report: dict[str, Any], out: Path) -> list[Path]:
    """``validation.json`` and the two charts (``validation_gantt.png``, ``validation_memory.png``)."""
    import matplotlib.pyplot as plt

    from sim.compare_plots import validation_gantt_figure, validation_memory_figure

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "validation.json", out / "validation_gantt.png", out / "validation_memory.png"]
    paths[0].write_text(json.dumps(report, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for path, figure in zip(paths[1:], (validation_gantt_figure, validation_memory_figure)):
        fig = figure(report)
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return paths

"""The validation loop: profile → run → simulate → compare, for one scenario and plan.

``dapple-run validate`` proves (or disproves) the simulator on the machine at hand:

1. **links**: latency and bandwidth between two processes on the backend
   (``runtime.measure.profile_run``), which also writes the measured scenario's frame;
2. **profile and run, taking turns**: ``nproc`` processes run the plan for real, and before
   each of a few runs of consecutive steps they all profile together: every layer's
   forward and backward time (one thread per CPU rank, as in a run), the optimizer step
   from cold caches, and what each forward or backward action costs beyond its layers
   (``measure_action_overhead``). Taking turns a second or so apart, profile and run see
   the machine in the same state, which a profile taken before the run does not on a
   host whose speed drifts;
3. **simulate** each turn's profile (``_predict_turns``) with the SimPy engine, the
   device's memory bandwidth set to what the optimizer step achieves (the only memory-bound
   work the simulator charges it with) and its ``action_overhead`` to the measured one; the
   turn with the median prediction is the prediction;
4. **compare** per iteration, per stage, per action and per device (``sim.report.analysis.validation``).

The report is a ``sim.core.validation_report.ValidationReport``; ``combine_rounds`` makes
one of several rounds, and ``dapple-run validate`` (``runtime.commands.validate``) writes its
JSON and charts. ``validate`` also writes the prediction and the median measured step as
Chrome/Perfetto traces (``trace_predicted.json``, ``trace_measured.json``), laid out alike.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from argparse import Namespace
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from runtime.commands.run import follow_steps
from runtime.execution.launch import spawn
from runtime.execution.status import StatusBoard
from runtime.measure import profile_run
from runtime.measure.trace import write_traces
from runtime.model.config import RunnableScenario
from runtime.validation.collapse import expand_view
from runtime.validation.profile import profile_slice
from sim.core.command import Stopwatch
from sim.core.units import format_bandwidth, format_time
from sim.core.validation_report import RoundComparison, TurnComparison, ValidationProfile, ValidationReport
from sim.cost.split import split_samples
from sim.engine.result import SimResult
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario
from sim.report.analysis.validation import compare, measured_view, predicted_view

__all__ = ["combine_rounds", "validate"]


def _validate_worker(device, runnable: RunnableScenario, batch: int, steps: int, warmup_steps: int, slices: int,
                     repeats: int, seed: int, timeout: float, status_folder: str | None = None):
    """Run the plan with the profile taking turns with it: before each of ``slices`` runs of
    consecutive steps, every rank profiles (``_profile_slice``). Rank 0's run summary (None
    elsewhere) and this rank's profile slices, each with the ``seconds`` it took. With
    ``status_folder`` each rank keeps its status file there (``runtime.execution.status``), which
    the launcher's progress bar follows."""
    # torch only in the processes that run the plan: the loop's own module stays torch-free
    import torch.distributed as dist

    # torch too: the executor and the session run the plan's modules, the groups are meshes
    from runtime.execution.executor import ExecOptions
    from runtime.execution.session import SessionOptions, run_session
    from runtime.model.context_parallel import profile_groups

    profiles: list[dict[str, Any]] = []
    per_slice = max(1, math.ceil(repeats / slices))
    tp_mesh, ring = profile_groups(runnable.plan, dist.get_rank(), device.type)  # each profiles with its own

    def between(k: int) -> None:
        start = time.perf_counter()
        profiles.append(profile_slice(runnable, device, batch, warmup=3 if k == 0 else 1, repeats=per_slice,
                                      tp_mesh=tp_mesh, ring=ring))
        profiles[-1]["seconds"] = time.perf_counter() - start

    status = StatusBoard(status_folder, dist.get_rank()) if status_folder else None
    options = SessionOptions(steps=steps, warmup_steps=warmup_steps, execution=ExecOptions(seed=seed, timeout_s=timeout))
    summary = run_session(runnable, options, device, status=status, between=between, slices=slices)
    if status is not None:
        status.close()
    return summary, profiles


def _owners(plan, num_layers: int) -> list[list[int]]:
    """For each layer, the ranks that run it in ``plan`` (every rank for a layer no stage has)."""
    owners: list[list[int]] = [[] for _ in range(num_layers)]
    for stage in plan.stages:
        for k in range(*stage.layers):
            owners[k] += [d for d in stage.devices if d not in owners[k]]
    everyone = sorted({d for stage in plan.stages for d in stage.devices})
    return [ranks or everyone for ranks in owners]


@dataclass(frozen=True, slots=True, kw_only=True)
class _TurnProfile:
    """One turn of the profile, as the simulator gets it (``_slice_profile``)."""

    layers: tuple
    """Every layer (``runtime.measure.profiler.LayerProfile``, seconds and bytes), in model order."""
    optimizer: dict[str, float]
    """The slowest rank's optimizer step (``runtime.validation.profile.measure_optimizer``'s:
    ``optimizer_s``, ``implied_bandwidth_bytes_per_s``)."""
    action_overhead_s: float
    """The per-action overhead, seconds (never below 0)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Prediction:
    """Every turn simulated on its own profile, and the turn with the median prediction."""

    turns: tuple[TurnComparison, ...]
    """Each turn's prediction against the steps run right after it."""
    middle: int
    """Index (from 0) of the turn with the median prediction: the report's prediction."""
    result: SimResult
    """That turn's simulation."""
    profile: _TurnProfile
    """That turn's profile."""


def _slice_profile(per_rank: list[list[dict[str, Any]]], turn: int, plan) -> _TurnProfile:
    """What the simulator gets from one turn of the profile on every rank: each layer's
    forward and backward time the median over the ranks that run it in the plan (every rank
    times every layer, but a device that runs slower than another, as a shared host's cores
    can, runs its own stages so); the slowest rank's optimizer step (one memory bandwidth
    for every device: the one that gets the slowest rank right); the per-action overhead
    the median over the ranks' samples, never below 0."""
    profiles = [ranks[turn] for ranks in per_rank]
    owners = _owners(plan, len(profiles[0]["layers"]))
    layers = []
    for k, first in enumerate(profiles[0]["layers"]):
        measured = [profiles[rank]["layers"][k] for rank in owners[k] if rank < len(profiles)]
        layers.append(replace(first, fwd_s=statistics.median(m.fwd_s for m in measured),
                              bwd_s=statistics.median(m.bwd_s for m in measured)))
    optimizer = max((p["optimizer"] for p in profiles), key=lambda o: o["optimizer_s"])
    overheads = [v for p in profiles for v in p["overheads"]]
    return _TurnProfile(layers=tuple(layers), optimizer=optimizer,
                        action_overhead_s=max(0.0, statistics.median(overheads)) if overheads else 0.0)


def _write_measured_scenario(frame: Path, out: Path, device: str, profile: _TurnProfile) -> Path:
    """The measured scenario in ``out``: the scenario ``frame`` (links, device, plan, as
    ``profile_run`` wrote it) on the turn's layers (``out/profile.txt``), with the optimizer's
    memory bandwidth and the action overhead; its path."""
    # torch only where a profile is written: the loop's own module stays torch-free
    from runtime.measure.profiler import write_profile

    out.mkdir(parents=True, exist_ok=True)
    write_profile(list(profile.layers), out, device=device)
    doc = yaml.safe_load(frame.read_text(encoding="utf-8"))
    doc["cluster"]["device"]["memory_bandwidth"] = format_bandwidth(
        profile.optimizer["implied_bandwidth_bytes_per_s"], 6)
    doc["cluster"]["device"]["action_overhead"] = format_time(profile.action_overhead_s, 6)
    path = out / "scenario.yaml"
    path.write_text(
        "# The scenario on the layers, links, optimizer step and per-action overhead measured by\n"
        "# dapple-run validate (on all ranks at once, taking turns with the run).\n"
        + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None),
        encoding="utf-8",
    )
    return path


def _predict_turns(frame: Path, device: str, per_rank: list[list[dict[str, Any]]], measured: list[float],
                   plan) -> _Prediction:
    """Each turn on its own: its profile simulated (its scenario in ``sliceK`` next to
    ``frame``, or in ``frame``'s folder for a single turn) against the median of the steps
    run right after it. A turn's profile is one moment of the machine; pooling every layer's
    times over turns would mix moments."""
    count = len(per_rank[0])
    turns, results, profiles = [], [], []
    for k in range(count):
        profiles.append(_slice_profile(per_rank, k, plan))
        folder = frame.parent / f"slice{k + 1}" if count > 1 else frame.parent
        results.append(run_scenario(load_scenario(_write_measured_scenario(frame, folder, device, profiles[k])),
                                    engine="simpy"))
        steps = statistics.median(measured[len(measured) * k // count:len(measured) * (k + 1) // count])
        predicted = results[k].iteration_time_s
        turns.append(TurnComparison(turn=k + 1, predicted_s=predicted, measured_s=steps,
                                    iteration_time_frac=(predicted - steps) / steps))
    middle = sorted(range(count), key=lambda k: turns[k].predicted_s)[count // 2]
    return _Prediction(turns=tuple(turns), middle=middle, result=results[middle], profile=profiles[middle])


def validate(
    runnable: RunnableScenario,
    *,
    nproc: int,
    backend: str,
    steps: int,
    out: Path,
    warmup: int = 2,
    slices: int = 5,
    repeats: int = 20,
    seed: int = 0,
    timeout: float = 45.0,
    tick=None,
    watch=None,
) -> ValidationReport:
    """Profile, run, simulate and compare; the report (``sim.report.analysis.validation.compare``).

    ``tick(n, desc=...)`` (a progress bar's, over the ``warmup + steps`` steps) hears what
    is under way; ``watch`` (a ``sim.core.command.Stopwatch``) times the phases.

    The links are measured first (``runtime.measure.profile_run``, 2 fresh processes). Then
    ``nproc`` processes run ``warmup + steps`` steps of the plan, and before each of
    ``slices`` runs of consecutive measured steps they all profile the layers, the optimizer
    step and the per-action overhead (``repeats`` timed runs per layer in all). Profile and
    run thus take turns a second or so apart, and see the machine in the same state: on a
    shared or virtual host whose speed drifts by tens of percent over seconds, a profile
    taken before the run predicts a different machine. Each turn's profile is simulated
    with the SimPy engine (``_predict_turns``); the turn with the median prediction is the
    prediction, against the median of all measured steps; every turn's own prediction and
    steps are in the report's ``turns``.
    """
    watch = watch or Stopwatch()
    say = tick or (lambda n=1, desc=None: None)
    plan = runnable.plan
    slices = max(1, min(slices, steps))
    # the largest slice of the least replicated stage
    batch = split_samples(runnable.scenario.training.microbatch_size,
                          min(plan.num_replicas(s) for s in range(plan.num_stages)))[0]
    args = Namespace(backend=backend, batch_size=batch, warmup=3, repeats=10, no_links=False, timeout=timeout)
    say(0, desc="measuring the device and the links")
    with watch.phase("measure the device and the links"):
        profile = profile_run.profile_here(runnable, args, out / "profile")  # links, the device, the scenario's frame
    measured, per_rank = _run_taking_turns(runnable, nproc, backend, batch, steps, warmup, slices, repeats, seed,
                                           timeout, tick, watch)
    frame, device = Path(profile["scenario"]), profile["device"]["name"]
    say(0, desc=f"simulating {len(per_rank[0])} profiles")
    with watch.phase(f"simulate {len(per_rank[0])} profiles"):
        prediction = _predict_turns(frame, device, per_rank, measured["iteration_times_s"], plan)
        if len(prediction.turns) > 1:  # the measured scenario next to the links is the median turn's
            _write_measured_scenario(frame, frame.parent, device, prediction.profile)
    return _report(runnable, prediction, measured, profile, backend=backend, nproc=nproc, steps=steps, out=out)


def _run_taking_turns(runnable: RunnableScenario, nproc: int, backend: str, batch: int, steps: int, warmup: int,
                      slices: int, repeats: int, seed: int, timeout: float, tick, watch: Stopwatch):
    """``nproc`` processes run the plan, profiling before each of ``slices`` runs of steps
    (``_validate_worker``): rank 0's run summary and every rank's profile turns."""
    if tick is not None:
        tick(0, desc=f"starting {nproc} processes")
    with watch.phase(f"run {warmup} + {steps} steps taking turns with {slices} profiles"), \
            tempfile.TemporaryDirectory(prefix="dapple-validate-status-") as folder, \
            follow_steps(Path(folder), nproc, tick):
        results = spawn(_validate_worker, nproc, runnable, batch, steps, warmup, slices, repeats, seed, timeout,
                        folder if tick is not None else None, backend=backend, timeout_s=max(timeout, 600.0))
    per_rank = [profiles for _, profiles in results]
    watch.add("of which profiling between the steps (rank 0)", sum(p.get("seconds", 0.0) for p in per_rank[0]))
    return results[0][0], per_rank


_COLLAPSED = ("each simulated device is one tensor-parallel group; its layers were measured as one device's share, "
              "collectives included (runtime.validation.collapse)")


def _report(runnable: RunnableScenario, prediction: _Prediction, measured: dict[str, Any], profile: dict[str, Any],
            *, backend: str, nproc: int, steps: int, out: Path) -> ValidationReport:
    """The median turn's prediction against the run, with what it was simulated on and the traces."""
    plan, turn = runnable.plan, prediction.profile
    memory = "allocator" if backend == "nccl" else "counted"
    view = predicted_view(prediction.result, memory=memory)
    if plan.tensor_parallel > 1:  # each simulated device is one tensor-parallel group (runtime.validation.collapse)
        view = expand_view(view, plan)
    simulated_on = ValidationProfile(
        batch_size=profile["batch_size"], links=profile["links"], optimizer_s=turn.optimizer["optimizer_s"],
        optimizer_bandwidth_bytes_per_s=turn.optimizer["implied_bandwidth_bytes_per_s"],
        action_overhead_s=turn.action_overhead_s, scenario=profile["scenario"],
        layers=tuple(asdict(layer) for layer in turn.layers), num_turns=len(prediction.turns),
        turn=prediction.middle + 1)
    return compare(view, measured_view(measured), scenario=runnable.scenario.name, schedule=plan.schedule,
                   backend=backend, nproc=nproc, steps=steps, memory=memory, profile=simulated_on,
                   turns=prediction.turns if len(prediction.turns) > 1 else (),
                   traces=write_traces(prediction.result, measured, out, scenario=runnable.scenario.name),
                   collapsed=_COLLAPSED if plan.tensor_parallel > 1 else None)


def combine_rounds(reports: list[ValidationReport]) -> ValidationReport:
    """One report from several rounds of profile → simulate → run → compare.

    A machine whose speed drifts (a shared or virtual host) moves each round's profile and
    run apart by that drift; the median round says more than any one. The result is the
    round with the median iteration-time error (the upper middle one for an even count: its
    tables, events and charts), with ``rounds`` (each round's predicted and measured
    iteration time and error) and ``error.iteration_time_frac_median``.
    """
    ordered = sorted(range(len(reports)), key=lambda k: reports[k].error.iteration_time_frac)
    median_round = ordered[len(ordered) // 2]
    chosen = reports[median_round]
    rounds = tuple(RoundComparison(round=k + 1, predicted_s=r.predicted.iteration_time_s,
                                   measured_s=r.measured.iteration_time_s,
                                   iteration_time_frac=r.error.iteration_time_frac) for k, r in enumerate(reports))
    median = statistics.median(r.error.iteration_time_frac for r in reports)
    return replace(chosen, rounds=rounds, median_round=median_round + 1,
                   error=replace(chosen.error, iteration_time_frac_median=median))

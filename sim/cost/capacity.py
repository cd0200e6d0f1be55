"""A training run's estimate: one replayed iteration scaled to the whole run, with its price.

``estimate_run(scenario, summary)`` answers what a capacity study asks: how many days, how many
GPU-hours, what cost, what energy and carbon, and what failures and checkpoints take. It
combines the closed forms of ``sim.cost.energy`` (time, GPU-hours, cost, energy, carbon) and
``sim.cost.goodput`` (Young/Daly, the exact renewal time, the seeded Monte Carlo) and writes
down every figure it used (``RunEstimate.assumptions``). ``estimate_from`` takes the pieces
instead (an iteration time and busy shares), for callers that sweep cluster sizes without a
replay each. Both cost microseconds, plus the Monte Carlo's few milliseconds.

Checkpoint size: the model's parameters and optimizer state (with mixed precision the fp32
master weights), each tensor once (``sim.cost.memory.model_state_bytes`` at d = 1, without
gradients, which a checkpoint does not keep). A plan that shards them (ZeRO, FSDP) holds exactly
that summed over its devices; a replicated plan holds copies, of which a checkpoint writes one
(as torch.distributed.checkpoint de-duplicates replicated tensors).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from sim.core.reliability import ReliabilitySpec
from sim.core.run_estimate import CheckpointPlan, Goodput, MonteCarlo, RunEstimate, RunTotals
from sim.core.specs import ClusterSpec
from sim.core.summary import Summary
from sim.core.training import TrainingSpec
from sim.core.units import format_bandwidth, format_bytes
from sim.cost import energy, goodput
from sim.cost.memory import model_state_bytes

__all__ = ["checkpoint_bytes", "estimate_from", "estimate_run", "tokens_per_sample"]


def tokens_per_sample(model) -> int | None:
    """A generated transformer's sequence length (tokens per sample); None for a model without one."""
    if model.preset is None or "seq_len" not in model.preset.values:
        return None
    return model.preset.values["seq_len"]


def checkpoint_bytes(model) -> float:
    """Bytes of one checkpoint: parameters + optimizer state (master weights included), once."""
    states = model_state_bytes(model.param_bytes(), optimizer_bytes_per_param_byte=model.optimizer_state_bytes_per_param_byte,
                               data_parallel=1)
    return states.parameters + states.optimizer


def estimate_run(scenario: Any, summary: Summary) -> RunEstimate | None:
    """The run of ``scenario`` (its ``training.steps``) at ``summary``'s iteration; None when the
    scenario sets no run length or the iteration did not finish."""
    if scenario.training.steps is None or summary.iteration_time_s is None:
        return None
    states = [d.memory_breakdown.parameters + d.memory_breakdown.optimizer for d in summary.devices
              if d.memory_breakdown is not None]
    return estimate_from(cluster=scenario.cluster, training=scenario.training, model=scenario.model,
                         reliability=getattr(scenario, "reliability", None),
                         iteration_time_s=summary.iteration_time_s,
                         busy_share_sum=sum(min(d.busy_s / summary.iteration_time_s, 1.0) for d in summary.devices),
                         largest_device_state_bytes=max(states) if states else None)


def estimate_from(*, cluster: ClusterSpec, training: TrainingSpec, model: Any, reliability: ReliabilitySpec | None,
                  iteration_time_s: float, busy_share_sum: float,
                  largest_device_state_bytes: float | None = None) -> RunEstimate:
    """The run from its pieces: ``busy_share_sum`` is Σ over the plan's devices of busy time over
    iteration time; ``largest_device_state_bytes`` the most parameter and optimizer bytes one
    device holds (what an asynchronous snapshot waits for; None: the checkpoint over the devices)."""
    steps, devices = training.steps, cluster.num_devices
    notes = [_length_note(training, model, iteration_time_s)]
    time_s = energy.time_to_train_s(steps, iteration_time_s)
    power_w, power_notes = _power(cluster, busy_share_sum)
    notes += power_notes
    failure_free = _totals(cluster, time_s, power_w)
    per_sample = tokens_per_sample(model)
    estimate = RunEstimate(steps=steps, tokens=None if per_sample is None else steps * training.global_batch_size * per_sample,
                           iteration_time_s=iteration_time_s, devices=devices,
                           busy_share=busy_share_sum / devices, failure_free=failure_free)
    if reliability is None:
        return _with(estimate, notes + ["no reliability section: no failures, no checkpoints"])
    size = checkpoint_bytes(model)
    largest = size / devices if largest_device_state_bytes is None else largest_device_state_bytes
    plan, good, carlo, more = _failures(reliability, devices, time_s, size, largest)
    expected = _totals(cluster, good.expected_time_s, power_w)
    return _with(replace(estimate, checkpoint=plan, goodput=good, expected=expected, monte_carlo=carlo), notes + more)


def _with(estimate: RunEstimate, notes: list[str]) -> RunEstimate:
    return replace(estimate, assumptions=tuple(notes))


def _length_note(training: TrainingSpec, model: Any, iteration_time_s: float) -> str:
    per_sample = tokens_per_sample(model)
    if training.tokens is not None:
        per_step = training.global_batch_size * per_sample
        return (f"steps {training.steps:,}: training.tokens {training.tokens:.4g} / ({training.global_batch_size:,} "
                f"samples x {per_sample:,} tokens = {per_step:,} per step), rounded up; {iteration_time_s:.4g} s "
                "per step (the replay)")
    return f"steps {training.steps:,} (training.steps); {iteration_time_s:.4g} s per step (the replay)"


def _power(cluster: ClusterSpec, busy_share_sum: float) -> tuple[float | None, list[str]]:
    """The cluster's IT power (None without ``power_w``) and what it assumed."""
    device = cluster.device
    notes = [f"GPU-hours count all {cluster.num_devices:,} devices of the cluster (the cluster is paid for)",
             f"price {cluster.price_per_gpu_hour:g} per GPU-hour (cluster.price_per_gpu_hour)"
             if cluster.price_per_gpu_hour is not None else "no price set (cluster.price_per_gpu_hour)"]
    if device.power_w is None:
        return None, notes + ["no device power set (cluster.device.power_w): no energy estimate"]
    notes.append(f"device power {device.power_w:g} W at full load (cluster.device.power_w; the presets' are "
                 "NVIDIA's datasheet TDPs)")
    if device.idle_power_w is None:
        notes.append("no idle power set (cluster.device.idle_power_w): every device counted at full power "
                     "all the time, an upper bound")
    else:
        notes.append(f"idle power {device.idle_power_w:g} W; power linear in each device's busy share "
                     f"(an assumption), mean busy share {busy_share_sum / cluster.num_devices:.1%}")
    host = cluster.host_power_w
    notes.append(f"host power {host:g} W per server (cluster.host_power_w)" if host is not None
                 else "no host power set (cluster.host_power_w): 0 W per server")
    notes.append(f"PUE {cluster.pue:g} (cluster.pue)" if cluster.pue is not None
                 else "no PUE set (cluster.pue): 1.0, IT power only")
    notes.append(f"grid {cluster.carbon_g_per_kwh:g} gCO2e/kWh (cluster.carbon_g_per_kwh)"
                 if cluster.carbon_g_per_kwh is not None else "no grid intensity set (cluster.carbon_g_per_kwh)")
    watts = energy.cluster_power_w(devices=cluster.num_devices, busy_device_share_sum=busy_share_sum,
                                   power_w=device.power_w, idle_power_w=device.idle_power_w,
                                   servers=cluster.nodes, host_power_w=host or 0.0)
    return watts, notes


def _totals(cluster: ClusterSpec, time_s: float, power_w: float | None) -> RunTotals:
    hours = energy.gpu_hours(cluster.num_devices, time_s)
    kwh = None if power_w is None else energy.energy_kwh(power_w, time_s, cluster.pue or 1.0)
    return RunTotals(time_s=time_s, gpu_hours=hours, cost=energy.cost(hours, cluster.price_per_gpu_hour),
                     energy_kwh=kwh, carbon_kg=energy.carbon_kg(kwh, cluster.carbon_g_per_kwh))


def _failures(spec: ReliabilitySpec, devices: int, work_s: float, size_bytes: float,
              largest_bytes: float) -> tuple[CheckpointPlan, Goodput, MonteCarlo, list[str]]:
    """The checkpoint interval, the closed-form goodput and the Monte Carlo, with their notes."""
    mtbf = spec.gpu_mtbf_s / devices
    write = size_bytes / spec.write_bandwidth_bytes_per_s
    blocking = largest_bytes / spec.snapshot_bandwidth_bytes_per_s if spec.async_checkpoint else write
    young, daly = goodput.young_interval_s(blocking, mtbf), goodput.daly_interval_s(blocking, mtbf)
    if spec.checkpoint_interval_s is not None:
        interval, rule = spec.checkpoint_interval_s, "given"
    elif spec.async_checkpoint:  # Young on the blocking part; a write must end before the next starts
        interval, rule = max(young, write), "young"
    else:
        interval, rule = daly, "daly"
    loss = spec.restart_s + (write if spec.async_checkpoint else 0.0)
    times, counts = goodput.monte_carlo_times_s(work_s, interval_s=interval, blocking_s=blocking, mtbf_s=mtbf,
                                                loss_s=loss, runs=spec.monte_carlo_runs, seed=spec.seed)
    expected = goodput.expected_run_time_s(work_s, interval_s=interval, blocking_s=blocking, mtbf_s=mtbf, loss_s=loss)
    plan = CheckpointPlan(size_bytes=size_bytes, write_s=write, blocking_s=blocking, interval_s=interval,
                          young_interval_s=young, daly_interval_s=daly, rule=rule)
    good = Goodput(cluster_mtbf_s=mtbf, expected_failures=goodput.expected_failures(
        work_s, interval_s=interval, blocking_s=blocking, mtbf_s=mtbf),
        first_order_lost_fraction=goodput.first_order_lost_fraction(interval, blocking, mtbf, loss),
        expected_time_s=expected, goodput=work_s / expected)
    p5, p50, p95 = (float(v) for v in np.percentile(times, [5, 50, 95]))
    carlo = MonteCarlo(runs=spec.monte_carlo_runs, seed=spec.seed, mean_s=float(times.mean()), p5_s=p5, p50_s=p50,
                       p95_s=p95, mean_failures=float(counts.mean()))
    mode = (f"asynchronous: training blocks {blocking:.3g} s for the largest device's {format_bytes(largest_bytes)} "
            "over the snapshot bandwidth; a failure also loses the write in flight") if spec.async_checkpoint \
        else "synchronous: training waits for the whole write"
    notes = [f"failure rate: {spec.source}; cluster MTBF = per-GPU MTBF / {devices:,} devices = {mtbf / 3600:.3g} h",
             f"checkpoint {format_bytes(size_bytes)} (parameters + optimizer state with master weights, each once) "
             f"at {format_bandwidth(spec.write_bandwidth_bytes_per_s)} to storage = {write:.3g} s; {mode}",
             f"restart {spec.restart_s:g} s per failure (reliability.restart_s); restarts do not fail",
             "failures: Poisson; energy and cost over the expected wall time at the same power"]
    return plan, good, carlo, notes

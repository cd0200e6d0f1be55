"""The keys of a whole run: its length, its price and power, its failures and checkpoints.

All optional; a scenario without them simulates one iteration exactly as before::

    training: {global_batch_size: 1024, microbatch_size: 1, tokens: 15T}     # or steps: 500000
    cluster:  {preset: dgx-h100, nodes: 64, price_per_gpu_hour: 2.5, host_power_w: 1.5kW, pue: 1.1,
               carbon_g_per_kwh: 400}
    reliability:
      preset: llama3-405b              # or gpu_mtbf_h: 50000, or interruptions_per_day + gpus
      checkpoint: {interval: auto, write_bandwidth: 50GB/s, async: false}
      restart_s: 10min
      monte_carlo: {runs: 1000, seed: 0}

``training.tokens`` becomes steps (tokens over global batch × sequence length, rounded up): it
needs a model with a sequence (gpt, bert, llama); ``steps`` works for any. ``cluster.device``
takes ``power_w`` and ``idle_power_w`` (``sim.input.cluster``). A key named with a unit
(``_w``, ``_h``, ``_s``) reads a bare number in that unit, or text with any unit of its kind
(``0.7kW``, ``10min``). ``sim.cost.capacity`` turns them into the run's estimate.
"""

from __future__ import annotations

import math
from typing import Any

from sim.core.model_spec import ModelSpec
from sim.core.reliability import DEFAULT_MONTE_CARLO_RUNS, RELIABILITY_PRESETS, ReliabilitySpec
from sim.core.units import parse_bandwidth, parse_count, parse_power, parse_time
from sim.cost.capacity import tokens_per_sample
from sim.input.strict import StrictReader, join_key, show_value

__all__ = ["CLUSTER_RUN_KEYS", "MAX_STEPS", "read_run_length", "read_reliability", "read_site"]

MAX_STEPS = 10**12
"""Most optimizer steps a run may have."""
MAX_TOKENS = 1e18
"""Most tokens a run may train on (a billion times Llama 3's 15.6T)."""
POWER_BOUNDS = (1.0, 1e5, "1W to 100kW")
"""Range of a device's or a host's power."""
CLUSTER_RUN_KEYS = {"price_per_gpu_hour", "host_power_w", "pue", "carbon_g_per_kwh"}
"""The ``cluster`` keys of a run (``read_site``)."""
_RELIABILITY_KEYS = {"preset", "gpu_mtbf_h", "interruptions_per_day", "gpus", "checkpoint", "restart_s",
                     "monte_carlo"}


def read_run_length(reader: StrictReader, data: dict, model: ModelSpec,
                    global_batch_size: int) -> tuple[int | None, float | None]:
    """``(steps, tokens)`` from ``training.steps`` or ``training.tokens`` (one, not both)."""
    if "steps" in data and "tokens" in data:
        raise reader.fail("training.tokens", "give either tokens or steps, not both")
    if "steps" in data:
        return reader.integer(data, "training", "steps", maximum=MAX_STEPS), None
    if "tokens" not in data:
        return None, None
    per_sample = tokens_per_sample(model)
    if per_sample is None:
        raise reader.fail("training.tokens", f"model {model.name!r} has no sequence to count tokens in; "
                                             "give training.steps instead")
    tokens = reader.quantity(data, "training", "tokens", parse_count, bounds=(1.0, MAX_TOKENS, "1 to 1e18"))
    steps = math.ceil(tokens / (global_batch_size * per_sample))
    if steps > MAX_STEPS:
        raise reader.fail("training.tokens", f"{show_value(data['tokens'])} is {steps:,} steps, more than "
                                             f"{MAX_STEPS:,}; raise global_batch_size or train on fewer tokens")
    return steps, tokens


def read_site(reader: StrictReader, data: dict) -> dict[str, float | None]:
    """``ClusterSpec``'s price, host power, PUE and carbon intensity (None where not given)."""
    def plain(name: str, low: float, high: float) -> float | None:
        return reader.number(data, "cluster", name, low=low, high=high) if name in data else None
    return {
        "price_per_gpu_hour": plain("price_per_gpu_hour", 0.0, 1e6),
        "host_power_w": reader.quantity(data, "cluster", "host_power_w", _watts, bounds=(0.0, 1e5, "0W to 100kW"),
                                        allow_zero=True) if "host_power_w" in data else None,
        "pue": plain("pue", 1.0, 10.0),
        "carbon_g_per_kwh": plain("carbon_g_per_kwh", 0.0, 1e4),
    }


def _watts(value: Any) -> float:
    """Watts; a bare number is in watts (the key says ``_w``)."""
    return parse_power(value, default_unit="W")


def _hours(value: Any) -> float:
    """Seconds; a bare number is in hours (``_h``)."""
    return parse_time(value, default_unit="h")


def _seconds(value: Any) -> float:
    """Seconds; a bare number is in seconds (``_s``)."""
    return parse_time(value, default_unit="s")


def device_power(reader: StrictReader, values: dict, key: str) -> dict[str, float | None]:
    """``DeviceSpec``'s ``power_w`` and ``idle_power_w`` (None where not given)."""
    return {name: reader.quantity(values, key, name, _watts, bounds=POWER_BOUNDS if name == "power_w"
                                  else (0.0, 1e5, "0W to 100kW"), allow_zero=name == "idle_power_w")
            if values.get(name) is not None else None for name in ("power_w", "idle_power_w")}


def read_reliability(reader: StrictReader, data: Any) -> ReliabilitySpec | None:
    """The ``reliability:`` section (``sim.core.reliability``), or None without one."""
    if data is None:
        return None
    key = "reliability"
    data = reader.mapping(data, key)
    reader.keys(data, key, allowed=_RELIABILITY_KEYS, required={"checkpoint", "restart_s"})
    mtbf_s, source = _failure_rate(reader, data)
    checkpoint = reader.mapping(data["checkpoint"], "reliability.checkpoint")
    ckey = "reliability.checkpoint"
    reader.keys(checkpoint, ckey, allowed={"interval", "write_bandwidth", "async", "snapshot_bandwidth"},
                required={"write_bandwidth"})
    interval = checkpoint.get("interval", "auto")
    if interval != "auto":
        interval = reader.quantity(checkpoint, ckey, "interval", parse_time, bounds=(1.0, 1e8, "1s to 1e8s"))
    carlo = reader.mapping(data.get("monte_carlo", {}), "reliability.monte_carlo")
    reader.keys(carlo, "reliability.monte_carlo", allowed={"runs", "seed"})
    return reader.build(
        key, ReliabilitySpec, gpu_mtbf_s=mtbf_s, source=source,
        write_bandwidth_bytes_per_s=reader.quantity(checkpoint, ckey, "write_bandwidth", parse_bandwidth),
        snapshot_bandwidth_bytes_per_s=reader.quantity(checkpoint, ckey, "snapshot_bandwidth", parse_bandwidth,
                                                       "25GB/s"),
        async_checkpoint=reader.boolean(checkpoint, ckey, "async", False),
        checkpoint_interval_s=None if interval == "auto" else interval,
        restart_s=reader.quantity(data, key, "restart_s", _seconds, bounds=(0.0, 1e6, "0s to 1e6s"),
                                  allow_zero=True),
        monte_carlo_runs=reader.integer(carlo, "reliability.monte_carlo", "runs", DEFAULT_MONTE_CARLO_RUNS,
                                        maximum=100_000),
        seed=reader.integer(carlo, "reliability.monte_carlo", "seed", 0, minimum=0, maximum=2**63 - 1),
    )


def _failure_rate(reader: StrictReader, data: dict) -> tuple[float, str]:
    """Per-device MTBF in seconds and where it comes from: a preset, ``gpu_mtbf_h``, or
    ``interruptions_per_day`` observed on ``gpus`` devices."""
    given = sorted(name for name in ("preset", "gpu_mtbf_h", "interruptions_per_day") if name in data)
    if len(given) != 1:
        raise reader.fail("reliability", f"give one failure rate: preset ({', '.join(sorted(RELIABILITY_PRESETS))}), "
                                         f"gpu_mtbf_h, or interruptions_per_day with gpus; got {given or 'none'}")
    if "gpus" in data and given != ["interruptions_per_day"]:
        raise reader.fail("reliability.gpus", "goes with interruptions_per_day (the GPUs they were counted on)")
    if given == ["preset"]:
        rate = RELIABILITY_PRESETS[reader.string(data, "reliability", "preset", choices=RELIABILITY_PRESETS)]
        return rate.gpu_mtbf_s, f"reliability.preset {data['preset']}: {rate.source}"
    if given == ["gpu_mtbf_h"]:
        mtbf = reader.quantity(data, "reliability", "gpu_mtbf_h", _hours, bounds=(3600.0, 3.6e12, "1h to 1e9h"))
        return mtbf, f"reliability.gpu_mtbf_h: {mtbf / 3600:,.6g} h per GPU"
    rate = reader.number(data, "reliability", "interruptions_per_day", low=1e-6, high=1e6)
    if "gpus" not in data:
        raise reader.fail(join_key("reliability", "gpus"), "missing; interruptions_per_day needs the GPU count "
                                                          "they were observed on")
    gpus = reader.integer(data, "reliability", "gpus", maximum=2**24)
    return gpus * 86400.0 / rate, f"reliability.interruptions_per_day: {rate:g} a day on {gpus:,} GPUs"

"""The ``cluster:`` section: servers of identical devices, the ports between them.

A cluster is ``nodes`` servers of ``devices_per_node`` devices; each device has one port to
the other devices of its server (``intra_node``) and each server has ``nics_per_node``
network cards (``inter_node``). It is written out in full, or as a preset
(``sim.input.presets``) with any key overridden next to the preset's name::

    cluster: {preset: a100-nvlink-8, nodes: 4, inter_node: {bandwidth: 100Gb/s}}

Above the servers, an optional ``fabric`` (switch tiers, rails, a scale-up domain;
``sim.input.fabric_section``); without it the servers sit on one non-blocking switch.

A device is a preset's name (``device: V100-16GB``) or a custom device. A custom device
needs only what no rule of thumb can guess, its ``memory`` and its dense half-precision
``peak_flops``; every other number it leaves out takes a documented default
(``CUSTOM_DEVICE_DEFAULTS``), and ``dapple-sim check`` lists the ones it took::

    device: {name: held-out, memory: 80GiB, peak_flops: 100TFLOP/s}
    # peak_fp32_flops 6.25TFLOP/s (peak_flops / 16), memory_bandwidth 653.5GB/s, ...

Every number has a valid range, checked here (``docs/scenario.md``): sizes, rates and
latencies those of their kind (``sim.input.strict.QUANTITY_RANGES``: memory 1MiB to 1PiB,
bandwidths 1B/s to 1PB/s, FLOP rates 1GFLOP/s to 1000PFLOP/s, latencies 0s to 10s), the
fixed overheads 0s to 1s, the plain numbers ``DEVICE_NUMBER_RANGES``, and the cluster's
counts ``MAX_NODES``, ``MAX_DEVICES_PER_NODE`` and ``MAX_DEVICES``. A number outside them
(``memory_efficiency: 0``, ``matmul_half_dim: 1.0e+308``, ``bandwidth: 1e-320B/s``) would
divide by zero or overflow to infinity inside the cost model.

A link may carry ``collectives:``, what its collectives cost as ``dapple-run profile``
measured them (``read_collectives``; ``sim.core.measured_collectives``)::

    intra_node:
      bandwidth: 1.2GB/s
      collectives:
        fsdp_call_overhead: 900us      # FSDP2's own cost per all-gather or reduce-scatter call
        fits:                          # seconds = latency + bytes / bandwidth, per kind and ranks
          - {kind: all-gather, ranks: 2, latency: 310us, bandwidth: 650MB/s}

``kind`` one of ``sim.core.measured_collectives.COLLECTIVE_KINDS``, ``ranks`` the group size
measured (2 to 4096), ``bytes`` the collective's whole buffer; latencies and the overhead 0s
to 1s. A link without the key prices its collectives by the ring formulas of
``sim.cost.comm``, as every scenario written before it did.
"""

from __future__ import annotations

import copy
from types import MappingProxyType
from typing import Any, Mapping

from sim.core.measured_collectives import COLLECTIVE_KINDS, CollectiveFit, MeasuredCollectives
from sim.core.specs import ATTENTION_KERNELS, ClusterSpec, DeviceSpec, LinkSpec
from sim.core.units import (
    format_bandwidth,
    format_flop_rate,
    parse_bandwidth,
    parse_bytes,
    parse_flop_rate,
    parse_time,
)
from sim.input.fabric_section import apply_fabric, read_fabric
from sim.input.presets import CLUSTER_PRESETS, DEVICE_PRESETS
from sim.input.run_section import CLUSTER_RUN_KEYS, device_power, read_site
from sim.input.strict import StrictReader, join_key, show_value

__all__ = ["CUSTOM_DEVICE_DEFAULTS", "FP32_PEAK_DIVISOR", "MAX_FITS", "MEMORY_BYTES_PER_FLOP", "read_cluster", "read_collectives",
           "read_device"]

_CLUSTER_KEYS = {"preset", "name", "nodes", "devices_per_node", "device", "intra_node", "inter_node", "nics_per_node",
                 "fabric", *CLUSTER_RUN_KEYS}
_DEVICE_KEYS = {"name", "memory", "peak_flops", "peak_fp32_flops", "memory_bandwidth", "efficiency",
                "matmul_half_dim", "kernel_overhead", "kernel_issue", "memory_efficiency", "action_overhead",
                "memory_reserved", "default_attention", "attention_efficiency", "attention_backward_efficiency",
                "sdpa_efficiency", "sdpa_backward_efficiency", "cudnn_efficiency", "cudnn_backward_efficiency",
                "overlap_slowdown", "power_w", "idle_power_w",
                "peak_fp8_flops", "sm_count", "fp8_efficiency"}
_LINK_KEYS = {"bandwidth", "latency", "name", "send_overhead", "send_bandwidth", "recv_overhead",
              "collective_efficiency", "collectives"}

_REFERENCE = DEVICE_PRESETS["A100-80GB"]

MAX_NODES = 100_000
"""Most servers in a cluster."""
MAX_DEVICES_PER_NODE = 1024
"""Most devices (and network cards) in a server."""
MAX_DEVICES = 2**17
"""Most devices in a cluster (131 072, 8 x Llama 3's 16 384 GPUs: `check` describes every device,
which at 2^20 took 12 s and 670 MB)."""
OVERHEAD_RANGE = (0.0, 1.0, "0s to 1s")
"""Range of every fixed per-kernel, per-action and per-message overhead."""
DEVICE_NUMBER_RANGES: Mapping[str, tuple[float, float, bool]] = MappingProxyType({
    "efficiency": (0.01, 1.0, False),
    "matmul_half_dim": (0.0, 1e6, False),
    "memory_efficiency": (0.01, 1.0, False),
    "attention_efficiency": (0.01, 1.0, False),
    "attention_backward_efficiency": (0.01, 1.0, False),
    "sdpa_efficiency": (0.01, 1.0, False),
    "sdpa_backward_efficiency": (0.01, 1.0, False),
    "cudnn_efficiency": (0.01, 1.0, False),
    "cudnn_backward_efficiency": (0.01, 1.0, False),
})
"""``cluster.device`` plain number -> (low, high, low excluded): efficiency and
memory_efficiency and the four attention efficiencies in [0.01, 1] (the range ``dapple-sim calibrate`` fits them in; at a
millionth of the peak a step would take years), matmul_half_dim in [0, 1e6]. ``overlap_slowdown`` is
read apart, in [0, 1], 0 when a custom device leaves it out (no slowdown: nothing to report as a default)."""

FP32_PEAK_DIVISOR: float = parse_flop_rate(_REFERENCE["peak_flops"]) / parse_flop_rate(_REFERENCE["peak_fp32_flops"])
"""``peak_flops`` over ``peak_fp32_flops`` of a custom device that gives no fp32 peak: 16.

The A100 SXM's ratio (NVIDIA A100 Tensor Core GPU datasheet: 312 TFLOP/s dense bf16/fp16 on
tensor cores, 19.5 TFLOP/s fp32 without them; ``sim.input.presets``). fp32 here is plain
fp32, as ``DeviceSpec.peak_fp32_flop_per_s`` is: TF32's 156 TFLOP/s needs the framework to
opt in (PyTorch's matmuls run plain fp32 by default since 1.12). Computed from the A100
preset's numbers so that the two cannot drift apart.
"""

MEMORY_BYTES_PER_FLOP: float = parse_bandwidth(_REFERENCE["memory_bandwidth"]) / parse_flop_rate(_REFERENCE["peak_flops"])
"""Bytes/s of device memory per FLOP/s of ``peak_flops`` for a custom device that gives no
``memory_bandwidth``: 2039 GB/s / 312 TFLOP/s, about 1 byte per 153 FLOP (the A100 SXM 80GB's
HBM2e against its dense bf16 peak, NVIDIA A100 datasheet; ``sim.input.presets``)."""

CUSTOM_DEVICE_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "peak_fp32_flops": f"peak_flops / {FP32_PEAK_DIVISOR:g}",
        "memory_bandwidth": f"peak_flops x {MEMORY_BYTES_PER_FLOP:.4g} B/FLOP",
        "efficiency": 0.5,
        "matmul_half_dim": 0,
        "memory_efficiency": 1,
        "kernel_overhead": "0s",
        "kernel_issue": "0s",
        "action_overhead": "0s",
        "memory_reserved": "0B",
        "default_attention": "unfused",
        "attention_efficiency": _REFERENCE["attention_efficiency"],
        "attention_backward_efficiency": _REFERENCE["attention_backward_efficiency"],
        "sdpa_efficiency": _REFERENCE["sdpa_efficiency"],
        "sdpa_backward_efficiency": _REFERENCE["sdpa_backward_efficiency"],
        "cudnn_efficiency": _REFERENCE["cudnn_efficiency"],
        "cudnn_backward_efficiency": _REFERENCE["cudnn_backward_efficiency"],
    }
)
"""``cluster.device`` key -> what a custom device that leaves it out gets.

The two rates are derived from ``peak_flops`` by the A100's ratios (``FP32_PEAK_DIVISOR``,
``MEMORY_BYTES_PER_FLOP``). The kernel model's numbers are ``DeviceSpec``'s defaults (see
``sim.cost.kernels``): large matrix products reach half the peak whatever their size, element-wise
kernels the full memory bandwidth, and neither a kernel launch (no overhead, no issue-time
floor) nor the framework around a stage's forward or backward costs a fixed time. Fit them to measured runs with
``dapple-sim calibrate``. The attention efficiencies are the A100's (FlashAttention-2,
``sim.input.presets``). A custom device runs attention ``unfused`` unless it names a
``default_attention`` (or the model an ``attention``): a custom device is costed as the CPU that
``dapple-run profile`` measures, as its ``for-loop`` optimizer default is, and the CPU
calibrations were fitted with unfused attention; a custom GPU sets ``default_attention: flash``.
A preset device gives every key itself, so takes none of these.
"""


def read_cluster(reader: StrictReader, data: Any) -> tuple[ClusterSpec, tuple[tuple[str, str], ...]]:
    """The cluster, and ``(key, value used)`` for each device key a default filled in."""
    data = reader.mapping(data, "cluster")
    reader.keys(data, "cluster", allowed=_CLUSTER_KEYS)
    if data.get("preset") is not None:
        data = _merge_preset(reader, data)
    reader.keys(data, "cluster", allowed=_CLUSTER_KEYS,
                required={"nodes", "devices_per_node", "device", "intra_node", "inter_node"})
    device, defaults = read_device(reader, data["device"])
    nodes = reader.integer(data, "cluster", "nodes", maximum=MAX_NODES)
    per_node = reader.integer(data, "cluster", "devices_per_node", maximum=MAX_DEVICES_PER_NODE)
    if nodes * per_node > MAX_DEVICES:
        raise reader.fail("cluster.nodes", f"{nodes} nodes of {per_node} devices are {nodes * per_node:,} devices, "
                                           f"more than the {MAX_DEVICES:,} a cluster may have")
    cluster = reader.build(
        "cluster",
        ClusterSpec,
        name=reader.string(data, "cluster", "name") if "name" in data else "",
        nodes=nodes,
        devices_per_node=per_node,
        nics_per_node=reader.integer(data, "cluster", "nics_per_node", 1, maximum=MAX_DEVICES_PER_NODE),
        device=device,
        intra_node=_link(reader, data["intra_node"], "cluster.intra_node"),
        inter_node=_link(reader, data["inter_node"], "cluster.inter_node"),
        **read_site(reader, data),
    )
    if data.get("fabric") is not None:  # without it: one non-blocking switch, as ever
        cluster = apply_fabric(reader, cluster, read_fabric(reader, data["fabric"]))
    return cluster, defaults


def _merge_preset(reader: StrictReader, data: dict) -> dict:
    """The preset's mapping with the file's keys over it (links and the device key by key)."""
    preset_name = reader.string(data, "cluster", "preset", choices=CLUSTER_PRESETS)
    merged = {**copy.deepcopy(dict(CLUSTER_PRESETS[preset_name])), "name": preset_name}
    for name, value in data.items():
        if name in ("intra_node", "inter_node", "fabric") and isinstance(value, dict) and merged.get(name):
            merged[name] = {**merged[name], **value}
        elif name == "device" and isinstance(value, dict) and "name" not in value:
            base = merged[name] if isinstance(merged[name], dict) else {"name": merged[name]}
            merged[name] = {**base, **value}  # override some of the preset's device
        elif name != "preset":
            merged[name] = value
    return merged


def read_device(reader: StrictReader, data: Any) -> tuple[DeviceSpec, tuple[tuple[str, str], ...]]:
    """A preset or custom device, and ``(key, value used)`` for each key a default filled in."""
    key = "cluster.device"
    if isinstance(data, str):
        data = {"name": data}
    data = reader.mapping(data, key)
    reader.keys(data, key, allowed=_DEVICE_KEYS, required={"name"})
    name = reader.string(data, key, "name")
    preset = DEVICE_PRESETS.get(name)
    if preset is None:
        for needed in ("memory", "peak_flops"):
            if data.get(needed) is None:
                raise reader.fail(
                    join_key(key, needed),
                    f"missing for device {name!r}, which is not a preset ({', '.join(sorted(DEVICE_PRESETS))}); "
                    "a custom device needs memory and peak_flops (dapple-sim check lists the defaults of the rest)",
                )
    values = {**(preset or {}), **data}
    memory = reader.quantity(values, key, "memory", parse_bytes)
    peak = reader.quantity(values, key, "peak_flops", parse_flop_rate)
    derived = {"peak_fp32_flops": peak / FP32_PEAK_DIVISOR, "memory_bandwidth": peak * MEMORY_BYTES_PER_FLOP}
    device = reader.build(
        key,
        DeviceSpec,
        name=name,
        memory_bytes=memory,
        peak_flop_per_s=peak,
        peak_fp32_flop_per_s=reader.quantity(values, key, "peak_fp32_flops", parse_flop_rate)
        if "peak_fp32_flops" in values else derived["peak_fp32_flops"],
        memory_bandwidth_bytes_per_s=reader.quantity(values, key, "memory_bandwidth", parse_bandwidth)
        if "memory_bandwidth" in values else derived["memory_bandwidth"],
        peak_fp8_flop_per_s=reader.quantity(values, key, "peak_fp8_flops", parse_flop_rate)
        if "peak_fp8_flops" in values else None,
        **{field: reader.number(values, key, field, CUSTOM_DEVICE_DEFAULTS[field], low=low, high=high,
                                low_open=low_open)
           for field, (low, high, low_open) in DEVICE_NUMBER_RANGES.items()},
        overlap_slowdown=reader.number(values, key, "overlap_slowdown", 0.0, low=0.0, high=1.0),
        sm_count=reader.integer(values, key, "sm_count", 0, minimum=0, maximum=1_000_000),
        fp8_efficiency=reader.number(values, key, "fp8_efficiency", low=0.01, high=1.0)
        if "fp8_efficiency" in values else None,
        kernel_overhead_s=reader.quantity(values, key, "kernel_overhead", parse_time,
                                          CUSTOM_DEVICE_DEFAULTS["kernel_overhead"], bounds=OVERHEAD_RANGE),
        kernel_issue_s=reader.quantity(values, key, "kernel_issue", parse_time,
                                       CUSTOM_DEVICE_DEFAULTS["kernel_issue"], bounds=OVERHEAD_RANGE),
        action_overhead_s=reader.quantity(values, key, "action_overhead", parse_time,
                                          CUSTOM_DEVICE_DEFAULTS["action_overhead"], bounds=OVERHEAD_RANGE),
        memory_reserved_bytes=reader.quantity(values, key, "memory_reserved", parse_bytes,
                                              CUSTOM_DEVICE_DEFAULTS["memory_reserved"], allow_zero=True),
        default_attention=reader.string(values, key, "default_attention", CUSTOM_DEVICE_DEFAULTS["default_attention"],
                                        choices=set(ATTENTION_KERNELS)),
        **device_power(reader, values, key),
    )
    shown = {
        "peak_fp32_flops": format_flop_rate(derived["peak_fp32_flops"]),
        "memory_bandwidth": format_bandwidth(derived["memory_bandwidth"]),
    }
    used = tuple(
        (field, f"{shown[field]} ({rule}, the A100's ratio)" if field in shown else str(rule))
        for field, rule in CUSTOM_DEVICE_DEFAULTS.items()
        if field not in values
    )
    return device, used


def _link(reader: StrictReader, data: Any, key: str) -> LinkSpec:
    data = reader.mapping(data, key)
    reader.keys(data, key, allowed=_LINK_KEYS, required={"bandwidth"})
    label = data.get("name", "")
    if not isinstance(label, str):
        raise reader.fail(join_key(key, "name"), f"must be a string, got {show_value(label)}")
    return reader.build(
        key,
        LinkSpec,
        bandwidth_bytes_per_s=reader.quantity(data, key, "bandwidth", parse_bandwidth),
        latency_s=reader.quantity(data, key, "latency", parse_time, "0s"),
        name=label,
        send_overhead_s=reader.quantity(data, key, "send_overhead", parse_time, "0s", bounds=OVERHEAD_RANGE),
        send_bandwidth_bytes_per_s=reader.quantity(data, key, "send_bandwidth", parse_bandwidth)
        if "send_bandwidth" in data else None,
        recv_overhead_s=reader.quantity(data, key, "recv_overhead", parse_time, "0s", bounds=OVERHEAD_RANGE),
        collective_efficiency=reader.number(data, key, "collective_efficiency", 1.0, low=0.01, high=1.0),
        collectives=read_collectives(reader, data["collectives"], join_key(key, "collectives"))
        if "collectives" in data else None,
    )


MAX_FITS = 64
"""Most fits one link may carry (5 kinds over a few group sizes need far fewer)."""

_COLLECTIVES_KEYS = {"fsdp_call_overhead", "fits"}
_FIT_KEYS = {"kind", "ranks", "latency", "bandwidth"}
_SECONDS = (0.0, 1.0, "0s to 1s")


def read_collectives(reader: StrictReader, data: Any, key: str) -> MeasuredCollectives:
    """The ``collectives:`` mapping at ``key`` (``LINK.collectives``), read strictly."""
    data = reader.mapping(data, key)
    reader.keys(data, key, allowed=_COLLECTIVES_KEYS, required={"fits"})
    rows = data["fits"]
    where = join_key(key, "fits")
    if not isinstance(rows, list) or not rows:
        raise reader.fail(where, f"must be a non-empty list of fits, got {show_value(rows)}")
    if len(rows) > MAX_FITS:
        raise reader.fail(where, f"{len(rows)} fits; at most {MAX_FITS}")
    fits = []
    for index, row in enumerate(rows):
        at = f"{where}[{index}]"
        row = reader.mapping(row, at)
        reader.keys(row, at, allowed=_FIT_KEYS, required=_FIT_KEYS)
        fits.append(reader.build(at, CollectiveFit, kind=reader.string(row, at, "kind", choices=COLLECTIVE_KINDS),
                                 ranks=reader.integer(row, at, "ranks", minimum=2, maximum=4096),
                                 latency_s=reader.quantity(row, at, "latency", parse_time, bounds=_SECONDS),
                                 bandwidth_bytes_per_s=reader.quantity(row, at, "bandwidth", parse_bandwidth)))
    fits.sort(key=lambda f: (f.kind, f.ranks))
    return reader.build(key, MeasuredCollectives, fits=tuple(fits),
                        fsdp_call_overhead_s=reader.quantity(data, key, "fsdp_call_overhead", parse_time, "0s",
                                                             bounds=_SECONDS))

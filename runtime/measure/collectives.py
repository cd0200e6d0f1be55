"""Timing the collectives the plan kinds call, on the launched ranks, and FSDP2's cost per call.

``dapple-run profile`` starts ``RANKS`` local processes on the backend (``measure_worker``)
and, on them together, times with torch's own calls, at each of ``SIZES_BYTES`` (the buffer:
``sim.core.measured_collectives``):

* ``all_reduce`` (data parallelism's gradients, tensor parallelism's activations),
  ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (what FSDP2 calls per unit, and
  sequence parallelism), ``broadcast`` (ZeRO-1's updated shards) over groups of 2 (ranks 0
  and 1, the others waiting) and of all ``RANKS``, ring attention's step (``ring-shift``: every
  member's ``batch_isend_irecv`` of a block to the next member and from the previous, the very
  ``runtime.model.ring_attention.Ring.shift``) over the same groups, and a ``send``/``recv`` pair
  between ranks 0 and 1 (pipeline stages): each the mean of ``repeats`` calls after a barrier, the sizes
  taking turns (as ``runtime.measure.bandwidth.measure_links``), the slowest rank's mean;
* FSDP2's per-call cost: one forward and backward of a stack of ``FSDP_UNITS`` linear layers
  under ``fully_shard`` (a unit per layer, ``reshard_after_forward=True``: an all-gather per
  unit in the forward and in the backward, a reduce-scatter per unit in the backward) on
  ranks 0 and 1, against the same stack unsharded and the fitted times of its collectives
  (``fsdp_call_overhead``).

Each kind and group size is fitted to ``latency + bytes / bandwidth``
(``fit_collective``, below), which the profile writes into the measured cluster's
``intra_node.collectives`` key (``collectives_key``).

The fit, pure Python (the tests fit synthetic measurements): ordinary least squares, the
closed form (slope ``Σ(x−x̄)(y−ȳ) / Σ(x−x̄)²``, intercept ``ȳ − slope·x̄``), the alpha-beta
model of ``sim.core.specs.LinkSpec`` (Hockney 1994) as NCCL's and gloo's benchmarks report
it; a negative intercept (noise at the small sizes) is taken as 0 and a slope at or below 0
as the bandwidth of the largest size alone. FSDP2's own cost per call is what one step of
the ``fully_shard``-ed stack takes beyond the same stack unsharded and beyond its
collectives' fitted times, over its calls, never below 0.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from runtime.model.ring_attention import Ring
from sim.core.measured_collectives import CollectiveFit, MeasuredCollectives
from sim.core.units import format_bandwidth, format_time

__all__ = ["FSDP_UNITS", "RANKS", "SIZES_BYTES", "collectives_key", "fit_collective", "fsdp_call_overhead",
           "measure_worker"]

RANKS = 4
"""Processes the measurement starts: groups of 2 and 4 are timed."""
SIZES_BYTES = (4096, 65_536, 524_288, 2_097_152)
"""Buffer sizes timed, bytes: from latency-bound to bandwidth-bound on gloo."""
FSDP_UNITS = 4
"""Linear layers (FSDP2 units) of the stack that times FSDP2's own cost."""
FSDP_WIDTH = 256
"""Width of each layer of that stack (a 256 KiB fp32 weight, a small model's block)."""


def fit_collective(kind: str, ranks: int, sizes_bytes: Sequence[float], seconds: Sequence[float]) -> CollectiveFit:
    """The least-squares line through (bytes, seconds) as a fit (the module docstring)."""
    n = len(sizes_bytes)
    if n < 2 or n != len(seconds):
        raise ValueError(f"a fit needs two or more sizes with one time each, got {n} sizes and {len(seconds)} times")
    mean_x, mean_y = sum(sizes_bytes) / n, sum(seconds) / n
    sxx = sum((x - mean_x) ** 2 for x in sizes_bytes)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes_bytes, seconds))
    slope = sxy / sxx if sxx > 0 else 0.0
    latency = max(0.0, mean_y - slope * mean_x)
    if slope <= 0:
        biggest = max(range(n), key=lambda k: sizes_bytes[k])
        slope = max(seconds[biggest], 1e-12) / max(sizes_bytes[biggest], 1.0)
    return CollectiveFit(kind=kind, ranks=ranks, latency_s=latency, bandwidth_bytes_per_s=1.0 / slope)


def fsdp_call_overhead(sharded_s: float, plain_s: float, collectives_s: float, calls: int) -> float:
    """Seconds FSDP2 adds per call: ``(sharded − plain − collectives) / calls``, never below 0."""
    return max(0.0, (sharded_s - plain_s - collectives_s) / calls) if calls > 0 else 0.0


def collectives_key(measured: MeasuredCollectives) -> dict[str, Any]:
    """``measured`` as the link's ``collectives:`` mapping (``sim.input.cluster.read_collectives``)."""
    return {
        "fsdp_call_overhead": format_time(measured.fsdp_call_overhead_s, 6),
        "fits": [{"kind": f.kind, "ranks": f.ranks, "latency": format_time(f.latency_s, 6),
                  "bandwidth": format_bandwidth(f.bandwidth_bytes_per_s, 6)} for f in measured.fits],
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _call(kind: str, buffer: torch.Tensor, part: torch.Tensor, group, ranks: int) -> None:
    if kind == "all-reduce":
        dist.all_reduce(buffer, group=group)
    elif kind == "all-gather":
        dist.all_gather_into_tensor(buffer, part, group=group)
    elif kind == "reduce-scatter":
        dist.reduce_scatter_tensor(part, buffer, group=group)
    elif kind == "broadcast":
        dist.broadcast(buffer, src=0, group=group)
    elif kind == "ring-shift":  # one step of ring attention: to the next member, from the previous
        Ring(ranks=tuple(range(ranks)), index=dist.get_rank(), group=group).shift(buffer, 0)()
    elif dist.get_rank() == 0:  # point-to-point: rank 0 sends, rank 1 receives
        dist.send(buffer, 1)
    else:
        dist.recv(buffer, 0)


def _time_kind(kind: str, ranks: int, group, device: torch.device, repeats: int) -> list[float]:
    """This rank's mean seconds per size of ``kind`` over ``group`` (None: not a member)."""
    rank = dist.get_rank()
    member = rank < ranks
    buffers = [torch.ones(size // 4, device=device) for size in SIZES_BYTES]
    parts = [torch.ones(b.numel() // ranks, device=device) for b in buffers]
    times: list[list[float]] = [[] for _ in SIZES_BYTES]
    for index in range(repeats + 1):  # the first round warms the connections up
        for k, (buffer, part) in enumerate(zip(buffers, parts)):
            dist.barrier()
            if not member:
                continue
            start = time.perf_counter()
            _call(kind, buffer, part, group, ranks)
            _sync(device)
            if index:
                times[k].append(time.perf_counter() - start)
    return [statistics.fmean(t) if t else 0.0 for t in times]


def _slowest(values: list[float], device: torch.device) -> list[float]:
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return mine.tolist()


def _stack_step_s(device: torch.device, mesh: DeviceMesh | None, repeats: int) -> float:
    """Median seconds of one forward and backward of the ``FSDP_UNITS`` stack (sharded with ``mesh``)."""
    torch.manual_seed(0)
    stack = nn.Sequential(*(nn.Linear(FSDP_WIDTH, FSDP_WIDTH, bias=False) for _ in range(FSDP_UNITS))).to(device)
    if mesh is not None:
        for layer in stack:
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        fully_shard(stack, mesh=mesh, reshard_after_forward=True)
    x = torch.randn(4, FSDP_WIDTH, device=device)
    times = []
    for index in range(repeats + 2):
        _sync(device)
        start = time.perf_counter()
        stack(x).sum().backward()
        _sync(device)
        if index >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_worker(device: torch.device, repeats: int = 10) -> MeasuredCollectives:
    """On each of the ``RANKS`` ranks (``runtime.execution.launch.spawn``): every kind's fit and
    FSDP2's per-call cost; the same on every rank."""
    world = dist.get_world_size()
    pair = dist.new_group([0, 1])
    fits = []
    for ranks, group in sorted({2: pair, world: None}.items()):
        for kind in ("all-gather", "all-reduce", "broadcast", "reduce-scatter", "ring-shift"):
            seconds = _slowest(_time_kind(kind, ranks, group, device, repeats), device)
            fits.append(fit_collective(kind, ranks, SIZES_BYTES, seconds))
    seconds = _slowest(_time_kind("point-to-point", 2, None, device, repeats), device)
    fits.append(fit_collective("point-to-point", 2, SIZES_BYTES, seconds))
    overhead = 0.0
    dist.barrier()
    if dist.get_rank() < 2:
        mesh = DeviceMesh.from_group(pair, device.type)
        sharded = _stack_step_s(device, mesh, repeats)
        plain = _stack_step_s(device, None, repeats)
        unit_bytes = FSDP_WIDTH * FSDP_WIDTH * 4
        by_kind = {(f.kind, f.ranks): f for f in fits}
        per_unit = sum(f.latency_s + unit_bytes / f.bandwidth_bytes_per_s
                       for f in (by_kind[("all-gather", 2)], by_kind[("all-gather", 2)], by_kind[("reduce-scatter", 2)]))
        overhead = fsdp_call_overhead(sharded, plain, FSDP_UNITS * per_unit, 3 * FSDP_UNITS)
    overhead = _slowest([overhead], device)[0]
    fits.sort(key=lambda f: (f.kind, f.ranks))
    return MeasuredCollectives(fits=tuple(fits), fsdp_call_overhead_s=overhead)

"""Profiling a tensor-parallel plan: layers as one device of a group runs them, and the
group's collectives at the sizes a block uses.

``dapple-run profile`` on a plan with ``tensor_parallel: t`` starts t local processes (one
tensor-parallel group, gloo or NCCL) and, on them together:

* times every layer as one device's share (``runtime.measure.profiler.profile_layer`` with the
  group's mesh), so its forward and backward include its collectives;
* times the collectives Megatron-LM runs per block (``sim.cost.comm.tensor_parallel_collectives``:
  all-reduces, or all-gathers and reduce-scatters with sequence parallelism; Shoeybi et al.
  2019, §3; Korthikanti et al. 2022, §4.2.2) at the block's size for the profile batch,
  with torch's own collectives (``all_reduce``, ``all_gather_single``,
  ``reduce_scatter_single``) over the group, each the median of ``repeats`` after a barrier.
  The bus bandwidth is NCCL-tests' convention: all-reduce 2(t−1)/t · bytes / time,
  all-gather and reduce-scatter (t−1)/t · bytes / time.

Rank 0's layers go into the measured scenario (``runtime.validation.collapse``), the collectives next
to it (``collectives.json``, and a comment in ``scenario.yaml``).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from runtime.measure.profiler import profile_layers
from runtime.model.config import RunnableScenario
from runtime.model.models import TORCH_DTYPES
from sim.models import shard_model

__all__ = ["collective_sizes", "measure_collectives", "tp_profile_worker"]

_BUS_FACTOR = {"all-reduce": lambda t: 2 * (t - 1) / t, "all-gather": lambda t: (t - 1) / t,
               "reduce-scatter": lambda t: (t - 1) / t}


def collective_sizes(runnable: RunnableScenario, batch: int) -> list[tuple[str, float]]:
    """(kind, bytes) of each distinct collective one block runs for ``batch`` samples."""
    plan = runnable.plan
    block = shard_model(runnable.scenario.model, plan.shard).layers[1]
    return sorted({(c.kind, c.bytes * batch) for c in block.tp_collectives})


def _time(fn, device: torch.device, repeats: int) -> float:
    times = []
    for index in range(repeats + 2):
        dist.barrier()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_collectives(runnable: RunnableScenario, batch: int, device: torch.device, *,
                        repeats: int = 10) -> list[dict[str, Any]]:
    """Each collective of ``collective_sizes`` timed over the whole (local) world."""
    t = dist.get_world_size()
    dtype = TORCH_DTYPES[runnable.model.values["dtype"]]
    element = torch.empty((), dtype=dtype).element_size()
    rows = []
    for kind, nbytes in collective_sizes(runnable, batch):
        whole = torch.ones(int(nbytes // element), dtype=dtype, device=device)
        part = torch.ones(whole.numel() // t, dtype=dtype, device=device)
        if kind == "all-reduce":
            def fn():
                dist.all_reduce(whole)
        elif kind == "all-gather":
            def fn():
                dist.all_gather_single(whole[:part.numel() * t], part)
        else:
            def fn():
                dist.reduce_scatter_single(part, whole[:part.numel() * t])
        seconds = _time(fn, device, repeats)
        rows.append({"kind": kind, "bytes": float(nbytes), "ranks": t, "seconds": seconds,
                     "bus_bandwidth_bytes_per_s": _BUS_FACTOR[kind](t) * nbytes / seconds})
    return rows


def tp_profile_worker(device: torch.device, runnable: RunnableScenario, batch: int, warmup: int,
                      repeats: int) -> dict[str, Any]:
    """On each of the t ranks (``runtime.execution.launch.spawn``): the layers as one device's share and
    the block's collectives."""

    mesh = DeviceMesh(device.type, list(range(dist.get_world_size())), mesh_dim_names=("tensor",))
    layers = profile_layers(runnable.model, batch, device, warmup=warmup, repeats=repeats, seed=0, mesh=mesh,
                            sequence_parallel=runnable.plan.sequence_parallel,
                            expert_parallel=runnable.plan.expert_parallel)
    return {"layers": layers, "collectives": measure_collectives(runnable, batch, device, repeats=repeats)}

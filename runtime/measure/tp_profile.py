"""Profiling a tensor- or context-parallel plan: layers as one device of a group runs them, and
the tensor-parallel group's collectives at the sizes a block uses.

``dapple-run profile`` on a plan with ``tensor_parallel: t`` and ``context_parallel: c`` starts
t·c local processes (one replica's devices, gloo or NCCL; a (context, tensor) mesh, tensor rank
innermost as ``PlanSpec.replicas`` lays them) and, on them together:

* times every layer as one device's share (``runtime.measure.profiler.profile_layer`` with the
  tensor mesh and the context ring), so its forward and backward include its collectives and
  ring attention's key/value shifts;
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

from runtime.measure.profiler import mtp_holds_table_copy, profile_layers
from runtime.model.config import RunnableScenario
from runtime.model.context_parallel import context_ring
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


def _time(fn, device: torch.device, repeats: int, group=None) -> float:
    times = []
    for index in range(repeats + 2):
        dist.barrier(group=group)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_collectives(runnable: RunnableScenario, batch: int, device: torch.device, *,
                        repeats: int = 10) -> list[dict[str, Any]]:
    """Each collective of ``collective_sizes`` timed over rank 0's tensor-parallel group (ranks
    0 .. t − 1; the others return nothing)."""
    t = runnable.plan.tensor_parallel
    group = None if t == dist.get_world_size() else dist.new_group(list(range(t)))  # rank 0's tensor group
    if dist.get_rank() >= t:
        return []
    dtype = TORCH_DTYPES[runnable.model.values["dtype"]]
    element = torch.empty((), dtype=dtype).element_size()
    rows = []
    for kind, nbytes in collective_sizes(runnable, batch):
        whole = torch.ones(int(nbytes // element), dtype=dtype, device=device)
        part = torch.ones(whole.numel() // t, dtype=dtype, device=device)
        if kind == "all-reduce":
            def fn():
                dist.all_reduce(whole, group=group)
        elif kind == "all-gather":
            def fn():
                dist.all_gather_single(whole[:part.numel() * t], part, group=group)
        else:
            def fn():
                dist.reduce_scatter_single(part, whole[:part.numel() * t], group=group)
        seconds = _time(fn, device, repeats, group)
        rows.append({"kind": kind, "bytes": float(nbytes), "ranks": t, "seconds": seconds,
                     "bus_bandwidth_bytes_per_s": _BUS_FACTOR[kind](t) * nbytes / seconds})
    return rows


def tp_profile_worker(device: torch.device, runnable: RunnableScenario, batch: int, warmup: int,
                      repeats: int) -> dict[str, Any]:
    """On each of the t·c ranks (``runtime.execution.launch.spawn``): the layers as one device's share and
    the block's collectives (none without tensor parallelism)."""
    plan = runnable.plan
    t, c = plan.tensor_parallel, plan.context_parallel
    mesh = DeviceMesh(device.type, torch.arange(c * t).reshape(c, t), mesh_dim_names=("context", "tensor"))
    ring = context_ring(mesh["context"], dist.get_rank()) if c > 1 else None
    layers = profile_layers(runnable.model, batch, device, warmup=warmup, repeats=repeats, seed=0,
                            mesh=mesh["tensor"] if t > 1 else None, sequence_parallel=plan.sequence_parallel,
                            expert_parallel=plan.expert_parallel * plan.expert_tensor_parallel, ring=ring,
                            recompute=plan.recompute, table_copy=mtp_holds_table_copy(runnable.model, plan))
    collectives = measure_collectives(runnable, batch, device, repeats=repeats) if t > 1 else []
    return {"layers": layers, "collectives": collectives}

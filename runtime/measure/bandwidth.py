"""Measuring the machine: link latency and bandwidth, all-reduce, and the device itself.

The simulator charges a transfer ``latency + bytes / bandwidth`` (``sim.core.specs.LinkSpec``).
Two ranks on the current backend measure both the way NCCL's and gloo's own tests do:

* point-to-point: ping-pong; the one-way time is half the round trip (the mean of round
  trips after one barrier, so that no barrier skew is counted, the sizes taking turns; see
  ``measure_links``). The latency is the one-way time of the smallest message, the bandwidth
  ``bytes / (time − latency)`` of the largest;
* all-reduce: the mean time of one ``all_reduce``; its bus bandwidth is
  ``2(n−1)/n · bytes / (time − latency)`` (NCCL tests' "busbw"), for n ranks;
* on a CPU, what messages cost the compute of busy ranks (gloo writes a message to its
  socket in the thread that calls ``isend``, and a transport thread on the receiver takes
  it in, competing with the compute for a core): while one of ranks 0 and 1 computes, the
  other computes a shorter piece and then sends it a message, as neighbouring pipeline
  stages do (``_host_costs``). The sender's ``isend`` call gives the ``send_overhead``
  (smallest message) and ``send_bandwidth`` (``bytes / (time − overhead)`` of the largest;
  ``sim.core.specs.LinkSpec.send_issue_s``); what the receiver's piece takes beyond the same
  piece with no message in flight, the mean over messages up to 256 KiB, is the
  ``recv_overhead`` (``LinkSpec.recv_overhead_s``).
  On a GPU the copies run on their own streams, and nothing is charged.

The device gets a matmul FLOP rate (fp32, and half precision on a GPU), a copy bandwidth
and its memory. ``cluster_yaml`` writes it all as a scenario's ``cluster:`` section with
units; the all-reduce numbers, which a cluster section has no key for, go in comments.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import yaml

from sim.core.units import format_bandwidth, format_bytes, format_flop_rate, format_time

__all__ = ["DEFAULT_SIZES", "cluster_yaml", "measure_device", "measure_links"]

DEFAULT_SIZES = (4, 4096, 262_144, 4_194_304, 33_554_432)
"""Message sizes in bytes: latency-bound to bandwidth-bound."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _round_trip(buffer: torch.Tensor, rank: int) -> None:
    if rank == 0:
        dist.send(buffer, 1)
        dist.recv(buffer, 1)
    elif rank == 1:
        dist.recv(buffer, 0)
        dist.send(buffer, 0)


def _timed(fn, device: torch.device) -> float:
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _work_unit(seconds: float) -> Callable[[], None]:
    """A fixed piece of compute (small matrix products) that takes about ``seconds`` here."""
    a = torch.full((64, 64), 1.0 / 64)
    count, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds / 4:
        a @ a
        count += 1
    reps = max(1, 4 * count)

    def unit() -> None:
        for _ in range(reps):
            a @ a
    return unit


def _host_costs(buffers: list[torch.Tensor], rank: int, repeats: int) -> dict[str, list[float]]:
    """What messages cost ranks 0 and 1 while they compute, as pipeline neighbours do: one
    rank (the receiver) computes a fixed piece of about two milliseconds; the other computes
    half of that (a forward), then issues its ``isend`` into the receiver's piece, or sends
    nothing (the baseline); message sizes and the baseline take turns, then the ranks swap
    roles. Per size, the means over the repeats: the ``isend`` call (``send``) and the
    receiver's piece beyond the baseline's (``receive``: the transport thread taking the
    message in competes with the compute for a core)."""
    peer = 1 - rank
    unit = _work_unit(1e-3)
    scratch = [torch.empty_like(b) for b in buffers]
    sent: list[list[float]] = [[] for _ in buffers]
    received: list[list[float]] = [[] for _ in buffers]
    quiet: list[float] = []
    for _ in range(repeats):
        for sender in (0, 1):
            for index in [None, *range(len(buffers))]:
                incoming = dist.irecv(scratch[index], peer) if rank != sender and index is not None else None
                dist.barrier()
                if rank == sender:
                    unit()
                    if index is not None:
                        began = time.perf_counter()
                        outgoing = dist.isend(buffers[index], peer)
                        sent[index].append(time.perf_counter() - began)
                    time.sleep(2e-3)  # idle through the receiver's piece, message or not
                    if index is not None:
                        outgoing.wait()
                else:
                    began = time.perf_counter()
                    unit()
                    unit()
                    (quiet if index is None else received[index]).append(time.perf_counter() - began)
                    if incoming is not None:
                        incoming.wait()
    base = statistics.fmean(quiet)
    return {"send": [statistics.fmean(t) for t in sent], "receive": [statistics.fmean(t) - base for t in received]}


def measure_links(device: torch.device, sizes: tuple[int, ...] = DEFAULT_SIZES, repeats: int = 20) -> dict[str, Any]:
    """Ping-pong between ranks 0 and 1 and all-reduce over every rank; the same on every rank.

    The sizes take turns, ``repeats`` rounds of one round trip each (then the same for the
    all-reduces), and each size keeps its mean: a moment when the operating system holds a
    process back then costs one sample of every size rather than all the samples of one. The
    mean, not the median: such moments happen in a run too, and a run pays for every message.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    buffers = [torch.zeros(max(1, size // 4), dtype=torch.float32, device=device) for size in sizes]
    for buffer in buffers:  # warm-up: connections, allocations
        _round_trip(buffer, rank)
        dist.all_reduce(buffer)
    _sync(device)
    dist.barrier()  # once: the round trips that follow start together, with no barrier skew in them
    trips: list[list[float]] = [[] for _ in sizes]
    for _ in range(repeats):
        for index, buffer in enumerate(buffers):
            trips[index].append(_timed(lambda: _round_trip(buffer, rank), device) / 2)
    dist.barrier()  # all-reduces after the ping-pongs: a rank leaving one late would skew the next trip
    reduces: list[list[float]] = [[] for _ in sizes]
    for _ in range(repeats):
        for index, buffer in enumerate(buffers):
            reduces[index].append(_timed(lambda: dist.all_reduce(buffer), device))
    n = len(sizes)
    host = {"send": [0.0] * n, "receive": [0.0] * n}
    host_repeats = 2 * repeats
    if device.type == "cpu" and rank < 2:
        host = _host_costs(buffers, rank, host_repeats)
    elif device.type == "cpu":
        for _ in range(host_repeats * 2 * (n + 1)):  # the others keep _host_costs's barriers company
            dist.barrier()
    p2p = [statistics.fmean(t) for t in trips]
    reduce = [statistics.fmean(t) for t in reduces]
    # rank 0's view of the ping-pong is the one that counts; the host costs are the two ranks' mean
    mine = torch.tensor(host["send"] + host["receive"], dtype=torch.float64)
    both = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(both, mine)
    host_costs = [max(0.0, v) for v in ((both[0] + both[1]) / 2).tolist()]
    issue, slowdown = host_costs[:n], host_costs[n:]
    shared = torch.tensor(p2p + reduce, dtype=torch.float64)
    dist.broadcast(shared, 0)
    p2p, reduce = shared[:n].tolist(), shared[n:].tolist()
    big = sizes[-1]
    p2p_latency, reduce_latency = p2p[0], reduce[0]
    small = [k for k, size in enumerate(sizes) if size <= 262_144] or [0]
    return {
        "send_issue_s": issue,
        "send_overhead_s": issue[0],
        "send_bandwidth_bytes_per_s": big / (issue[-1] - issue[0]) if issue[-1] > issue[0] else None,
        "recv_s": slowdown,
        "recv_overhead_s": statistics.fmean(slowdown[k] for k in small),
        "backend": dist.get_backend(),
        "ranks": world,
        "sizes_bytes": list(sizes),
        "p2p_one_way_s": p2p,
        "allreduce_s": reduce,
        "p2p_latency_s": p2p_latency,
        "p2p_bandwidth_bytes_per_s": big / max(p2p[-1] - p2p_latency, 1e-12),
        "allreduce_latency_s": reduce_latency,
        "allreduce_bus_bandwidth_bytes_per_s": 2 * (world - 1) / world * big / max(reduce[-1] - reduce_latency, 1e-12),
    }


def measure_device(device: torch.device, *, matmul_size: int = 1024, copy_bytes: int = 64 * 2**20,
                   repeats: int = 5) -> dict[str, Any]:
    """Name, memory, fp32 (and half-precision) matmul FLOP/s and copy bandwidth of ``device``."""

    def rate(dtype: torch.dtype) -> float:
        a = torch.randn(matmul_size, matmul_size, device=device).to(dtype)
        b = torch.randn(matmul_size, matmul_size, device=device).to(dtype)
        seconds = _best(lambda: a @ b, device, repeats)
        return 2 * matmul_size**3 / seconds

    fp32 = rate(torch.float32)
    half = rate(torch.float16) if device.type == "cuda" else fp32
    source = torch.empty(copy_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    target = torch.empty_like(source)
    copy_s = _best(lambda: target.copy_(source), device, repeats)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, memory = props.name, float(props.total_memory)
    else:
        name, memory = "cpu-core", float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return {"name": name, "memory_bytes": memory, "peak_fp32_flop_per_s": fp32, "peak_flop_per_s": half,
            "memory_bandwidth_bytes_per_s": 2 * copy_bytes / copy_s, "threads": torch.get_num_threads()}


def _best(fn, device: torch.device, repeats: int) -> float:
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def cluster_yaml(device_info: dict[str, Any], links: dict[str, Any], *, nodes: int, devices_per_node: int,
                 memory_share: int = 1, collectives: dict[str, Any] | None = None) -> str:
    """A scenario's ``cluster:`` section (YAML text with units) from the measurements.

    ``memory_share``: devices that share the measured memory (CPU ranks share the RAM).
    ``collectives``: the measured collectives (``runtime.measure.collectives.collectives_key``),
    the intra-node link's ``collectives`` key.
    """
    bw = format_bandwidth(links["p2p_bandwidth_bytes_per_s"])
    latency = format_time(links["p2p_latency_s"])
    backend = links["backend"]
    send = ""  # what sending and receiving cost the compute (measured on a CPU only)
    if links.get("send_overhead_s"):
        send = f", send_overhead: {format_time(links['send_overhead_s'])}"
        if links.get("send_bandwidth_bytes_per_s"):
            send += f", send_bandwidth: {format_bandwidth(links['send_bandwidth_bytes_per_s'])}"
    if links.get("recv_overhead_s"):
        send += f", recv_overhead: {format_time(links['recv_overhead_s'])}"
    measured = "" if collectives is None else \
        f", collectives: {yaml.safe_dump(collectives, default_flow_style=True, sort_keys=True, width=10**6).strip()}"
    device = (
        f"{{name: {device_info['name']!r}, memory: {format_bytes(device_info['memory_bytes'] / memory_share)}, "
        f"peak_flops: {format_flop_rate(device_info['peak_flop_per_s'])}, "
        f"peak_fp32_flops: {format_flop_rate(device_info['peak_fp32_flop_per_s'])}, "
        f"memory_bandwidth: {format_bandwidth(device_info['memory_bandwidth_bytes_per_s'])}}}"
    )
    return "\n".join([
        (f"# Measured by dapple-run profile: {links['ranks']} ranks on {backend}, "
         f"{device_info['threads']} thread(s) per rank."),
        f"# point-to-point: latency {latency}, bandwidth {bw} ({format_bytes(links['sizes_bytes'][-1])} messages)",
        (f"# all-reduce over {links['ranks']} ranks: latency {format_time(links['allreduce_latency_s'])}, "
         f"bus bandwidth {format_bandwidth(links['allreduce_bus_bandwidth_bytes_per_s'])}"),
        "# inter_node repeats intra_node: only one node was measured.",
        "cluster:",
        f"  nodes: {nodes}",
        f"  devices_per_node: {devices_per_node}",
        f"  device: {device}",
        f"  intra_node: {{bandwidth: {bw}, latency: {latency}{send}, name: {backend}{measured}}}",
        f"  inter_node: {{bandwidth: {bw}, latency: {latency}{send}, name: {backend} (not measured)}}",
        "",
    ])

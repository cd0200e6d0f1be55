"""Presets: named devices and clusters, written the way a scenario file would write them.

A scenario may say ``device: V100-16GB`` or ``cluster: {preset: v100-nvlink-8, nodes: 2}``
and override any key next to the preset's name. The presets are kept as scenario-file
mappings (strings with units) so that a preset and a hand-written cluster go through the
same parser and the same checks.

Numbers are the vendors' dense (no sparsity) peaks:
V100 SXM2: NVIDIA Tesla V100 datasheet (125 TFLOP/s fp16 tensor, 15.7 fp32, 900 GB/s HBM2);
A100 SXM 80GB: NVIDIA A100 datasheet (312 bf16, 19.5 fp32, 2039 GB/s);
H100 SXM: NVIDIA H100 datasheet (989 bf16, 67 fp32, 3.35 TB/s);
H200 SXM: NVIDIA H200 datasheet (989 bf16, 67 fp32, 4.8 TB/s, 141 GB).
Kernel-model defaults (``sim.cost.kernels``: matrix efficiency e_max, the dimension D at which a
product loses half of it to tiling, launch gap, achieved share of memory bandwidth) are starting
points: fit them to your runs with ``dapple-sim calibrate``. Two are measured: the launch gap
(below), and the H100 SXM's bf16 e_max, the A100's times the two devices' measured ratio
(``MAMF_BF16``, ``mamf_efficiency``): the largest matmul rate each reaches, by the same benchmark,
with the size curve and each timing's launch gap divided out. That ratio is 0.939, so the H100
prices its products at 0.75 x 0.939 = 0.70 where the A100 prices them at 0.75.
The framework's fixed cost per stage forward or backward (``action_overhead``) is 0 (the host's).
Kernels run asynchronously on a GPU, hiding the host's launch work while they outlast it, but the
device idles between two back-to-back kernels of a stream: ``kernel_overhead``, ``KERNEL_GAP``. The
host's ``kernel_issue`` time per kernel is the floor of a kernel's time (``sim.cost.compute.kernel_time_s``):
10 µs, a PyTorch operator's CPU-side work from Python to ``cudaLaunchKernel`` (the CUDA API's
overhead is "on the order of 10 μs per kernel launch", Modal's GPU glossary, "overhead").
Intra-node ``collective_efficiency``: NCCL's bus bandwidth over the port's figure (nccl-tests'
``all_reduce_perf``): 8 A100 on NVSwitch reach about 230 GB/s of 300 GB/s at 1 GiB (0.77); H100
and H200 NVSwitch servers about 75–80% (0.78); the V100 servers' and every network link's 1.0 (no
measurement cited). A preset gives every key: a scenario on one takes no custom-device default.
NVLink bandwidths are per GPU and per direction: V100 6 × 25 GB/s NVLink2, A100 12 × 25 GB/s
NVLink3, H100/H200 18 × 25 GB/s NVLink4 (through NVSwitch).
DAPPLE's set-ups (Fan et al., PPoPP'21, §6.1): config A, 8 V100 a server with NVLink, 25 Gb/s Ethernet
between servers; config B, 1 V100 a server. DGX H100: 8 H100 on NVSwitch, 8 ConnectX-7 400 Gb/s ports.
Fabrics (``cluster.fabric``, ``sim.core.fabric``):
``dgx-superpod-h100``: NVIDIA DGX SuperPOD reference architecture with DGX H100 systems (RA-11333-001,
"Network Fabrics", read from docs.nvidia.com/dgx-superpod/reference-architecture-scalable-infrastructure-h100):
"Each group of 32 nodes is rail-aligned. Traffic per rail of the DGX H100 systems is always one hop
away from the other 31 nodes in a SU. Traffic between nodes, or between rails, traverses the spine
layer"; its Table 4 cables as many spine-leaf links as node-leaf ones (1 SU: 252 and 256; 4 SU:
1,020 and 1,024), so the leaves are non-blocking; NDR 400 Gb/s InfiniBand. Leaf groups of 32
servers with 8 rails, a spine above them, 4 SU (128 nodes; the RA's 127 leave one for UFM).
``llama3-roce-h100``: the Llama 3 paper (Dubey et al. 2024, "The Llama 3 Herd of Models", §3.3.1
"Network"): "Both RoCE and InfiniBand clusters leverage 400 Gbps interconnects between GPUs" (one
400 Gb/s NIC per GPU here); "each rack hosts 16 GPUs split between two servers and connected by a
single Minipack2 top-of-the-rack (ToR) switch. In the middle layer, 192 such racks are connected by
Cluster Switches to form a pod of 3,072 GPUs with full bisection bandwidth ... eight such pods ...
are connected via Aggregation Switches to form a cluster of 24K GPUs ... the aggregation layer ...
has an oversubscription ratio of 1:7": tiers rack (2 servers), pod (192 racks, 1:7 up), core (8
pods); 2,048 nodes by default, the "up to 16K of these 24K GPUs" its pre-training used. The servers'
NVLink figures are the DGX H100 preset's (Grand Teton's 8 GPUs "are connected by NVLink", §3.3.1).
``gb200-nvl72``: the DGX GB200 user guide ("Hardware": each 72-GPU rack has "18x 1RU compute trays,
each with 2 Grace CPUs and 4 Blackwell GPUs"; a tray's cluster network "4x NVIDIA ConnectX-7 single
port 400G OSFP NIC") and the DGX SuperPOD GB200 reference architecture ("Network Fabrics", multi-node
NVLink: "full-mesh connectivity between all 72 GPUs within the same DGX GB200 rack ... delivering a
total bandwidth of 1.8 TB/s", both directions: 900 GB/s each way; "each SU contains 8 DGX GB200
systems", the leaf group of 8 racks = 144 trays here). The device: 186 GB (MLCommons Inference
v6.1, Crusoe's GB200-NVL72 system description: "accelerator_memory_capacity": "186 GB") and 2,500
TFLOP/s dense BF16 (G. K. Lockwood's B200 notes, the GB200 variant at 1,200 W: BF16 matrix 2500);
every other device number takes the custom-device defaults (``sim.input.cluster``), and the 3 µs
NVLink latency is the H100 presets', not a GB200 measurement.
H800 (DeepSeek-V3's GPU): the report (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv
2412.19437v2, read from a stored copy of its HTML) states 8 GPUs a node on NVLink and NVSwitch,
InfiniBand across (§3.1), and "NVLink offers a bandwidth of 160 GB/s, roughly 3.2 times that of
IB (50 GB/s)" (§3.2.2): ``dgx-h800`` takes those two figures as the links' bandwidths, at
collective efficiency 1.0 (no measurement of NCCL on it is cited; the report's kernels use
their own all-to-all), and one 400 Gb/s (50 GB/s) NIC per GPU, 8 a node (the report gives IB's
bandwidth per GPU, not the NIC count). The report does not state the H800's compute: ``H800-80GB``
is the H100 SXM's figures (an H100 with its NVLink cut), an assumption. FP8: the H100 SXM's dense
FP8 tensor-core peak, 1,979 TFLOP/s (NVIDIA H100 datasheet, "FP8 Tensor Core 3,958 teraFLOPS"
with sparsity, half that dense), which the H800 and H200 presets share; a model that names
``gemm_dtype: fp8`` prices its FP8 products at it (``sim.models.precision``).

Attention (``sim.cost.compute.fused_attention_s``): ``default_attention`` is the kernel a generated
transformer gets unless ``model.attention`` names one: ``flash`` on the A100, H100 and H200;
``unfused`` on the V100, which FlashAttention-2 does not run on (its README: "Ampere, Ada, or
Hopper GPUs"). The efficiencies are FlashAttention's measured TFLOP/s over the dense 16-bit
peak, at head dimension 128 (every shipped GPT and Llama) and sequence 4k (the middle of the
2k-8k the shipped models train at), with the causal mask (GPT and Llama are decoders), FLOPs
counted as the papers count them (4·s²·d·heads forward, halved under the causal mask, 2.5×
that backward):
A100 (FlashAttention-2, both ``flash`` and ``sdpa``): Dao 2023, "FlashAttention-2" (arXiv
2307.08691), Figure 4(d), forward + backward with causal mask, head dim 128, 4k: 173 TFLOP/s,
173/312 = 0.554, taken for the forward and for the backward (the separate forward and
backward figures were not available to read);
H100 and H200 ``flash`` (FlashAttention-3): Shah et al. 2024, "FlashAttention-3" (arXiv
2407.08608), Figure 5(d), forward with causal mask, head dim 128, 4k: 579 TFLOP/s, 579/989 =
0.585; Figure 6, backward, head dim 128, 4k: 542 TFLOP/s, 0.548;
H100 and H200 ``sdpa`` (torch's flash backend is FlashAttention-2, ``torch.nn.functional.
scaled_dot_product_attention``'s documentation): the same figures' FlashAttention-2 bars, 319
TFLOP/s forward (0.323) and 310 backward (0.313); ``cudnn`` (Transformer Engine on sm90 prefers
cuDNN's fused attention, ``attention.py`` at v1.9 and v1.11: "Disabling FlashAttention to give
FusedAttention preference on Hopper+"): their cuDNN bars, 518 (0.524) and 499 (0.505). On the A100
TE runs FlashAttention-2: its ``cudnn`` is its ``flash``.
The H200's values are the H100's (the same chip, 989 TFLOP/s); the V100's the A100's, standing in
where no FlashAttention measurement exists.

Board power (``power_w``, what ``sim.cost.energy`` counts at full load) is each datasheet's maximum
TDP: H100-80GB 700 W (meta-llama/llama-models ``models/llama3_1/MODEL_CARD.md`` at 1b28708: "H100-80GB
(TDP of 700W)"), A100 SXM4 400 W (techpowerup.com's A100 SXM4 page: "rated at 400 W maximum"), V100
SXM2 300 W (hwupgrade.it: 300 W for the SXM2 module, 250 W for the PCIe card), H200 SXM 700 W
(openmetal.io: "H200 SXM5 ... runs at 700W TDP"). ``idle_power_w`` is unset (no idle measurement of
these boards was found), so a preset device counts its TDP the whole run (an upper bound). No preset
sets a price, a host power or a PUE (``sim.input.run_section``).

``overlap_slowdown``: compute beside an overlapped collective (FSDP's gathers, the context ring, chunked
tensor parallelism) runs that much longer (``sim.cost.overlap.contended_s``), NCCL's kernels holding SMs
(an ``ncclAllGather`` beside a GEMM on a 132-SM H100 launches 24 blocks: forums.developer.nvidia.com,
"Compute-Communication Overlap Causes Severe GEMM Performance Degradation because of Tail Effect"):
``OVERLAP_SLOWDOWN``, measured over A100 and H100 among others; 0 on the V100 (no measurement).

``sm_count``: the H100 SXM5's 132 SMs of the full GH100's 144 (NVIDIA H100 Tensor Core GPU
Architecture whitepaper; glennklockwood.com/garden/processors/h100: "132 SMs (2 per TPC)"; the H800
and H200 the same part), which ``plan.overlap.communication_sms`` shares out
(``sim.cost.overlap.communication_sms_slowdown``); unset (0) on the V100 and A100.

``fp8_efficiency``: the H100-class presets' FP8 products at ``H100_FP8_EFFICIENCY``, DeepGEMM's
measured H800 FP8 GEMM rates at DeepSeek-V3's shapes (``DEEPGEMM_H800_FP8_TFLOPS``) as one e_max;
their bf16 products keep ``efficiency``. The H800's FP8 tensor cores are the H100 SXM's.

``memory_reserved``: the CUDA context, cuBLASLt's workspace (32 MiB Hopper, 4 MiB A100, 1 MiB V100),
NCCL's ring buffers and fragmentation (``sim.cost.reserved.reserved_memory_bytes`` cites each).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from sim.core.units import parse_time
from sim.cost.reserved import reserved_memory_bytes

__all__ = ["A100_EFFICIENCY", "CUTLASS36_H800_FP8_TFLOPS", "DEEPGEMM_H800_FP8_TFLOPS", "DEEPGEMM_SPEEDUPS", "DEVICE_PRESETS",
           "CLUSTER_PRESETS", "H100_EFFICIENCY", "H100_FP8_EFFICIENCY", "KERNEL_GAP", "MAMF_BF16", "mamf_efficiency", "OVERLAP_SLOWDOWN", "measured_fp8_efficiency"]

KERNEL_GAP = "2us"
"""The A100 and H100-class presets' ``kernel_overhead``: the device's idle time between two
back-to-back kernels of one stream (the front end starting the next as the last drains), measured
in DeepSeek's H800 training profile (deepseek-ai/profile-data ``train.json`` at 4496024: of the
compute stream's 926 gaps between consecutive kernels, 905 are under 20 µs, median 2 µs, mean
2.02 µs, at the trace's 1 µs resolution). No A100 training trace was found to read; the same
launch path is taken to cost the same there. The V100 keeps 0: its shipped scenarios replay layers
profiled whole (DAPPLE's profiles), gaps included."""

OVERLAP_SLOWDOWN = 0.189
"""Compute's slowdown beside an overlapped collective on the A100 and H100 presets: "overlapping
computation and communication can result in an average computational slowdown of 18.9%, with a
maximum of 40.0%" (Lee et al. 2025, "Characterizing Compute-Communication Overlap in
GPU-Accelerated Distributed Deep Learning", arXiv 2507.03114, abstract: GPT and Llama models on
4 A100s, H100s, MI250s and MI210s)."""


DEEPGEMM_H800_FP8_TFLOPS: tuple[tuple[int, int, int, int, float], ...] = (
    (1, 4096, 2112, 7168, 1058), (1, 4096, 24576, 1536, 990), (1, 4096, 32768, 512, 590),
    (1, 4096, 7168, 16384, 1358), (1, 4096, 4096, 7168, 1304), (1, 4096, 7168, 2048, 1025),
    (4, 8192, 4096, 7168, 1297), (4, 8192, 7168, 2048, 1099),
)
"""``(groups, M, N, K, TFLOP/s)``: DeepGEMM's measured FP8 GEMMs on the H800 at DeepSeek-V3's shapes
(deepseek-ai/DeepGEMM, README.md at a6d97a1c1b48a7a9d7994d0e155ee6f11d0a3f07, 2025-02-25, its first
release, "Performance": the M = 4096 rows of "Normal GEMMs for dense models" and the 8192-row groups
of "Grouped GEMMs for MoE models (contiguous layout)"; 1×128 and 128×128 scaling, DeepSeek-V3 §3.3.2;
the smaller-M rows, decoding shapes, left out)."""


DEEPGEMM_SPEEDUPS: tuple[float, ...] = (1.1, 1.0, 1.0, 1.2, 1.1, 1.1, 1.2, 1.2)
"""The "Speedup" column of the same README rows as ``DEEPGEMM_H800_FP8_TFLOPS``, in its order: "All
speedup metrics are calculated in comparison to our internally and carefully optimized
implementation based on CUTLASS 3.6" (deepseek-ai/DeepGEMM README at a6d97a1, "Performance")."""

CUTLASS36_H800_FP8_TFLOPS = tuple((g, m, n, k, rate / speedup)
                                  for (g, m, n, k, rate), speedup in zip(DEEPGEMM_H800_FP8_TFLOPS, DEEPGEMM_SPEEDUPS))
"""DeepSeek's own FP8 GEMMs before DeepGEMM, at the same shapes: each DeepGEMM rate over its speedup.
DeepSeek-V3 (arXiv 2412.19437, December 2024) predates DeepGEMM (February 2025), so its products ran
at these rates: the published scenario's ``fp8_efficiency`` is their ``measured_fp8_efficiency``, 0.538."""


def _size_curve(half_dim: float, m: float, n: float, k: float) -> float:
    """``(1 + D/M)(1 + D/N)(1 + D/K)`` (D: ``matmul_half_dim``), by which ``kernel_time_s`` divides e_max."""
    return (1.0 + half_dim / m) * (1.0 + half_dim / n) * (1.0 + half_dim / k)


def measured_fp8_efficiency(rows=DEEPGEMM_H800_FP8_TFLOPS, *, peak_tflops: float = 1979.0,
                            half_dim: float = 64.0) -> float:
    """The FP8 matrix efficiency e_max that prices ``rows`` (``DEEPGEMM_H800_FP8_TFLOPS``), run one
    after another, in the time they took: each row's rate over the FP8 peak with ``_size_curve``
    divided out, their FLOP-weighted harmonic mean ``ΣF / Σ(F/e)``."""
    flop = [2.0 * g * m * n * k for g, m, n, k, _ in rows]
    eff = [rate / peak_tflops * _size_curve(half_dim, m, n, k) for _, m, n, k, rate in rows]
    return sum(flop) / sum(f / e for f, e in zip(flop, eff))


H100_FP8_EFFICIENCY = round(measured_fp8_efficiency(), 3)
"""The H100-class presets' ``fp8_efficiency``: DeepGEMM's H800 rates (``measured_fp8_efficiency``),
0.626, against the bf16 products' e_max 0.70 (``H100_EFFICIENCY``)."""


MAMF_BF16: Mapping[str, tuple[float, float, int, int, int]] = MappingProxyType({
    "A100-80GB": (271.2, 312.0, 1024, 10240, 5120),
    "H100-80GB": (794.5, 989.0, 2048, 2048, 13312),
})
"""Device -> ``(MAMF TFLOP/s, dense bf16 peak TFLOP/s, M, N, K of the best shape)``: the Maximum
Achievable Matmul FLOPS, bf16 ``torch.mm`` over a brute-force sweep of shapes, the mean of 100
iterations after 50 warm-up at each (S. Bekman, "Machine Learning Engineering Open Book",
stas00/ml-engineering ``compute/accelerator/README.md`` at b9e2972, "Maximum Achievable Matmul FLOPS
comparison table", BF16: "NVIDIA A100 SXM | 271.2 | 312 | 86.9% | 1024x10240x5120 | 2.6.0+cu126" and
"NVIDIA H100 SXM | 794.5 | 989 | 80.3% | 2048x2048x13312 | 2.7.0+cu126"; benchmark
``compute/accelerator/benchmarks/mamf-finder.py``, which times each ``torch.mm`` alone between two
CUDA events after clearing the L2, so each time holds one launch gap). One benchmark on both devices:
their ratio is a measurement, though each figure is the best shape's, not a training run's."""


def mamf_efficiency(device: str, *, half_dim: float, gap_s: float = 0.0) -> float:
    """The matrix efficiency e_max that ``sim.cost.compute.kernel_time_s`` would need to price
    ``device``'s MAMF shape (``MAMF_BF16``) at its measured rate: the product's FLOPs over the
    peak times its measured time less the one launch gap ``gap_s`` it holds (the preset's
    ``kernel_overhead``, which ``kernel_time_s`` adds back), with ``_size_curve`` divided out."""
    rate, peak, m, n, k = MAMF_BF16[device]
    flop = 2.0 * m * n * k
    work_s = flop / (rate * 1e12) - gap_s
    return flop / (peak * 1e12 * work_s) * _size_curve(half_dim, m, n, k)


A100_EFFICIENCY = 0.75
"""The A100 preset's bf16 e_max: a starting point (module docstring), which the A100 rows
(Korthikanti et al. 2022 Table 5, Narayanan et al. 2021 Table 1) are replayed with."""

H100_EFFICIENCY = round(A100_EFFICIENCY * mamf_efficiency("H100-80GB", half_dim=64, gap_s=parse_time(KERNEL_GAP))
                        / mamf_efficiency("A100-80GB", half_dim=48, gap_s=parse_time(KERNEL_GAP)), 2)
"""The H100-class presets' bf16 e_max: the A100's scaled by the measured MAMF ratio
(``mamf_efficiency`` with each measured time's 2 µs launch gap and the three dimensions' size curve
taken out: 0.871 against 0.927, 0.939), 0.704, to two places 0.70. Both presets price their products
at about 0.81 of what the MAMF benchmark measures at its best shape (the A100 0.809, the H100 0.807)."""


def _reserved(memory_bytes: float, cublas_workspace_bytes: float) -> str:
    """A preset's ``memory_reserved``, in bytes, as a scenario file writes it."""
    return f"{reserved_memory_bytes(memory_bytes, cublas_workspace_bytes=cublas_workspace_bytes):.17g}B"


_H100_SXM: Mapping[str, Any] = MappingProxyType({
        "memory": "80GiB",
        "memory_reserved": _reserved(80 * 2**30, 32 * 2**20),
        "peak_flops": "989TFLOP/s",
        "peak_fp32_flops": "67TFLOP/s",
        "peak_fp8_flops": "1979TFLOP/s",
        "memory_bandwidth": "3350GB/s",
        "efficiency": H100_EFFICIENCY,
        "matmul_half_dim": 64,
        "kernel_overhead": KERNEL_GAP,
        "kernel_issue": "10us",
        "memory_efficiency": 0.8,
        "action_overhead": "0s",
        "default_attention": "flash",
        "attention_efficiency": 0.585,
        "attention_backward_efficiency": 0.548,
        "sdpa_efficiency": 0.323,
        "sdpa_backward_efficiency": 0.313,
        "cudnn_efficiency": 0.524,
        "cudnn_backward_efficiency": 0.505,
        "overlap_slowdown": OVERLAP_SLOWDOWN,
        "sm_count": 132,
        "fp8_efficiency": H100_FP8_EFFICIENCY,
        "power_w": "700W",
    })
"""The H100 SXM 80GB (NVIDIA H100 datasheet), which the H800 preset shares."""

DEVICE_PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "V100-16GB": {
            "memory": "16GiB",
            "memory_reserved": _reserved(16 * 2**30, 2**20),
            "peak_flops": "125TFLOP/s",
            "peak_fp32_flops": "15.7TFLOP/s",
            "memory_bandwidth": "900GB/s",
            "efficiency": 0.7,
            "matmul_half_dim": 32,
            "kernel_overhead": "0s",
            "kernel_issue": "10us",
            "memory_efficiency": 0.8,
            "action_overhead": "0s",
            "default_attention": "unfused",
            "attention_efficiency": 0.554,
            "attention_backward_efficiency": 0.554,
            "sdpa_efficiency": 0.554,
            "sdpa_backward_efficiency": 0.554,
            "cudnn_efficiency": 0.554,
            "cudnn_backward_efficiency": 0.554,
            "overlap_slowdown": 0.0,
            "power_w": "300W",
        },
        "A100-80GB": {
            "memory": "80GiB",
            "memory_reserved": _reserved(80 * 2**30, 4 * 2**20),
            "peak_flops": "312TFLOP/s",
            "peak_fp32_flops": "19.5TFLOP/s",
            "memory_bandwidth": "2039GB/s",
            "efficiency": A100_EFFICIENCY,
            "matmul_half_dim": 48,
            "kernel_overhead": KERNEL_GAP,
            "kernel_issue": "10us",
            "memory_efficiency": 0.8,
            "action_overhead": "0s",
            "default_attention": "flash",
            "attention_efficiency": 0.554,
            "attention_backward_efficiency": 0.554,
            "sdpa_efficiency": 0.554,
            "sdpa_backward_efficiency": 0.554,
            "cudnn_efficiency": 0.554,
            "cudnn_backward_efficiency": 0.554,
            "overlap_slowdown": OVERLAP_SLOWDOWN,
            "power_w": "400W",
        },
        "H100-80GB": _H100_SXM,
        "H800-80GB": _H100_SXM,  # the H100 SXM's figures (module docstring)
        "H200-141GB": {  # the H100's chip with more and faster memory (module docstring)
            **_H100_SXM,
            "memory": "141GB",
            "memory_reserved": _reserved(141e9, 32 * 2**20),
            "memory_bandwidth": "4800GB/s",
        },
    }
)
"""Device name -> scenario mapping of its ``cluster.device`` keys."""

_DGX_H100: Mapping[str, Any] = MappingProxyType({
    "devices_per_node": 8,
    "device": "H100-80GB",
    "intra_node": {"bandwidth": "450GB/s", "latency": "3us", "name": "NVSwitch", "collective_efficiency": 0.78},
    "inter_node": {"bandwidth": "400Gb/s", "latency": "5us", "name": "InfiniBand"},
    "nics_per_node": 8,
})
"""A DGX H100 server's GPUs, NVSwitch and eight 400 Gb/s NICs, which the dgx-h100,
dgx-superpod-h100 and llama3-roce-h100 presets share (each sets its own server count; the
last names its NICs RoCE)."""

CLUSTER_PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "v100-nvlink-8": {
            "nodes": 2,
            "devices_per_node": 8,
            "device": "V100-16GB",
            "intra_node": {"bandwidth": "150GB/s", "latency": "5us", "name": "NVLink"},
            "inter_node": {"bandwidth": "25Gb/s", "latency": "25us", "name": "Ethernet"},
        },
        "v100-ethernet-1": {
            "nodes": 16,
            "devices_per_node": 1,
            "device": "V100-16GB",
            "intra_node": {"bandwidth": "16GB/s", "latency": "5us", "name": "PCIe"},
            "inter_node": {"bandwidth": "25Gb/s", "latency": "25us", "name": "Ethernet"},
        },
        "a100-nvlink-8": {
            "nodes": 2,
            "devices_per_node": 8,
            "device": "A100-80GB",
            "intra_node": {"bandwidth": "300GB/s", "latency": "3us", "name": "NVSwitch", "collective_efficiency": 0.77},
            "inter_node": {"bandwidth": "200Gb/s", "latency": "5us", "name": "InfiniBand"},
            "nics_per_node": 8,
        },
        "dgx-h100": {**_DGX_H100, "nodes": 4},
        "dgx-h800": {
            "nodes": 256,
            "devices_per_node": 8,
            "device": "H800-80GB",
            "intra_node": {"bandwidth": "160GB/s", "latency": "3us", "name": "NVLink"},
            "inter_node": {"bandwidth": "50GB/s", "latency": "5us", "name": "InfiniBand"},
            "nics_per_node": 8,
        },
        "dgx-superpod-h100": {  # DGX H100 servers on a rail-optimised leaf/spine (module docstring)
            **_DGX_H100,
            "nodes": 128,
            "fabric": {"tiers": [{"name": "leaf", "size": 32}, {"name": "spine"}], "rail_optimised": True},
        },
        "llama3-roce-h100": {  # Meta's 24K-GPU RoCE cluster, three tiers, 1:7 above the pods (module docstring)
            **_DGX_H100,
            "nodes": 2048,
            "inter_node": {"bandwidth": "400Gb/s", "latency": "5us", "name": "RoCE"},
            "fabric": {"tiers": [{"name": "rack", "size": 2}, {"name": "pod", "size": 192, "oversubscription": 7},
                                 {"name": "core", "size": 8}]},
        },
        "gb200-nvl72": {  # GB200 NVL72 racks: 18 trays of 4 GPUs, one NVLink domain each (module docstring)
            "nodes": 144,
            "devices_per_node": 4,
            "device": {"name": "GB200", "memory": "186GB", "peak_flops": "2500TFLOP/s"},
            "intra_node": {"bandwidth": "900GB/s", "latency": "3us", "name": "NVLink 5"},
            "inter_node": {"bandwidth": "400Gb/s", "latency": "5us", "name": "InfiniBand"},
            "nics_per_node": 4,
            "fabric": {"tiers": [{"name": "leaf", "size": 144}, {"name": "spine"}],
                       "scale_up": {"size": 72, "bandwidth": "900GB/s", "latency": "3us"}},
        },
        "hgx-h200": {
            "nodes": 4,
            "devices_per_node": 8,
            "device": "H200-141GB",
            "intra_node": {"bandwidth": "450GB/s", "latency": "3us", "name": "NVSwitch", "collective_efficiency": 0.78},
            "inter_node": {"bandwidth": "400Gb/s", "latency": "5us", "name": "InfiniBand"},
            "nics_per_node": 8,
        },
    }
)
"""Cluster preset name -> scenario mapping of its ``cluster`` keys (``nodes`` is a default)."""

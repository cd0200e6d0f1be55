"""Specs: what the user's cluster, model, training set-up and plan are, as frozen data.

A simulation has four independent inputs (as in Calculon: system, model, strategy kept apart):

* ``ClusterSpec`` — ``nodes`` servers of ``devices_per_node`` identical ``DeviceSpec`` GPUs.
  Every GPU has one intra-node port (``intra_node``: NVLink, NVSwitch or PCIe bandwidth per
  GPU); every server has ``nics_per_node`` network cards (``inter_node``: bandwidth per NIC).
  Device ids are global: ``node * devices_per_node + local_index``.
* ``ModelSpec`` — the model's layers; it lives in ``sim.core.model_spec``.
* ``TrainingSpec`` — the global batch and the micro-batch that enters the pipeline; it lives in
  ``sim.core.training``.

The plan (stages and schedule) is the fourth input; it lives in ``sim.core.plan``.

Specs check themselves in ``__post_init__`` and raise ``SpecError`` naming the field; they
do nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.core.errors import SpecError
from sim.core.fabric import FabricSpec
from sim.core.measured_collectives import MeasuredCollectives
from sim.core.units import format_bytes

__all__ = [
    "ATTENTION_KERNELS",
    "DTYPE_BYTES",
    "OPTIMIZER_IMPLEMENTATIONS",
    "OPTIMIZER_STATES",
    "DeviceSpec",
    "LinkSpec",
    "ClusterSpec",
    "non_negative",
    "optimizer_state_factor",
    "positive",
    "positive_int",
]

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
"""Bytes per element of each supported training dtype."""

FP8 = "fp8"
"""The matrix-product precision ``model.gemm_dtype`` may name (``sim.models.precision``): E4M3
inputs on FP8 tensor cores, accumulated in higher precision; not a training dtype of its own."""

OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
"""fp32 state tensors each optimizer keeps per parameter (Adam: first and second moment)."""

OPTIMIZER_IMPLEMENTATIONS = ("fused", "foreach", "for-loop")
"""How an optimizer step runs (``sim.cost.compute.optimizer_step_kernels``): ``fused``, one multi-tensor
kernel doing the whole update in one pass (apex/Transformer Engine ``FusedAdam`` as Megatron-LM
and DeepSpeed use it, torch's ``fused=True``); ``foreach``, one multi-tensor launch per
element-wise operation (torch's ``foreach=True``, its default on CUDA); ``for-loop``, every
operation once per tensor (torch's single-tensor path, its default on CPUs)."""


ATTENTION_KERNELS = ("flash", "sdpa", "cudnn", "unfused")
"""How a generated transformer's attention runs (``model.attention``; ``sim.cost.kernels``): ``flash``,
one fused kernel (FlashAttention-2 on Ampere, FlashAttention-3 on Hopper) at the device's
``attention_efficiency``; ``sdpa``, ``torch.nn.functional.scaled_dot_product_attention``'s flash
backend (FlashAttention-2 on every GPU) at ``sdpa_efficiency``; ``cudnn``, Transformer Engine's
``DotProductAttention`` as Megatron-Core runs it: cuDNN's fused flash attention on Hopper (TE prefers
it to FlashAttention there), FlashAttention-2 on Ampere, at ``cudnn_efficiency``; ``unfused``,
Megatron-LM's separate score, softmax, dropout and value kernels with their s×s tensors in memory."""


def optimizer_state_factor(optimizer: str, dtype: str, moment_dtype: str | None = None) -> float:
    """Optimizer state bytes per parameter byte.

    Each state tensor is fp32 (4 bytes per parameter) unless ``moment_dtype`` names another.
    Mixed precision (fp16/bf16 parameters) adds an fp32 master copy, as in ZeRO (Rajbhandari
    et al., SC'20, §3.1: Adam in mixed precision holds 2 + 2 + 12 bytes per parameter, of which
    12 are optimizer state). DeepSeek-V3 (arXiv 2412.19437, §3.3.3, "Low-Precision Optimizer
    States") keeps "the first and second moments in the AdamW optimizer" in BF16 while "the
    master weights (stored by the optimizer) and gradients ... are still retained in FP32":
    ``moment_dtype: bf16``, 4 + 2·2 = 8 bytes of state per parameter.
    """
    if optimizer not in OPTIMIZER_STATES:
        raise SpecError("optimizer", f"unknown optimizer {optimizer!r}; valid: {_names(OPTIMIZER_STATES)}")
    if dtype not in DTYPE_BYTES:
        raise SpecError("dtype", f"unknown dtype {dtype!r}; valid: {_names(DTYPE_BYTES)}")
    if moment_dtype is not None and moment_dtype not in DTYPE_BYTES:
        raise SpecError("optimizer.moment_dtype", f"unknown dtype {moment_dtype!r}; valid: {_names(DTYPE_BYTES)}")
    param_bytes = DTYPE_BYTES[dtype]
    master_copies = 0 if param_bytes == 4 else 1
    moment_bytes = DTYPE_BYTES[moment_dtype] if moment_dtype is not None else 4
    return (OPTIMIZER_STATES[optimizer] * moment_bytes + master_copies * 4.0) / param_bytes


def _names(table: dict) -> str:
    return ", ".join(sorted(table))


def positive(key: str, value: float) -> None:
    """Raise ``SpecError`` unless ``value`` is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SpecError(key, f"must be a positive number, got {value!r}")


def non_negative(key: str, value: float) -> None:
    """Raise ``SpecError`` unless ``value`` is a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise SpecError(key, f"must be a number >= 0, got {value!r}")


def positive_int(key: str, value: int) -> None:
    """Raise ``SpecError`` unless ``value`` is an integer > 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(key, f"must be a positive integer, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSpec:
    """One accelerator."""

    name: str
    """Display name, e.g. ``V100-16GB``."""
    memory_bytes: float
    """The device's memory in bytes, as its data sheet gives it."""
    peak_flop_per_s: float
    """Dense half-precision (fp16/bf16 tensor core) peak, FLOP/s."""
    peak_fp32_flop_per_s: float
    """Dense fp32 peak (without TF32), FLOP/s; used for fp32 models. A scenario's custom device
    that leaves it out gets ``peak_flops / 16``, the A100's ratio (``sim.input.cluster``)."""
    memory_bandwidth_bytes_per_s: float
    """Device memory (HBM) bandwidth, bytes/s. A scenario's custom device that leaves it out gets
    ``peak_flops`` × 2039 GB/s / 312 TFLOP/s, the A100's ratio (``sim.input.cluster``)."""
    efficiency: float = 0.5
    """Fraction of peak that large matrix products achieve (e_max of ``sim.cost.kernels``), in (0, 1]."""
    matmul_half_dim: float = 0.0
    """Size of a matrix product's dimension at which it loses half its efficiency to tiling
    (D of ``sim.cost.kernels``); 0: no size effect."""
    kernel_overhead_s: float = 0.0
    """Device time every kernel adds beyond its work, seconds: on a GPU the idle gap between two
    back-to-back kernels of a stream (2 µs on the A100 and H100-class presets, measured:
    ``sim.input.presets.KERNEL_GAP``), on a CPU the dispatcher's work in the kernel's own thread.
    A kernel takes ``max(work + kernel_overhead, kernel_issue)`` (``sim.cost.compute.kernel_time_s``)."""
    kernel_issue_s: float = 0.0
    """Seconds the host (framework and driver) takes to issue one kernel to the device, which
    runs it asynchronously: a kernel takes at least this long, however little work it has
    (``sim.cost.compute.kernel_time_s``: the larger of device time and issue time). 0: no floor."""
    memory_efficiency: float = 1.0
    """Fraction of ``memory_bandwidth`` element-wise kernels achieve, in (0, 1]."""
    action_overhead_s: float = 0.0
    """Fixed cost of each forward and each backward a framework runs for one stage on one
    micro-batch, outside its kernels (the Python and autograd work around them), seconds."""
    memory_reserved_bytes: float = 0.0
    """Bytes of ``memory_bytes`` a training process cannot use for tensors: the CUDA context,
    NCCL's buffers, the caching allocator's fragmentation; ``usable_memory_bytes`` is the rest."""
    default_attention: str = "unfused"
    """The attention kernel (``ATTENTION_KERNELS``) a generated transformer on this device gets
    when its ``model.attention`` names none: ``flash`` on the Ampere and Hopper presets."""
    attention_efficiency: float = 0.554
    """Fraction of ``peak_flop_per_s`` a ``flash`` attention forward reaches on the FLOPs it does,
    in (0, 1] (``sim.cost.compute.fused_attention_s``; the presets' values are FlashAttention's
    published measurements, ``sim.input.presets``). Default: the A100's, FlashAttention-2."""
    attention_backward_efficiency: float = 0.554
    """The same for a ``flash`` attention backward (which recomputes the scores), in (0, 1]."""
    sdpa_efficiency: float = 0.554
    """Fraction of peak an ``sdpa`` attention forward reaches (torch's FlashAttention-2 backend), in (0, 1]."""
    sdpa_backward_efficiency: float = 0.554
    """The same for an ``sdpa`` attention backward, in (0, 1]."""
    cudnn_efficiency: float = 0.554
    """Fraction of peak a ``cudnn`` attention forward reaches (Transformer Engine's fused attention:
    cuDNN's on Hopper, FlashAttention-2 on Ampere), in (0, 1]."""
    cudnn_backward_efficiency: float = 0.554
    """The same for a ``cudnn`` attention backward, in (0, 1]."""
    peak_fp8_flop_per_s: float | None = None
    """Dense FP8 (E4M3 tensor core) peak, FLOP/s, at which the matrix products a model runs in FP8
    (``model.gemm_dtype: fp8``, ``sim.models.precision``) are priced; None: the device has no FP8
    tensor cores (Volta, Ampere), and an FP8 model on it is refused."""
    fp8_efficiency: float | None = None
    """The matrix efficiency (e_max) of FP8 products, in (0, 1]; None: ``efficiency``, as for
    every product (the H100-class presets' value is DeepGEMM's measured H800 rate, ``sim.input.presets``)."""
    overlap_slowdown: float = 0.0
    """How much longer compute takes while an overlapped collective runs beside it, a fraction in
    [0, 1]: the collective's kernels hold SMs and memory bandwidth the compute would use
    (``sim.cost.overlap.contended_s``; the presets' value is a measured average, ``sim.input.presets``)."""
    sm_count: int = 0
    """Streaming multiprocessors on the chip (132 on the H100 SXM and the H800, NVIDIA H100 Tensor
    Core GPU Architecture whitepaper); 0: not given. ``plan.overlap.communication_sms`` takes its
    SMs from these (``sim.cost.overlap.communication_sms_slowdown``)."""
    power_w: float | None = None
    """Board power at full load (the datasheet's TDP), watts; None: not set (no energy estimate).
    The presets' figures are NVIDIA's datasheets' (``sim.input.presets``)."""
    idle_power_w: float | None = None
    """Board power while idle, watts, at most ``power_w``; None: not set, and a device is counted
    at ``power_w`` all the time (an upper bound; ``sim.cost.energy``)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("name", "must not be empty")
        positive("memory", self.memory_bytes)
        positive("peak_flops", self.peak_flop_per_s)
        positive("peak_fp32_flops", self.peak_fp32_flop_per_s)
        positive("memory_bandwidth", self.memory_bandwidth_bytes_per_s)
        positive("efficiency", self.efficiency)
        if self.efficiency > 1:
            raise SpecError("efficiency", f"must be in (0, 1], got {self.efficiency!r}")
        non_negative("action_overhead", self.action_overhead_s)
        non_negative("kernel_overhead", self.kernel_overhead_s)
        non_negative("kernel_issue", self.kernel_issue_s)
        non_negative("memory_reserved", self.memory_reserved_bytes)
        if self.default_attention not in ATTENTION_KERNELS:
            raise SpecError("default_attention", f"unknown kernel {self.default_attention!r}; "
                                                 f"valid: {', '.join(ATTENTION_KERNELS)}")
        if not 0 <= self.overlap_slowdown <= 1:
            raise SpecError("overlap_slowdown", f"must be in [0, 1], got {self.overlap_slowdown!r}")
        for key in ("attention_efficiency", "attention_backward_efficiency", "sdpa_efficiency",
                    "sdpa_backward_efficiency", "cudnn_efficiency", "cudnn_backward_efficiency"):
            positive(key, getattr(self, key))
            if getattr(self, key) > 1:
                raise SpecError(key, f"must be in (0, 1], got {getattr(self, key)!r}")
        if isinstance(self.sm_count, bool) or not isinstance(self.sm_count, int) or self.sm_count < 0:
            raise SpecError("sm_count", f"must be an integer >= 0, got {self.sm_count!r}")
        if self.fp8_efficiency is not None and not 0 < self.fp8_efficiency <= 1:
            raise SpecError("fp8_efficiency", f"must be in (0, 1], got {self.fp8_efficiency!r}")
        if self.peak_fp8_flop_per_s is not None:
            positive("peak_fp8_flops", self.peak_fp8_flop_per_s)
        if self.power_w is not None:
            positive("power_w", self.power_w)
        if self.idle_power_w is not None:
            non_negative("idle_power_w", self.idle_power_w)
            if self.power_w is None or self.idle_power_w > self.power_w:
                raise SpecError("idle_power_w", f"{self.idle_power_w:g} W needs a power_w at least as large "
                                                f"(got {self.power_w}); set power_w, or lower idle_power_w")
        if self.memory_reserved_bytes >= self.memory_bytes:
            raise SpecError("memory_reserved", f"must be less than memory ({format_bytes(self.memory_bytes)}), got "
                                               f"{format_bytes(self.memory_reserved_bytes)}; lower it, or raise memory")

    @property
    def usable_memory_bytes(self) -> float:
        """What tensors may fill: ``memory_bytes − memory_reserved_bytes``; more is out of memory."""
        return self.memory_bytes - self.memory_reserved_bytes

    def attention_efficiencies(self, kernel: str) -> tuple[float, float]:
        """(forward, backward) fraction of peak the fused attention ``kernel`` (flash, sdpa or cudnn) reaches."""
        if kernel == "sdpa":
            return self.sdpa_efficiency, self.sdpa_backward_efficiency
        if kernel == "cudnn":
            return self.cudnn_efficiency, self.cudnn_backward_efficiency
        return self.attention_efficiency, self.attention_backward_efficiency

    def matrix_efficiency_for(self, dtype: str) -> float:
        """e_max of a product in ``dtype``: ``fp8_efficiency`` for FP8 where given, else ``efficiency``."""
        return self.fp8_efficiency if dtype == FP8 and self.fp8_efficiency is not None else self.efficiency

    def peak_flop_per_s_for(self, dtype: str) -> float:
        """The peak that applies to math in ``dtype`` (fp32 has its own, slower peak; ``fp8`` the
        FP8 tensor cores', which a device without them refuses)."""
        if dtype == FP8:
            if self.peak_fp8_flop_per_s is None:
                raise SpecError("model.gemm_dtype", f"device {self.name} has no FP8 peak (FP8 tensor cores are "
                                                    "Hopper's and later); set cluster.device.peak_fp8_flops or "
                                                    "remove model.gemm_dtype")
            return self.peak_fp8_flop_per_s
        return self.peak_fp32_flop_per_s if DTYPE_BYTES.get(dtype) == 4 else self.peak_flop_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """A kind of port: every transfer through it costs ``latency_s + bytes / bandwidth``.

    Where the hosts' processors do the sending (gloo on a CPU writes each message to its
    socket in the thread that issues it, and a transport thread on the receiver takes it
    in), a send also holds up the sender's compute stream for ``send_issue_s(bytes)`` and
    the receiver's for ``recv_overhead_s``; on GPUs (NCCL: the copies run on their own
    streams) both are 0, the default.
    """

    bandwidth_bytes_per_s: float
    """Bandwidth of one port in one direction, bytes/s."""
    latency_s: float = 0.0
    """Fixed cost per transfer, seconds."""
    name: str = ""
    """What the port is (``NVLink``, ``PCIe``, ``Ethernet``, ``InfiniBand``); display only."""
    send_overhead_s: float = 0.0
    """Seconds each send holds up the sender's compute stream, whatever its size."""
    send_bandwidth_bytes_per_s: float | None = None
    """Rate at which the sender's compute stream pushes a message out, bytes/s; None: no
    per-byte cost on the compute stream."""
    recv_overhead_s: float = 0.0
    """Seconds each received message costs the receiver's compute stream (on a CPU the
    transport thread that takes it in competes with the compute for a core)."""
    collective_efficiency: float = 1.0
    """Share of ``bandwidth`` a collective's ring reaches through this port, in (0, 1]: NCCL's
    bus bandwidth over the port's figure (nccl-tests' ``all_reduce_perf`` on 8 A100 over
    NVSwitch: about 230 GB/s of 300 GB/s at 1 GiB). Point-to-point transfers use ``bandwidth``."""
    collectives: MeasuredCollectives | None = None
    """The link's collectives as measured (``dapple-run profile``), which ``sim.cost.comm``
    prices them from instead of the ring formulas; None (the default): not measured."""

    def __post_init__(self) -> None:
        positive("bandwidth", self.bandwidth_bytes_per_s)
        positive("collective_efficiency", self.collective_efficiency)
        if self.collective_efficiency > 1:
            raise SpecError("collective_efficiency", f"must be in (0, 1], got {self.collective_efficiency!r}")
        non_negative("latency", self.latency_s)
        non_negative("send_overhead", self.send_overhead_s)
        non_negative("recv_overhead", self.recv_overhead_s)
        if self.send_bandwidth_bytes_per_s is not None:
            positive("send_bandwidth", self.send_bandwidth_bytes_per_s)

    @property
    def collective_bandwidth_bytes_per_s(self) -> float:
        """Bandwidth a ring collective reaches through the port: ``bandwidth × collective_efficiency``."""
        return self.bandwidth_bytes_per_s * self.collective_efficiency

    def send_issue_s(self, nbytes: float) -> float:
        """Seconds one send of ``nbytes`` holds up the sender's compute stream."""
        if nbytes <= 0:
            return 0.0
        rate = self.send_bandwidth_bytes_per_s
        return self.send_overhead_s + (nbytes / rate if rate else 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """Identical servers of identical GPUs; a GPU port inside a server, NICs between servers."""

    nodes: int
    """Number of servers, >= 1."""
    devices_per_node: int
    """GPUs per server, >= 1."""
    device: DeviceSpec
    """Every GPU of the cluster."""
    intra_node: LinkSpec
    """Each GPU's port to the other GPUs of its server (bandwidth per GPU)."""
    inter_node: LinkSpec
    """Each network card's port to the other servers (bandwidth per NIC)."""
    nics_per_node: int = 1
    """Network cards per server; GPU ``j`` of a server uses NIC ``j * nics // devices``."""
    name: str = ""
    """Display name, e.g. the preset it came from."""
    price_per_gpu_hour: float | None = None
    """What one device of the cluster costs per hour, in the currency the user budgets in;
    None: no price set (presets set none). ``sim.cost.energy``."""
    host_power_w: float | None = None
    """Power of one server apart from its devices (CPUs, memory, NICs, fans), watts; None: not
    set, counted as 0."""
    pue: float | None = None
    """Power usage effectiveness of the data centre (facility power over IT power), >= 1; None:
    not set, counted as 1.0."""
    carbon_g_per_kwh: float | None = None
    """Grid carbon intensity, grams of CO2-equivalent per kWh; None: no carbon estimate."""
    fabric: FabricSpec | None = None
    """The switch tiers above the servers (``sim.core.fabric``); None: one non-blocking switch."""

    def __post_init__(self) -> None:
        positive_int("nodes", self.nodes)
        for key in ("price_per_gpu_hour", "host_power_w", "carbon_g_per_kwh"):
            if getattr(self, key) is not None:
                non_negative(key, getattr(self, key))
        if self.pue is not None and not (isinstance(self.pue, (int, float)) and 1.0 <= self.pue <= 10.0):
            raise SpecError("pue", f"must be a number from 1 to 10, got {self.pue!r}")
        positive_int("devices_per_node", self.devices_per_node)
        positive_int("nics_per_node", self.nics_per_node)
        if self.nics_per_node > self.devices_per_node:
            raise SpecError(
                "nics_per_node",
                f"{self.nics_per_node} NICs for {self.devices_per_node} GPUs per node; "
                "use at most one NIC per GPU",
            )

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    def node_of(self, device: int) -> int:
        """The server that holds global device id ``device``."""
        return device // self.devices_per_node

    def nic_of(self, device: int) -> int:
        """Global id of the NIC that ``device`` sends and receives inter-node traffic through."""
        local = device % self.devices_per_node
        return self.node_of(device) * self.nics_per_node + local * self.nics_per_node // self.devices_per_node

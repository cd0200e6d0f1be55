"""Specs: what the user's cluster, model, training set-up and plan are, as frozen data.

A simulation has four independent inputs (as in Calculon: system, model, strategy kept apart):

* ``ClusterSpec`` — ``nodes`` servers of ``devices_per_node`` identical ``DeviceSpec`` GPUs.
  Every GPU has one intra-node port (``intra_node``: NVLink, NVSwitch or PCIe bandwidth per
  GPU); every server has ``nics_per_node`` network cards (``inter_node``: bandwidth per NIC).
  Device ids are global: ``node * devices_per_node + local_index``.
* ``ModelSpec`` — an ordered list of ``LayerSpec`` (profile order or generator order), with the
  bytes that cross each possible cut between two stages. All per-layer sizes and times are
  per *sample*; the cost model scales them to a micro-batch. A generated model also keeps
  the generator and parameters that built it (``ModelPreset``), so nothing needs the
  scenario file again to build it for real.
* ``TrainingSpec`` — the global batch and the micro-batch that enters the pipeline.

The plan (stages and schedule) is the fourth input; it lives in ``sim.plan``.

Specs validate themselves in ``__post_init__`` and raise ``SpecError`` naming the field; they
do nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sim.errors import SpecError

__all__ = [
    "DTYPE_BYTES",
    "OPTIMIZER_STATES",
    "DeviceSpec",
    "LinkSpec",
    "ClusterSpec",
    "LayerSpec",
    "ModelPreset",
    "ModelSpec",
    "TrainingSpec",
    "optimizer_state_factor",
]

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
"""Bytes per element of each supported training dtype."""

OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
"""fp32 state tensors each optimizer keeps per parameter (Adam: first and second moment)."""


def optimizer_state_factor(optimizer: str, dtype: str) -> float:
    """Optimizer state bytes per parameter byte.

    Each state tensor is fp32 (4 bytes per parameter). Mixed precision (fp16/bf16 parameters)
    adds an fp32 master copy, as in ZeRO (Rajbhandari et al., SC'20, §3.1: Adam in mixed
    precision holds 2 + 2 + 12 bytes per parameter, of which 12 are optimizer state).
    """
    if optimizer not in OPTIMIZER_STATES:
        raise SpecError("optimizer", f"unknown optimizer {optimizer!r}; valid: {_names(OPTIMIZER_STATES)}")
    if dtype not in DTYPE_BYTES:
        raise SpecError("dtype", f"unknown dtype {dtype!r}; valid: {_names(DTYPE_BYTES)}")
    param_bytes = DTYPE_BYTES[dtype]
    master_copies = 0 if param_bytes == 4 else 1
    return (OPTIMIZER_STATES[optimizer] + master_copies) * 4.0 / param_bytes


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
    """Usable device memory in bytes; exceeding it is an out-of-memory verdict."""
    peak_flop_per_s: float
    """Dense half-precision (fp16/bf16 tensor core) peak, FLOP/s."""
    peak_fp32_flop_per_s: float
    """Dense fp32 peak (without TF32), FLOP/s; used for fp32 models. A scenario's custom device
    that leaves it out gets ``peak_flops / 16``, the A100's ratio (``sim.input.cluster``)."""
    memory_bandwidth_bytes_per_s: float
    """Device memory (HBM) bandwidth, bytes/s. A scenario's custom device that leaves it out gets
    ``peak_flops`` × 2039 GB/s / 312 TFLOP/s, the A100's ratio (``sim.input.cluster``)."""
    efficiency: float = 0.5
    """Fraction of peak that large matrix products achieve (e_max of ``sim.kernels``), in (0, 1]."""
    matmul_half_dim: float = 0.0
    """Size of a matrix product's dimension at which it loses half its efficiency to tiling
    (D of ``sim.kernels``); 0: no size effect."""
    kernel_overhead_s: float = 0.0
    """Fixed cost of every kernel launch, seconds."""
    memory_efficiency: float = 1.0
    """Fraction of ``memory_bandwidth`` element-wise kernels achieve, in (0, 1]."""
    action_overhead_s: float = 0.0
    """Fixed cost of each forward and each backward a framework runs for one stage on one
    micro-batch, outside its kernels (the Python and autograd work around them), seconds."""

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

    def peak_flop_per_s_for(self, dtype: str) -> float:
        """The peak that applies to math in ``dtype`` (fp32 has its own, slower peak)."""
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

    def __post_init__(self) -> None:
        positive("bandwidth", self.bandwidth_bytes_per_s)
        non_negative("latency", self.latency_s)
        non_negative("send_overhead", self.send_overhead_s)
        non_negative("recv_overhead", self.recv_overhead_s)
        if self.send_bandwidth_bytes_per_s is not None:
            positive("send_bandwidth", self.send_bandwidth_bytes_per_s)

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

    def __post_init__(self) -> None:
        positive_int("nodes", self.nodes)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSpec:
    """One layer of a model; sizes and times are per sample."""

    name: str
    """Name from the profile or the generator (``block_3``, ``embedding``)."""
    param_bytes: float
    """Bytes of this layer's parameters (gradients take as many)."""
    output_bytes: float
    """Bytes of this layer's output for one sample."""
    stash_bytes: float
    """Bytes this layer keeps from its forward until its backward, for one sample."""
    fwd_s: float | None = None
    """Measured forward time for one sample, seconds (from a profile); None if costed from FLOPs."""
    bwd_s: float | None = None
    """Measured backward time for one sample, seconds; None if costed from FLOPs."""
    fwd_flop: float = 0.0
    """Forward FLOPs for one sample."""
    bwd_flop: float = 0.0
    """Backward FLOPs for one sample (input and weight gradients together)."""
    wgrad_fraction: float = 0.5
    """Share of the backward that computes weight gradients (zero-bubble schedules' W), [0, 1]."""
    kernels: tuple = ()
    """Forward kernels (``sim.kernels.KernelSpec``) of a generated layer; when present the
    cost model times them one by one instead of dividing ``fwd_flop`` by a single rate."""
    param_tensors: int | None = None
    """Parameter tensors (weights, biases) the optimizer steps one by one; None: two (a weight
    and a bias) for a layer with parameters, as a measured profile does not say."""

    def __post_init__(self) -> None:
        for key in ("param_bytes", "output_bytes", "stash_bytes", "fwd_flop", "bwd_flop"):
            non_negative(key, getattr(self, key))
        if (self.fwd_s is None) != (self.bwd_s is None):
            raise SpecError("fwd_s", "give both forward and backward times, or neither")
        if self.fwd_s is not None:
            non_negative("fwd_s", self.fwd_s)
            non_negative("bwd_s", self.bwd_s)
        elif self.fwd_flop == 0 and self.bwd_flop == 0 and self.param_bytes > 0:
            raise SpecError("fwd_flop", f"layer {self.name!r} has parameters but neither times nor FLOPs")
        if not 0 <= self.wgrad_fraction <= 1:
            raise SpecError("wgrad_fraction", f"must be in [0, 1], got {self.wgrad_fraction!r}")
        if self.param_tensors is not None and (isinstance(self.param_tensors, bool) or self.param_tensors < 0):
            raise SpecError("param_tensors", f"must be an integer >= 0, got {self.param_tensors!r}")

    @property
    def is_measured(self) -> bool:
        return self.fwd_s is not None

    @property
    def optimizer_tensors(self) -> int:
        """Tensors the optimizer steps for this layer (``param_tensors`` with its default)."""
        if self.param_tensors is not None:
            return self.param_tensors
        return 2 if self.param_bytes > 0 else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPreset:
    """The generator a built-in model came from, with every parameter it was built with."""

    name: str
    """Generator name, a key of ``sim.models.MODEL_PRESETS`` (``gpt``, ``bert``, ``mlp``, ``vgg``)."""
    params: tuple[tuple[str, Any], ...]
    """(parameter, value) pairs sorted by name: every parameter of the generator, defaults
    filled in and computed ones (``ffn_hidden``, ``input_size``) resolved, so that
    ``build_model(name, **values)`` builds the same model again."""

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("preset", "must not be empty")
        keys = [pair[0] for pair in self.params]
        if keys != sorted(set(keys)):
            raise SpecError("params", f"must be (name, value) pairs sorted by unique name, got names {keys}")
        for key, value in self.params:
            if not isinstance(value, (bool, int, float, str, type(None))):
                raise SpecError(key, f"must be a number, a string or a boolean, got {value!r}")

    @property
    def values(self) -> dict[str, Any]:
        """The parameters as keywords for ``sim.models.build_model``."""
        return dict(self.params)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """An ordered list of layers and what crosses each possible cut between stages."""

    name: str
    """Display name (``bert-48``, ``gpt-1.3b``)."""
    layers: tuple[LayerSpec, ...]
    """Layers in execution order; a stage owns a contiguous range of them."""
    boundary_bytes: tuple[float, ...]
    """Per sample, bytes that cross a cut just before layer ``k`` (``len(layers) + 1`` entries).

    Entry 0 is the model input; entry ``len(layers)`` is 0. For a chain it is the previous
    layer's output; for a DAG it is every tensor produced before the cut and consumed after it.
    """
    dtype: str = "fp32"
    """Training dtype of parameters and activations: fp32, tf32, fp16 or bf16."""
    optimizer: str = "adam"
    """Optimizer whose state is kept per parameter: sgd, momentum, adam, adamw."""
    source: str = ""
    """Where the model came from (a profile path or a preset description)."""
    preset: ModelPreset | None = None
    """The generator and parameters of a built-in model (``sim.models``), which the runtime
    builds as torch modules; None for a measured profile."""

    def __post_init__(self) -> None:
        if not self.layers:
            raise SpecError("layers", "a model needs at least one layer")
        if len(self.boundary_bytes) != len(self.layers) + 1:
            raise SpecError(
                "boundary_bytes",
                f"needs {len(self.layers) + 1} entries (one per cut), got {len(self.boundary_bytes)}",
            )
        for k, value in enumerate(self.boundary_bytes):
            non_negative(f"boundary_bytes[{k}]", value)
        optimizer_state_factor(self.optimizer, self.dtype)  # raises on unknown names

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def optimizer_state_bytes_per_param_byte(self) -> float:
        return optimizer_state_factor(self.optimizer, self.dtype)

    def param_bytes(self, start: int = 0, end: int | None = None) -> float:
        """Parameter bytes of layers ``[start, end)``."""
        return sum(layer.param_bytes for layer in self.layers[start:end])


MAX_MICROBATCHES = 100_000
"""Most micro-batches per iteration (a schedule lists every one of them on every rank)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """How many samples one iteration trains on and how they are cut into micro-batches."""

    global_batch_size: int
    """Samples per iteration (per optimizer step), over the whole cluster."""
    microbatch_size: int
    """Samples per micro-batch as it enters the pipeline; each stage splits it over its replicas.

    (Megatron-LM's per-replica micro-batch size times the data-parallel degree.)
    """

    def __post_init__(self) -> None:
        positive_int("global_batch_size", self.global_batch_size)
        positive_int("microbatch_size", self.microbatch_size)
        if self.global_batch_size // self.microbatch_size > MAX_MICROBATCHES:
            raise SpecError(
                "global_batch_size",
                f"{self.global_batch_size} / {self.microbatch_size} is {self.global_batch_size // self.microbatch_size} "
                f"micro-batches, more than the {MAX_MICROBATCHES} a schedule can hold; raise microbatch_size",
            )
        if self.global_batch_size % self.microbatch_size:
            raise SpecError(
                "microbatch_size",
                f"{self.microbatch_size} does not divide global_batch_size {self.global_batch_size}; "
                f"use a divisor such as {_nearest_divisors(self.global_batch_size, self.microbatch_size)}",
            )

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // self.microbatch_size


def _nearest_divisors(n: int, near: int) -> str:
    """The divisors of ``n`` just below and just above ``near``, as text (``2 or 4``)."""
    small = [d for d in range(1, min(math.isqrt(n), 10**6) + 1) if n % d == 0]
    divisors = sorted(set(small) | {n // d for d in small})
    below = max(d for d in divisors if d <= near)
    above = [d for d in divisors if d > near]
    return f"{below} or {above[0]}" if above else str(below)

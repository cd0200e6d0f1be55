"""The layer profiler: what each layer costs on this device, in the format the simulator reads.

The simulator's numbers for a measured model come from a profile file in PipeDream's
graph format (``sim.input.profiles``): one node per layer with its forward and backward time in
milliseconds for one batch of the profile batch size, its output (activation) bytes and
its parameter bytes, and an edge from each layer to the next. Here each layer of a
built-in model is run alone on a batch of that size:

* forward and backward times: ``warmup`` untimed runs, then the median of ``repeats``
  (the backward starts from a fresh forward each time; on a GPU every timing is bracketed
  by ``torch.cuda.synchronize``);
* output bytes: the layer's output for the batch (0 for the head, whose output is the loss,
  as ``sim.models`` counts it);
* saved (stashed) activation bytes: what autograd keeps from one forward
  (``runtime.measure.memory.SavedTensorMeter``), and parameter bytes.

Under a plan's selective recompute (``selective``, ``selective-op``) each block is profiled with its
region checkpointed as the run holds it (``runtime.model.recompute.apply_selective``): its stash is
what the checkpointed block keeps (the region's inputs and SAC's saved outputs) and its backward
includes the region run again, the two numbers the simulator reads off a measured layer under that
mode (``sim.cost.memory.layer_stash_bytes``: a measured layer's ``stash_bytes``; no kernels, so no
recompute time of its own). Under ``full`` the layer is profiled whole: the executor re-runs the
stage, and the simulator keeps the stage's input and rebuilds each layer's whole stash.

The stash goes into the profile as the optional ``stash_size`` field ``sim.input.profiles`` reads;
the complete measurements also go to a JSON file next to it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.measure.memory import SavedTensorMeter
from runtime.model.config import ModelConfig
from runtime.model.context_parallel import apply_context_parallel, sequence_positions
from runtime.model.experts import MoE
from runtime.model.models import (
    TRANSFORMERS,
    build_layer,
    input_dtype,
    layer_param_bytes,
    num_layers,
    sample_shape,
    synthetic_batch,
)
from runtime.model.recompute import apply_selective
from runtime.model.tensor_parallel import loss_parallel_if, parallelize_layer
from sim.core import jsonio
from sim.core.parallelism import Recompute
from sim.models import build_model

__all__ = ["LayerProfile", "mtp_holds_table_copy", "profile_layers", "profile_text", "write_profile"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerProfile:
    """One layer, measured on one batch of ``batch_size`` samples."""

    name: str
    batch_size: int
    fwd_s: float
    """Median forward time of the batch, seconds."""
    bwd_s: float
    """Median backward time of the batch (input and weight gradients), seconds."""
    output_bytes: int
    """Bytes of the layer's output for the batch (0 for the loss)."""
    stash_bytes: int
    """Bytes autograd saves from the forward for the backward, for the batch."""
    param_bytes: int


def _median_time(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int,
                 setup: Callable[[], Any] | None = None) -> float:
    """Median wall time of ``fn(setup())`` after ``warmup`` untimed calls."""
    times = []
    for index in range(warmup + repeats):
        arg = setup() if setup is not None else None
        _sync(device)
        start = time.perf_counter()
        fn() if setup is None else fn(arg)
        _sync(device)
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _layer_input(config: ModelConfig, index: int, batch_size: int, device: torch.device, seed: int,
                 sequence_share: int = 1, ring=None):
    """The layer's input and the labels; with ``ring`` its context rank's positions of the
    tokens and labels (``sequence_positions``), and ``sequence_share`` of the sequence otherwise."""
    inputs, labels = synthetic_batch(config, batch_size, step=0, seed=seed, device=device)
    if ring is not None:
        held = sequence_positions(config.values["seq_len"], ring.size, ring.index).to(device)
        inputs, labels = (inputs[:, held] if index == 0 else inputs), labels[:, held]
    if index == 0:
        return inputs, labels
    generator = torch.Generator().manual_seed(seed + index)
    shape = sample_shape(config, index)
    shape = (shape[0] // sequence_share, *shape[1:])
    x = torch.randn((batch_size, *shape), generator=generator)
    return x.to(device=device, dtype=input_dtype(config, index)), labels


def profile_layer(config: ModelConfig, index: int, batch_size: int, device: torch.device, *,
                  warmup: int = 3, repeats: int = 10, seed: int = 0, mesh=None,
                  sequence_parallel: bool = False, expert_parallel: int = 1, ring=None,
                  recompute: Recompute = Recompute.NONE, table_copy: bool = False) -> LayerProfile:
    """Measure layer ``index`` of ``config`` on ``batch_size`` samples on ``device``.

    With ``mesh`` (a 1D tensor-parallel mesh; every rank of it calls this together) the layer
    is one device's share (``runtime.model.tensor_parallel.parallelize_layer``): its times include
    its tensor-parallel collectives, its bytes are this device's, its output bytes the 1/t of
    the sequence it sends to the next stage, and with sequence parallelism its input is 1/t of
    the sequence too. An MoE block runs every routed expert on this device's tokens (the FLOPs
    one device of an expert-parallel group does on average, without the all-to-all) and counts
    the 1/``expert_parallel`` of the routed experts' bytes one device holds (pass EP × ETP: under
    expert tensor parallelism a device holds count/EP experts, each 1/ETP of its width). With ``ring`` (a
    context-parallel ``runtime.model.ring_attention.Ring``; every rank of it calls this together)
    the layer runs on one context rank's 1/c of every sequence, its attention over the ring
    (``runtime.model.context_parallel``): its times include the ring's key/value shifts as gloo or
    NCCL makes them, its bytes are that rank's. Under a selective ``recompute`` a block's region
    is checkpointed as the run holds it (the module docstring). With ``table_copy``
    (``mtp_holds_table_copy``) the mtp layer's bytes include its copy of the token table, 1/t of it.
    """
    layer = build_layer(config, index, seed=seed, device=device)
    is_head = index == num_layers(config) - 1
    if is_head and config.preset in TRANSFORMERS and config.values["tied_embeddings"]:
        layer.untie_copy(build_layer(config, 0, seed=seed, device=device).token.weight)
    takes_labels = is_head or getattr(layer, "wants_labels", False)  # the mtp layer reads the tokens ahead
    if getattr(layer, "wants_labels", False):
        layer.tie(build_layer(config, 0, seed=seed, device=device).token)
    t = 1 if mesh is None else mesh.size()
    if mesh is not None:
        parallelize_layer(layer, mesh, sequence_parallel=sequence_parallel)
    c = 1 if ring is None else ring.size
    if ring is not None:  # after tensor parallelism, as the executor holds it (runtime.execution.holdings)
        apply_context_parallel(layer, ring, config.values["seq_len"], device)
    apply_selective(layer, recompute)  # after TP and CP, as runtime.execution.holdings; none but selective modes
    x, labels = _layer_input(config, index, batch_size, device, seed, (t if sequence_parallel else 1) * c, ring)
    x.requires_grad_(x.is_floating_point())

    def forward():
        out = layer(x, labels) if takes_labels else layer(x)
        return out.to_local() if is_head and mesh is not None else out  # the loss, replicated

    with loss_parallel_if(t):
        fwd_s = _median_time(forward, device, warmup, repeats)  # with autograd recording, as in training
        meter = SavedTensorMeter(layer.parameters())
        with meter.watching():
            out = forward()
        stash_bytes = meter.current_bytes
        output_bytes = 0 if is_head else out.numel() * out.element_size() // (1 if sequence_parallel else t)
        grad = None if is_head else torch.ones_like(out)
        del out

        def backward(out):
            out.backward(grad)

        bwd_s = _median_time(backward, device, warmup, repeats, setup=forward)
    params = layer_param_bytes(layer)
    if isinstance(getattr(layer, "mlp", None), MoE):  # one device holds count/EP of the routed experts
        routed = layer_param_bytes(layer.mlp.experts)
        params -= routed - routed // expert_parallel
    if is_head and config.preset in TRANSFORMERS and config.values["tied_embeddings"]:
        params -= layer.proj.weight.numel() * layer.proj.weight.element_size()  # the embedding's bytes, as sim.models counts
    if table_copy and getattr(layer, "wants_labels", False):  # vocabulary-parallel under TP, as the run's copy
        table = build_layer(config, 0, seed=seed, device=device).token.weight
        params += table.numel() * table.element_size() // t
    mtp = {"mtp_depth": config.mtp_depth} if config.mtp_depth else {}  # the layer list with the mtp layer
    name = build_model(config.preset, **config.values, **mtp).layers[index].name
    return LayerProfile(name=name, batch_size=batch_size, fwd_s=fwd_s, bwd_s=bwd_s, output_bytes=output_bytes,
                        stash_bytes=stash_bytes, param_bytes=params)


def profile_layers(config: ModelConfig, batch_size: int, device: torch.device, *, warmup: int = 3,
                   repeats: int = 10, seed: int = 0, mesh=None, sequence_parallel: bool = False,
                   expert_parallel: int = 1, ring=None, recompute: Recompute = Recompute.NONE,
                   table_copy: bool = False) -> list[LayerProfile]:
    """Every layer of the model, in order (with ``mesh`` or ``ring``: one device's share of each;
    ``recompute``: the plan's, for its selective modes' checkpointed regions; ``table_copy``: see
    ``profile_layer``)."""
    return [profile_layer(config, k, batch_size, device, warmup=warmup, repeats=repeats, seed=seed, mesh=mesh,
                          sequence_parallel=sequence_parallel, expert_parallel=expert_parallel, ring=ring,
                          recompute=recompute, table_copy=table_copy)
            for k in range(num_layers(config))]


def mtp_holds_table_copy(config: ModelConfig, plan) -> bool:
    """Whether ``plan``'s mtp layer holds a copy of the token table: an untied model whose mtp layer's
    devices hold no embedding (``runtime.model.models._share_table``, Megatron-Core's MTP stage; the
    simulator's ``tied_layers``). A measured profile cannot say that two layers share a table, so the
    copy is counted in the mtp layer's bytes, as each device of that layer holds it."""
    if config.preset not in TRANSFORMERS or not config.mtp_depth or config.values["tied_embeddings"]:
        return False

    def devices(k: int) -> set[int]:
        return {d for stage in plan.stages if stage.layers[0] <= k < stage.layers[1] for d in stage.devices}

    return not devices(num_layers(config) - 2) & devices(0)


def profile_text(layers: list[LayerProfile]) -> str:
    """The PipeDream/DAPPLE graph text of a chain of ``layers`` (``sim.input.profiles`` reads it)."""
    lines = [
        f"node{k + 1} -- {layer.name} -- forward_compute_time={layer.fwd_s * 1e3:.6f}, "
        f"backward_compute_time={layer.bwd_s * 1e3:.6f}, activation_size={float(layer.output_bytes):.1f}, "
        f"parameter_size={float(layer.param_bytes):.1f}, stash_size={float(layer.stash_bytes):.1f}"
        for k, layer in enumerate(layers)
    ]
    lines += [f"\tnode{k + 1} -- node{k + 2}" for k in range(len(layers) - 1)]
    return "\n".join(lines) + "\n"


def write_profile(layers: list[LayerProfile], folder: str | Path, *, device: str) -> tuple[Path, Path]:
    """Write ``profile.txt`` (the simulator's format) and ``profile.json`` (every measurement)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text_path, json_path = folder / "profile.txt", folder / "profile.json"
    text_path.write_text(profile_text(layers), encoding="utf-8")

    detail = {"device": device, "batch_size": layers[0].batch_size, "layers": [asdict(layer) for layer in layers]}
    json_path.write_text(jsonio.dumps(detail, indent=2) + "\n", encoding="utf-8")
    return text_path, json_path

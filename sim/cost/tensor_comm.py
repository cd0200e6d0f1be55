"""A transformer block's tensor-parallel collectives, and which of them Megatron-LM runs beside its GEMMs.

Megatron-LM splits a block's two linears of each half column- then row-wise (Shoeybi et al.
2019, §3, Figure 3): operator g all-reduces the output of the attention's output projection and
of the MLP's second linear in the forward (2 all-reduces), operator f all-reduces the input
gradients of the QKV projection and of the MLP's first linear in the backward (2 more).
Sequence parallelism (Korthikanti et al. 2022, §4.2.2, Figure 5) turns each all-reduce into an
all-gather before the column-parallel linear and a reduce-scatter after the row-parallel one
(the same bytes on the wire); the backward runs the conjugates. A fully recomputed forward
repeats the forward's collectives inside the backward.

**Beside the column-parallel linear's backward** (``plan.overlap.column_backward``). From
2022 Megatron-LM runs each column-parallel linear through
``LinearWithGradAccumulationAndAsyncCommunication`` (megatron/mpu/layers.py at cfd2e21,
2022-04-28, the code of Korthikanti et al.'s runs): its backward computes the input gradient,
launches that gradient's all-reduce with ``async_op=True`` and computes the weight gradient
while it runs (``--async-tensor-model-parallel-allreduce``, on unless
``--no-async-tensor-model-parallel-allreduce``). Under ``--sequence-parallel`` the forward saved
only the device's 1/t of the linear's input, so the backward all-gathers it again, with
``async_op=True`` beside the input-gradient product, and reduce-scatters the input gradient with
``async_op=True`` beside the weight-gradient product. Korthikanti et al. §6.2 measure the effect:
full recompute costs 39% of a 22B layer's time rather than the 33% of one more forward "due to an
optimization in the backward pass where we overlap all-reduce communication with the linear
weight's gradient computation" (Table 4: forward 7.7 ms, backward 11.9 ms, not 2 × 7.7).
Those collectives are marked ``beside``; sequence parallelism's second all-gather of the input
has its own phase, ``regather``, counted only where they run beside (without the key the
engine charges what it did before: the backward's four collectives blocking the compute stream
and no second gather). The row-parallel linears' input gradients (sequence parallelism's
all-gathers in the backward) still block: the next product needs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.parallelism import BlockShape, Recompute

__all__ = ["PHASES", "TensorParallelCollective", "tensor_parallel_collectives"]

PHASES = ("forward", "recompute", "backward", "regather")
"""When a block's tensor-parallel collective runs: its forward, the forward a full recompute runs
again, its backward, and sequence parallelism's second gather of a column-parallel input for the
weight gradient (Megatron-LM's, beside the input-gradient product)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorParallelCollective:
    """One collective over a tensor-parallel group, per block and sample."""

    kind: str
    """``all-reduce``, ``all-gather`` or ``reduce-scatter``."""
    phase: str
    """One of ``PHASES``."""
    bytes: float
    """The full activation each rank contributes or receives: e·s·h per sample (all-gather and
    reduce-scatter: the gathered size; each rank holds 1/t of it)."""
    beside: bool = False
    """A column-parallel linear's backward collective, which Megatron-LM 2022 runs with
    ``async_op=True`` beside the linear's own products (the module docstring); it blocks the compute
    stream unless ``plan.overlap.column_backward``."""


def tensor_parallel_collectives(shape: BlockShape, *, tensor_parallel: int, sequence_parallel: bool = False,
                                recompute: Recompute = Recompute.NONE) -> tuple[TensorParallelCollective, ...]:
    """The collectives of one block for one sample over a tensor-parallel group (none if t = 1),
    in the order the block runs them (the module docstring): row-parallel output, then the
    backward's column-parallel input gradients marked ``beside``, and under sequence parallelism
    the two second gathers of the column-parallel inputs (phase ``regather``) last."""
    if tensor_parallel <= 1:
        return ()
    nbytes = float(shape.element_bytes * shape.seq_len * shape.hidden)
    forward = ("all-gather", "reduce-scatter") * 2 if sequence_parallel else ("all-reduce",) * 2
    result = [TensorParallelCollective(kind=k, phase="forward", bytes=nbytes) for k in forward]
    if recompute is Recompute.FULL:
        result += [TensorParallelCollective(kind=k, phase="recompute", bytes=nbytes) for k in forward]
    # the backward of (column, row) linear pairs, each pair row first: the row's input gradient
    # (all-gathered under sequence parallelism; none without), then the column's (beside)
    backward = (("all-gather", False), ("reduce-scatter", True)) * 2 if sequence_parallel else (("all-reduce", True),) * 2
    result += [TensorParallelCollective(kind=k, phase="backward", bytes=nbytes, beside=b) for k, b in backward]
    if sequence_parallel:
        result += [TensorParallelCollective(kind="all-gather", phase="regather", bytes=nbytes, beside=True)] * 2
    return tuple(result)

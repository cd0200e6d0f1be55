"""Memory in closed form: what one device keeps, by kind.

Notation as in Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", arXiv 2205.05198): s sequence length, b micro-batch size per replica,
h hidden size, a attention heads, t tensor-parallel degree, d data-parallel degree, c
context-parallel degree. Every function here is the one home of its formula; the cost model,
the compiler, the planner and the tests call it.

* ``block_activation_bytes`` — what one transformer block stashes per sample (Korthikanti et
  al., §4.1–4.3 and Table 2), written for any element width and MLP width, for grouped-query
  attention and gated MLPs;
* ``model_state_bytes`` — parameters, gradients and optimizer state per device under ZeRO
  sharding (Rajbhandari et al. 2020, "ZeRO", §5);
* ``static_bytes`` — a replica's model states for a range of layers, unsharded.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.model_spec import ModelSpec
from sim.core.parallelism import BlockShape, Recompute, Sharding

__all__ = ["StateBytes", "block_activation_bytes", "model_state_bytes", "static_bytes"]


def block_activation_bytes(
    shape: BlockShape,
    *,
    tensor_parallel: int = 1,
    context_parallel: int = 1,
    sequence_parallel: bool = False,
    recompute: Recompute = Recompute.NONE,
) -> float:
    """Bytes one block stashes per sample on one device.

    Korthikanti et al. §4.1 count, per block, with e-byte elements (e = 2 gives their numbers)
    and m = 1 if there are dropouts, else 0:

    * attention: the QKV input e·sh; Q and K, e·(sh + s·h_kv); V, e·s·h_kv; the softmax output
      e·as² and its dropout mask m·as²; the output projection input e·sh; its dropout mask m·sh
      (h_kv = kv_heads·h/a: grouped-query attention shrinks K and V);
    * MLP: the first linear's input e·sh; the activation's input e·sf (a gated MLP: gate and
      up, 2e·sf); the second linear's input e·sf; its dropout mask m·sh;
    * two norms' inputs, 2e·sh.

    With e = 2, m = 1, f = 4h, h_kv = h this is sh(34 + 5as/h) (their Eq. 1). Tensor
    parallelism splits everything but the norms' inputs, the two linears' inputs and the two
    dropout masks over t, which leaves sh(10 + 24/t + 5as/(ht)) (§4.2.1); sequence parallelism
    splits those over t too, sh(34 + 5as/h)/t (§4.2.2); selective recompute drops the s×s terms,
    34sh/t (§5); full recompute keeps the block input, 2sh (2sh/t with sequence parallelism).
    Context parallelism splits the sequence over c (ring attention: Liu et al. 2023), so every
    term divides by c, the s×s terms included (each device holds s/c queries × s/c keys per
    step and keeps its own block).
    """
    s, h, a, f, e = shape.seq_len, shape.hidden, shape.heads, shape.ffn_hidden, shape.element_bytes
    t, c = tensor_parallel, context_parallel
    m = 1 if shape.dropout else 0
    h_kv = (shape.kv_heads or a) * h // a
    if recompute is Recompute.FULL:
        return e * s * h / (t if sequence_parallel else 1) / c
    replicated = 2 * e * s * h + 2 * m * s * h + 2 * e * s * h  # linear inputs, dropout masks, norm inputs
    split = e * (s * h + s * h_kv) + e * s * h_kv + e * s * h  # Q, K, V, output projection input
    split += (2 if shape.gated else 1) * e * s * f + e * s * f  # activation input(s), second linear input
    quadratic = (e + m) * a * s * s  # softmax output and its dropout mask (and the dropout's output: see below)
    quadratic += e * a * s * s if m else 0  # the dropout's output, attention over values' input
    if recompute is Recompute.SELECTIVE:
        quadratic = 0
    per_device = replicated / (t if sequence_parallel else 1) + split / t + quadratic / t
    return per_device / c


@dataclass(frozen=True, slots=True, kw_only=True)
class StateBytes:
    """Model states one device holds at rest."""

    parameters: float
    gradients: float
    optimizer: float
    """Optimizer state (with mixed precision, the fp32 master weights too)."""

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer


def model_state_bytes(param_bytes: float, *, optimizer_bytes_per_param_byte: float, data_parallel: int,
                      sharding: Sharding = Sharding.NONE, grad_bytes_per_param_byte: float = 1.0) -> StateBytes:
    """Parameters, gradients and optimizer state per device for ``param_bytes`` of parameters
    (already divided by tensor parallelism and the pipeline), over ``data_parallel`` replicas.

    ZeRO (Rajbhandari et al. 2020, §5.1, Figure 1): with 2-byte weights and Adam (12 bytes of
    state per parameter) a device holds 16Ψ unsharded, 4Ψ + 12Ψ/d with the optimizer state
    sharded (ZeRO-1), 2Ψ + 14Ψ/d with gradients too (ZeRO-2), 16Ψ/d with parameters too
    (ZeRO-3, FSDP). Gradients kept in fp32 for 16-bit weights (Megatron-LM's ``main_grad``,
    ``grad_bytes_per_param_byte`` 2) make it 18Ψ unsharded, Megatron-LM's count for "bf16
    param, fp32 grads" (its distributed-optimizer guide, ``docs/source/distrib_optimizer.md``).
    """
    d = data_parallel
    grads = param_bytes * grad_bytes_per_param_byte
    optimizer = param_bytes * optimizer_bytes_per_param_byte
    sharded = {Sharding.NONE: 0, Sharding.OPTIMIZER: 1, Sharding.GRADIENTS: 2, Sharding.FULL: 3}[sharding]
    return StateBytes(
        parameters=param_bytes / d if sharded >= 3 else param_bytes,
        gradients=grads / d if sharded >= 2 else grads,
        optimizer=optimizer / d if sharded >= 1 else optimizer,
    )


def static_bytes(model: ModelSpec, start: int, end: int) -> float:
    """Parameters + gradients + optimizer state of layers ``[start, end)`` on one replica
    (a tied embedding's second copy included, ``ModelSpec.stage_param_bytes``)."""
    params = model.stage_param_bytes(start, end)
    return params * (1.0 + model.grad_bytes_per_param_byte + model.optimizer_state_bytes_per_param_byte)

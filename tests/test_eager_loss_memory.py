"""Eager cross-entropy's backward workspace (``sim.cost.kernels.eager_loss_workspace_bytes``): torchtitan's
``F.cross_entropy(pred.float(), ...)`` holds, in its backward, nll_loss's fp32 gradient and
log_softmax's fp32 input gradient beside the saved fp32 log-softmax: 2·4·s·V bytes per sample, on
top of the stash, for as long as the head's backward runs. Megatron's fused loss holds none.

Closed forms written out: the head's workspace, the stage's peak activations under every recompute
mode (the largest of the workspace and what a block's backward rebuilds), and a replay's peak.
"""

from __future__ import annotations

from sim.core.parallelism import Recompute
from sim.cost.memory import op_sac_stash_bytes, stage_activation_bytes
from sim.models import build_model

LLAMA = dict(layers=2, hidden=256, heads=8, kv_heads=2, seq_len=128, vocab=512, dtype="bf16")


def _llama(kernels: str):
    return build_model("llama", attention="flash", kernels=kernels, **LLAMA)


def test_the_eager_head_holds_two_fp32_logit_tensors_in_its_backward():
    eager, fused = _llama("eager"), _llama("fused")
    assert eager.layers[-1].backward_workspace_bytes == 2 * 4 * 128 * 512
    assert fused.layers[-1].backward_workspace_bytes == 0.0
    assert all(layer.backward_workspace_bytes == 0.0 for layer in eager.layers[:-1])


def test_the_workspace_is_held_beside_the_whole_stash():
    model, samples = _llama("eager"), 3
    n = len(model.layers)
    workspace = 2 * 4 * 128 * 512 * samples
    for mode in (Recompute.NONE, Recompute.SELECTIVE):
        kept = stage_activation_bytes(model, 0, n, samples, mode)
        assert kept.rebuilt_bytes == workspace
        assert kept.stash_bytes == stage_activation_bytes(_llama("fused"), 0, n, samples, mode).stash_bytes
    # selective-op: the larger of the workspace and a block's unsaved rest (here the workspace)
    op = stage_activation_bytes(model, 0, n, samples, Recompute.SELECTIVE_OP)
    block = model.layers[1]
    assert op.rebuilt_bytes == max(workspace, (block.stash_bytes - op_sac_stash_bytes(block)) * samples)
    # full recompute: the head's segment rebuilt, then its workspace on top
    full = stage_activation_bytes(model, 0, n, samples, Recompute.FULL)
    head = model.layers[-1]
    assert full.rebuilt_bytes == max(block.stash_bytes * samples, head.stash_bytes * samples + workspace)
    # a stage without the head holds no workspace
    assert stage_activation_bytes(model, 0, n - 1, samples, Recompute.NONE).rebuilt_bytes == 0.0

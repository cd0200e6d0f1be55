"""What Megatron-Core pays in a Mixtral run that the published MoE rows need (issue 31).

Each test writes out the closed form of one mechanism, cited to Megatron-LM at tag core_v0.9.0.
"""

from __future__ import annotations

import pytest

from sim.core.errors import ScenarioError
from sim.core.experts import ExpertSpec
from sim.core.model_spec import LayerSpec
from sim.cost.compute import layer_times_s, stage_cost
from sim.engine.fault_view import FaultView
from sim.engine.flows import flow_paths
from sim.input.scenario import load_scenario
from sim.models import shard_model
from sim.models.moe import DISPATCH_COUNTS, forward_only_kernels, permute_kernels, router_kernels, unpermute_kernels

MIXTRAL = "scenarios/published/megatron2024_mixtral_8x7b_64.yaml"


def test_the_mixtral_row_keeps_fp32_gradients_as_bf16_megatron_does():
    # megatron/training/arguments.py at core_v0.9.0: --bf16 sets accumulate_allreduce_grads_in_fp32,
    # so the DDP buffers hold 4-byte gradients beside 2-byte parameters (stack: megatron-core)
    scenario = load_scenario(MIXTRAL)
    assert scenario.model.grad_dtype == "fp32"
    model = shard_model(scenario.model, scenario.plan.shard)
    cost = stage_cost(model, scenario.cluster.device, 1, 2, 1, data_parallel=16, expert_data_parallel=2)
    assert cost.states.gradients == 2 * cost.states.parameters


def _kernel_bytes(kernels) -> tuple[float, float]:
    """(forward, backward) bytes of ``kernels``: a backward without its own moves twice the forward's."""
    fwd = sum(k.bytes for k in kernels)
    bwd = sum(2 * k.bytes if k.bwd_bytes is None else k.bwd_bytes for k in kernels)
    return fwd, bwd


def test_permute_and_unpermute_move_what_megatron_cores_passes_move():
    # moe_utils.py at core_v0.9.0, T tokens, k copies each, width h, d bytes: n = d·T·k·h, m = d·T·h
    tokens, k, h, d = 4096, 2, 4096, 2
    n, m = d * tokens * k * h, d * tokens * h
    # permute: argsort (indices only) + gather (read and write every copy); backward zeros + scatter_add_
    fwd, bwd = _kernel_bytes(permute_kernels(tokens, k, h, d, unfused=True))
    assert fwd == 2 * 8 * tokens * k + 2 * n and bwd == m + 3 * n
    # unpermute: zeros n, scatter_add_ 3n, × probs 2n, sum over k n + m; backward g·p m + n,
    # g·x m + 2n and its sum n, gather 2n
    fwd, bwd = _kernel_bytes(unpermute_kernels(tokens, k, h, d, unfused=True))
    assert fwd == 7 * n + m and bwd == 6 * n + 2 * m
    assert len(unpermute_kernels(tokens, k, h, d, unfused=True)) == 4  # four launches each way


def test_the_router_launches_eight_kernels_each_way_after_its_gating_product():
    # router.py / moe_utils.py at core_v0.9.0: topk, softmax + cast of the k scores, softmax of the
    # logits, then the aux loss's sum, product, sum and scale; at 10 µs a launch on the H100 preset
    kernels = router_kernels(4096, 8, 2, 2, unfused=True)
    assert len(kernels) == 8
    device = load_scenario(MIXTRAL).cluster.device
    layer = LayerSpec(name="r", param_bytes=0.0, output_bytes=0.0, stash_bytes=0.0, kernels=kernels)
    fwd, bwd, _ = layer_times_s(layer, device, "bf16", 1)
    assert fwd == pytest.approx(8 * 10e-6) and bwd == pytest.approx(8 * 10e-6)  # all below the issue floor


def test_fused_permutation_is_one_pass_each_way_and_the_default():
    tokens, k, h, d = 4096, 2, 4096, 2
    n, m = d * tokens * k * h, d * tokens * h
    assert _kernel_bytes(permute_kernels(tokens, k, h, d, unfused=False)) == (m + n, 2 * (m + n))
    assert _kernel_bytes(unpermute_kernels(tokens, k, h, d, unfused=False)) == (m + n, 2 * (m + n))
    assert len(router_kernels(tokens, 8, k, d, unfused=False)) == 1
    assert ExpertSpec(count=8, top_k=2, ffn_hidden=8).permute == "fused"


def test_the_permute_key_reaches_the_mixtral_blocks_and_a_typo_is_one_line():
    scenario = load_scenario(MIXTRAL)
    assert scenario.model.experts.permute == "unfused"
    names = [kern.name for kern in shard_model(scenario.model, scenario.plan.shard).layers[1].kernels]
    assert "moe_unpermute_scatter" in names and "moe_unpermute" not in names
    with pytest.raises(ScenarioError, match="permute"):
        load_scenario(MIXTRAL, overrides={"model.experts.permute": "fusd"})


def test_unequal_flows_of_one_phase_share_a_port_as_processor_sharing():
    # an MoE stage's reduction: device 0's dense share (b1) and its experts' share (b2 > b1) both
    # leave through its NIC to server 1 in one all-reduce phase; sharing it fairly, the small one
    # ends at 2·b1/B and the large one at (b1 + b2)/B (Kleinrock 1967), not at 2·b2/B
    cluster = load_scenario(MIXTRAL).cluster
    b1, b2 = 43e6, 352e6
    flows = [(0, 8, ("AR", 0, 1), b1), (0, 8, ("AR", 0, 1), b2)]
    rates = flow_paths(flows, cluster, FaultView((), cluster)).static_rates({0: 0, 8: 0})
    nic = cluster.inter_node.bandwidth_bytes_per_s
    assert b1 / rates[0] == pytest.approx(2 * b1 / nic) and b2 / rates[1] == pytest.approx((b1 + b2) / nic)
    equal = flow_paths(flows[:1] * 2, cluster, FaultView((), cluster)).static_rates({0: 0, 8: 0})
    assert equal == [nic / 2, nic / 2]  # equal flows: the port's bandwidth over their count, exactly


def test_forward_only_launches_cost_an_issue_time_forward_and_nothing_backward():
    # router: histc + the tracker's two updates; dispatcher (EP 8): the eleven counts of preprocess
    # (DISPATCH_COUNTS) and the host's synchronize before the all-to-all: 15 launches, 10 µs each
    kernels = forward_only_kernels(4096, 8, 2, spread=True, unfused=True)
    assert len(kernels) == 3 + len(DISPATCH_COUNTS) + 1 == 15
    assert len(forward_only_kernels(4096, 8, 2, spread=False, unfused=True)) == 3 + 2 + 1
    assert forward_only_kernels(4096, 8, 2, spread=True, unfused=False) == ()
    device = load_scenario(MIXTRAL).cluster.device
    layer = LayerSpec(name="r", param_bytes=0.0, output_bytes=0.0, stash_bytes=0.0, kernels=kernels)
    fwd, bwd, _ = layer_times_s(layer, device, "bf16", 1)
    assert fwd == pytest.approx(15 * 10e-6) and bwd == 0.0

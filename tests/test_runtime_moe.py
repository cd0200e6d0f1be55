"""Mixtures of experts in the runtime: the MoE layer against a loop over tokens, its parameters
against the simulator's, what cannot run refused in one line before launch, and expert
parallelism on gloo ranks (EP 2, EP 2 × TP 2 with sequence parallelism, EP 1 × TP 2 without,
EP 2 × PP 2, EP 2 × ETP 2, under ZeRO-1 and FSDP2, at a capacity factor, with node-limited routing
over 1-device servers and over 3-device servers that two EP groups straddle differently) training
one step exactly like the unsplit model in one process (rtol 1e-5, fp32), its states by kind as the
simulator counts them.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.tensor.parallel")

from conftest import SCENARIOS, assert_matches_unsplit, kinds_beside_prediction  # noqa: E402
from sim.core.errors import DappleError  # noqa: E402

MOE = str(SCENARIOS / "moe_tiny_cpu.yaml")
FOUR = {"cluster.devices_per_node": "4"}
UNEVEN = {"cluster.nodes": "2", "cluster.devices_per_node": "3"}
ONE_STAGE_4 = "[{layers: [0, 4], devices: [0, 1, 2, 3]}]"
TWO_STAGES = "[{layers: [0, 2], devices: [0, 1]}, {layers: [2, 4], devices: [2, 3]}]"

TWO_RANKS = {"ep2": {}, "ep2-gpipe-recompute": {"plan.schedule": "gpipe", "plan.recompute": "true"},
             # each device drops at capacity on its 2 samples of a micro-batch, the reference per the same groups
             "ep2-capacity": {"model.experts.capacity_factor": "1.0"},
             # each rank its own server: a token's 2 experts both on its better server (node_limited)
             "ep2-node-limit": {"model.experts.node_limit": "1", "cluster.nodes": "2", "cluster.devices_per_node": "1"},
             # TP 2 without sequence parallelism: both route every token, each dispatches half the sequence
             "ep1-tp2": {"plan.tensor_parallel": "2", "plan.expert_parallel": "1"}}
TP2_SP = {"plan.tensor_parallel": "2", "plan.sequence_parallel": "true"}
FOUR_RANKS = {
    "ep2-tp2-sp": {**FOUR, **TP2_SP, "plan.stages": ONE_STAGE_4},
    "ep2-pp2": {**FOUR, "plan.stages": TWO_STAGES},
    # the routed experts' states over their expert-data-parallel pair (0, 2) or (1, 3), the dense over all 4
    "ep2-dp2-zero1": {**FOUR, "plan.stages": ONE_STAGE_4, "plan.sharding": "optimizer"},
    "ep2-dp2-fsdp": {**FOUR, "plan.stages": ONE_STAGE_4, "plan.sharding": "full"},
    # each expert's width over the pairs (0, 1), (2, 3); EP over (0, 2), (1, 3) (sim.core.plan's layout)
    "ep2-etp2": {**FOUR, "plan.stages": ONE_STAGE_4, "plan.expert_tensor_parallel": "2"},
}
FOUR_RANKS_SLOW = {  # combinations of what FOUR_RANKS runs one at a time
    "ep2-dp2-zero2": {**FOUR, "plan.stages": ONE_STAGE_4, "plan.sharding": "gradients"},
    "ep2-tp2-sp-fsdp": {**FOUR, **TP2_SP, "plan.stages": ONE_STAGE_4, "plan.sharding": "full"},
    "ep2-etp2-fsdp": {**FOUR, "plan.stages": ONE_STAGE_4, "plan.expert_tensor_parallel": "2", "plan.sharding": "full"},
    "ep2-tp2-sp-capacity": {**FOUR, **TP2_SP, "plan.stages": ONE_STAGE_4, "model.experts.capacity_factor": "0.75"},
    # 3-device servers: EP group (0, 1) on server 0 alone, (2, 3) over servers 0 and 1, each routing its own way
    "ep2-dp2-uneven-servers": {**UNEVEN, "plan.stages": ONE_STAGE_4, "model.experts.node_limit": "1"},
}


def _moe(gated: bool, *, shared: int = 0, normalize: bool = True):
    from runtime.model.experts import MoE

    torch.manual_seed(3)
    layer = MoE(8, count=4, top_k=2, ffn_hidden=6, shared=shared, gated=gated, normalize=normalize)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.5)
    return layer


def _loop(layer, x):
    """The MoE layer written out token by token: softmax of the router's scores, the top 2,
    their weights renormalised (or not), each chosen expert's output weighted and summed."""
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        probs = torch.softmax(x[i] @ layer.router.weight.T, dim=-1)
        order = sorted(range(4), key=lambda e: -float(probs[e]))[:2]
        total = sum(float(probs[e]) for e in order) if layer.normalize else 1.0
        for e in order:
            out[i] += float(probs[e]) / total * layer.experts[str(e)](x[i:i + 1])[0]
        if layer.shared is not None:
            out[i] += layer.shared(x[i:i + 1])[0]
    return out


@pytest.mark.parametrize(("gated", "shared", "normalize"), [(True, 0, True), (False, 1, True), (True, 1, False)])
def test_the_moe_layer_is_a_loop_over_tokens(gated, shared, normalize):
    layer = _moe(gated, shared=shared, normalize=normalize)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    got = layer(x)
    with torch.no_grad():
        expected = _loop(layer, x.reshape(-1, 8)).reshape(2, 5, 8)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_routing_is_deterministic_and_every_expert_gets_a_gradient():
    layer = _moe(True)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(2))
    assert torch.equal(layer(x), layer(x))
    layer(x).square().sum().backward()
    assert all(p.grad is not None for p in layer.parameters())


def test_an_expert_parallel_rank_holds_the_simulators_parameter_bytes():
    # rank 1 of EP 2 holds experts 2 and 3: the simulator's per-device block (sim.models.moe)
    from runtime.model.config import load_runnable
    from runtime.model.models import build_layers, layer_param_bytes
    from sim.core.parallelism import Shard
    from sim.models import shard_model

    runnable = load_runnable(MOE)
    whole = build_layers(runnable.model)
    half = build_layers(runnable.model, range(4), local_experts={1: (2, 3), 2: (2, 3)})
    predicted = shard_model(runnable.scenario.model, Shard(expert=2)).layers
    for k in range(4):
        assert layer_param_bytes(whole[k]) == runnable.scenario.model.layers[k].param_bytes
        assert layer_param_bytes(half[k]) == predicted[k].param_bytes
    # each expert has its own seed: rank 1's experts are the unsplit model's experts 2 and 3
    assert sorted(half[1].mlp.experts) == ["2", "3"]
    assert torch.equal(half[1].mlp.experts["3"].w1.weight, whole[1].mlp.experts["3"].w1.weight)
    assert torch.equal(half[1].mlp.router.weight, whole[1].mlp.router.weight)


@pytest.mark.parametrize(("overrides", "key", "why"), [
    ({"model.experts.imbalance": "1.5"}, "model.experts.imbalance", "cost-model input"),
    ({"model.gemm_dtype": "fp8", "model.fp8_activations": "true", "cluster.device.peak_fp8_flops": "2TFLOP/s"},
     "model.fp8_activations", "E5M6"),
    ({"model.optimizer": "{name: adamw, moment_dtype: bf16}"}, "model.optimizer.moment_dtype", "zeros_like"),
    ({"model.optimizer": "{name: adam, grad_dtype: bf16}"}, "model.optimizer.grad_dtype", "main_grad"),
])
def test_what_the_runtime_cannot_run_is_one_line_before_launch(overrides, key, why):
    from runtime.model.config import load_runnable

    with pytest.raises(DappleError) as caught:
        load_runnable(MOE, overrides)
    message = str(caught.value)
    assert "\n" not in message and f"{key}: not supported by the runtime" in message and why in message


def test_expert_parallelism_with_tensor_parallelism_needs_sequence_parallelism_in_the_simulators_words():
    from runtime.model.config import load_runnable

    # the simulator refuses it (Megatron-Core's requirement) and so the runtime, before launch
    with pytest.raises(DappleError) as caught:
        load_runnable(MOE, {**FOUR, "plan.tensor_parallel": "2", "plan.stages": ONE_STAGE_4})
    assert "needs sequence_parallel: true (Megatron-Core's requirement)" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_node_limited_routing_picks_the_top_k_on_the_best_servers():
    from runtime.model.experts import node_limited, route

    # experts 0, 1 on server 0 and 2, 3 on server 1; top 2 on at most 1 server: each server scored
    # by its best 2 // 1 = 2 probabilities, server 0 .4 + .05 = .45 < server 1 .3 + .25 = .55
    probs = torch.tensor([[0.4, 0.05, 0.3, 0.25], [0.1, 0.5, 0.3, 0.1]])
    servers = torch.tensor([0, 0, 1, 1])
    expected = torch.tensor([[-1, -1, 0.3, 0.25], [0.1, 0.5, -1, -1]])
    assert torch.equal(node_limited(probs, servers, 2, 1), expected)
    weights, chosen = route(probs.log(), 2, normalize=True, servers=servers, node_limit=1)
    assert chosen.tolist() == [[2, 3], [1, 0]]
    assert weights[0].tolist() == pytest.approx([0.3 / 0.55, 0.25 / 0.55])
    # unlimited, token 0 goes to experts 0 and 2, on both servers; a limit of 2 servers limits nothing
    assert route(probs.log(), 2, normalize=True)[1][0].tolist() == [0, 2]
    assert torch.equal(node_limited(probs, servers, 2, 2), probs)


def test_each_experts_server_is_where_the_simulator_lays_its_expert_parallel_rank():
    from runtime.model.config import load_runnable

    # EP 2 over devices 0 and 1: one server (devices_per_node 2) or two (devices_per_node 1)
    limit = {"model.experts.node_limit": "1"}
    assert load_runnable(MOE, limit).model.servers_of(1) == (0, 0, 0, 0)
    split = load_runnable(MOE, {**limit, **TWO_RANKS["ep2-node-limit"]}).model
    assert split.expert_servers == tuple((k, d, (0, 0, 1, 1)) for k in (1, 2) for d in (0, 1))
    # 3-device servers: group (0, 1) all on server 0, group (2, 3) device 2 on server 0, 3 on server 1
    uneven = load_runnable(MOE, {**limit, **UNEVEN, "plan.stages": ONE_STAGE_4}).model
    assert [uneven.servers_of(2, d) for d in range(4)] == [(0, 0, 0, 0)] * 2 + [(0, 0, 1, 1)] * 2
    # one expert a server cannot hold a token's 2 experts on 1 server: one line
    with pytest.raises(DappleError, match="node_limit: 1 servers of 1 experts"):
        load_runnable(MOE, {**limit, "cluster.nodes": "4", "cluster.devices_per_node": "1",
                            "plan.stages": ONE_STAGE_4, "plan.expert_parallel": "4"})


def test_each_token_is_routed_over_its_own_groups_servers():
    from runtime.model.experts import node_limited

    # token 0's group holds every expert on one server (nothing limited), token 1's two a server:
    # token 1 scores server 0 .1 + .5 = .6 > server 1 .4, so experts 2 and 3 are masked
    probs = torch.tensor([[0.4, 0.05, 0.3, 0.25], [0.1, 0.5, 0.3, 0.1]])
    servers = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1]])
    assert torch.equal(node_limited(probs, servers, 2, 1), torch.tensor([[0.4, 0.05, 0.3, 0.25], [0.1, 0.5, -1, -1]]))


def test_the_reference_gives_each_token_the_map_of_the_group_that_dispatches_it():
    from runtime.model.config import load_runnable
    from runtime.validation.grad_check import token_servers

    # 4 one-device replicas on 3-device servers: sample i of each micro-batch of 4 on device i, devices
    # 0, 1 in EP group (0, 1) (one server), 2, 3 in (2, 3) (experts 0-1 on server 0, 2-3 on server 1)
    runnable = load_runnable(MOE, {**UNEVEN, "plan.stages": ONE_STAGE_4, "model.experts.node_limit": "1"})
    maps = token_servers(runnable.plan, runnable.model, microbatch_size=4, num_microbatches=2, seq_len=16)
    assert sorted(maps) == [1, 2]
    by_sample = maps[1].reshape(8, 16, 4)
    assert bool((by_sample == by_sample[:, :1]).all())
    assert by_sample[:, 0].tolist() == ([[0, 0, 0, 0]] * 2 + [[0, 0, 1, 1]] * 2) * 2


def test_a_capacity_keeps_each_experts_highest_weight_copies_per_group():
    from runtime.model.experts import within_capacity

    # 4 tokens, top-1 of 2 experts, capacity factor 1: capacity ceil(4·1/2·1) = 2 copies an expert;
    # expert 0 gets tokens 0, 1, 2 (weights .9, .6, .7) and keeps 0 and 2
    chosen = torch.tensor([[0], [0], [0], [1]])
    weights = torch.tensor([[0.9], [0.6], [0.7], [0.8]])
    assert within_capacity(weights, chosen, 2, 1.0).tolist() == [True, False, True, True]
    # groups {0} and {1, 2, 3}: capacities ceil(0.5) = 1 and ceil(1.5) = 2, so nothing is dropped
    groups = torch.tensor([0, 1, 1, 1])
    assert within_capacity(weights, chosen, 2, 1.0, groups).tolist() == [True] * 4
    # capacity factor 0.5: ceil(1) = 1; capacity factor 3: ceil(6) = 6 > 4 tokens, nothing dropped
    assert within_capacity(weights, chosen, 2, 0.5).tolist() == [True, False, False, True]
    assert within_capacity(weights, chosen, 2, 3.0).tolist() == [True] * 4


def test_the_references_drop_groups_are_the_tokens_one_device_routes_in_one_call():
    from runtime.model.config import load_runnable
    from runtime.validation.grad_check import drop_groups

    # EP 2 on 2 devices, micro-batches of 4 split 2 + 2: sample b is (micro-batch b // 4, replica b % 4 // 2)
    plan = load_runnable(MOE).plan
    labels = drop_groups(plan, microbatch_size=4, num_microbatches=2, seq_len=16, layers=range(4))[1].reshape(8, 16)
    assert labels[:, 0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3] and bool((labels == labels[:, :1]).all())
    # TP 2 with sequence parallelism: tensor rank k routes positions [8k, 8k + 8) of its replica's samples
    plan = load_runnable(MOE, FOUR_RANKS["ep2-tp2-sp"]).plan
    labels = drop_groups(plan, microbatch_size=4, num_microbatches=2, seq_len=16, layers=range(4))[2].reshape(8, 16)
    assert labels[:, 0].tolist() == [0, 0, 2, 2, 4, 4, 6, 6] and labels[:, 8].tolist() == [1, 1, 3, 3, 5, 5, 7, 7]


def test_with_context_parallelism_the_drop_groups_follow_each_context_ranks_chunks():
    from runtime.model.config import _expert_limits, load_runnable
    from runtime.validation.grad_check import drop_groups

    # CP 2 (one replica of 2 devices), seq 16 in 4 chunks of 4: context rank 0 holds positions 0-3 and
    # 12-15, rank 1 positions 4-11 (Megatron-LM's load-balanced cut); labels (micro-batch · 2 + rank)
    overrides = {"model.experts.capacity_factor": "1.0", "plan.context_parallel": "2", "plan.expert_parallel": "1"}
    runnable = load_runnable(MOE, overrides)
    assert not [why for _, present, why in _expert_limits(runnable.plan, runnable.model.experts) if present]
    labels = drop_groups(runnable.plan, microbatch_size=4, num_microbatches=2, seq_len=16, layers=range(4))
    row = labels[1].reshape(8, 16)
    assert row[0].tolist() == [0] * 4 + [1] * 8 + [0] * 4 and row[4].tolist() == [2] * 4 + [3] * 8 + [2] * 4
    # CP 2 × TP 2 with sequence parallelism: context rank 0's positions 0-3 on tensor rank 0, 12-15 on 1
    plan = load_runnable(MOE, {**overrides, **FOUR, **TP2_SP, "plan.stages": ONE_STAGE_4}).plan
    row = drop_groups(plan, microbatch_size=4, num_microbatches=2, seq_len=16, layers=range(4))[1].reshape(8, 16)[0]
    assert row.tolist() == [0] * 4 + [2] * 4 + [3] * 4 + [1] * 4


def _cases(device, cases: dict, path: str = MOE):
    from runtime.execution.session import SessionOptions, run_session
    from runtime.model.config import load_runnable

    return {name: run_session(load_runnable(path, overrides), SessionOptions(steps=1, check=True), device)
            for name, overrides in cases.items()}


def _spawn(nproc: int, cases: dict, path: str = MOE):
    from runtime.execution.launch import spawn

    return spawn(_cases, nproc, cases, path)[0]


@pytest.fixture(scope="module")
def two_ranks():
    return _spawn(2, TWO_RANKS)


@pytest.fixture(scope="module")
def four_ranks():
    return _spawn(4, FOUR_RANKS)


@pytest.mark.dist
@pytest.mark.parametrize("name", sorted(TWO_RANKS))
def test_expert_parallel_plans_on_two_ranks_match_the_unsplit_model(two_ranks, name):
    assert_matches_unsplit(two_ranks[name])


@pytest.mark.dist
@pytest.mark.parametrize("name", sorted(FOUR_RANKS))
def test_expert_parallel_with_tensor_or_pipeline_parallelism_matches_the_unsplit_model(four_ranks, name):
    assert_matches_unsplit(four_ranks[name])


@pytest.mark.slow
def test_combined_four_rank_expert_plans_match_the_unsplit_model():
    summaries = _spawn(4, FOUR_RANKS_SLOW)
    for name, summary in summaries.items():
        assert_matches_unsplit(summary)
    for kinds, expected in kinds_beside_prediction(MOE, FOUR_RANKS_SLOW["ep2-etp2-fsdp"], summaries["ep2-etp2-fsdp"]):
        assert kinds["parameters"] == pytest.approx(expected.parameters, rel=0.02)
        assert kinds["optimizer"] == pytest.approx(expected.optimizer, rel=0.02)


@pytest.mark.dist
def test_node_limited_routing_changes_where_tokens_go(two_ranks):
    # the same weights and batch, routed within one server a token: another loss than unlimited
    assert two_ranks["ep2-node-limit"]["losses"][0] != pytest.approx(two_ranks["ep2"]["losses"][0], rel=1e-6)


@pytest.mark.dist
def test_expert_states_are_counted_by_kind_as_the_simulator_predicts(two_ranks, four_ranks):
    for summary, overrides in [(two_ranks["ep2"], {})] + [
            (four_ranks[name], FOUR_RANKS[name])
            for name in ("ep2-pp2", "ep2-tp2-sp", "ep2-dp2-zero1", "ep2-dp2-fsdp", "ep2-etp2")]:
        for kinds, expected in kinds_beside_prediction(MOE, overrides, summary):
            assert kinds["parameters"] == pytest.approx(expected.parameters, rel=0.02)
            assert kinds["gradients"] == pytest.approx(expected.gradients, rel=0.02)
            assert kinds["optimizer"] == pytest.approx(expected.optimizer, rel=0.02)
    assert two_ranks["ep2"]["parallelism"]["expert"] == 2


def test_a_profiled_moe_block_counts_one_expert_parallel_devices_bytes():
    # dapple-run validate and profile: the measured profile's parameter bytes are one device's
    from runtime.measure.profiler import profile_layer
    from runtime.model.config import load_runnable
    from sim.core.parallelism import Shard
    from sim.models import shard_model

    runnable = load_runnable(MOE)
    measured = profile_layer(runnable.model, 1, 1, torch.device("cpu"), warmup=0, repeats=1, expert_parallel=2)
    assert measured.param_bytes == shard_model(runnable.scenario.model, Shard(expert=2)).layers[1].param_bytes


@pytest.mark.slow
def test_split_backwards_model_chunks_node_limits_and_tp_without_sp_match_the_unsplit_model():
    # zero-bubble's I and W both run the all-to-all's backward on every rank of a group, in order;
    # node-limited routing with two expert-parallel groups, each over two servers; TP 2 without sequence
    # parallelism at a capacity
    chunks = "[{layers: [0, 1], devices: [0, 1]}, {layers: [1, 2], devices: [2, 3]}, " \
             "{layers: [2, 3], devices: [0, 1]}, {layers: [3, 4], devices: [2, 3]}]"
    cases = {"zb-h1": {**FOUR, "plan.schedule": "zb-h1", "plan.stages": TWO_STAGES},
             # EP groups (0, 1) and (2, 3), each over two 1-device servers: experts 0-1 on one, 2-3 on the other
             "ep2-dp2-node-limit": {"cluster.nodes": "4", "cluster.devices_per_node": "1", "plan.stages": ONE_STAGE_4,
                                    "model.experts.node_limit": "1"},
             # TP 2 without sequence parallelism, each tensor rank's capacity over the half it dispatches
             "ep1-tp2-dp2-capacity": {**FOUR, "plan.stages": ONE_STAGE_4, "plan.tensor_parallel": "2",
                                      "plan.expert_parallel": "1", "model.experts.capacity_factor": "0.75"},
             "interleaved": {**FOUR, "plan.schedule": "interleaved", "plan.stages": chunks}}
    for summary in _spawn(4, cases).values():
        assert_matches_unsplit(summary)


@pytest.mark.slow
def test_expert_tensor_parallelism_with_biases_tensor_parallelism_or_alone_matches_the_unsplit_model(tmp_path):
    # gpt's experts have biases: w1's is cut with its rows, w2's added on one expert-tensor rank and
    # its gradient summed over the pair (also on FSDP2's shards); EP 1 × ETP 2; ETP 2 beside TP 2 with
    # sequence parallelism
    text = (SCENARIOS / "moe_tiny_cpu.yaml").read_text().replace("preset: llama", "preset: gpt")
    gpt = tmp_path / "moe_gpt.yaml"
    gpt.write_text("\n".join(line for line in text.splitlines() if "kv_heads" not in line))
    etp = {**FOUR, "plan.stages": ONE_STAGE_4, "plan.expert_tensor_parallel": "2"}
    cases = {"gpt-ep2-etp2": etp, "gpt-ep2-etp2-zero1": {**etp, "plan.sharding": "optimizer"},
             "gpt-ep2-etp2-fsdp": {**etp, "plan.sharding": "full"},
             "gpt-ep1-etp2": {**etp, "plan.expert_parallel": "1"}, "gpt-ep2-etp2-tp2-sp": {**etp, **TP2_SP}}
    for summary in _spawn(4, cases, str(gpt)).values():
        assert_matches_unsplit(summary)

"""Multi-token prediction in the runtime: the loss against DeepSeek-V3's Eqs. 21–25 written out,
each layer's parameters against the simulator's, the labels ahead at a context rank's positions,
the limits refused in one line, and data, pipeline (gpt tied; llama untied, whose last stage holds
a copy of the table), tensor (with and without sequence parallelism) and context parallelism
training one step exactly like the unsplit model (and, slow, under FSDP2 and with experts), which
holds the MTP modules too (rtol 1e-5, fp32), with parameters, gradients and optimizer states by
kind as the simulator predicts.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import SCENARIOS, assert_matches_unsplit, kinds_beside_prediction, spawn_checked  # noqa: E402
from sim.core.errors import DappleError  # noqa: E402

GPT = str(SCENARIOS / "gpt_tiny_cpu.yaml")  # 4 blocks, hidden 64, 4 heads, seq 32; PP 2 on 2 devices
MTP = {"model.mtp_depth": "2"}
LLAMA = {"model.preset": "llama", "model.kv_heads": "2"}
PP2 = {"plan.stages": "[{layers: [0, 3], devices: [0]}, {layers: [3, 7], devices: [1]}]"}
DP2 = {"plan.stages": "[{layers: [0, 7], devices: [0, 1]}]"}
TP2 = {**MTP, **DP2, "plan.tensor_parallel": "2"}
SP = {"plan.sequence_parallel": "true"}
TWO_RANKS = {
    "gpt-tied-pp2": {**MTP, **PP2, "model.tied_embeddings": "true"},
    "gpt-tied-tp2-sp": {**TP2, **SP, "model.tied_embeddings": "true"},  # vocabulary-parallel look-up, scatter
    # untied: the last stage's mtp layer holds a copy of the table, summed with the embedding's
    "llama-untied-pp2": {**MTP, **PP2, **LLAMA},
}


def _written_out(layers, ids, labels, weight):
    """DeepSeek-V3 §2.2: Eqs. 21–22 truncated to the T − k positions that have a token k ahead,
    Eq. 24 with its 1/T, Eq. 25 with λ = 0.3, plus the main cross-entropy."""
    rms = lambda x, w: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w  # noqa: E731
    n, s = ids.shape
    h = ids
    for k in range(5):
        h = layers[k](h)
    main_logits = layers[6].project(layers[6].norm(h))
    loss = torch.nn.functional.cross_entropy(main_logits.flatten(0, 1), labels.flatten())
    tokens = torch.cat([ids, labels[:, -1:]], 1)  # t_0 .. t_s
    mtp = []
    for k, module in enumerate(layers[5].depths, start=1):
        h = h[:, : s - k] if k == 1 else h[:, :-1]                                   # positions 0 .. s-1-k
        e = weight[tokens[:, k: s]]                                                  # Emb(t_{i+k})
        joined = torch.cat([rms(h, module.hidden_norm.weight), rms(e, module.embedding_norm.weight)], -1)
        h = module.block(joined @ module.proj.weight.T)                              # Eqs. 21–22
        logits = layers[6].project(layers[6].mtp_norms[k - 1](h))                    # Eq. 23
        log_p = torch.log_softmax(logits, -1).gather(-1, tokens[:, k + 1:, None]).squeeze(-1)
        mtp.append(-log_p.sum() / (n * s))                                           # Eq. 24
    return loss + 0.3 / len(mtp) * sum(mtp)                                          # Eq. 25


def test_the_mtp_loss_is_deepseek_v3s_equations():
    from runtime.model.config import load_runnable
    from runtime.model.models import build_layers, synthetic_batch, whole_model

    torch.manual_seed(0)
    runnable = load_runnable(GPT, {**MTP, **DP2})
    model = whole_model(runnable.model, seed=3)
    ids, labels = synthetic_batch(runnable.model, 3, step=0, seed=3)
    got = model(ids, labels)
    layers = build_layers(runnable.model, seed=3)
    with torch.no_grad():
        expected = _written_out(layers, ids, labels, layers[0].token.weight)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
    got.backward()  # every MTP weight and the shared table get a gradient
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.layers["5"].parameters())


@pytest.mark.parametrize("overrides", [{**MTP, **DP2}, TWO_RANKS["gpt-tied-pp2"], {**MTP, **DP2, **LLAMA}],
                         ids=["gpt", "gpt-tied", "llama"])
def test_each_layer_holds_the_simulators_parameter_bytes(overrides):
    from runtime.model.config import load_runnable
    from runtime.model.models import build_layers, layer_param_bytes

    runnable = load_runnable(GPT, overrides)
    layers = build_layers(runnable.model)
    assert [layer_param_bytes(layers[k]) for k in range(7)] == [layer.param_bytes for layer in
                                                                 runnable.scenario.model.layers]
    # two modules of: two RMSNorms (64 each), M_k 128·64, a GPT block; fp32
    block = layer_param_bytes(layers[4])
    assert layer_param_bytes(layers[5]) == 2 * (4 * (2 * 64 + 128 * 64) + block)


@pytest.fixture
def fake_tensor_mesh():
    """A 2-device mesh in this one process over torch's fake process group (its collectives do
    nothing): enough to cut the layers as a tensor rank holds them, without launching ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (2,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("overrides", [{**TP2, "model.tied_embeddings": "true"}, {**TP2, **SP, **LLAMA}],
                         ids=["gpt-tied-tp2", "llama-tp2-sp"])
def test_a_tensor_rank_holds_the_simulators_parameter_bytes_per_layer(fake_tensor_mesh, overrides):
    # the mtp layer: two modules of two norms (64 each), 1/2 of M_k's 128·64 and a block's share; fp32
    from runtime.model.config import load_runnable
    from runtime.model.models import StageModule, build_layers, layer_param_bytes
    from runtime.model.tensor_parallel import parallelize_stage
    from sim.core.parallelism import Shard
    from sim.models import shard_model

    runnable = load_runnable(GPT, overrides)
    layers = build_layers(runnable.model)
    parallelize_stage(StageModule(layers, is_last=True), fake_tensor_mesh,
                      sequence_parallel=runnable.plan.sequence_parallel, first=True)
    predicted = shard_model(runnable.scenario.model, Shard(tensor=2, sequence_parallel=runnable.plan.sequence_parallel))
    assert [layer_param_bytes(layers[k]) for k in range(7)] == [layer.param_bytes for layer in predicted.layers]
    assert layer_param_bytes(layers[5]) == 2 * (4 * (2 * 64 + 128 * 64 // 2) + layer_param_bytes(layers[4]))


def test_the_labels_ahead_are_the_whole_sequences_at_a_context_ranks_positions():
    # s = 8 in 2c = 4 chunks of 2: context rank 0 of 2 holds positions 0, 1, 6, 7 (chunks 0 and 3)
    from runtime.model.context_parallel import context_batch, sequence_positions
    from runtime.model.mtp import IGNORE, labels_ahead

    labels = torch.arange(10, 18).reshape(1, 8)  # label i is 10 + i
    held = sequence_positions(8, 2, 0)
    assert held.tolist() == [0, 1, 6, 7]
    ahead = labels_ahead(labels, 2, held)[0].tolist()
    assert ahead == [[10, 11, 12], [11, 12, 13], [16, 17, IGNORE], [17, IGNORE, IGNORE]]
    ids, cut = context_batch((labels - 10, labels), held, 2)
    assert ids.tolist() == [[0, 1, 6, 7]] and cut.tolist() == [ahead]
    assert context_batch((labels, labels), held)[1].tolist() == [[10, 11, 16, 17]]  # no MTP: labels cut alone
    # rank 1 holds chunks 1 and 2: its tokens ahead of position 5 lie in rank 0's chunk 3
    assert labels_ahead(labels, 2, sequence_positions(8, 2, 1))[0].tolist() == [
        [12, 13, 14], [13, 14, 15], [14, 15, 16], [15, 16, 17]]


@pytest.mark.parametrize("overrides", [TP2, {**TP2, **SP}, {**MTP, **DP2, "plan.context_parallel": "2"},
                                       {**MTP, **DP2, **LLAMA, "plan.context_parallel": "2",
                                        "plan.tensor_parallel": "2", "cluster.devices_per_node": "4",
                                        "plan.stages": "[{layers: [0, 7], devices: [0, 1, 2, 3]}]"}],
                         ids=["tp2", "tp2-sp", "cp2", "llama-tp2-cp2"])
def test_tensor_and_context_parallel_mtp_plans_are_not_refused(overrides):
    from runtime.model.config import load_runnable

    assert load_runnable(GPT, overrides).model.mtp_depth == 2


MOE = str(SCENARIOS / "moe_tiny_cpu.yaml")  # llama, 2 MoE blocks (4 experts, top 2, 1 shared), EP 2 on 2 devices
MOE_MTP = {**MTP, "plan.stages": "[{layers: [0, 5], devices: [0, 1]}]"}


def test_the_mtp_block_is_an_moe_block_whose_experts_lie_as_the_main_blocks():
    # DeepSeek-V3 §2.2: TRM_k is a block like the main model's (MoE where the last block is); EP rank 1
    # holds routed experts 2 and 3 in every depth, each from the unsplit model's seed, and one device's
    # bytes are the simulator's per-device layer (sim.models.mtp, sim.models.moe)
    from runtime.model.config import load_runnable
    from runtime.model.experts import MoE
    from runtime.model.models import build_layers, layer_param_bytes
    from sim.models import shard_model

    runnable = load_runnable(MOE, MOE_MTP)
    whole = build_layers(runnable.model)
    half = build_layers(runnable.model, local_experts={k: (2, 3) for k in range(1, 4)})
    part = shard_model(runnable.scenario.model, runnable.scenario.plan.shard)
    assert [layer_param_bytes(half[k]) for k in range(5)] == [layer.param_bytes for layer in part.layers]
    for d in range(2):
        mine, unsplit = half[3].depths[d].block.mlp, whole[3].depths[d].block.mlp
        assert isinstance(mine, MoE) and sorted(mine.experts) == ["2", "3"]
        assert torch.equal(mine.experts["3"].w1.weight, unsplit.experts["3"].w1.weight)
    # each depth's experts their own: depth 1's expert 0 is not depth 0's, nor block 1's
    assert not torch.equal(whole[3].depths[1].block.mlp.experts["0"].w1.weight,
                           whole[3].depths[0].block.mlp.experts["0"].w1.weight)
    assert not torch.equal(whole[3].depths[0].block.mlp.experts["0"].w1.weight, whole[2].mlp.experts["0"].w1.weight)


@pytest.mark.parametrize("overrides, words", [
    ({**MTP, "plan.stages": "[{layers: [0, 6], devices: [0]}, {layers: [6, 7], devices: [1]}]",
      "model.tied_embeddings": "true"}, "plan.stages: the mtp layer (5) is on stage 0"),
    ({**MTP, "cluster.devices_per_node": "1", "plan.schedule": "interleaved", "plan.sharding": "full",
      "plan.stages": "[{layers: [0, 3], devices: [0]}, {layers: [3, 7], devices: [0]}]"},
     "put them in one stage or use sharding: none or optimizer"),
    ({**MTP, "cluster.devices_per_node": "3", "plan.sharding": "full", "training.microbatch_size": "2",
      "plan.stages": "[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 7], devices: [2]}]"},
     "give both stages as many replicas"),
], ids=["mtp-apart-from-head", "fsdp-interleaved", "fsdp-replicas-differ"])
def test_what_the_runtime_does_not_run_is_refused_in_one_line(overrides, words):
    from runtime.model.config import load_runnable

    with pytest.raises(DappleError) as caught:
        load_runnable(GPT, overrides)
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)



@pytest.fixture(scope="module")
def two_ranks():
    return spawn_checked(GPT, 2, TWO_RANKS)


@pytest.mark.dist
@pytest.mark.parametrize("name", sorted(TWO_RANKS))
def test_mtp_with_data_pipeline_or_tensor_parallelism_matches_the_unsplit_model(two_ranks, name):
    assert two_ranks[name]["check_passed"], name
    assert_matches_unsplit(two_ranks[name])


@pytest.mark.dist
def test_mtp_states_are_counted_by_kind_as_the_simulator_predicts(two_ranks):
    for name, overrides in TWO_RANKS.items():
        for kinds, expected in kinds_beside_prediction(GPT, overrides, two_ranks[name]):
            assert kinds["parameters"] == pytest.approx(expected.parameters, rel=1e-6), name
            assert kinds["gradients"] == pytest.approx(expected.gradients, rel=1e-6), name
            assert kinds["optimizer"] == pytest.approx(expected.optimizer, rel=1e-6), name


def test_the_torch_peer_refuses_mtp_in_one_line():
    # torch.distributed.pipelining's loss_fn(logits, labels) sees the main logits only
    from runtime.execution.peer import check_peer_plan
    from runtime.model.config import load_runnable

    with pytest.raises(DappleError) as caught:
        check_peer_plan(load_runnable(GPT, {**TWO_RANKS["gpt-tied-pp2"], "plan.schedule": "gpipe"}), 2)
    assert "not the multi-token-prediction losses; remove model.mtp_depth" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("index", [5, 6], ids=["mtp", "head"])
def test_the_mtp_layer_and_the_head_profile_alone(index):
    # the head's input is the mtp layer's 1 + D hidden states side by side (the simulator's cut after mtp)
    from runtime.measure.profiler import profile_layer
    from runtime.model.config import load_runnable

    torch.set_num_threads(1)
    runnable = load_runnable(GPT, {**MTP, **DP2})
    profile = profile_layer(runnable.model, index, 2, torch.device("cpu"), warmup=0, repeats=1)
    assert profile.param_bytes == runnable.scenario.model.layers[index].param_bytes


@pytest.mark.slow
def test_mtp_with_sharding_recompute_and_split_backwards_matches_the_unsplit_model():

    four = {**MTP, "model.tied_embeddings": "true", "cluster.devices_per_node": "4",
            "plan.stages": "[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 7], devices: [2, 3]}]"}
    cases = {"pp2-dp2": four, "pp2-dp2-zero1": {**four, "plan.sharding": "optimizer"},
             "pp2-dp2-recompute": {**four, "plan.recompute": "full"},
             "pp2-dp2-selective": {**four, "plan.recompute": "selective"},
             "pp2-dp2-zb-h1": {**four, "plan.schedule": "zb-h1"},
             # ZeRO-2 reduce-scatters too: the embedding group pairs the copies' shards (tied_groups)
             "pp2-dp2-zero2": {**four, "plan.sharding": "gradients"},
             "llama-untied-pp2-dp2-fsdp": {**four, **LLAMA, "model.tied_embeddings": "false", "plan.sharding": "full"},
             "llama-depth-1-dp4": {"model.mtp_depth": "1", "model.preset": "llama", "cluster.devices_per_node": "4",
                                   "plan.stages": "[{layers: [0, 7], devices: [0, 1, 2, 3]}]"}}
    for name, summary in spawn_checked(GPT, 4, cases).items():
        assert summary["check_passed"], name
        assert_matches_unsplit(summary)


@pytest.mark.slow
def test_mtp_with_tensor_or_context_parallelism_on_two_ranks_matches_the_unsplit_model():
    # the tokens ahead of a context rank's chunk lie in the other rank's: taken from the whole labels
    cp2 = {**MTP, **DP2, "plan.context_parallel": "2"}
    cases = {"gpt-tp2": TP2, "gpt-cp2": cp2, "llama-tp2-sp": {**TP2, **SP, **LLAMA}, "llama-cp2": {**cp2, **LLAMA},
             "llama-dp2": {**MTP, **DP2, **LLAMA}}
    for name, summary in spawn_checked(GPT, 2, cases).items():
        assert summary["check_passed"], name
        assert_matches_unsplit(summary)
        for kinds, expected in kinds_beside_prediction(GPT, cases[name], summary):  # 1/t of M_k, whole under CP
            assert kinds["parameters"] == pytest.approx(expected.parameters, rel=1e-6), name
            assert kinds["optimizer"] == pytest.approx(expected.optimizer, rel=1e-6), name


FSDP = {  # the mtp layer borrows the table (DP: the embedding's; PP: a tied head's) or holds a copy
    "llama-dp2-fsdp": {**MTP, **DP2, **LLAMA, "plan.sharding": "full"},
    "gpt-tied-dp2-zero2": {**MTP, **DP2, "model.tied_embeddings": "true", "plan.sharding": "gradients"},
    "gpt-tied-pp2-fsdp": {**TWO_RANKS["gpt-tied-pp2"], "plan.sharding": "full"},
    "llama-untied-pp2-zero2": {**TWO_RANKS["llama-untied-pp2"], "plan.sharding": "gradients"},
}


@pytest.mark.slow
def test_mtp_under_fsdp2_matches_the_unsplit_model_and_shards_its_states():
    summaries = spawn_checked(GPT, 2, FSDP)
    for name, summary in summaries.items():
        assert_matches_unsplit(summary)
    for name in ("llama-dp2-fsdp", "gpt-tied-pp2-fsdp"):  # ZeRO-3: every state 1/d, as predicted
        for kinds, expected in kinds_beside_prediction(GPT, FSDP[name], summaries[name]):
            assert kinds["parameters"] == pytest.approx(expected.parameters, rel=1e-6), name
            assert kinds["optimizer"] == pytest.approx(expected.optimizer, rel=1e-6), name


@pytest.mark.slow
def test_mtp_with_tensor_pipeline_and_context_parallelism_on_four_ranks_matches_the_unsplit_model():
    four = {**MTP, "model.tied_embeddings": "true", "cluster.devices_per_node": "4", "plan.tensor_parallel": "2"}
    tp2_pp2 = {**four, "plan.stages": "[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 7], devices: [2, 3]}]"}
    cases = {"gpt-tied-tp2-pp2": tp2_pp2, "llama-tied-tp2-pp2-sp": {**tp2_pp2, **LLAMA, **SP},
             # the last stage's copy of the untied table is vocabulary-parallel, as the embedding's
             "llama-untied-tp2-pp2-sp": {**tp2_pp2, **LLAMA, **SP, "model.tied_embeddings": "false"},
             "llama-tp2-cp2": {**four, **LLAMA, "plan.context_parallel": "2",
                               "plan.stages": "[{layers: [0, 7], devices: [0, 1, 2, 3]}]"}}
    summaries = spawn_checked(GPT, 4, cases)
    for name, summary in summaries.items():
        assert summary["check_passed"], name
        assert_matches_unsplit(summary)
    for kinds, expected in kinds_beside_prediction(GPT, cases["llama-untied-tp2-pp2-sp"],
                                                   summaries["llama-untied-tp2-pp2-sp"]):
        assert kinds["parameters"] == pytest.approx(expected.parameters, rel=1e-6)


@pytest.mark.slow
def test_mtp_with_experts_matches_the_unsplit_model():
    cases = {"ep2": MOE_MTP, "ep2-capacity": {**MOE_MTP, "model.experts.capacity_factor": "1.0"},
             "ep2-node-limit": {**MOE_MTP, "model.experts.node_limit": "1", "cluster.nodes": "2",
                                "cluster.devices_per_node": "1"},
             "ep2-zero1": {**MOE_MTP, "plan.sharding": "optimizer"}, "ep2-fsdp": {**MOE_MTP, "plan.sharding": "full"},
             "etp2": {**MOE_MTP, "plan.expert_parallel": "1", "plan.expert_tensor_parallel": "2"}}
    summaries = spawn_checked(MOE, 2, cases)
    for name, summary in summaries.items():
        assert_matches_unsplit(summary)
    for name in ("ep2", "ep2-fsdp", "etp2"):  # each device's states by kind as the simulator counts them
        for kinds, expected in kinds_beside_prediction(MOE, cases[name], summaries[name]):
            assert kinds["parameters"] == pytest.approx(expected.parameters, rel=1e-6), name
            assert kinds["optimizer"] == pytest.approx(expected.optimizer, rel=1e-6), name


@pytest.mark.slow
def test_mtp_on_dualpipes_v_reads_the_embeddings_own_table():
    # DeepSeek-V3 §3.2.3: the V puts the embedding and the mtp layer on one device, which holds one
    # table (sim.models.mtp.table_on_one_device); its split backward's W feeds that table as well
    v = {**MTP, **LLAMA, "plan.stages": "[{layers: [0, 2], devices: [0]}, {layers: [2, 4], devices: [1]},"
                                        " {layers: [4, 5], devices: [1]}, {layers: [5, 7], devices: [0]}]"}
    cases = {"zb-v": {**v, "plan.schedule": "zb-v"}, "dualpipe-v": {**v, "plan.schedule": "{name: dualpipe-v, chunks: 2}"}}
    summaries = spawn_checked(GPT, 2, cases)
    for name, summary in summaries.items():
        assert_matches_unsplit(summary)
        for kinds, expected in kinds_beside_prediction(GPT, cases[name], summary):
            assert kinds["parameters"] == pytest.approx(expected.parameters, rel=1e-6), name


@pytest.mark.slow
def test_mtp_with_experts_over_pipeline_stages_matches_the_unsplit_model():
    # all three at once: the last stage's copy of the untied table, its MoE mtp block over EP 2, FSDP2
    four = {"model.mtp_depth": "1", "cluster.devices_per_node": "4",
            "plan.stages": "[{layers: [0, 2], devices: [0, 1]}, {layers: [2, 5], devices: [2, 3]}]"}
    cases = {"pp2-ep2": four, "pp2-ep2-fsdp": {**four, "plan.sharding": "full"},
             "pp2-ep2-zero2": {**four, "plan.sharding": "gradients"}}
    for name, summary in spawn_checked(MOE, 4, cases).items():
        assert_matches_unsplit(summary)

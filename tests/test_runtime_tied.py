"""Tied embeddings (the ``gpt`` preset as shipped) and vocabulary padding in the runtime.

One weight serves the vocabulary-parallel embedding and the head: under tensor and sequence
parallelism it is one ``Shard(0)`` DTensor used by both (``runtime.model.layers.LMHead``
reads the embedding's weight at each call); across pipeline stages each end holds a copy and
the copies' gradients are summed over Megatron-LM's embedding groups
(``runtime.execution.holdings.tied_groups``); FSDP2 keeps the pair in the stage's root unit;
ZeRO-1 sees the parameter once. Each plan trains one step exactly like the unsplit tied model
in one process (rtol 1e-5, fp32), on tiny shapes (hidden 32, 4 layers, sequence 16). A
vocabulary that ``vocab_divisible_by`` x t does not divide is padded as the simulator pads it.

All cases of one world size share one set of processes (one spawn per world size).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import SCENARIOS, assert_matches_unsplit, spawn_checked

GPT = str(SCENARIOS / "gpt_tiny_cpu.yaml")
SHIPPED = {"model.tied_embeddings": "true", "model.hidden": "32", "model.seq_len": "16"}
"""gpt_tiny_cpu.yaml unties its head (for validate's profile); the preset as shipped ties it."""
TP2_PP2 = "[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 6], devices: [2, 3]}]"
FOUR = {**SHIPPED, "cluster.devices_per_node": "4"}
PADDED = {"model.vocab": "201", "model.vocab_divisible_by": "128"}
"""GPT-2's 50,257 scaled down: 201 tokens, a multiple of 128 x 2 = 256 rows at t = 2."""

FOUR_RANKS = {
    "tp2-pp2": {**FOUR, "plan.tensor_parallel": "2", "plan.stages": TP2_PP2},
    "tp2-pp2-sp": {**FOUR, "plan.tensor_parallel": "2", "plan.sequence_parallel": "true", "plan.stages": TP2_PP2},
    "tp2-dp2-zero1": {**FOUR, "plan.tensor_parallel": "2", "plan.sharding": "optimizer",
                      "plan.stages": "[{layers: [0, 6], devices: [0, 1, 2, 3]}]"},
    "tp2-pp2-padded": {**FOUR, **PADDED, "plan.tensor_parallel": "2", "plan.stages": TP2_PP2},
    "fsdp2-pp2": {**FOUR, "plan.sharding": "full", "plan.stages": TP2_PP2},
}
TWO_RANKS = {
    "fsdp2": {**SHIPPED, "plan.sharding": "full", "plan.stages": "[{layers: [0, 6], devices: [0, 1]}]"},
    "tp2-sp": {**SHIPPED, "plan.tensor_parallel": "2", "plan.sequence_parallel": "true",
               "plan.stages": "[{layers: [0, 6], devices: [0, 1]}]"},
}



def _spawn(nproc: int, cases: dict):
    return spawn_checked(GPT, nproc, cases)


@pytest.fixture(scope="module")
def four_ranks():
    pytest.importorskip("torch.distributed.tensor.parallel")
    return _spawn(4, FOUR_RANKS)


@pytest.fixture(scope="module")
def two_ranks():
    pytest.importorskip("torch.distributed.tensor.parallel")
    return _spawn(2, TWO_RANKS)


@pytest.mark.dist
@pytest.mark.parametrize("name", sorted(FOUR_RANKS))
def test_four_rank_tied_plans_match_the_unsplit_tied_model(four_ranks, name):
    assert_matches_unsplit(four_ranks[name])


@pytest.mark.dist
@pytest.mark.parametrize("name", sorted(TWO_RANKS))
def test_two_rank_tied_plans_match_the_unsplit_tied_model(two_ranks, name):
    assert_matches_unsplit(two_ranks[name])


@pytest.mark.dist
def test_the_padded_vocabulary_is_built_and_reported_as_the_simulator_counts_it(four_ranks):
    from runtime.model.config import load_runnable
    from sim.engine.run import run_scenario

    summary = four_ranks["tp2-pp2-padded"]
    assert summary["vocabulary"]["padded_at_tensor_parallel"] == 256  # ceil(201 / 256) * 256
    assert summary["vocabulary"]["text"].startswith("vocabulary 201 padded to 256")
    # each device holds 128 of the 256 rows (32 wide, fp32), as the simulator's parameters say
    predicted = run_scenario(load_runnable(GPT, FOUR_RANKS["tp2-pp2-padded"]).scenario, engine="fast").summarize()
    for measured, device in zip(summary["devices"], predicted.devices):
        assert measured["memory_breakdown_bytes"]["parameters"] == pytest.approx(device.memory_breakdown.parameters,
                                                                                rel=0.02)
    assert four_ranks["tp2-pp2"]["vocabulary"]["text"] == ""  # 128 rows at vocab_divisible_by 1: no padding


def test_gpt2s_vocabulary_is_padded_for_the_plans_tensor_degree():
    from runtime.model.config import model_config, runnable_model
    from runtime.model.models import build_layer
    from sim.models import build_model

    shipped = build_model("gpt", layers=2, hidden=8, heads=2, seq_len=16, vocab=50257)  # vocab_divisible_by 128
    for t, rows in [(1, 50304), (2, 50432), (4, 50688), (8, 51200)]:  # ceil(50,257 / 128t) * 128t
        assert runnable_model(shipped, tensor_parallel=t).padded_vocab == rows
    config = runnable_model(shipped, tensor_parallel=8)
    assert build_layer(config, 0).token.weight.shape == torch.Size([51200, 8])
    assert build_layer(config, 3).borrowed == ()  # built alone: the tie is made by build_layers
    assert model_config({"preset": "mlp", "layers": 2, "hidden": 8, "input_size": 4, "num_classes": 3}).padded_vocab \
        is None


def test_embedding_groups_pair_the_same_vocabulary_slice_or_the_same_shard():
    from runtime.execution.holdings import tied_groups
    from runtime.model.config import load_runnable

    plan = load_runnable(GPT, {**FOUR, "plan.tensor_parallel": "2", "plan.stages": TP2_PP2}).plan
    assert tied_groups(plan, sharded=False) == ((0, 2), (1, 3))  # tensor rank 0 with 0, 1 with 1
    six = {**SHIPPED, "cluster.devices_per_node": "6", "plan.tensor_parallel": "2", "training.microbatch_size": "3",
           "training.global_batch_size": "12",
           "plan.stages": "[{layers: [0, 3], devices: [0, 1, 2, 3]}, {layers: [3, 6], devices: [4, 5]}]"}
    # DAPPLE's 2:1: both replicas of the embedding and the head's one copy, per tensor rank
    assert tied_groups(load_runnable(GPT, six).plan, sharded=False) == ((0, 2, 4), (1, 3, 5))
    fsdp = load_runnable(GPT, {**FOUR, "plan.stages": "[{layers: [0, 3], devices: [0, 1]},"
                                                      " {layers: [3, 6], devices: [2, 3]}]"}).plan
    assert tied_groups(fsdp, sharded=True) == ((0, 2), (1, 3))  # replica r's shard with replica r's


@pytest.mark.parametrize(("overrides", "message"), [
    ({**SHIPPED, "cluster.devices_per_node": "1", "plan.schedule": "interleaved", "plan.sharding": "full",
      "plan.stages": "[{layers: [0, 3], devices: [0]}, {layers: [3, 6], devices: [0]}]"},
     "FSDP2 manages a parameter in one fully_shard unit"),
    ({**SHIPPED, "cluster.devices_per_node": "3", "plan.sharding": "full", "training.microbatch_size": "2",
      "plan.stages": "[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 6], devices: [2]}]"},
     "no two copies hold the same shard"),
], ids=["fsdp-interleaved", "fsdp-uneven"])
def test_what_remains_refused_of_a_tied_pair_is_one_line_naming_fsdp2(overrides, message):
    from runtime.model.config import load_runnable
    from sim.core.errors import DappleError

    with pytest.raises(DappleError) as info:
        load_runnable(GPT, overrides)
    assert message in str(info.value) and "model.tied_embeddings" in str(info.value)
    assert "\n" not in str(info.value)


def test_tied_tensor_parallel_plans_are_no_longer_refused():
    from runtime.model.config import load_runnable

    for overrides in [*FOUR_RANKS.values(), *TWO_RANKS.values()]:
        assert load_runnable(GPT, overrides).model.values["tied_embeddings"]


def test_dapple_run_prints_the_padded_vocabulary(capsys):
    from runtime.commands.run import print_run

    text = "vocabulary 201 padded to 256 at tensor parallel 2 (a multiple of 128 x 2; Megatron-LM ...)"
    summary = {"name": "n", "schedule": "1f1b", "num_stages": 1, "num_microbatches": 1, "world_size": 2,
               "backend": "gloo", "device_type": "cpu", "iteration_times_s": [0.1], "median_iteration_time_s": 0.1,
               "throughput_samples_per_s": 1.0, "losses": [1.0], "warmup_steps": 0, "devices": [],
               "trace": "t.json", "vocabulary": {"text": text}}
    print_run(summary, as_json=False)
    assert text in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.dist
def test_gpt2s_vocabulary_of_50257_runs_with_tensor_parallelism_on_gloo():
    gpt2 = {**SHIPPED, "model.vocab": "50257", "model.vocab_divisible_by": "128", "plan.tensor_parallel": "2",
            "plan.stages": "[{layers: [0, 6], devices: [0, 1]}]"}
    summary = _spawn(2, {"gpt2": gpt2})["gpt2"]
    assert_matches_unsplit(summary)
    assert summary["vocabulary"]["padded_at_tensor_parallel"] == 50432  # ceil(50,257 / 256) * 256

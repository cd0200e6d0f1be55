"""Context parallelism on real gloo ranks: ring attention over Megatron-LM's load-balanced cut
trains one step exactly like the unsplit model in one process (rtol 1e-5, fp32), alone and with
tensor (sequence) parallelism, pipeline stages, data-parallel replicas, ZeRO and FSDP2, with the
gpt and llama presets as shipped (tied embeddings), and with a llama MoE's expert parallelism
(dropless, and at a capacity factor that drops per context rank's tokens).

All cases of one world size share one set of processes (one spawn per world size).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.tensor.parallel")

from conftest import SCENARIOS, assert_matches_unsplit  # noqa: E402

pytestmark = pytest.mark.dist

ONE_STAGE_2 = "[{layers: [0, 6], devices: [0, 1]}]"
ONE_STAGE_4 = "[{layers: [0, 6], devices: [0, 1, 2, 3]}]"
PP2 = "[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 6], devices: [2, 3]}]"
TIED = {"model.tied_embeddings": "true"}  # the gpt preset's default (the scenario unties it)
LLAMA = {"model.preset": "llama", "model.kv_heads": "2", **TIED}
CP2 = {"plan.context_parallel": "2"}
CP2_4 = {"cluster.devices_per_node": "4", **CP2}

TWO_RANKS = {
    "cp2": {**CP2, **TIED, "plan.stages": ONE_STAGE_2},
    "llama-cp2": {**LLAMA, **CP2, "plan.stages": ONE_STAGE_2},
    "dp2": {**TIED, "plan.stages": ONE_STAGE_2},  # the same tokens per device, cut by samples
    # llama MoE: expert parallelism 2 over the two context ranks (each routes its own tokens)
    "moe-cp2-ep2": {"scenario": "moe_tiny_cpu.yaml", **CP2},
    # a capacity drops per device's call, on its context rank's chunks (grad_check.drop_groups)
    "moe-cp2-ep2-capacity": {"scenario": "moe_tiny_cpu.yaml", **CP2, "model.experts.capacity_factor": "0.75"},
}
FOUR_RANKS = {  # the combinations (-m slow)
    "cp2-tp2": {**CP2_4, **TIED, "plan.tensor_parallel": "2", "plan.stages": ONE_STAGE_4},
    "cp2-tp2-sp": {**CP2_4, **TIED, "plan.tensor_parallel": "2", "plan.sequence_parallel": "true",
                   "plan.stages": ONE_STAGE_4},
    "llama-cp2-tp2-sp": {**CP2_4, **LLAMA, "plan.tensor_parallel": "2", "plan.sequence_parallel": "true",
                         "plan.stages": ONE_STAGE_4},
    "cp2-pp2": {**CP2_4, **TIED, "plan.stages": PP2},  # the tied copies summed over context ranks too
    "cp2-dp2": {**CP2_4, **TIED, "plan.stages": ONE_STAGE_4},
    "cp2-dp2-zero1": {**CP2_4, "plan.sharding": "optimizer", "plan.stages": ONE_STAGE_4},
    "cp2-dp2-zero2": {**CP2_4, **TIED, "plan.sharding": "gradients", "plan.stages": ONE_STAGE_4},
    "cp2-dp2-fsdp": {**CP2_4, "plan.sharding": "full", "plan.stages": ONE_STAGE_4},
    "cp2-pp2-zb-h1": {**CP2_4, "plan.schedule": "zb-h1", "plan.stages": PP2},
    "cp2-pp2-selective": {**CP2_4, "plan.recompute": "selective", "plan.stages": PP2},
    "cp2-pp2-recompute": {**CP2_4, "plan.recompute": "true", "plan.stages": PP2},
    "cp2-interleaved": {**CP2_4, **TIED, "plan.schedule": "interleaved",
                        "plan.stages": "[{layers: [0, 2], devices: [0, 1]}, {layers: [2, 3], devices: [2, 3]},"
                                       " {layers: [3, 4], devices: [0, 1]}, {layers: [4, 6], devices: [2, 3]}]"},
    "moe-cp2-tp2-sp": {"scenario": "moe_tiny_cpu.yaml", **CP2_4, "plan.tensor_parallel": "2",
                       "plan.sequence_parallel": "true", "plan.stages": "[{layers: [0, 4], devices: [0, 1, 2, 3]}]"},
}


def _cases(device, cases: dict):
    from runtime.execution.session import SessionOptions, run_session

    torch.set_num_threads(1)  # ranks share the host's cores
    return {name: run_session(_runnable(overrides), SessionOptions(steps=1, check=True), device)
            for name, overrides in cases.items()}


def _runnable(overrides: dict):
    from runtime.model.config import load_runnable

    overrides = dict(overrides)
    return load_runnable(SCENARIOS / overrides.pop("scenario", "gpt_tiny_cpu.yaml"), overrides)


def _spawn(nproc: int, cases: dict):
    from runtime.execution.launch import spawn

    return spawn(_cases, nproc, cases)[0]


@pytest.fixture(scope="module")
def two_ranks():
    return _spawn(2, TWO_RANKS)


@pytest.mark.parametrize("name", sorted(TWO_RANKS))
def test_context_parallel_2_matches_the_unsplit_model(two_ranks, name):
    assert_matches_unsplit(two_ranks[name])


def test_each_context_rank_counts_the_activations_of_its_half_of_the_sequence(two_ranks):
    # context 2 and data 2 both leave a device half the tokens of the batch: the simulator predicts
    # the same activations for both, and the measured peaks (ring attention's saved blocks are 1/c
    # too: q, k, v, its output and log-sum-exp, no s × s scores) agree within 10%
    from sim.engine.run import run_scenario

    measured = {name: [d["memory_breakdown_bytes"]["activations"] for d in two_ranks[name]["devices"]]
                for name in ("cp2", "dp2")}
    predicted = {name: [d.memory_breakdown.activations for d in run_scenario(
        _runnable(TWO_RANKS[name]).scenario, engine="fast").summarize().devices] for name in ("cp2", "dp2")}
    assert predicted["cp2"] == predicted["dp2"]
    for cp, dp in zip(measured["cp2"], measured["dp2"]):
        assert cp == pytest.approx(dp, rel=0.10)


def test_the_context_ranks_losses_sum_to_the_whole_batch_mean(two_ranks):
    # each rank's mean over its 1/c of the tokens is scaled by 1/c; step 1 (after Adam's first
    # step) equals the data-parallel run's, which cuts the same batch by samples
    assert two_ranks["cp2"]["losses"][1] == pytest.approx(two_ranks["dp2"]["losses"][1], rel=1e-5)


@pytest.mark.slow
def test_context_parallelism_with_tensor_pipeline_data_and_sharding_matches_the_unsplit_model():
    results = _spawn(4, FOUR_RANKS)
    for name in FOUR_RANKS:
        assert_matches_unsplit(results[name])


@pytest.mark.slow
def test_the_shipped_context_parallel_scenario_runs_checked_from_the_command_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "runtime", "run", str(SCENARIOS / "gpt_tiny_cp_cpu.yaml"),
                             "--nproc", "2", "--steps", "1", "--json", "--check", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["parallelism"]["context"] == 2 and summary["world_size"] == 2
    assert_matches_unsplit(summary)


@pytest.mark.parametrize(("overrides", "message"), [
    # 36 tokens cut in 4 chunks (the scenario's check) leave each context rank 18: not 4 tensor ranks' parts
    ({**CP2, "model.seq_len": "36", "model.heads": "8", "plan.tensor_parallel": "4", "cluster.devices_per_node": "8",
      "plan.stages": "[{layers: [0, 6], devices: [0, 1, 2, 3, 4, 5, 6, 7]}]"}, "model.seq_len: not supported by the runtime"),
], ids=["context-part-not-in-4"])
def test_what_context_parallelism_cannot_run_is_one_line_before_launch(overrides, message):
    from sim.core.errors import DappleError

    with pytest.raises(DappleError) as info:
        _runnable(overrides)
    assert message in str(info.value) and "\n" not in str(info.value)

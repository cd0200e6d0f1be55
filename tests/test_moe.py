"""Mixtures of experts (issue 31, items 1-3): the all-to-all's closed form inside and across
servers, the memory of a sharded expert layer, the presets' parameter counts against their model
cards, one-line errors, and the two replays agreeing on an MoE plan."""

from __future__ import annotations

import pytest

from sim.core.errors import ScenarioError
from sim.core.experts import ExpertSpec, ImbalanceDraw
from sim.core.parallelism import Shard, Sharding
from sim.cost.comm import all_to_all, all_to_all_s
from sim.cost.compute import stage_cost
from sim.engine.run import run_scenario
from sim.engine.workload import GROUP
from sim.input.scenario import load_scenario, parse_scenario
from sim.models import build_model, shard_model
from sim.models.moe import parameter_counts

GIB = 2**30


def _tiny(plan: str, *, nodes: int = 1, per_node: int = 8, experts: str = "{count: 8, top_k: 2, ffn_hidden: 128}",
          batch: int = 8, microbatch: int = 8):
    text = f"""
name: moe-tiny
cluster: {{preset: dgx-h100, nodes: {nodes}, devices_per_node: {per_node}}}
model: {{preset: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, seq_len: 32, vocab: 128,
         experts: {experts}}}
training: {{global_batch_size: {batch}, microbatch_size: {microbatch}}}
plan: {plan}
"""
    return parse_scenario(text, source="moe-tiny.yaml")


def test_all_to_all_inside_a_server():
    cluster = _tiny("{pipeline_parallel: 1, data_parallel: 8, expert_parallel: 8}").cluster
    nbytes = 1.0 * GIB
    (phase,) = all_to_all([8], nbytes, cluster)
    # each of 8 sends 1/8 to each of the 7 others over NVSwitch: 7/8 of its bytes, at 450 GB/s x 0.78, one latency
    assert phase.bytes_per_device == pytest.approx(7 / 8 * GIB)
    assert all_to_all_s([8], nbytes, cluster) == pytest.approx(7 / 8 * GIB / (450e9 * 0.78) + 3e-6)


def test_all_to_all_across_servers():
    cluster = _tiny("{pipeline_parallel: 1, data_parallel: 64, expert_parallel: 64}", nodes=8, batch=64,
                    microbatch=64, experts="{count: 64, top_k: 2, ffn_hidden: 128}").cluster
    nbytes = 1.0 * GIB
    inside, across = all_to_all([8] * 8, nbytes, cluster)
    # 64 members, 8 a server: 7/64 to the server's others over NVLink, 56/64 through the GPU's own
    # 400 Gb/s NIC (8 NICs a server), the two at once: the slower is the time
    assert inside.bytes_per_device == pytest.approx(7 / 64 * GIB)
    assert across.bytes_per_device == pytest.approx(56 / 64 * GIB)
    expected = max(7 / 64 * GIB / (450e9 * 0.78) + 3e-6, 56 / 64 * GIB / 50e9 + 5e-6)
    assert all_to_all_s([8] * 8, nbytes, cluster) == pytest.approx(expected)
    assert all_to_all_s([1], nbytes, cluster) == 0.0


def test_the_engine_all_to_all_alone_takes_the_closed_form():
    scenario = _tiny("{pipeline_parallel: 1, data_parallel: 8, expert_parallel: 8}")
    part = scenario.resolved.model
    result = run_scenario(scenario, engine="simpy", contention=True)
    seconds = [times[1] - times[0] for cls, rec in zip(result.workload.classes, result.records)
               for op, times in zip(cls.ops, rec.op_times) if op.code == GROUP and op.kind.value == "F"]
    a2a = sum(layer.a2a_bytes for layer in part.layers)  # one sample a replica: 8 over 8 replicas
    assert seconds and max(seconds) == pytest.approx(all_to_all_s([8], 2 * a2a * 1, scenario.cluster), rel=1e-6)


def test_memory_of_a_sharded_expert_layer_under_zero1():
    experts = ExpertSpec(count=8, top_k=2, ffn_hidden=128)
    model = build_model("llama", layers=1, hidden=64, heads=4, kv_heads=2, seq_len=32, vocab=128, experts=experts)
    part = shard_model(model, Shard(expert=4, expert_tensor=2))
    block = part.layers[1]
    # 8/4 = 2 local experts, each SwiGLU (64 x 2·128 up, 128 x 64 down) split 2 ways: 2 x 12,288 = 24,576 params
    assert block.expert_param_bytes == 2 * (64 * 256 + 128 * 64) / 2 * 2
    cost = stage_cost(part, scenario_device(), 0, 3, 1, data_parallel=16, sharding=Sharding.OPTIMIZER,
                      expert_data_parallel=2)
    total, expert = part.param_bytes(), part.expert_param_bytes()
    # bf16 weights, Adam: 12 bytes of state a parameter, 6 per parameter byte; ZeRO-1 shards the
    # dense state over 16 devices and the experts' over the 2 that hold the same experts
    assert cost.states.parameters == total
    assert cost.states.gradients == total
    assert cost.states.optimizer == pytest.approx((total - expert) * 6 / 16 + expert * 6 / 2)


def scenario_device():
    return _tiny("{pipeline_parallel: 1, data_parallel: 8, expert_parallel: 8}").cluster.device


def _mla_projection_params(hidden: int = 7168, heads: int = 128, d_h: int = 128, d_c: int = 512, d_q: int = 1536,
                           rope: int = 64) -> int:
    """MLA's projections (DeepSeek-V3 report §2.1.1, dims from §4.2): q down and up (with the
    decoupled RoPE queries), kv down (with the shared RoPE key), kv up (keys and values), output."""
    return hidden * d_q + d_q * heads * (d_h + rope) + hidden * (d_c + rope) + d_c * heads * 2 * d_h \
        + heads * d_h * hidden


@pytest.mark.parametrize("path, total_b, active_b, attention_excess_b", [
    # Mixtral: exact shapes (Jiang et al. 2024, arXiv 2401.04088, §2: "47B parameters", "13B active",
    # rounded; the generator counts 46.70B / 12.88B)
    ("scenarios/mixtral_8x7b_h100_ep8.yaml", 47.0, 13.0, 0.0),
    # DeepSeek-V3 (arXiv 2412.19437v2, abstract: 671B / 37B): MLA as 128-head attention, 4h^2 less
    # MLA's projections from §4.2's d_c 512, d'_c 1536, d_h 128, d_h^R 64 (187.1M) more, x 61
    ("scenarios/deepseek_v3_h800_ep64.yaml", 671.0, 37.0, (4 * 7168**2 - _mla_projection_params()) * 61 / 1e9),
    # Qwen3-30B-A3B (30.5B / 3.3B): 64-wide heads where Qwen3's are 128 wide, (9.44M - 18.87M) x 48
    ("scenarios/qwen3_30b_a3b_h100_ep8.yaml", 30.5, 3.3,
     48 * ((2048 * (2048 + 512) + 2048**2) - (2048 * (4096 + 1024) + 4096 * 2048)) / 1e9),
])
def test_preset_parameter_counts_match_their_model_cards(path, total_b, active_b, attention_excess_b):
    counts = parameter_counts(load_scenario(path, ignore_plan=True).model)
    assert counts.total / 1e9 == pytest.approx(total_b, rel=0.02)
    assert (counts.active / 1e9 - attention_excess_b) == pytest.approx(active_b, rel=0.02)


@pytest.mark.parametrize("plan, experts, key", [
    ("{pipeline_parallel: 1, data_parallel: 8, expert_parallel: 3}", "{count: 8, top_k: 2, ffn_hidden: 128}",
     "plan.expert_parallel"),
    ("{pipeline_parallel: 1, data_parallel: 8, expert_parallel: 4}", "{count: 6, top_k: 2, ffn_hidden: 128}",
     "plan.expert_parallel"),
    ("{pipeline_parallel: 1, data_parallel: 8}", "{count: 8, top_k: 9, ffn_hidden: 128}", "model.experts.top_k"),
    ("{pipeline_parallel: 1, data_parallel: 8}", "{count: 8, top_k: 2, ffn_hidden: 128, layers: [5]}",
     "model.experts.layers"),
])
def test_bad_expert_settings_are_one_line_errors(plan, experts, key):
    with pytest.raises(ScenarioError) as info:
        _tiny(plan, experts=experts)
    message = str(info.value)
    assert "\n" not in message and f"{key}:" in message


def test_expert_parallel_on_a_dense_model_is_refused():
    text = """
name: dense
cluster: {preset: dgx-h100, nodes: 1}
model: {preset: llama, layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab: 128}
training: {global_batch_size: 8, microbatch_size: 8}
plan: {pipeline_parallel: 1, data_parallel: 8, expert_parallel: 2}
"""
    with pytest.raises(ScenarioError, match="plan.expert_parallel: the model has no experts"):
        parse_scenario(text, source="dense.yaml")


def test_expert_groups_follow_megatron_cores_layout():
    plan = _tiny("{pipeline_parallel: 1, data_parallel: 8, expert_parallel: 2, expert_tensor_parallel: 2}").plan
    # local rank r = etp + ETP·(ep + EP·edp): EP groups are ETP apart, expert-data groups EP·ETP apart
    assert plan.expert_groups(0) == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert plan.expert_data_groups(0) == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_both_replays_agree_on_an_moe_plan_without_contention():
    scenario = _tiny("{pipeline_parallel: 2, data_parallel: 4, expert_parallel: 4, schedule: 1f1b}",
                     batch=32, microbatch=8)
    simpy = run_scenario(scenario, engine="simpy", contention=False).summarize().iteration_time_s
    fast = run_scenario(scenario, engine="fast").summarize().iteration_time_s
    assert fast == pytest.approx(simpy, rel=1e-9)
    dense = run_scenario(_tiny("{pipeline_parallel: 2, data_parallel: 4, schedule: 1f1b}", batch=32, microbatch=8),
                         engine="fast").summarize().iteration_time_s
    assert fast != dense  # the all-to-all and the experts' layout cost something


def test_imbalance_and_capacity_slow_the_busiest_rank():
    device = scenario_device()

    def forward_s(**kw) -> float:
        experts = ExpertSpec(count=8, top_k=2, ffn_hidden=4096, **kw)
        model = build_model("llama", layers=1, hidden=1024, heads=8, seq_len=2048, vocab=128, experts=experts)
        return stage_cost(shard_model(model, Shard(expert=8)), device, 1, 2, 4).fwd_s
    even, skewed = forward_s(), forward_s(imbalance=2.0)
    capped = forward_s(imbalance=2.0, capacity_factor=1.25)
    drawn = forward_s(draw=ImbalanceDraw(distribution="zipf", parameter=1.0, seed=3))
    assert even < capped < skewed
    assert drawn > even
    assert ExpertSpec(count=8, top_k=2, ffn_hidden=8).rank_imbalance(8) == 1.0


def test_h800_preset_has_the_deepseek_v3_reports_links():
    cluster = load_scenario("scenarios/deepseek_v3_h800_ep64.yaml", ignore_plan=True).cluster
    # arXiv 2412.19437v2 §3.2.2: "NVLink offers a bandwidth of 160 GB/s, roughly 3.2 times that of IB (50 GB/s)"
    assert cluster.intra_node.bandwidth_bytes_per_s == 160e9
    assert cluster.inter_node.bandwidth_bytes_per_s == 50e9
    assert cluster.num_devices == 2048 and cluster.device.name == "H800-80GB"
    h100 = _tiny("{pipeline_parallel: 1, data_parallel: 8}").cluster.device
    assert cluster.device.peak_flop_per_s == h100.peak_flop_per_s  # the H100 SXM's compute (assumed)


def test_an_unsharded_optimizer_step_covers_what_the_device_holds():
    """Unsharded, a device steps its dense parameters and its own experts (all it holds); sharded
    over d devices, the step's bytes are chosen so that /d gives 1/d of the dense and 1/d_e of
    the experts: (P − E) + E·d/d_e."""
    from sim.core.parallelism import Sharding
    from sim.cost.experts import stepped_param_bytes

    dense, experts = 6.0e9, 4.0e9  # a device's bytes: dense part and its own experts
    assert stepped_param_bytes(dense + experts, experts, data_parallel=16, expert_data_parallel=2,
                               sharding=Sharding.NONE) == dense + experts
    sharded = stepped_param_bytes(dense + experts, experts, data_parallel=16, expert_data_parallel=2,
                                  sharding=Sharding.OPTIMIZER)
    assert sharded == dense + experts * 16 / 2
    assert sharded / 16 == dense / 16 + experts / 2

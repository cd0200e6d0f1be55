"""The experts' all-to-all beside compute (``plan.overlap.expert_all_to_all``, issue 31 item 3):
each action's dispatch and combine run on the communication stream beside its compute, so
only max(0, a2a − compute) is exposed, in both replays."""

from __future__ import annotations

import pytest

from sim.core.errors import ScenarioError, SpecError
from sim.cost.comm import all_to_all_s
from sim.cost.compute import all_to_all_share, layer_times_s, stage_cost
from sim.cost.overlap import communication_sms_slowdown, contended_s, exposed_beside_s, held_sms_s
from sim.engine.run import run_scenario
from sim.input.scenario import parse_scenario


def _scenario(overlap: str, *, hidden: int = 64, seq_len: int = 32, nodes: int = 1):
    text = f"""
name: moe-overlap
cluster: {{preset: dgx-h100, nodes: {nodes}, devices_per_node: {8 // nodes}, nics_per_node: {8 // nodes}}}
model: {{preset: llama, layers: 2, hidden: {hidden}, heads: 4, kv_heads: 2, seq_len: {seq_len}, vocab: 128,
         experts: {{count: 8, top_k: 2, ffn_hidden: {4 * hidden}}}}}
training: {{global_batch_size: 8, microbatch_size: 8}}
plan: {{pipeline_parallel: 1, data_parallel: 8, expert_parallel: 8, overlap: {overlap}}}
"""
    return parse_scenario(text, source="moe-overlap.yaml")


def test_exposed_beside_closed_form():
    assert exposed_beside_s(3.0, 1.0) == 2.0
    assert exposed_beside_s(1.0, 3.0) == 0.0


@pytest.mark.parametrize("hidden, seq_len, nodes", [(1024, 2048, 1), (512, 8192, 8)])
@pytest.mark.parametrize("engine", ["simpy", "fast"])
def test_overlap_hides_min_of_all_to_all_and_compute(engine, hidden, seq_len, nodes):
    blocking, hidden_a2a = _scenario("{}", hidden=hidden, seq_len=seq_len, nodes=nodes), \
        _scenario("{expert_all_to_all: true}", hidden=hidden, seq_len=seq_len, nodes=nodes)
    kw = {"contention": False} if engine == "simpy" else {}
    t_block = run_scenario(blocking, engine=engine, **kw).summarize().iteration_time_s
    t_hide = run_scenario(hidden_a2a, engine=engine, **kw).summarize().iteration_time_s
    # one stage, one micro-batch a replica (8 samples over 8 replicas): the forward's 2 and the
    # backward's 2 all-to-alls of a2a_bytes per sample, over 8 GPUs: one server's NVSwitch, or
    # one GPU on each of 8 servers (through the NICs)
    part, cluster = blocking.resolved.model, blocking.cluster
    a2a = sum(layer.a2a_bytes for layer in part.layers)
    a_f = all_to_all_s([8 // nodes] * nodes, 2 * a2a, cluster)
    a_b = all_to_all_s([8 // nodes] * nodes, 2 * a2a, cluster)
    cost = stage_cost(part, cluster.device, 0, len(part.layers), 1, data_parallel=8,
                      expert_data_parallel=1)
    # blocking: F + a_F + B + a_B; beside: max(F', a_F) + max(B', a_B), the compute slowed beside the
    # all-to-all (H100 preset's overlap_slowdown s: F' = F + min(a_F·s/(1 + s), s·F)); the difference
    # is the hidden part
    slow = cluster.device.overlap_slowdown
    assert slow == 0.189
    f_c, b_c = contended_s(cost.fwd_s, a_f, slow), contended_s(cost.bwd_s, a_b, slow)
    assert f_c == pytest.approx(cost.fwd_s + min(a_f * slow / (1 + slow), slow * cost.fwd_s), rel=1e-12)
    hidden_s = (cost.fwd_s + a_f - f_c - exposed_beside_s(a_f, f_c)) \
        + (cost.bwd_s + a_b - b_c - exposed_beside_s(a_b, b_c))
    assert t_block - t_hide == pytest.approx(hidden_s, rel=1e-6, abs=1e-12)
    assert hidden_s > 0
    # across servers the all-to-all outlasts the forward (partly exposed); inside one it hides whole
    assert (a_f > cost.fwd_s) == (nodes == 8)


def test_overlap_key_must_be_a_boolean():
    with pytest.raises(ScenarioError, match="expert_all_to_all"):
        _scenario("{expert_all_to_all: 3}")


def test_communication_sms_slowdown_is_their_share_of_the_sms():
    # DeepSeek-V3 §3.2.2: 20 of 132 SMs communicate; the compute on the other 112 runs 132/112
    # times as long: s = 20/112, and beside G seconds of all-to-all it loses G·20/132
    s = communication_sms_slowdown(132, 20)
    assert s == pytest.approx(20 / 112, rel=1e-15)
    assert contended_s(10.0, 1.0, s) == pytest.approx(10.0 + 20 / 132, rel=1e-12)
    assert contended_s(1.0, 10.0, s) == pytest.approx(132 / 112, rel=1e-12)  # all of it beside: 112 SMs
    with pytest.raises(SpecError, match="communication_sms"):
        communication_sms_slowdown(0, 20)  # the device gives no SM count
    with pytest.raises(SpecError, match="communication_sms"):
        communication_sms_slowdown(132, 132)


def test_communication_sms_replace_the_overlap_slowdown_beside_the_all_to_all():
    shape = dict(hidden=1024, seq_len=2048, nodes=1)
    generic = _scenario("{expert_all_to_all: true}", **shape)
    sms = _scenario("{expert_all_to_all: true, communication_sms: 20}", **shape)
    assert sms.cluster.device.sm_count == 132  # the H100 preset
    part, cluster = generic.resolved.model, generic.cluster
    a = all_to_all_s([8], 2 * sum(layer.a2a_bytes for layer in part.layers), cluster)
    cost = stage_cost(part, cluster.device, 0, len(part.layers), 1, data_parallel=8, expert_data_parallel=1)
    assert a < cost.fwd_s  # hidden whole: each action lasts its slowed compute

    t_generic = run_scenario(generic, engine="fast").summarize().iteration_time_s
    t_sms = run_scenario(sms, engine="fast").summarize().iteration_time_s
    generic_s = contended_s(cost.fwd_s, a, 0.189) + contended_s(cost.bwd_s, a, 0.189)
    # DualPipe's dedicated SMs (DeepSeek-V3 §3.2.1): held while the MoE blocks compute, not only for
    # the a seconds the bytes take, so those blocks run on 112 of 132 SMs throughout; the
    # embedding and the head beside them keep all 132
    blocks = [layer for layer in part.layers if layer.a2a_bytes > 0]
    assert [layer.name for layer in blocks] == ["block_0", "block_1"]
    moe_s = sum(sum(layer_times_s(layer, cluster.device, part.dtype, 1)[:2]) for layer in blocks)
    assert moe_s < cost.fwd_s + cost.bwd_s
    held_s = cost.fwd_s + cost.bwd_s + moe_s * 20 / 112
    assert t_sms - t_generic == pytest.approx(held_s - generic_s, rel=1e-6)
    assert held_s - generic_s > 0  # held for the blocks costs more than the generic slowdown for a seconds


def test_held_sms_slow_the_moe_blocks_beside_an_all_to_all():
    s = communication_sms_slowdown(132, 20)
    assert held_sms_s(10.0, 1.0, s) == pytest.approx(10.0 * 132 / 112, rel=1e-12)  # 1 s of bytes: all 10 s slowed
    assert held_sms_s(10.0, 1.0, s, 0.25) == pytest.approx(7.5 + 2.5 * 132 / 112, rel=1e-12)  # a quarter MoE blocks
    assert held_sms_s(10.0, 0.0, s) == 10.0  # nothing beside it: all 132 SMs
    assert held_sms_s(10.0, 1.0, 0.0) == 10.0


def test_communication_sms_must_be_a_count_below_the_device_sms():
    with pytest.raises(ScenarioError, match="communication_sms"):
        _scenario("{expert_all_to_all: true, communication_sms: -1}")
    with pytest.raises(SpecError, match="communication_sms"):
        run_scenario(_scenario("{expert_all_to_all: true, communication_sms: 132}"), engine="fast")


def test_all_to_all_share_is_the_moe_blocks_part_of_the_stage_compute():
    scenario = _scenario("{expert_all_to_all: true}", hidden=1024, seq_len=2048)
    part, device = scenario.resolved.model, scenario.cluster.device
    assert device.action_overhead_s == 0  # the H100 preset: a stage's time is its layers'
    names = [layer.name for layer in part.layers]
    assert names == ["embedding", "block_0", "block_1", "head"]
    assert all_to_all_share(part, device, 1, 3, 1) == (pytest.approx(1.0, rel=1e-12), pytest.approx(1.0, rel=1e-12))
    assert all_to_all_share(part, device, 0, 1, 1) == (0.0, 0.0)  # the embedding: no all-to-all
    fwd = sum(layer_times_s(part.layers[i], device, part.dtype, 1)[0] for i in (1, 2))
    total = sum(layer_times_s(layer, device, part.dtype, 1)[0] for layer in part.layers)
    assert all_to_all_share(part, device, 0, 4, 1)[0] == pytest.approx(fwd / total, rel=1e-12)

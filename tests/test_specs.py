"""Specs: invariants checked at construction, and plan checks against a model and cluster."""

from __future__ import annotations

import pytest

from sim.core.errors import SpecError
from sim.core.model_spec import LayerSpec, ModelSpec
from sim.core.plan import PlanSpec, StageSpec, check_plan
from sim.core.specs import ClusterSpec, DeviceSpec, LinkSpec, optimizer_state_factor
from sim.core.training import TrainingSpec
from sim.cost.compute import stage_cost
from sim.cost.memory import static_bytes
from sim.cost.split import split_samples

V100 = DeviceSpec(
    name="V100", memory_bytes=16 * 2**30, peak_flop_per_s=125e12, peak_fp32_flop_per_s=15.7e12,
    memory_bandwidth_bytes_per_s=900e9, efficiency=0.5,
)


def _plan(*stages, schedule="dapple"):
    return PlanSpec(stages=tuple(StageSpec(layers=l, devices=d) for l, d in stages), schedule=schedule)


def test_optimizer_state_factor():
    assert optimizer_state_factor("adam", "fp32") == 2.0  # two fp32 moments per fp32 parameter
    assert optimizer_state_factor("adam", "fp16") == 6.0  # master copy + two moments, 12 B per 2 B
    assert optimizer_state_factor("sgd", "fp32") == 0.0
    assert optimizer_state_factor("momentum", "bf16") == 4.0
    with pytest.raises(SpecError, match="unknown optimizer"):
        optimizer_state_factor("adamax", "fp32")


def test_cluster_device_ids_and_nics():
    link = LinkSpec(bandwidth_bytes_per_s=1e9)
    cluster = ClusterSpec(nodes=2, devices_per_node=8, device=V100, intra_node=link, inter_node=link, nics_per_node=4)
    assert cluster.num_devices == 16
    assert cluster.node_of(9) == 1
    assert [cluster.nic_of(d) for d in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert cluster.nic_of(15) == 7
    with pytest.raises(SpecError, match="nics_per_node"):
        ClusterSpec(nodes=1, devices_per_node=2, device=V100, intra_node=link, inter_node=link, nics_per_node=4)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"memory_bytes": 0}, "memory"),
        ({"efficiency": 1.5}, "efficiency"),
        ({"peak_flop_per_s": float("nan")}, "peak_flops"),
    ],
)
def test_device_rejects(kwargs, key):
    base = dict(name="x", memory_bytes=1.0, peak_flop_per_s=1.0, peak_fp32_flop_per_s=1.0, memory_bandwidth_bytes_per_s=1.0)
    with pytest.raises(SpecError) as info:
        DeviceSpec(**{**base, **kwargs})
    assert info.value.key == key


def test_training_microbatches():
    assert TrainingSpec(global_batch_size=128, microbatch_size=16).num_microbatches == 8
    with pytest.raises(SpecError, match="use a divisor such as 2 or 4"):
        TrainingSpec(global_batch_size=128, microbatch_size=3)


def test_plan_device_groups_and_ranks():
    plan = _plan(((0, 2), (0, 1)), ((2, 4), (2, 3)), ((4, 6), (1, 0)), ((6, 8), (3, 2)), schedule="interleaved")
    assert plan.device_groups == ((0, 1), (2, 3))
    assert plan.stage_ranks == (0, 1, 0, 1)
    check_plan(plan, num_layers=8, num_devices=4)
    with pytest.raises(SpecError, match="only the interleaved schedule"):
        check_plan(_plan(((0, 2), (0,)), ((2, 4), (0,))), num_layers=4, num_devices=1)
    with pytest.raises(SpecError, match="two different device sets"):
        _plan(((0, 2), (0, 1)), ((2, 4), (1, 2)))


@pytest.mark.parametrize(
    ("stages", "key", "message"),
    [
        ((((0, 3), (0,)), ((4, 8), (1,))), "stages[1].layers", "leaves a gap"),
        ((((0, 5), (0,)), ((4, 8), (1,))), "stages[1].layers", "overlaps"),
        ((((0, 3), (0,)), ((3, 7), (1,))), "stages[1].layers", "ends at layer 7"),
        ((((0, 3), (0,)), ((3, 9), (1,))), "stages[1].layers", "runs past"),
        ((((0, 3), (0,)), ((3, 8), (4,))), "stages[1].devices", "device 4 does not exist"),
        ((((1, 3), (0,)), ((3, 8), (1,))), "stages[0].layers", "leaves a gap"),
    ],
)
def test_check_plan_rejects(stages, key, message):
    with pytest.raises(SpecError, match=message) as info:
        check_plan(_plan(*stages), num_layers=8, num_devices=4)
    assert info.value.key == key


def test_more_stages_than_layers():
    plan = _plan(((0, 1), (0,)), ((1, 2), (1,)), ((2, 3), (2,)))
    with pytest.raises(SpecError, match="3 stages for a model of 2 layers"):
        check_plan(plan, num_layers=2, num_devices=4)


def _model(**kw):
    layers = (
        LayerSpec(name="a", param_bytes=100.0, output_bytes=10.0, stash_bytes=30.0, fwd_s=1e-3, bwd_s=2e-3),
        LayerSpec(name="b", param_bytes=50.0, output_bytes=5.0, stash_bytes=20.0, fwd_flop=1e9, bwd_flop=2e9),
    )
    return ModelSpec(name="m", layers=layers, boundary_bytes=(7.0, 10.0, 0.0), **kw)


def test_stage_cost_measured_and_flop_layers():
    model = _model(dtype="fp32", optimizer="adam")
    cost = stage_cost(model, V100, 0, 2, samples=4)
    flop_s = 1e9 * 4 / (15.7e12 * 0.5)  # fp32 model: fp32 peak times efficiency
    assert cost.fwd_s == pytest.approx(4e-3 + flop_s)
    assert cost.bwd_s == pytest.approx(8e-3 + 2 * flop_s)
    assert cost.stash_bytes == pytest.approx(4 * 50.0)
    assert cost.input_bytes == pytest.approx(4 * 7.0)
    assert cost.static_bytes == pytest.approx(150.0 * (1 + 1 + 2))  # params, grads, two moments
    recomputed = stage_cost(model, V100, 0, 2, samples=4, recompute=True)
    assert recomputed.bwd_s == pytest.approx(cost.bwd_s + cost.fwd_s)
    assert recomputed.stash_bytes == pytest.approx(4 * 7.0)
    assert static_bytes(model, 1, 2) == pytest.approx(50.0 * 4)


def test_split_samples():
    assert split_samples(16, 8) == (2,) * 8
    assert split_samples(5, 3) == (2, 2, 1)
    assert split_samples(2, 4) == (1, 1, 0, 0)
    assert sum(split_samples(97, 15)) == 97


def test_layer_needs_times_or_flops():
    with pytest.raises(SpecError, match="neither times nor FLOPs"):
        LayerSpec(name="x", param_bytes=10.0, output_bytes=1.0, stash_bytes=1.0)
    with pytest.raises(SpecError, match="both forward and backward"):
        LayerSpec(name="x", param_bytes=10.0, output_bytes=1.0, stash_bytes=1.0, fwd_s=1.0)


def test_a_link_charges_the_sender_for_issuing_a_send():
    assert LinkSpec(bandwidth_bytes_per_s=1e9).send_issue_s(1e6) == 0.0  # GPUs: nothing
    link = LinkSpec(bandwidth_bytes_per_s=1e9, send_overhead_s=1e-4, send_bandwidth_bytes_per_s=1e10)
    assert link.send_issue_s(1e6) == pytest.approx(1e-4 + 1e-4)
    assert link.send_issue_s(0) == 0.0  # nothing sent, nothing issued
    assert LinkSpec(bandwidth_bytes_per_s=1e9, send_overhead_s=2e-4).send_issue_s(1e9) == pytest.approx(2e-4)
    with pytest.raises(SpecError, match="send_overhead"):
        LinkSpec(bandwidth_bytes_per_s=1e9, send_overhead_s=-1e-6)


def test_a_scenario_sets_the_send_issue_cost_per_link():
    from conftest import SCENARIOS
    from sim.input.scenario import load_scenario

    path = SCENARIOS / "gpt_tiny_cpu.yaml"
    plain = load_scenario(path)
    assert plain.cluster.intra_node.send_overhead_s == 0.0 and plain.cluster.intra_node.send_bandwidth_bytes_per_s is None
    charged = load_scenario(path, {"cluster.intra_node.send_overhead": "120us", "cluster.intra_node.send_bandwidth": "4GB/s"})
    assert charged.cluster.intra_node.send_overhead_s == pytest.approx(120e-6)
    assert charged.cluster.intra_node.send_bandwidth_bytes_per_s == pytest.approx(4e9)
    assert charged.cluster.inter_node.send_overhead_s == 0.0

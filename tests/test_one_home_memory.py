"""One home for memory and compute: the engine, ``dapple-sim check``, the planner's tables and
its memory check before a replay all get a plan's memory at rest from
``sim.cost.memory.stage_state_bytes``, and the planner's prefix sums add up the same per-layer
terms as ``sim.cost.compute.stage_cost``.

For plans that cover every sharding (none, optimizer, gradients, full), every recompute mode
(none, selective, full), tensor parallelism 1, 2 and 8, and a tied embedding split over two
stages, the per-device memory at rest must be the same float in all four places; the ZeRO
closed forms are written out for the small cases.
"""

from __future__ import annotations

import pytest

from planner.search.costs import CostTables
from planner.search.memory import plan_peak_bytes
from sim.app.check import describe
from sim.core.parallelism import Recompute, Sharding
from sim.cost.compute import stage_cost
from sim.cost.split import split_samples
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario
from sim.models import shard_model

TINY = "scenarios/gpt_tiny_cpu.yaml"
LLAMA = "scenarios/llama3_70b_h100_fsdp.yaml"
GPT3 = "scenarios/gpt3_175b_a100_tp8_pp8.yaml"
ONE_STAGE_TWO_DEVICES = {"plan.stages": "[{layers: [0, 6], devices: [0, 1]}]"}

CASES = {
    "tiny, two stages": (TINY, {}),
    "tiny, tied embedding over two stages": (TINY, {"model.tied_embeddings": "true"}),
    **{f"tiny, d=2, sharding {s.value}": (TINY, {**ONE_STAGE_TWO_DEVICES, "plan.sharding": s.value})
       for s in Sharding},
    **{f"tiny, two stages, recompute {r.value}": (TINY, {"plan.recompute": r.value}) for r in Recompute},
    "tiny, t=2": (TINY, {**ONE_STAGE_TWO_DEVICES, "plan.tensor_parallel": "2", "plan.sequence_parallel": "true"}),
    "llama3 70b, t=8, fsdp over 8, selective": (LLAMA, {}),
    "llama3 70b, t=8, zero-1 over 8, full recompute": (LLAMA, {"plan.sharding": "optimizer", "plan.recompute": "full"}),
    # a third is not a binary fraction: the same float only if every place divides alike
    "llama3 70b, t=8, fsdp over 3": (LLAMA, {"cluster.nodes": "3", "plan.data_parallel": "3"}),
    "gpt3 175b, t=8, interleaved, tied": (GPT3, {}),
    "gpt3 175b, t=8, interleaved, zero-2 over 3, full recompute": (GPT3, {"cluster.nodes": "24",
                                                                          "plan.data_parallel": "3",
                                                                          "plan.sharding": "gradients",
                                                                          "plan.recompute": "full"}),
}


def _planner_static(scenario) -> dict[int, float]:
    """Per device, the planner table's ``static_bytes`` summed over its stages in stage order."""
    plan = scenario.plan
    tables = CostTables(scenario, tensor_parallel=plan.tensor_parallel, context_parallel=plan.context_parallel)
    held: dict[int, float] = {}
    for s, stage in enumerate(plan.stages):
        static = tables.static_bytes(*stage.layers, plan.num_replicas(s), plan.sharding)
        for device in stage.devices:
            held[device] = held.get(device, 0.0) + static
    return held


@pytest.mark.parametrize("name", sorted(CASES))
def test_memory_at_rest_is_one_number_everywhere(name):
    path, overrides = CASES[name]
    scenario = load_scenario(path, overrides=overrides)
    result = run_scenario(scenario, engine="fast")
    engine = {d.device: d.memory_breakdown for d in result.summarize().devices}
    engine_static = {device: cls.static_bytes for cls in result.workload.classes for device in cls.devices}
    checked = {d.device: d for d in describe(scenario).plan.devices}
    planner = _planner_static(scenario)
    assert sorted(engine) == sorted(checked) == sorted(planner)
    for device, kinds in engine.items():
        by_kind = checked[device].by_kind
        assert (kinds.parameters, kinds.gradients, kinds.optimizer) == \
               (by_kind.parameters, by_kind.gradients, by_kind.optimizer)
        assert engine_static[device] == checked[device].memory_at_rest_bytes == planner[device]
        assert kinds.parameters + kinds.gradients + kinds.optimizer == pytest.approx(planner[device], rel=1e-15)
    estimate = plan_peak_bytes(scenario.resolved)
    assert estimate.static_bytes == planner[estimate.device] == engine_static[estimate.device]


def test_zero_closed_forms_on_two_devices():
    """One stage on two fp32 devices with Adam: P of parameters, P of gradients, 2P of moments;
    ZeRO-1 shards the moments (P + P + P), ZeRO-2 the gradients too (P + P/2 + P), ZeRO-3
    everything ((P + P + 2P)/2) (Rajbhandari et al. 2020, §5.1)."""
    P = load_scenario(TINY).model.param_bytes()
    expected = {Sharding.NONE: (P, P, 2 * P), Sharding.OPTIMIZER: (P, P, P),
                Sharding.GRADIENTS: (P, P / 2, P), Sharding.FULL: (P / 2, P / 2, P)}
    for sharding, (params, grads, states) in expected.items():
        scenario = load_scenario(TINY, overrides={**ONE_STAGE_TWO_DEVICES, "plan.sharding": sharding.value})
        device = describe(scenario).plan.devices[0]
        kinds = device.by_kind
        assert (kinds.parameters, kinds.gradients, kinds.optimizer) == (params, grads, states)
        assert device.memory_at_rest_bytes == params + grads + states
        assert CostTables(scenario).static_bytes(0, 6, 2, sharding) == params + grads + states


def test_a_tied_embedding_split_over_two_stages_keeps_a_copy_on_the_heads():
    """The head's stage holds its own copy of the vocab × hidden matrix (128 × 64 fp32), with its
    gradient and its two Adam moments: 4 bytes of states per byte of it."""
    scenario = load_scenario(TINY, overrides={"model.tied_embeddings": "true"})
    model = scenario.model
    copy = 128 * 64 * 4
    stages = describe(scenario).plan.stages
    assert stages[1].param_bytes == model.param_bytes(3, 6) + copy
    assert stages[1].memory_at_rest_bytes == 4 * (model.param_bytes(3, 6) + copy)
    assert stages[0].memory_at_rest_bytes == 4 * model.param_bytes(0, 3)  # the matrix itself, once
    assert CostTables(scenario).static_bytes(3, 6) == stages[1].memory_at_rest_bytes


def test_mixed_precision_adam_holds_sixteen_bytes_per_parameter():
    """GPT-3 175B in fp16 with Adam, unsharded: 2 + 2 + 12 bytes per parameter, 8 per parameter
    byte (ZeRO §3.1); a device of the interleaved plan holds three chunks."""
    scenario = load_scenario(GPT3)
    part = shard_model(scenario.model, scenario.plan.shard)
    for stage, described in zip(scenario.plan.stages, describe(scenario).plan.stages):
        assert described.memory_at_rest_bytes == 8 * part.stage_param_bytes(*stage.layers)
    device = describe(scenario).plan.devices[0]
    assert device.stages == (0, 8, 16)
    assert device.memory_at_rest_bytes == sum(8 * part.stage_param_bytes(*scenario.plan.stages[s].layers)
                                              for s in (0, 8, 16))


@pytest.mark.parametrize("path", [TINY, GPT3])
@pytest.mark.parametrize("recompute", list(Recompute))
def test_the_planner_tables_time_and_stash_are_stage_costs(path, recompute):
    """The tables' prefix sums of ``stage_cost``'s per-layer terms give its forward, backward and
    stash for every stage of the plan, recompute included (one tensor-parallel rank, so the tables
    add no collective; equal up to the order of the float additions: differences of prefix sums
    against a running sum)."""
    scenario = load_scenario(path, overrides={"plan.tensor_parallel": "1", "plan.sequence_parallel": "false"}
                             if path == GPT3 else {})
    plan, training = scenario.plan, scenario.training
    model = shard_model(scenario.model, plan.shard)
    tables = CostTables(scenario)
    for s, stage in enumerate(plan.stages):
        samples = split_samples(training.microbatch_size, plan.num_replicas(s))[0]
        cost = stage_cost(model, scenario.cluster.device, *stage.layers, samples, recompute=recompute)
        fwd_s, bwd_s = tables.compute_s(*stage.layers, samples, recompute)
        assert (fwd_s, bwd_s) == (pytest.approx(cost.fwd_s, rel=1e-12), pytest.approx(cost.bwd_s, rel=1e-12))
        assert tables.stash_bytes(*stage.layers, samples, recompute=recompute) == \
               pytest.approx(cost.stash_bytes, rel=1e-12)
        assert tables.optimizer_s(*stage.layers) == cost.optimizer_s - cost.tied_allreduce_s


def test_recompute_adds_the_forward_or_the_attention_core_to_the_backward():
    """Full recompute runs the forward again inside the backward; selective only attention's
    core; the action overhead is paid once per action either way."""
    scenario = load_scenario(TINY)
    model, device = scenario.model, scenario.cluster.device
    none, selective, full = (stage_cost(model, device, 0, 3, 4, recompute=r)
                             for r in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL))
    overhead = device.action_overhead_s
    assert full.bwd_s == pytest.approx(none.bwd_s + (none.fwd_s - overhead))
    assert none.bwd_s < selective.bwd_s < full.bwd_s
    assert none.fwd_s == selective.fwd_s == full.fwd_s

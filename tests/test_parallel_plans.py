"""4D plans in the simulator: tensor, sequence and context parallelism and sharded data
parallelism — the plan keys, the memory each device holds, the collectives, and the replays'
invariants on random plans."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO
from sim.core.errors import ScenarioError
from sim.core.parallelism import Recompute, Sharding
from sim.cost.comm import ring_bytes
from sim.engine.compile import compile_workload
from sim.engine.fastpath import replay
from sim.engine.replay import simulate
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario, parse_scenario

MODEL = "{preset: gpt, layers: 4, hidden: 64, heads: 4, seq_len: 32, vocab: 128, dtype: fp16}"


def _scenario(plan: str, *, nodes: int = 2, per_node: int = 4, batch: int = 8, microbatch: int = 4, model=MODEL):
    text = f"""
name: four-d
cluster: {{preset: a100-nvlink-8, nodes: {nodes}, devices_per_node: {per_node}, nics_per_node: 1}}
model: {model}
training: {{global_batch_size: {batch}, microbatch_size: {microbatch}}}
plan: {plan}
"""
    return parse_scenario(text, source="four-d.yaml")


def test_a_grid_is_laid_out_in_megatrons_rank_order_with_balanced_stages():
    scenario = _scenario("{schedule: dapple, tensor_parallel: 2, pipeline_parallel: 2, data_parallel: 2}")
    plan = scenario.plan
    assert [s.devices for s in plan.stages] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert plan.tensor_groups(0) == ((0, 1), (2, 3)) and plan.replicas(1) == ((4, 5), (6, 7))
    assert plan.gradient_groups(0) == ((0, 2), (1, 3))
    # 6 layers (embedding, 4 blocks, head): the head's vocabulary projection is cheap here
    assert plan.stages[0].layers[0] == 0 and plan.stages[1].layers[1] == scenario.model.num_layers
    interleaved = _scenario("{schedule: {name: interleaved, chunks: 2}, pipeline_parallel: 2, data_parallel: 1}",
                            per_node=2, nodes=1)
    assert [s.devices for s in interleaved.plan.stages] == [(0,), (1,), (0,), (1,)]


@pytest.mark.parametrize("plan, key", [
    ("{schedule: dapple, tensor_parallel: 3, pipeline_parallel: 1, data_parallel: 1}", "plan.tensor_parallel"),
    ("{schedule: dapple, sequence_parallel: true, pipeline_parallel: 1, data_parallel: 2}", "plan.sequence_parallel"),
    ("{schedule: dapple, context_parallel: 3, pipeline_parallel: 1, data_parallel: 1}", "plan.context_parallel"),
    ("{tensor_parallel: 2, stages: [{layers: [0, 6], devices: [0, 1, 2]}]}", "plan.stages[0].devices"),
    ("{sharding: zero, pipeline_parallel: 1, data_parallel: 2}", "plan.sharding"),
    ("{recompute: some, pipeline_parallel: 1, data_parallel: 2}", "plan.recompute"),
    ("{pipeline_parallel: 4, data_parallel: 4}", "plan"),
])
def test_impossible_degrees_are_one_line_naming_the_key(plan, key):
    with pytest.raises(ScenarioError) as info:
        _scenario(plan)
    message = str(info.value)
    assert message.startswith(f"four-d.yaml: {key}:") and "\n" not in message


def _breakdown(scenario):
    summary = run_scenario(scenario, engine="fast").summarize()
    return summary, summary.devices[0].memory_breakdown


@pytest.mark.parametrize("t", [2, 4])
def test_parameter_bytes_fall_by_t_apart_from_the_replicated_ones(t):
    whole, _ = _breakdown(_scenario("{schedule: gpipe, pipeline_parallel: 1, data_parallel: 1}"))
    split, _ = _breakdown(_scenario(f"{{schedule: gpipe, tensor_parallel: {t}, pipeline_parallel: 1, "
                                    "data_parallel: 1}"))
    h, layers, s = 64, 4, 32
    # replicated: per block the two row-parallel biases and two LayerNorms (6h), the position
    # table (s·h) and the final LayerNorm (2h); all fp16
    replicated = 2 * (layers * 6 * h + s * h + 2 * h)
    total = whole.devices[0].memory_breakdown.parameters
    # the token table of 128 rows is padded to 128·t (sim.models.vocab): 128 rows on each device
    table = 2 * 128 * h
    assert split.devices[0].memory_breakdown.parameters == pytest.approx((total - replicated - table) / t
                                                                         + replicated + table)
    assert split.parallelism.tensor == t and split.num_devices == t


@pytest.mark.parametrize("sharding, shrinks", [("optimizer", {"optimizer"}), ("gradients", {"optimizer", "gradients"}),
                                               ("full", {"optimizer", "gradients", "parameters"})])
def test_sharding_divides_the_states_it_names_by_the_data_parallel_degree(sharding, shrinks):
    d = 4
    _, plain = _breakdown(_scenario(f"{{schedule: gpipe, pipeline_parallel: 1, data_parallel: {d}}}"))
    _, sharded = _breakdown(_scenario(f"{{schedule: gpipe, sharding: {sharding}, pipeline_parallel: 1, "
                                      f"data_parallel: {d}}}"))
    for kind in ("parameters", "gradients", "optimizer"):
        expected = getattr(plain, kind) / (d if kind in shrinks else 1)
        assert getattr(sharded, kind) == pytest.approx(expected), kind


def test_tensor_parallel_collectives_per_action_are_megatrons_four_per_block():
    scenario = _scenario("{schedule: gpipe, tensor_parallel: 2, pipeline_parallel: 1, data_parallel: 1}",
                         microbatch=2, batch=4)
    workload = compile_workload(scenario)
    forward = [c for c in workload.group_collectives if workload.kinds[c.phases[0][0][0]].label == ("TP", 0, "F")]
    assert len(forward) == 1
    # 4 blocks x 2 all-reduces of s·h fp16 per sample, 2 samples; the embedding's one all-reduce;
    # each of the 2 ranks sends a ring all-reduce's 2(t−1)/t of it
    s, h = 32, 64
    # each of the 2 ranks sends a ring all-reduce's 2(t−1)/t of it, charged at the link's collective
    # bandwidth (bytes / collective_efficiency, sim.cost.comm.ring_flow_bytes)
    per_allreduce = ring_bytes(2, 2 * s * h * 2, halves=2) / scenario.cluster.intra_node.collective_efficiency
    assert forward[0].bytes == pytest.approx((4 * 2 + 1) * per_allreduce)
    ops = workload.classes[0].ops
    texts = [(op.code, op.text) for op in ops[:3]]
    assert texts[0][1] == "0F0" and texts[1] == (4, "0F0")  # the compute, then its blocking collective


_DEGREES = st.fixed_dictionaries({
    "t": st.sampled_from([1, 2]), "c": st.sampled_from([1, 2]), "sp": st.booleans(), "p": st.sampled_from([1, 2]),
    "d": st.sampled_from([1, 2]), "sharding": st.sampled_from([s.value for s in Sharding]),
    "recompute": st.sampled_from([r.value for r in Recompute]), "schedule": st.sampled_from(["gpipe", "dapple"]),
    "microbatch": st.sampled_from([2, 4]),
})


def _random(degrees) -> object:
    sp = degrees["sp"] and degrees["t"] > 1
    plan = (f"{{schedule: {degrees['schedule']}, tensor_parallel: {degrees['t']}, context_parallel: {degrees['c']}, "
            f"sequence_parallel: {str(sp).lower()}, sharding: {degrees['sharding']}, recompute: {degrees['recompute']}, "
            f"pipeline_parallel: {degrees['p']}, data_parallel: {degrees['d']}}}")
    return _scenario(plan, nodes=4, microbatch=degrees["microbatch"], batch=2 * degrees["microbatch"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_DEGREES)
def test_fast_path_equals_engine_without_contention_and_symmetry_is_exact(degrees):
    scenario = _random(degrees)
    reduced, full = compile_workload(scenario), compile_workload(scenario, symmetric=False)
    fast, engine = replay(reduced), simulate(reduced, contention=False)
    assert fast.iteration_time_s == pytest.approx(engine.iteration_time_s, rel=1e-9)
    assert simulate(full).iteration_time_s == pytest.approx(simulate(reduced).iteration_time_s, rel=1e-9)
    a, b = fast.summary(), simulate(full, contention=False).summary()
    assert [d["peak_memory_bytes"] for d in a["devices"]] == pytest.approx([d["peak_memory_bytes"] for d in b["devices"]])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_DEGREES)
def test_bytes_balance_and_memory_returns_to_rest(degrees):
    workload = compile_workload(_random(degrees))
    sizes = {c.index: len(c.devices) for c in workload.classes}
    for kind in workload.kinds:  # every real flow is sent by one device and received by another
        assert kind.send_bytes_per_device * sizes[kind.src_class] == pytest.approx(
            kind.recv_bytes_per_device * sizes[kind.dst_class])
    result = replay(workload)
    for cls in workload.classes:
        times, values = result.memory_timeline(cls.devices[0])
        assert values[-1] == pytest.approx(cls.static_bytes, abs=1e-6 * max(values))


@pytest.mark.parametrize("name", ["gpt3_175b_a100_tp8_pp8", "llama3_70b_h100_fsdp",
                                  "llama3_8b_h100_context_parallel"])
def test_shipped_4d_scenarios_simulate_and_fit(name):
    scenario = load_scenario(REPO / "scenarios" / f"{name}.yaml")
    summary = run_scenario(scenario, engine="fast").summarize()
    assert not summary.oom and summary.iteration_time_s > 0 and summary.mfu is not None and 0 < summary.mfu < 1
    assert summary.tokens_per_s == pytest.approx(summary.throughput_samples_per_s * scenario.model.preset.values["seq_len"])
    breakdown = summary.devices[0].memory_breakdown
    parts = breakdown.parameters + breakdown.gradients + breakdown.optimizer + breakdown.activations + breakdown.buffers
    assert parts == pytest.approx(summary.devices[0].peak_memory_bytes)


@pytest.mark.parametrize("plan", ["{tensor_parallel: 2, sequence_parallel: true, pipeline_parallel: 2, data_parallel: 2}",
                                  "{sharding: full, context_parallel: 2, pipeline_parallel: 2, data_parallel: 2}"])
def test_event_rows_are_one_per_action_with_group_collectives(plan):
    # tensor-parallel, context-parallel and FSDP collectives are ops of their own, but no rows:
    # they run inside or beside their action (events.csv and validation match rows by action)
    result = run_scenario(_scenario(plan), engine="simpy")
    rows = result.event_rows()
    keys = [(row.device, row.action) for row in rows]
    assert len(keys) == len(set(keys)) and {row.stream for row in rows} <= {"compute", "send", "recv", "allreduce"}


def test_the_runtime_refuses_what_it_cannot_run_before_launch_in_one_line(tmp_path):
    from runtime.model.config import load_runnable

    # what torch cannot do: FSDP2's post-backward runs at a split backward's I; selective
    # checkpointing allows one backward through a region (context parallelism runs: test_runtime_cp)
    for plan, key in [("schedule: zb-h1, sharding: gradients, data_parallel: 2", "plan.sharding"),
                      ("schedule: zb-h1, recompute: selective, data_parallel: 2", "plan.recompute")]:
        path = tmp_path / "4d.yaml"
        path.write_text(f"""
cluster: {{preset: a100-nvlink-8, nodes: 1}}
model: {MODEL}
training: {{global_batch_size: 8, microbatch_size: 4}}
plan: {{pipeline_parallel: 2, {plan}}}
""")
        with pytest.raises(Exception) as info:
            load_runnable(path)
        message = str(info.value)
        assert f"{key}: not supported by the runtime" in message and "\n" not in message

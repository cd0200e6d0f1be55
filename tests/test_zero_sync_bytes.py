"""ZeRO-1/2's gradient synchronisation without ``plan.overlap.param_gather``: a reduce-scatter of
the g gradient bytes, then an all-gather of the p bytes of the updated parameters (Rajbhandari et
al. 2020, §5.1–5.2; Megatron-Core core_r0.8.0 reduce-scatters ``grad_data`` in ``grad_dtype`` and
gathers ``param_data`` in ``param_dtype``). On a ring that is an all-reduce of (g + p)/2 bytes
(``sim.cost.comm.gradient_sync_bytes``): with fp32 gradients of a bf16 model, 3/4 of the bytes the
simulator charged before (an all-reduce of g); with bf16 gradients nothing changes."""

from __future__ import annotations

import dataclasses

import pytest

from planner.search.costs import CostTables
from planner.search.ranking import analytic_score
from planner.search.space import Candidate, to_scenario
from sim.core.measured_collectives import CollectiveFit, MeasuredCollectives
from sim.core.parallelism import Sharding
from sim.cost.comm import gradient_sync, gradient_sync_bytes
from sim.cost.measured_comm import measured_sync_terms
from sim.engine.compile import compile_workload
from sim.engine.run import run_scenario
from sim.engine.workload import REDUCE
from sim.input.scenario import parse_scenario

TEXT = """
name: zero-sync-bytes
cluster: {preset: dgx-h100, nodes: NODES}
model: {preset: gpt, layers: 4, hidden: 512, heads: 8, seq_len: 256, vocab: 1024, dtype: bf16,
        optimizer: {name: adam, grad_dtype: GRAD}}
training: {global_batch_size: 32, microbatch_size: 2}
plan: {schedule: 1f1b, tensor_parallel: 1, pipeline_parallel: 1, data_parallel: DP, sharding: SHARDING}
"""


def _scenario(grad_dtype: str, sharding: str = "optimizer", nodes: int = 2):
    text = TEXT.replace("GRAD", grad_dtype).replace("SHARDING", sharding)
    text = text.replace("NODES", str(nodes)).replace("DP", str(8 * nodes))
    return parse_scenario(text, source="zero-sync-bytes.yaml")


def _ar_bytes(scenario) -> float:
    return sum(k.bytes for k in compile_workload(scenario).kinds if k.label[0] == "AR")


def test_the_layout_is_an_allreduce_of_the_mean_bytes():
    """(g + p)/2 under ZeRO-1/2, g itself where p = g or p is not given; ``none`` all-reduces the
    gradients, ``full`` keeps only the reduce-scatter (half the layout)."""
    g, p = 4.0e9, 2.0e9
    for sharding in (Sharding.OPTIMIZER, Sharding.GRADIENTS):
        assert gradient_sync_bytes(g, sharding, param_bytes=p) == 3.0e9
        assert gradient_sync_bytes(g, sharding, param_bytes=g) == g
        assert gradient_sync_bytes(g, sharding) == g
    assert gradient_sync_bytes(g, Sharding.NONE, param_bytes=p) == g
    assert gradient_sync_bytes(g, Sharding.FULL, param_bytes=p) == g / 2


def test_one_ring_is_a_reduce_scatter_of_g_then_an_all_gather_of_p():
    """On one server of n = 8: (n−1)/n·g + (n−1)/n·p bytes at the link's collective bandwidth,
    plus 2(n−1) link latencies (a reduce-scatter's n−1 steps, an all-gather's n−1)."""
    cluster = _scenario("fp32", nodes=1).cluster
    link, n, g, p = cluster.intra_node, 8, 4.0e9, 2.0e9
    rate = link.bandwidth_bytes_per_s * link.collective_efficiency
    expected = (n - 1) / n * g / rate + (n - 1) / n * p / rate + 2 * (n - 1) * link.latency_s
    (phase,) = gradient_sync([n], g, Sharding.OPTIMIZER, cluster, param_bytes=p)
    assert phase.seconds == pytest.approx(expected, rel=1e-12)
    (unsharded,) = gradient_sync([n], g, Sharding.NONE, cluster, param_bytes=p)
    assert unsharded.seconds == pytest.approx(2 * (n - 1) / n * g / rate + 2 * (n - 1) * link.latency_s, rel=1e-12)


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_engine_moves_the_parameters_bytes(nodes):
    """fp32 gradients of a bf16 model (g = 2p): ZeRO-1's flows carry (2p + p)/2 = 1.5 times the
    bf16-gradient model's bytes, not twice (the all-reduce of the gradients keeps its 2)."""
    bf16, fp32 = _ar_bytes(_scenario("bf16", nodes=nodes)), _ar_bytes(_scenario("fp32", nodes=nodes))
    assert fp32 == pytest.approx(1.5 * bf16, rel=1e-12)
    plain = _ar_bytes(_scenario("fp32", "none", nodes=nodes))
    assert plain == pytest.approx(2 * _ar_bytes(_scenario("bf16", "none", nodes=nodes)), rel=1e-12)
    assert plain == pytest.approx(2 * bf16, rel=1e-12)  # ZeRO-1's layout with bf16 gradients is DDP's


@pytest.mark.parametrize("sharding", [Sharding.OPTIMIZER, Sharding.GRADIENTS])
def test_the_planner_prices_what_the_engine_replays(sharding):
    """The planner's one-stage estimate (exact for one stage) is the fast path's replay of ZeRO-1/2
    with fp32 gradients over two servers."""
    base = dataclasses.replace(_scenario("fp32", sharding.value), plan=None)
    candidate = Candidate(bounds=(0, base.model.num_layers), replicas=(16,), microbatch_size=2, sharding=sharding)
    planned = to_scenario(base, candidate)
    tables = CostTables(base)
    assert analytic_score(tables, base, candidate)[0] == pytest.approx(
        run_scenario(planned, engine="fast").summarize().iteration_time_s, rel=1e-9)
    layers = base.model.num_layers
    # the same steps and latencies; the bytes (2 + 1)/2 per parameter byte, midway between DDP's
    # fp32 all-reduce (2) and the bf16-gradient model's (1)
    ddp_s, zero_s = tables.allreduce_s(0, layers, 8, 2), tables.allreduce_s(0, layers, 8, 2, sharding)
    bf16 = CostTables(dataclasses.replace(_scenario("bf16", sharding.value), plan=None))
    assert zero_s == pytest.approx((ddp_s + bf16.allreduce_s(0, layers, 8, 2, sharding)) / 2, rel=1e-12)


EVERY = TEXT.replace("microbatch_size: 2", "microbatch_size: 1")


def _every(grad_dtype: str, nodes: int = 1):
    """ZeRO-2 reducing every micro-batch (``plan.fsdp.reduce_every_microbatch``, the default) over
    8 GPUs a server: 32 / (8·nodes) micro-batches of one sample."""
    text = EVERY.replace("GRAD", grad_dtype).replace("SHARDING", "gradients")
    return parse_scenario(text.replace("NODES", str(nodes)).replace("DP", str(8 * nodes)), source="every.yaml")


def _collective_bytes(workload, collective) -> float:
    return sum(workload.kinds[k].bytes for members, _ in collective.phases for k in members)


@pytest.mark.parametrize("nodes", [1, 2])
def test_zero2s_final_gather_moves_the_parameters_bytes(nodes):
    """After the last micro-batch's reduce-scatter of the fp32 gradients, ZeRO-2 all-gathers the
    bf16 parameters: a collective of its own with half the reduce-scatter's bytes, which the bf16-
    gradient model's reduce-scatter collective runs again (the same bytes)."""
    fp32, bf16 = compile_workload(_every("fp32", nodes)), compile_workload(_every("bf16", nodes))
    assert len(bf16.collectives) == 1 and len(fp32.collectives) == 2
    scatter, gather = fp32.collectives
    assert (scatter.stage, gather.stage, gather.index) == (0, 0, 1)
    assert _collective_bytes(fp32, gather) == pytest.approx(0.5 * _collective_bytes(fp32, scatter), rel=1e-12)
    assert _collective_bytes(fp32, gather) == pytest.approx(_collective_bytes(bf16, bf16.collectives[0]), rel=1e-12)
    reduces = [op for op in fp32.classes[0].ops if op.code == REDUCE]  # a reduce-scatter each, then the gather
    assert [op.collective for op in reduces] == [0] * fp32.num_microbatches + [1]


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_planner_prices_zero2s_final_gather_as_the_replay(nodes):
    """One stage: the planner's estimate is the fast path's replay with fp32 gradients."""
    base = dataclasses.replace(_every("fp32", nodes), plan=None)
    candidate = Candidate(bounds=(0, base.model.num_layers), replicas=(8 * nodes,), microbatch_size=1,
                          sharding=Sharding.GRADIENTS)
    planned = to_scenario(base, candidate)
    assert analytic_score(CostTables(base), base, candidate)[0] == pytest.approx(
        run_scenario(planned, engine="fast").summarize().iteration_time_s, rel=1e-9)


MOE = """
name: moe-zero1-fp32
cluster: {preset: dgx-h100, nodes: NODES}
model: {preset: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, seq_len: 32, vocab: 128, dtype: bf16,
        experts: {count: 8, top_k: 2, ffn_hidden: 128}, optimizer: {name: adam, grad_dtype: GRAD}}
training: {global_batch_size: BATCH, microbatch_size: BATCH}
plan: {schedule: gpipe, pipeline_parallel: 1, data_parallel: DP, expert_parallel: 4, sharding: optimizer}
"""


@pytest.mark.parametrize("nodes", [1, 2])
def test_an_moe_stages_sync_is_priced_as_the_fast_path_replays_it(nodes):
    """Dense and expert groups each reduce-scatter fp32 gradients and all-gather bf16 parameters:
    the planner's table (``moe_reduce_s``) is the fast path's REDUCE op, and its byte term 3/4 of
    the same model's DDP all-reduce of the fp32 gradients (the same latencies)."""
    text = MOE.replace("NODES", str(nodes)).replace("BATCH", str(8 * nodes)).replace("DP", str(8 * nodes))
    scenario = parse_scenario(text.replace("GRAD", "fp32"), source="moe-zero1-fp32.yaml")
    tables = CostTables(scenario, expert_parallel=4)
    layers = tables.num_layers
    result = run_scenario(scenario, engine="fast", contention=False)
    reduce = [times[1] - times[0] for cls, rec in zip(result.workload.classes, result.records)
              for op, times in zip(cls.ops, rec.op_times) if op.code == REDUCE]
    expected = tables.allreduce_s(0, layers, 8, nodes, Sharding.OPTIMIZER)
    assert reduce == pytest.approx([expected] * len(reduce), rel=1e-9)
    bf16 = CostTables(parse_scenario(text.replace("GRAD", "bf16"), source="x.yaml"), expert_parallel=4)
    ddp, half = tables.allreduce_s(0, layers, 8, nodes), bf16.allreduce_s(0, layers, 8, nodes, Sharding.OPTIMIZER)
    assert expected == pytest.approx((ddp + half) / 2, rel=1e-9)


def test_measured_calls_move_the_parameters_bytes_where_they_gather():
    """On a link with measured collectives over 2 ranks: ZeRO-1 is the all-reduce of g then the
    broadcasts of p, FSDP2's ZeRO-2 a reduce-scatter of g then an all-gather of p (the fits' own
    group size: ``latency + bytes / bandwidth`` each, FSDP2's per-call overhead on its calls)."""
    fits = (CollectiveFit(kind="all-gather", ranks=2, latency_s=1e-3, bandwidth_bytes_per_s=1e9),
            CollectiveFit(kind="all-reduce", ranks=2, latency_s=2e-4, bandwidth_bytes_per_s=2e9),
            CollectiveFit(kind="broadcast", ranks=2, latency_s=1e-4, bandwidth_bytes_per_s=4e9),
            CollectiveFit(kind="reduce-scatter", ranks=2, latency_s=1e-3, bandwidth_bytes_per_s=1e9))
    measured = MeasuredCollectives(fits=fits, fsdp_call_overhead_s=5e-4)
    g, p = 4e6, 2e6
    assert measured_sync_terms(measured, 2, g, Sharding.OPTIMIZER, param_bytes=p) == pytest.approx(
        (2e-4 + 1e-4, g / 2e9 + p / 4e9), rel=1e-12)
    assert measured_sync_terms(measured, 2, g, Sharding.GRADIENTS, param_bytes=p) == pytest.approx(
        (2 * (1e-3 + 5e-4), g / 1e9 + p / 1e9), rel=1e-12)
    assert measured_sync_terms(measured, 2, g, Sharding.GRADIENTS) == pytest.approx(
        (2 * (1e-3 + 5e-4), 2 * g / 1e9), rel=1e-12)

"""One home for every communication cost: the planner's tables give the time the engine takes.

For every kind of parallel group — the data-parallel gradient synchronisation under each
sharding mode, the tensor-parallel collectives of a forward and a backward, the
context-parallel ring, FSDP's parameter gather and a point-to-point transfer between stages —
inside one server and across servers, a tiny scenario runs the collective alone in the SimPy
engine (contention on, nothing else on its ports), and ``planner.search.costs.CostTables``
must give the same seconds. Both sides take their bytes, steps and links from
``sim.cost.comm`` and ``sim.cost.links``; a copy edited on one side only (the halves of a
collective kind, the ZeRO-3 halving, a link choice) breaks one of these. The tolerance is
1e-9 relative: the planner sums per-layer prefix sums and scales per-byte times where the
engine sums a stage's bytes, so the two differ by float rounding only.
"""

from __future__ import annotations

import pytest

from planner.search.costs import CostTables
from sim.core.parallelism import Sharding
from sim.cost.comm import HALVES, gradient_sync, gradient_sync_bytes, ring_bytes
from sim.engine.run import run_scenario
from sim.engine.workload import GROUP, RECV, REDUCE, SEND
from sim.input.scenario import parse_scenario

MODEL = "{{preset: gpt, layers: 2, hidden: 64, heads: {heads}, seq_len: 32, vocab: 128, dtype: fp16}}"
REL = 1e-9


def _scenario(plan: str, *, nodes: int, per_node: int, nics: int = 1, batch: int = 4, microbatch: int = 4,
              heads: int = 4):
    text = f"""
name: one-home
cluster: {{preset: a100-nvlink-8, nodes: {nodes}, devices_per_node: {per_node}, nics_per_node: {nics}}}
model: {MODEL.format(heads=heads)}
training: {{global_batch_size: {batch}, microbatch_size: {microbatch}}}
plan: {plan}
"""
    return parse_scenario(text, source="one-home.yaml")


def _op_seconds(result, code: int, *, kind: str | None = None, overlap: bool | None = None) -> list[float]:
    """Seconds each matching op of every class took (a collective alone: its start to its end)."""
    seconds = []
    for cls, rec in zip(result.workload.classes, result.records):
        for op, times in zip(cls.ops, rec.op_times):
            if op.code != code or (kind is not None and op.kind.value != kind):
                continue
            if overlap is not None and op.overlap != overlap:
                continue
            seconds.append(times[1] - times[0])
    return seconds


def _engine(scenario):
    return run_scenario(scenario, engine="simpy", contention=True)


# (servers, GPUs per server, NICs per server): inside one server; across two, the NICs shared or not
PLACES = [pytest.param(1, 4, 1, id="one-server"), pytest.param(2, 2, 1, id="two-servers-one-nic"),
          pytest.param(2, 2, 2, id="two-servers-a-nic-each")]


@pytest.mark.parametrize("sharding", ["none", "optimizer", "full"])
@pytest.mark.parametrize("nodes, per_node, nics", PLACES)
def test_gradient_sync_alone_takes_what_the_planners_table_says(sharding, nodes, per_node, nics):
    scenario = _scenario(f"{{schedule: gpipe, sharding: {sharding}, pipeline_parallel: 1, "
                         f"data_parallel: {nodes * per_node}}}", nodes=nodes, per_node=per_node, nics=nics)
    engine = _engine(scenario)
    reduces = _op_seconds(engine, REDUCE)
    tables = CostTables(scenario)
    planned = tables.allreduce_s(0, scenario.model.num_layers, per_node, nodes, Sharding(sharding))
    assert reduces and planned > 0
    assert reduces == pytest.approx([planned] * len(reduces), rel=REL)
    if nodes == 1:  # the closed form, written out: a ring all-reduce of n = 4 at the collective bandwidth
        n, link = per_node, scenario.cluster.intra_node
        # ZeRO-3 leaves the reduce-scatter only: the layout of an all-reduce of half the bytes
        grad = tables.param_bytes(0, scenario.model.num_layers) * tables.grad_factor * (0.5 if sharding == "full" else 1)
        assert planned == pytest.approx(2 * (n - 1) / n * grad / link.collective_bandwidth_bytes_per_s
                                        + 2 * (n - 1) * link.latency_s, rel=REL)


def test_full_sharding_leaves_half_the_gradient_bytes():
    assert gradient_sync_bytes(8.0, Sharding.FULL) == 4.0
    assert gradient_sync_bytes(8.0, Sharding.OPTIMIZER) == gradient_sync_bytes(8.0, Sharding.NONE) == 8.0
    assert HALVES == {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1}
    assert ring_bytes(4, 1.0, halves=HALVES["all-reduce"]) == 1.5
    cluster = _scenario("{pipeline_parallel: 1, data_parallel: 4}", nodes=2, per_node=2).cluster
    phases = gradient_sync([2, 2], 8.0, Sharding.NONE, cluster)  # reduce-scatter, across, all-gather
    assert [p.across_servers for p in phases] == [False, True, False] and [p.steps for p in phases] == [1, 2, 1]
    assert phases[1].bytes_per_device == ring_bytes(2, 8.0) / 2  # each GPU carries half the shard


TWO_PLACES = [pytest.param(1, 2, id="one-server"), pytest.param(2, 1, id="two-servers")]


# the group on one server, one member per server (a flat ring), across 2 and 4 servers (hierarchical)
GROUP_PLACES = [*TWO_PLACES, pytest.param(2, 2, id="two-servers-of-two"), pytest.param(4, 2, id="four-servers-of-two")]


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("nodes, per_node", GROUP_PLACES)
def test_tensor_parallel_collectives_alone_take_what_the_planners_table_says(recompute, nodes, per_node):
    t = nodes * per_node  # heads 4: t = 8 needs more
    scenario = _scenario(f"{{schedule: gpipe, tensor_parallel: {t}, recompute: {recompute}, pipeline_parallel: 1, "
                         "data_parallel: 1}", nodes=nodes, per_node=per_node, heads=8)
    engine = _engine(scenario)
    tables = CostTables(scenario, tensor_parallel=t)
    fwd, bwd = tables.tensor_parallel_s(0, tables.num_layers, scenario.training.microbatch_size)
    if recompute == "full":  # the recomputed forward repeats its collectives inside the backward
        bwd += fwd
    forward, backward = _op_seconds(engine, GROUP, kind="F"), _op_seconds(engine, GROUP, kind="B")
    assert forward and backward and fwd > 0
    assert forward == pytest.approx([fwd] * len(forward), rel=REL)
    assert backward == pytest.approx([bwd] * len(backward), rel=REL)


@pytest.mark.parametrize("nodes, per_node", [pytest.param(1, 4, id="one-server"), pytest.param(2, 2, id="two-servers")])
def test_context_ring_alone_takes_what_the_planners_table_says(nodes, per_node):
    c = 4  # c − 1 = 3 steps: the ring's bytes already count every step (LayerSpec.cp_ring_bytes)
    scenario = _scenario(f"{{schedule: gpipe, context_parallel: {c}, pipeline_parallel: 1, data_parallel: 1}}",
                         nodes=nodes, per_node=per_node)
    engine = _engine(scenario)
    tables = CostTables(scenario, context_parallel=c)
    fwd, bwd = tables.context_ring_s(0, tables.num_layers, scenario.training.microbatch_size)
    forward = _op_seconds(engine, GROUP, kind="F", overlap=True)
    backward = _op_seconds(engine, GROUP, kind="B", overlap=True)
    assert forward and backward
    assert forward == pytest.approx([fwd] * len(forward), rel=REL)
    assert backward == pytest.approx([bwd] * len(backward), rel=REL)
    link = scenario.cluster.intra_node if nodes == 1 else scenario.cluster.inter_node
    ring = sum(layer.cp_ring_bytes for layer in tables.model.layers) * scenario.training.microbatch_size
    assert bwd == pytest.approx(2 * ring / link.bandwidth_bytes_per_s + (c - 1) * link.latency_s, rel=REL)


@pytest.mark.parametrize("nodes, per_node", GROUP_PLACES)
def test_fsdp_gather_alone_takes_what_the_planners_table_says(nodes, per_node):
    d = nodes * per_node
    scenario = _scenario(f"{{schedule: gpipe, sharding: full, pipeline_parallel: 1, data_parallel: {d}}}",
                         nodes=nodes, per_node=per_node, batch=d, microbatch=d)
    engine = _engine(scenario)
    tables = CostTables(scenario)
    gather = tables.gather_s(0, tables.num_layers, d)
    gathers = _op_seconds(engine, GROUP, overlap=True)
    assert gathers and gather > 0
    assert gathers == pytest.approx([gather] * len(gathers), rel=REL)
    if d > 2:  # across servers hierarchically: tests/test_cross_server_groups.py writes it out
        return
    link = scenario.cluster.intra_node if nodes == 1 else scenario.cluster.inter_node
    assert gather == pytest.approx(tables.param_bytes(0, tables.num_layers) / 2 / link.collective_bandwidth_bytes_per_s
                                   + link.latency_s, rel=REL)


@pytest.mark.parametrize("nodes, per_node", TWO_PLACES)
def test_a_stage_transfer_alone_takes_what_the_planners_table_says(nodes, per_node):
    scenario = _scenario("{schedule: gpipe, pipeline_parallel: 2, data_parallel: 1}", nodes=nodes, per_node=per_node)
    engine = _engine(scenario)
    tables = CostTables(scenario)
    cut = scenario.plan.stages[1].layers[0]
    planned = tables.transfer_s(cut, scenario.training.microbatch_size, 1, 1, nodes == 1)
    classes, records = engine.workload.classes, engine.records
    sends = {(op.stage, op.kind.value): rec.op_times[i][0] for cls, rec in zip(classes, records)
             for i, op in enumerate(cls.ops) if op.code == SEND}
    arrivals = {(op.stage, op.kind.value): rec.op_times[i][1] for cls, rec in zip(classes, records)
                for i, op in enumerate(cls.ops) if op.code == RECV}
    # the activation leaves stage 0's forward and lands at stage 1's; the gradient goes back
    assert arrivals[(1, "RECV_F")] - sends[(0, "SEND_F")] == pytest.approx(planned, rel=REL)
    assert arrivals[(0, "RECV_B")] - sends[(1, "SEND_B")] == pytest.approx(planned, rel=REL)
    link = scenario.cluster.intra_node if nodes == 1 else scenario.cluster.inter_node
    nbytes = tables.model.boundary_bytes[cut] * scenario.training.microbatch_size
    assert planned == pytest.approx(link.latency_s + nbytes / link.bandwidth_bytes_per_s, rel=REL)

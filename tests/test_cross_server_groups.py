"""Groups that cross servers are costed on the path NCCL takes (``sim.cost.group_comm``).

A tensor-parallel all-reduce of b bytes over 2 servers of 8 GPUs is a ring reduce-scatter
inside each server, each GPU's b/8 shard across the two servers through its own NIC, and a
ring all-gather inside each server — not a flat ring of 16 whose crossing hop carries every
byte. The context-parallel ring's steps last their crossing hop; FSDP's all-gather over a
gradient group on several servers goes across first, then inside each server. Each is
written out here in closed form, replayed alone in the SimPy engine, and read from the
planner's table (``planner.search.costs.CostTables``): the three agree.
"""

from __future__ import annotations

import pytest

from planner.search.costs import CostTables
from sim.app.check import describe
from sim.cost.comm import hierarchical_allreduce
from sim.cost.group_comm import add_volumes, is_hierarchical, spanning_phases, tensor_parallel_volumes
from sim.cost.links import by_server, members_per_node
from sim.engine.run import run_scenario
from sim.engine.workload import GROUP
from sim.input.scenario import parse_scenario

REL = 1e-9


def _scenario(plan: str, *, nodes: int, per_node: int, nics: int, heads: int = 16):
    text = f"""
name: cross-server
cluster: {{preset: a100-nvlink-8, nodes: {nodes}, devices_per_node: {per_node}, nics_per_node: {nics}}}
model: {{preset: gpt, layers: 2, hidden: 256, heads: {heads}, seq_len: 32, vocab: 128, dtype: fp16}}
training: {{global_batch_size: 4, microbatch_size: 4}}
plan: {plan}
"""
    return parse_scenario(text, source="cross-server.yaml")


def _group_seconds(scenario, kind: str, *, overlap: bool) -> list[float]:
    """Seconds each GROUP op of ``kind`` (F or B) took in a SimPy replay with contention."""
    result = run_scenario(scenario, engine="simpy", contention=True)
    seconds = []
    for cls, rec in zip(result.workload.classes, result.records):
        for op, times in zip(cls.ops, rec.op_times):
            if op.code == GROUP and op.kind.value == kind and op.overlap == overlap:
                seconds.append(times[1] - times[0])
    return seconds


def _tp_allreduce_closed_form(b: float, n: int, k: int, cluster, *, gpus_per_nic: int = 1) -> float:
    """One all-reduce of b bytes over n GPUs on each of k servers, written out: reduce-scatter
    inside (n−1 steps), the b/n shard's ring across the servers (2(k−1) steps, the NIC shared by
    ``gpus_per_nic``), all-gather inside (n−1 steps)."""
    intra, inter = cluster.intra_node, cluster.inter_node
    inside = (n - 1) / n * b / intra.collective_bandwidth_bytes_per_s + (n - 1) * intra.latency_s
    across = (2 * (k - 1) / k * b / n * gpus_per_nic / inter.collective_bandwidth_bytes_per_s
              + 2 * (k - 1) * inter.latency_s)
    return inside + across + inside


def test_tp_allreduce_over_two_servers_of_eight_is_inside_across_inside():
    cluster = _scenario("{pipeline_parallel: 1, data_parallel: 16}", nodes=2, per_node=8, nics=8).cluster
    b = 3.0e6
    phases = spanning_phases({"all-reduce": (b, 1)}, [8, 8], cluster)
    assert list(phases) == ["before", "across", "after"]
    assert [p.steps for p in phases.values()] == [7, 2, 7]
    assert phases["across"].bytes_per_device == pytest.approx(b / 8)  # 2(k−1)/k = 1: the shard, once
    assert sum(p.seconds for p in phases.values()) == pytest.approx(_tp_allreduce_closed_form(b, 8, 2, cluster),
                                                                    rel=REL)
    # the flat ring it replaces pushed 2·15/16 of b through the crossing hop's NIC
    flat = 2 * 15 / 16 * b / cluster.inter_node.collective_bandwidth_bytes_per_s
    assert sum(p.seconds for p in phases.values()) < flat / 2


def test_spanning_all_reduce_is_the_gradient_all_reduces_layout():
    cluster = _scenario("{pipeline_parallel: 1, data_parallel: 16}", nodes=4, per_node=4, nics=1).cluster
    for shape in ([4, 4, 4, 4], [4, 2], [3, 1, 2]):
        ours = spanning_phases({"all-reduce": (1.0e6, 1)}, shape, cluster)
        gradient = hierarchical_allreduce(shape, 1.0e6, cluster)
        assert [p.steps for p in ours.values()] == [p.steps for p in gradient]
        assert [p.seconds for p in ours.values()] == pytest.approx([p.seconds for p in gradient], rel=REL)


def test_gather_and_scatter_skip_a_half_and_a_group_on_one_server_stays_flat():
    cluster = _scenario("{pipeline_parallel: 1, data_parallel: 8}", nodes=2, per_node=4, nics=4).cluster
    assert list(spanning_phases({"all-gather": (1.0, 1)}, [4, 4], cluster)) == ["across", "after"]
    assert list(spanning_phases({"reduce-scatter": (1.0, 1)}, [4, 4], cluster)) == ["before", "across"]
    assert not is_hierarchical([4]) and not is_hierarchical([1, 1, 1]) and is_hierarchical([2, 1])
    assert members_per_node(cluster, 6) == (4, 2) and members_per_node(cluster, 4, 2) == (2, 2)
    assert by_server(cluster, [5, 0, 4, 1]) == [[0, 1], [4, 5]]
    assert add_volumes({"all-reduce": (1.0, 2)}, {"all-reduce": (2.0, 1), "all-gather": (1.0, 1)}) == {
        "all-gather": (1.0, 1), "all-reduce": (3.0, 3)}


# (servers, GPUs per server, NICs per server): a rail per GPU; four GPUs on one NIC
TP_PLACES = [pytest.param(2, 8, 8, id="2x8-a-nic-each"), pytest.param(2, 8, 2, id="2x8-four-per-nic"),
             pytest.param(4, 4, 4, id="4x4-a-nic-each")]


@pytest.mark.parametrize("nodes, per_node, nics", TP_PLACES)
def test_tensor_parallel_across_servers_alone_equals_closed_form_and_table(nodes, per_node, nics):
    t = nodes * per_node
    scenario = _scenario(f"{{schedule: gpipe, tensor_parallel: {t}, pipeline_parallel: 1, data_parallel: 1}}",
                         nodes=nodes, per_node=per_node, nics=nics)
    tables = CostTables(scenario, tensor_parallel=t)
    samples = scenario.training.microbatch_size
    fwd, bwd = tables.tensor_parallel_s(0, tables.num_layers, samples)
    # closed form: every forward collective is one all-reduce's bytes on the wire (sequence
    # parallelism's gather + scatter move the same bytes in the same steps)
    layers = tables.model.layers
    volumes = tensor_parallel_volumes(layers, "forward", samples)
    b = sum(nbytes for nbytes, _ in volumes.values()) / (2 if "all-gather" in volumes else 1)
    count = sum(n for _, n in volumes.values()) // (2 if "all-gather" in volumes else 1)
    per_nic = -(-per_node // nics)
    one = _tp_allreduce_closed_form(b / count, per_node, nodes, scenario.cluster, gpus_per_nic=per_nic)
    assert fwd == pytest.approx(count * one, rel=REL)
    forward = _group_seconds(scenario, "F", overlap=False)
    backward = _group_seconds(scenario, "B", overlap=False)
    assert forward and backward
    assert forward == pytest.approx([fwd] * len(forward), rel=REL)
    assert backward == pytest.approx([bwd] * len(backward), rel=REL)


def test_context_ring_over_two_servers_waits_for_its_crossing_hops():
    # t = 2, c = 2 on 2 servers of 2 GPUs and one NIC: rings {0, 2} and {1, 3}; both rings'
    # crossing hops leave server 0 through its one NIC
    scenario = _scenario("{schedule: gpipe, tensor_parallel: 2, context_parallel: 2, pipeline_parallel: 1, "
                         "data_parallel: 1}", nodes=2, per_node=2, nics=1)
    tables = CostTables(scenario, tensor_parallel=2, context_parallel=2)
    samples = scenario.training.microbatch_size
    fwd, bwd = tables.context_ring_s(0, tables.num_layers, samples)
    c, steps = 2, 1
    block = sum(layer.cp_ring_bytes for layer in tables.model.layers) * samples / steps
    intra, inter = scenario.cluster.intra_node, scenario.cluster.inter_node
    step = max(block / intra.bandwidth_bytes_per_s + intra.latency_s,
               2 * block / inter.bandwidth_bytes_per_s + inter.latency_s)  # two rings on one NIC
    assert fwd == pytest.approx((c - 1) * step, rel=REL)
    forward, backward = _group_seconds(scenario, "F", overlap=True), _group_seconds(scenario, "B", overlap=True)
    assert forward and backward
    assert forward == pytest.approx([fwd] * len(forward), rel=REL)
    assert backward == pytest.approx([bwd] * len(backward), rel=REL)


def test_context_ring_of_four_over_two_servers_has_one_crossing_hop_per_server():
    scenario = _scenario("{schedule: gpipe, context_parallel: 4, pipeline_parallel: 1, data_parallel: 1}",
                         nodes=2, per_node=2, nics=1)
    tables = CostTables(scenario, context_parallel=4)
    samples = scenario.training.microbatch_size
    fwd, _ = tables.context_ring_s(0, tables.num_layers, samples)
    block = sum(layer.cp_ring_bytes for layer in tables.model.layers) * samples / 3
    intra, inter = scenario.cluster.intra_node, scenario.cluster.inter_node
    step = max(block / intra.bandwidth_bytes_per_s + intra.latency_s, block / inter.bandwidth_bytes_per_s
               + inter.latency_s)
    assert fwd == pytest.approx(3 * step, rel=REL)
    forward = _group_seconds(scenario, "F", overlap=True)
    assert forward and forward == pytest.approx([fwd] * len(forward), rel=REL)


@pytest.mark.parametrize("nics", [2, 1])
def test_fsdp_gather_across_servers_goes_across_then_inside(nics):
    scenario = _scenario("{schedule: gpipe, sharding: full, pipeline_parallel: 1, data_parallel: 4}",
                         nodes=2, per_node=2, nics=nics)
    tables = CostTables(scenario)
    gather = tables.gather_s(0, tables.num_layers, 4)
    p = tables.param_bytes(0, tables.num_layers)
    intra, inter = scenario.cluster.intra_node, scenario.cluster.inter_node
    n, k, per_nic = 2, 2, 2 // nics
    across = (k - 1) / k * p / n * per_nic / inter.collective_bandwidth_bytes_per_s + (k - 1) * inter.latency_s
    inside = (n - 1) / n * p / intra.collective_bandwidth_bytes_per_s + (n - 1) * intra.latency_s
    assert gather == pytest.approx(across + inside, rel=REL)
    gathers = _group_seconds(scenario, "F", overlap=True) + _group_seconds(scenario, "B", overlap=True)
    assert gathers == pytest.approx([gather] * len(gathers), rel=REL) and gathers


def test_check_says_what_path_a_spanning_group_is_costed_on():
    scenario = _scenario("{schedule: gpipe, tensor_parallel: 4, context_parallel: 2, pipeline_parallel: 1, "
                         "data_parallel: 1}", nodes=2, per_node=4, nics=4)
    warnings = describe(scenario).warnings
    tp = [w for w in warnings if w.startswith("tensor-parallel")]
    cp = [w for w in warnings if w.startswith("context-parallel")]
    assert not tp  # four GPUs of one server
    assert cp and "crossing hop" in cp[0] and "NIC" in cp[0]
    scenario = _scenario("{schedule: gpipe, tensor_parallel: 8, pipeline_parallel: 1, data_parallel: 1}",
                         nodes=2, per_node=4, nics=4)
    tp = [w for w in describe(scenario).warnings if w.startswith("tensor-parallel")]
    assert tp and "a ring inside each server" in tp[0] and "its own NIC" in tp[0]

"""Collectives by NCCL's algorithm over the tiers a group crosses (``sim.cost.fabric_comm``).

The cluster: 16 DGX H100 servers (8 NICs of B = 400 Gb/s = 50 GB/s each, 5 µs a wire) in two
leaf groups of 8 at 1:7 below one spine. A data-parallel group of one GPU a server climbs to the
spine, where each GPU gets B / 7 when every GPU sends. NCCL's model (tuning.cc, the constants of
``sim.cost.nccl_tuning``) written out for n = 16 nodes of one GPU each:

* ring, Simple: latency ``(8.4 + 2(n−1)·(14 + 2·5)) · 1.4`` µs (the plateau), algorithm bandwidth
  ``(B/7) · n / (2(n−1))``;
* tree, LL128: latency ``14 + 2·log2(n)·(8.5 + 5)`` µs, algorithm bandwidth
  ``(B/7) · 0.92 · 120/128 · 0.5 · correction`` (LL128's correction at 64 KiB, log2(S/64) = 10: 0.6).
"""

from __future__ import annotations

import json

import pytest

from sim.app.check import describe, format_description
from sim.core.errors import DappleError
from sim.core.parallelism import Sharding
from sim.cost.comm import gradient_sync, ring_flow_bytes
from sim.cost.fabric_comm import across_choice
from sim.engine.compile import compile_workload
from sim.input.scenario import parse_scenario

B = 50e9  # one NIC, bytes/s
N = 16  # servers, one group member each
SMALL, LARGE = 64 * 1024, 2 ** 30

YAML = """
name: fab3-small
cluster:
  preset: dgx-h100
  nodes: 16
  {fabric}
model: {{preset: gpt, layers: 4, hidden: 1024, heads: 16, seq_len: 1024, vocab: 32768, dtype: bf16}}
training: {{global_batch_size: 16, microbatch_size: 16}}
plan: {{schedule: gpipe, tensor_parallel: 8, pipeline_parallel: 1, data_parallel: 16}}
"""
FABRIC = "fabric: {{tiers: [{{name: leaf, size: 8, oversubscription: 7}}, {{name: spine}}]{extra}}}"


def _scenario(extra: str = "", fabric: bool = True):
    return parse_scenario(YAML.format(fabric=FABRIC.format(extra=extra) if fabric else ""))


def test_over_a_1_to_7_tier_auto_runs_the_tree_for_a_small_message_and_the_ring_for_a_large_one():
    cluster = _scenario().cluster
    small, large = (across_choice([1] * N, nbytes, cluster) for nbytes in (SMALL, LARGE))
    assert (small.crossing.name, small.crossing.oversubscription) == ("spine", 7.0)
    assert (small.algorithm, small.protocol) == ("tree", "LL128")
    tree_latency = (14.0 + 2 * 4 * (8.5 + 5.0)) * 1e-6
    assert small.latency_s == pytest.approx(tree_latency)
    assert small.nccl.seconds == pytest.approx(tree_latency + SMALL / (B / 7 * 0.92 * 120 / 128 * 0.5 * 0.6))
    assert (large.algorithm, large.protocol, large.bytes_factor) == ("ring", "Simple", 1.0)
    ring_latency = (8.4 + 2 * (N - 1) * (14.0 + 2 * 5.0)) * 1.4 * 1e-6
    assert large.latency_s == pytest.approx(ring_latency)
    assert large.nccl.seconds == pytest.approx(ring_latency + LARGE * 2 * (N - 1) / N / (B / 7))


def test_the_cross_server_phase_takes_the_algorithms_bytes_rate_and_latency():
    # the forced tree's Simple bandwidth (B/7 · 0.92 · 0.5) against the ring's ((B/7) · n/(2(n−1))):
    # its cross-server bytes are the ring's times their ratio; the rate B/7, the latency NCCL's
    cluster = _scenario(", collective_algorithm: tree").cluster
    (phase,) = gradient_sync([1] * N, LARGE, Sharding.NONE, cluster)
    factor = (N / (2 * (N - 1))) / (0.92 * 0.5)
    assert phase.flow_bytes == pytest.approx(ring_flow_bytes(N, LARGE, cluster.inter_node) * factor)
    assert phase.rate_bytes_per_s == pytest.approx(B / 7)
    assert phase.latency_s == pytest.approx((8.4 + 2 * 4 * (14.0 + 2 * 5.0)) * 1e-6)


def test_without_a_fabric_the_gradient_reduction_is_the_ring_of_before():
    cluster = _scenario(fabric=False).cluster
    (phase,) = gradient_sync([1] * N, LARGE, Sharding.NONE, cluster)
    assert phase.measured_latency_s is None and phase.latency_s == pytest.approx(2 * (N - 1) * 5e-6, rel=1e-12)
    assert phase.flow_bytes == ring_flow_bytes(N, LARGE, cluster.inter_node)
    assert phase.rate_bytes_per_s == B


def test_the_engine_charges_the_phase_of_the_one_home():
    # the engine's gradient flows and phase latency are ``gradient_sync``'s (one member a server: one ring)
    scenario = _scenario(", collective_algorithm: tree")
    workload = compile_workload(scenario)
    (collective,) = workload.collectives
    model = scenario.resolved.model
    (phase,) = gradient_sync([1] * N, model.stage_param_bytes(0, 4) * model.grad_bytes_per_param_byte,
                             Sharding.NONE, scenario.cluster)
    assert [latency for _, latency in collective.phases] == [phase.latency_s]


def test_check_prints_the_algorithm_of_each_gradient_message():
    description = describe(_scenario())
    assert description.collectives == ("DP all-reduce 22.06MiB: ring across the spine",)
    assert "collectives (NCCL's algorithm): DP all-reduce 22.06MiB: ring across the spine" \
        in format_description(description)
    assert json.loads(json.dumps(description.to_json()))["fabric"]["collectives"] == list(description.collectives)
    assert describe(_scenario(fabric=False)).collectives == ()


def test_an_unknown_algorithm_is_refused_naming_the_key():
    with pytest.raises(DappleError, match="collective_algorithm"):
        _scenario(", collective_algorithm: nvls")

"""ZeRO-3 as DeepSpeed ran it before v0.6 (``sim.cost.zero3``): gathers over one flat ring,
regathered every micro-batch and, under full recompute, again for the recompute; its gradients
all-reduced; a cap on the live parameters.

A small GPT trains under ``sharding: full`` over two servers of two GPUs (one NIC each), one
stage, so every collective crosses the network. With ``prefetch: false`` nothing hides a
gather: an iteration is, written out, every action's gather then its compute, then the
reduce-scatter and the optimizer step. Each collective is one ring over the four GPUs whose
slowest hop is a NIC: the all-gather of the stage's parameters P (``fsdp_gather``) and the
reduce-scatter of its gradients (``ring_collective``), ``(n−1)/n`` of the bytes each at the
NIC's collective bandwidth plus ``n − 1`` latencies.
"""

from __future__ import annotations

import dataclasses

import pytest

from planner.search.costs import CostTables
from planner.search.ranking import analytic_score
from planner.search.space import Candidate, to_scenario
from sim.core.errors import DappleError
from sim.core.overlap import FsdpSpec, OverlapSpec
from sim.core.parallelism import Recompute, Sharding
from sim.cost.comm import fsdp_gather, ring_collective
from sim.cost.memory import stage_held_bytes
from sim.cost.overlap import unit_count
from sim.cost.zero3 import capped_live_bytes, largest_tensor_bytes, live_cap_bytes, reduced_as, regathered_bytes
from sim.engine.run import run_scenario
from sim.input.scenario import parse_scenario

N = 4  # data-parallel devices, two per server


def _scenario(fsdp: str, *, batch: int = 4, extra: str = "", hidden: int = 256, seq_len: int = 128):
    text = f"""
name: zero3-deepspeed
cluster: {{preset: a100-nvlink-8, nodes: 2, devices_per_node: 2, nics_per_node: 2}}
model: {{preset: gpt, layers: 2, hidden: {hidden}, heads: 4, seq_len: {seq_len}, vocab: 512, dtype: fp16,
         optimizer: adam}}
training: {{global_batch_size: {batch}, microbatch_size: {N}}}
plan: {{schedule: 1f1b, sharding: full, data_parallel: {N}, fsdp: {fsdp}{extra}}}
"""
    return parse_scenario(text, source="zero3-deepspeed.yaml")


def _parts(scenario):
    """(forward, backward, optimizer step, one all-gather, the reduce-scatter) seconds alone."""
    cluster, model = scenario.cluster, scenario.resolved.model
    cost = scenario.resolved.costs[0][0]
    params = model.param_bytes(0, len(model.layers))
    gather = fsdp_gather(N, params, cluster.inter_node, cluster).seconds
    scatter = ring_collective("reduce-scatter", N, params * model.grad_bytes_per_param_byte,
                              cluster.inter_node, cluster).seconds
    return cost.fwd_s, cost.bwd_s, cost.optimizer_s, gather, scatter


@pytest.mark.parametrize("engine", ["simpy", "fast"])
def test_blocking_flat_iteration_is_compute_plus_every_collective(engine):
    scenario = _scenario("{prefetch: false, path: flat}")
    f, b, step, g, r = _parts(scenario)
    summary = run_scenario(scenario, engine=engine).summarize()
    # one micro-batch: gather, forward, gather again, backward, reduce-scatter, step
    assert summary.iteration_time_s == pytest.approx(g + f + g + b + r + step, rel=1e-9)


@pytest.mark.parametrize("engine", ["simpy", "fast"])
def test_every_microbatch_gathers_again(engine):
    # two micro-batches, their gradients accumulated unsharded and reduce-scattered once
    scenario = _scenario("{prefetch: false, path: flat, reduce_every_microbatch: false}", batch=8)
    f, b, step, g, r = _parts(scenario)
    summary = run_scenario(scenario, engine=engine).summarize()
    assert summary.iteration_time_s == pytest.approx(2 * (g + f + g + b) + r + step, rel=1e-9)


def test_prefetch_hides_what_blocking_exposes():
    blocking = run_scenario(_scenario("{prefetch: false, path: flat}"), engine="fast").summarize()
    prefetched = run_scenario(_scenario("{path: flat}"), engine="fast").summarize()
    assert prefetched.iteration_time_s < blocking.iteration_time_s
    assert blocking.exposed_communication_s > prefetched.exposed_communication_s


def test_flat_path_is_slower_than_nccl_hierarchical_across_servers():
    flat = run_scenario(_scenario("{prefetch: false, path: flat}"), engine="fast").summarize()
    hierarchical = run_scenario(_scenario("{prefetch: false}"), engine="fast").summarize()
    assert flat.iteration_time_s > hierarchical.iteration_time_s


@pytest.mark.parametrize("batch, fsdp, recompute", [
    (4, FsdpSpec(prefetch=False, path="flat", max_live_parameters=1e9), Recompute.NONE),
    (8, FsdpSpec(prefetch=False, path="flat", max_live_parameters=1e9), Recompute.NONE),
    (4, FsdpSpec(path="flat", max_live_parameters=1e9, max_reuse_distance=1, reduce_scatter=False), Recompute.FULL),
    (8, FsdpSpec(max_reuse_distance=1, reduce_scatter=False), Recompute.FULL)])
def test_the_planner_prices_it_as_the_engine_replays_it(batch, fsdp, recompute):
    # one stage over two servers: DAPPLE's latency model is exact, so estimate = replay
    base = _scenario("{}", batch=batch)
    candidate = Candidate(bounds=(0, len(base.resolved.model.layers)), replicas=(N,), microbatch_size=N,
                          sharding=Sharding.FULL, recompute=recompute)
    planned = to_scenario(base, candidate)
    planned = dataclasses.replace(planned, plan=dataclasses.replace(planned.plan, fsdp=fsdp))
    tables = CostTables(base, tensor_parallel=1, overlap=OverlapSpec(), fsdp=fsdp)
    estimate = analytic_score(tables, base, candidate)[0]
    assert estimate == pytest.approx(run_scenario(planned, engine="fast").summarize().iteration_time_s, rel=1e-9)


def test_largest_tensor_is_the_mlp_weight():
    model = _scenario("{}").resolved.model
    h = 256
    block = [layer for layer in model.layers if layer.checkpoint_bytes is not None][0]
    index = model.layers.index(block)
    assert largest_tensor_bytes(model, index, index + 1) == 4 * h * h * 2  # fc1 (or fc2): 4h², fp16
    assert live_cap_bytes(model, 1e9) == 2e9


def test_live_cap_closed_form():
    # FSDP holds two units (forward 12, backward 12 + 2·7); the cap C = 3 plus the largest tensor w = 2
    assert capped_live_bytes(12.0, 26.0, cap_bytes=3.0, largest_bytes=2.0, grad_bytes_per_param_byte=2.0) \
        == (3.0 + 2.0, 3.0 + 2.0 + 2.0 * 2.0)
    # a cap above what FSDP holds changes nothing
    assert capped_live_bytes(12.0, 26.0, cap_bytes=100.0, largest_bytes=2.0, grad_bytes_per_param_byte=2.0) \
        == (12.0, 26.0)


def test_stage_held_bytes_under_the_cap():
    scenario = _scenario("{max_live_parameters: 1000}")
    model, plan = scenario.resolved.model, scenario.plan
    held = stage_held_bytes(model, 0, len(model.layers), data_parallel=N, sharding=plan.sharding, fsdp=plan.fsdp)
    w, g = largest_tensor_bytes(model, 0, len(model.layers)), model.grad_bytes_per_param_byte
    assert (held.forward_bytes, held.backward_bytes) == (1000 * 2 + w, 1000 * 2 + w + g * w)
    uncapped = run_scenario(_scenario("{}"), engine="fast").summarize().peak_memory_bytes
    capped = run_scenario(scenario, engine="fast").summarize().peak_memory_bytes
    assert capped < uncapped


@pytest.mark.parametrize("fsdp, key", [("{path: ring}", "path"), ("{prefetch: 1}", "prefetch"),
                                       ("{max_live_parameters: 0}", "max_live_parameters"),
                                       ("{max_reuse_distance: -1}", "max_reuse_distance"),
                                       ("{reduce_scatter: 1}", "reduce_scatter")])
def test_bad_values_name_their_key(fsdp, key):
    with pytest.raises(DappleError, match=key):
        _scenario(fsdp)


H = 256  # the test GPT's hidden size: a block's weights qkv 3h², proj h², fc1 4h², fc2 4h² (fp16)


def _block(model):
    return next(i for i, layer in enumerate(model.layers) if layer.checkpoint_bytes is not None)


def test_regathered_bytes_closed_form():
    model = _scenario("{}").resolved.model
    i = _block(model)
    block = model.layers[i].param_bytes
    fc = 4 * H * H * 2  # bytes of fc1 and of fc2
    # reuse distance of a sub-module, elements: 2·(the later ones' elements); fc2 0, fc1 8h², proj 16h², qkv 18h²
    assert regathered_bytes(model, i, i + 1, max_reuse_distance=1e9, full_recompute=True) == 0.0  # all reused
    assert regathered_bytes(model, i, i + 1, max_reuse_distance=8 * H * H + 1, full_recompute=True) \
        == pytest.approx(block - 2 * fc)  # fc1 and fc2 kept, qkv (with the norms and biases) and proj again
    assert regathered_bytes(model, i, i + 1, max_reuse_distance=8 * H * H, full_recompute=True) \
        == pytest.approx(block - fc)  # fc1's distance 8h² is not below the cap: only fc2 kept
    assert regathered_bytes(model, i, i + 1, max_reuse_distance=1, full_recompute=False) == 0.0  # no recompute
    assert regathered_bytes(model, i, i + 1, max_reuse_distance=None, full_recompute=True) == 0.0  # FSDP
    assert regathered_bytes(model, 0, 1, max_reuse_distance=1, full_recompute=True) == 0.0  # the embedding


def test_reduce_scatter_false_all_reduces_zero3_gradients():
    assert reduced_as(Sharding.FULL, FsdpSpec(reduce_scatter=False)) is Sharding.NONE
    assert reduced_as(Sharding.FULL, FsdpSpec()) is Sharding.FULL
    assert reduced_as(Sharding.OPTIMIZER, FsdpSpec(reduce_scatter=False)) is Sharding.OPTIMIZER


V03 = "{path: flat, max_reuse_distance: 1, reduce_scatter: false}"
"""DeepSpeed v0.3's defaults on the test GPT (a cap of 1 element: every block regathered but its fc2)."""


@pytest.mark.parametrize("hidden, seq_len, compute_bound", [(256, 128, True), (1024, 16, False)])
@pytest.mark.parametrize("engine", ["simpy", "fast"])
def test_prefetched_v03_iteration_closed_form(engine, hidden, seq_len, compute_bound):
    # one micro-batch: each action's compute A beside its gathers G over U units (one a layer):
    # max(G/U + A, G + A/U) — compute-bound, the compute plus the first unit's gather; comm-bound,
    # the gathers plus the last unit's compute — A slowed by the device's overlap_slowdown s while
    # they run (A + min(G·s/(1+s), s·A)); the backward gathers the blocks again for the recompute;
    # then the all-reduce of the gradients and the step
    scenario = _scenario(V03, extra=", recompute: full", hidden=hidden, seq_len=seq_len)
    cluster, model = scenario.cluster, scenario.resolved.model
    f, b, step, g_forward, _ = _parts(scenario)
    params = model.param_bytes(0, len(model.layers))
    again = regathered_bytes(model, 0, len(model.layers), max_reuse_distance=1, full_recompute=True)
    fc2 = 4 * hidden * hidden * 2
    assert again == pytest.approx(sum(layer.param_bytes for layer in model.layers
                                      if layer.checkpoint_bytes is not None) - 2 * fc2)
    g_backward = fsdp_gather(N, params + again, cluster.inter_node, cluster).seconds
    reduce = ring_collective("all-reduce", N, params * model.grad_bytes_per_param_byte, cluster.inter_node,
                             cluster).seconds
    units, slow = unit_count(len(model.layers), 1), cluster.device.overlap_slowdown

    def action(a, g):
        a = a + min(g * slow / (1 + slow), slow * a) if slow else a
        return max(g / units + a, g + a / units)

    assert (f > g_forward) is compute_bound and (b > g_backward) is compute_bound  # the max's two branches
    summary = run_scenario(scenario, engine=engine).summarize()
    expected = action(f, g_forward) + action(b, g_backward) + reduce + step
    assert summary.iteration_time_s == pytest.approx(expected, rel=1e-9)

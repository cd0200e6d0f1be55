"""ZeRO-1/2's parameter all-gather (``plan.overlap.param_gather``) moves the 16-bit parameters, not
the fp32 gradients the reduce-scatter before it reduced: Megatron-Core's distributed optimizer
gathers a bucket's ``param_data``, allocated in the model's dtype (megatron/core/optimizer/
distrib_optimizer.py ``_dispatch_gather_model_params``, megatron/core/distributed/
param_and_grad_buffer.py at core_r0.8.0). The engine's gather flows and the planner's
``param_gather_s`` carry half the reduce-scatter's bytes for a bf16 model with fp32 gradients."""

from __future__ import annotations

import dataclasses

import pytest

from planner.search.costs import CostTables
from planner.search.ranking import analytic_score
from planner.search.space import Candidate, to_scenario
from sim.core.overlap import OverlapSpec
from sim.core.parallelism import Sharding
from sim.engine.compile import compile_workload
from sim.engine.run import run_scenario
from sim.input.scenario import parse_scenario

TEXT = """
name: param-gather-bytes
cluster: {preset: dgx-h100, nodes: 2}
model: {preset: gpt, layers: 4, hidden: 512, heads: 8, seq_len: 256, vocab: 1024, dtype: bf16,
        optimizer: {name: adam, grad_dtype: GRAD}}
training: {global_batch_size: 32, microbatch_size: 16}
plan: {schedule: 1f1b, tensor_parallel: 1, pipeline_parallel: 1, data_parallel: 16, sharding: optimizer,
       overlap: {grad_reduce: true, param_gather: true}}
"""


def _workload(grad_dtype: str):
    return compile_workload(parse_scenario(TEXT.replace("GRAD", grad_dtype), source="param-gather-bytes.yaml"))


def _bytes(workload, kind: str) -> float:
    return sum(k.bytes for k in workload.kinds if k.label[0] == kind)


@pytest.mark.parametrize("grad_dtype, ratio", [("bf16", 1.0), ("fp32", 0.5)])
def test_the_gather_moves_the_parameters_bytes(grad_dtype, ratio):
    """The reduce-scatter (AR kinds) moves the gradients' bytes; the all-gather (PG) the
    parameters': the same with bf16 gradients, half with fp32 ones (2 bytes of 4)."""
    w = _workload(grad_dtype)
    assert _bytes(w, "PG") == pytest.approx(ratio * _bytes(w, "AR"), rel=1e-12)
    assert _bytes(_workload("fp32"), "AR") == pytest.approx(2 * _bytes(_workload("bf16"), "AR"), rel=1e-12)
    assert _bytes(_workload("fp32"), "PG") == pytest.approx(_bytes(_workload("bf16"), "PG"), rel=1e-12)


def test_the_planner_prices_the_gather_as_the_replay():
    """The planner's one-stage estimate (exact for one stage) is the fast path's replay with fp32
    gradients, and its gather costs what the bf16-gradient model's does (the same parameter bytes)."""
    base = parse_scenario(TEXT.replace("GRAD", "fp32"), source="param-gather-bytes.yaml")
    base = dataclasses.replace(base, plan=None)
    candidate = Candidate(bounds=(0, base.model.num_layers), replicas=(16,), microbatch_size=16,
                          sharding=Sharding.OPTIMIZER)
    overlap = OverlapSpec(grad_reduce=True, param_gather=True)
    planned = to_scenario(base, candidate)
    planned = dataclasses.replace(planned, plan=dataclasses.replace(planned.plan, overlap=overlap))
    tables = CostTables(base, overlap=overlap)
    assert analytic_score(tables, base, candidate)[0] == pytest.approx(
        run_scenario(planned, engine="fast").summarize().iteration_time_s, rel=1e-9)
    layers = base.model.num_layers
    bf16 = CostTables(parse_scenario(TEXT.replace("GRAD", "bf16"), source="x.yaml"), overlap=overlap)
    gather_s = tables.param_gather_s(0, layers, 8, 2)[0]
    assert gather_s == pytest.approx(bf16.param_gather_s(0, layers, 8, 2)[0], rel=1e-12)
    # the reduce-scatter's rate term doubles, its latency does not: less than twice, more than once
    scatter_s = tables.allreduce_s(0, layers, 8, 2, Sharding.FULL)
    assert gather_s < scatter_s < 2 * gather_s

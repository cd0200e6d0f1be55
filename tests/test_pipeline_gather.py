"""The receiving tensor group's all-gather of a pipeline transfer (``plan.overlap.pipeline_gather``).

Megatron-LM sends each tensor rank's 1/t of a stage's output to the next stage (SC21 §4.1's
scatter/gather; the flows already send that share) and the receivers all-gather the whole
tensor over NVLink before the compute reads it (megatron/p2p_communication.py at 6fd7818,
``gather_split_1d_tensor``); with sequence parallelism the activation is already split and
nothing is gathered.
"""

from __future__ import annotations

import pytest

from sim.core.errors import DappleError
from sim.core.overlap import OverlapSpec
from sim.cost.comm import pipeline_gather_s
from sim.engine.run import run_scenario
from sim.input.scenario import parse_scenario

SCENARIO = """
cluster: {preset: a100-nvlink-8, nodes: 2}
model: {preset: gpt, layers: 4, hidden: 1024, heads: 16, seq_len: 1024, vocab: 4096, dtype: fp16}
training: {global_batch_size: 8, microbatch_size: 8}
plan: {schedule: 1f1b, tensor_parallel: 8, pipeline_parallel: 2, data_parallel: 1, sequence_parallel: SP,
       overlap: {pipeline_gather: FLAG}}
"""


def _iteration_s(flag: bool, sp: bool = False, engine: str = "fast") -> float:
    text = SCENARIO.replace("FLAG", str(flag).lower()).replace("SP", str(sp).lower())
    return run_scenario(parse_scenario(text), engine=engine).summarize().iteration_time_s


def test_the_gather_is_a_ring_all_gather_of_the_other_ranks_shares():
    link = parse_scenario(SCENARIO.replace("FLAG", "true").replace("SP", "false")).cluster.intra_node
    share = 2 * 2**20
    expected = 7 * share / (link.bandwidth_bytes_per_s * link.collective_efficiency) + 7 * link.latency_s
    assert pipeline_gather_s(share, 8, link) == pytest.approx(expected, rel=1e-12)
    assert pipeline_gather_s(share, 1, link) == 0.0 and pipeline_gather_s(0.0, 8, link) == 0.0


@pytest.mark.parametrize("engine", ["fast", "simpy"])
def test_one_micro_batch_waits_for_one_gather_each_way(engine):
    # one micro-batch over two stages: stage 1's forward waits on the activation's gather, stage
    # 0's backward on the gradient's; each share is 8 samples x 1024 x 1024 x 2 bytes / 8 ranks
    link = parse_scenario(SCENARIO.replace("FLAG", "true").replace("SP", "false")).cluster.intra_node
    gather = pipeline_gather_s(8 * 1024 * 1024 * 2 / 8, 8, link)
    assert _iteration_s(True, engine=engine) - _iteration_s(False, engine=engine) == pytest.approx(2 * gather, rel=1e-6)


def test_sequence_parallel_gathers_nothing():
    assert _iteration_s(True, sp=True) == _iteration_s(False, sp=True)


def test_the_key_is_read_checked_and_written_only_when_set():
    assert "pipeline_gather" not in OverlapSpec().to_json()
    assert OverlapSpec(pipeline_gather=True).to_json()["pipeline_gather"] is True
    with pytest.raises(DappleError, match="pipeline_gather"):
        OverlapSpec(pipeline_gather=1)

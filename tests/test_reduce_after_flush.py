"""Gradient reductions after the pipeline's flush (``plan.overlap.reduce_after_flush``).

Megatron-LM all-reduces each model chunk's gradients after ``forward_backward_func`` has run
the whole schedule (megatron/training.py at 6fd7818, ``train_step``); torch's pipelining
reduces each stage after its own last backward. A rank with several stages (interleaved 1F1B)
therefore starts no reduction before its last backward and runs them one after another: the
optimizer starts at last backward + Σ its chunks' all-reduces. One stage per rank: no change.
"""

from __future__ import annotations

import pytest

from sim.engine.run import run_scenario
from sim.input.scenario import parse_scenario
from sim.input.stack import STACKS
from sim.schedule.generators import generate
from sim.schedule.ir import ActionKind
from sim.schedule.passes import lower

SCENARIO = """
cluster: {preset: a100-nvlink-8, nodes: 2}
model: {preset: gpt, layers: 8, hidden: 1024, heads: 16, seq_len: 1024, vocab: 4096, dtype: fp16}
training: {global_batch_size: 32, microbatch_size: 8}
plan: {schedule: SCHEDULE, tensor_parallel: 4, pipeline_parallel: 2, data_parallel: 2, recompute: full,
       overlap: {reduce_after_flush: FLAG}}
"""


def _events(schedule: str, flag: bool, engine: str):
    s = parse_scenario(SCENARIO.replace("SCHEDULE", schedule).replace("FLAG", str(flag).lower()))
    result = run_scenario(s, engine=engine)
    rows = result.event_rows([0])
    return result.summarize().iteration_time_s, rows


def _reduce_and_optimizer(rows):
    reduces = sorted((r for r in rows if r.kind == "REDUCE_GRAD"), key=lambda r: r.start_s)
    last_compute_end = max(r.end_s for r in rows if r.kind in ("F", "B"))
    optim = next(r for r in rows if r.kind == "OPTIM")
    return reduces, last_compute_end, optim


def test_lowering_puts_every_reduction_after_the_ranks_last_action_lowest_stage_first():
    schedule = generate("interleaved", num_stages=2, num_microbatches=4, chunks=2)
    flushed = lower(schedule, reduce_after_flush=True)
    plain = lower(schedule)
    for acts in flushed.ranks:
        kinds = [a.kind for a in acts]
        first = kinds.index(ActionKind.REDUCE_GRAD)
        assert all(k is ActionKind.REDUCE_GRAD for k in kinds[first:]) and len(kinds) - first == 2
        stages = [a.stage for a in acts[first:]]
        assert stages == sorted(stages)
    # torch's placement: rank 0's chunk with the later stage reduces before its last backward
    rank0 = [a.kind for a in plain.ranks[0]]
    assert rank0.index(ActionKind.REDUCE_GRAD) < len(rank0) - 2


@pytest.mark.parametrize("engine", ["fast", "simpy"])
def test_interleaved_reductions_wait_for_the_flush_and_run_back_to_back(engine):
    flushed_s, rows = _events("{name: interleaved, chunks: 2}", True, engine)
    reduces, last_end, optim = _reduce_and_optimizer(rows)
    assert len(reduces) == 2 and reduces[0].start_s >= last_end - 1e-12
    assert reduces[1].start_s == pytest.approx(reduces[0].end_s)  # one collective stream, serial
    assert optim.start_s == pytest.approx(reduces[1].end_s)
    plain_s, plain_rows = _events("{name: interleaved, chunks: 2}", False, engine)
    plain_reduces, plain_end, _ = _reduce_and_optimizer(plain_rows)
    assert plain_reduces[0].start_s < plain_end  # the earlier chunk's reduction hides behind the backward
    # closed form: optimizer start = the flush + each stage's all-reduce as long as it is alone
    alone = {r.stage: r.end_s - r.start_s for r in plain_reduces}
    assert optim.start_s == pytest.approx(reduces[0].start_s + sum(alone.values()), rel=1e-9)
    assert [r.stage for r in reduces] == sorted(alone)  # lowest stage (Megatron's chunk 0) first
    assert flushed_s > plain_s


def test_one_stage_per_rank_is_unchanged():
    flushed_s, _ = _events("1f1b", True, "fast")
    plain_s, _ = _events("1f1b", False, "fast")
    assert flushed_s == plain_s


def test_megatron_lm_stack_reduces_after_the_flush_and_the_key_round_trips():
    assert any(v.key == "plan.overlap.reduce_after_flush" and v.value is True for v in STACKS["megatron-lm"])
    s = parse_scenario(SCENARIO.replace("SCHEDULE", "1f1b").replace("FLAG", "true"))
    assert s.plan.overlap.reduce_after_flush is True
    assert s.plan.overlap.to_json()["reduce_after_flush"] is True
    assert "reduce_after_flush" not in parse_scenario(
        SCENARIO.replace("SCHEDULE", "1f1b").replace("FLAG", "false")).plan.overlap.to_json()

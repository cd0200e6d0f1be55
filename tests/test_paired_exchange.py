"""Megatron-LM 2021's paired exchange in the interleaved schedule (``plan.overlap.paired_exchange``).

The interleaved loop at NVIDIA/Megatron-LM 6fd7818 (megatron/schedules.py) runs a steady step as
F, then B, then one blocking ``send_forward_backward_recv_forward_backward``: the forward's output
leaves only after the backward, and the backward's gradient must have arrived before the forward
(it came with the previous step's exchange). Its non-interleaved 1F1B sends and receives each
part on its own, as the default lowering does.
"""

from __future__ import annotations

import pytest

from sim.core.errors import DappleError
from sim.core.overlap import OverlapSpec
from sim.engine.run import run_scenario
from sim.input.scenario import parse_scenario
from sim.schedule.generators import generate
from sim.schedule.passes import lower, strip_communication

SCENARIO = """
cluster: {preset: a100-nvlink-8, nodes: 2}
model: {preset: gpt, layers: 8, hidden: 1024, heads: 16, seq_len: 1024, vocab: 4096, dtype: fp16}
training: {global_batch_size: 32, microbatch_size: 8}
plan: {schedule: {name: interleaved, chunks: 2}, tensor_parallel: 8, pipeline_parallel: 2, data_parallel: 1,
       recompute: full, overlap: {paired_exchange: FLAG}}
"""


def _text(acts) -> str:
    return " ".join(str(a) for a in acts)


def test_a_steady_forward_sends_after_the_backward_and_that_backward_receives_before_it():
    schedule = generate("interleaved", num_stages=2, num_microbatches=4, chunks=2)
    paired = lower(schedule, paired_exchange=True)
    # rank 0 (stages 0 and 2): warm-up forwards send at once; each steady (F, B) pair receives
    # B's gradient first and sends F's activation after B, beside B's own send.
    assert _text(paired.ranks[0]) == (
        "0F0 0SEND_F0 0F1 0SEND_F1 2RECV_F0 2F0 2SEND_F0 2RECV_F1 2F1 2SEND_F1 "
        "2RECV_B0 0F2 2B0 0SEND_F2 2SEND_B0 2RECV_B1 0F3 2B1 0SEND_F3 2SEND_B1 "
        "0RECV_B0 2RECV_F2 2F2 0B0 2SEND_F2 0RECV_B1 2RECV_F3 2F3 0B1 2SEND_F3 "
        "2RECV_B2 2B2 2SEND_B2 2RECV_B3 2B3 2SEND_B3 2REDUCE_GRAD 0RECV_B2 0B2 0RECV_B3 0B3 0REDUCE_GRAD")
    plain = lower(schedule)
    assert _text(plain.ranks[0]).startswith("0F0 0SEND_F0 0F1 0SEND_F1 2RECV_F0 2F0 2SEND_F0 2RECV_F1 2F1 "
                                            "2SEND_F1 0F2 0SEND_F2 2RECV_B0 2B0 2SEND_B0")
    assert strip_communication(paired) == strip_communication(plain)
    assert lower(paired, paired_exchange=True) == paired


def test_one_chunk_per_rank_is_untouched():
    schedule = generate("1f1b", num_stages=4, num_microbatches=8)
    assert lower(schedule, paired_exchange=True) == lower(schedule)


def _rows(flag: bool):
    result = run_scenario(parse_scenario(SCENARIO.replace("FLAG", str(flag).lower())), engine="fast")
    return result.summarize().iteration_time_s, result.event_rows([0, 8])


def test_the_replay_holds_each_paired_send_until_the_backward_ends():
    plain_s, _ = _rows(False)
    paired_s, rows = _rows(True)
    assert paired_s >= plain_s
    device0 = sorted((r for r in rows if r.device == 0), key=lambda r: (r.start_s, r.end_s))
    f2_send = next(r for r in device0 if r.kind == "SEND_F" and r.stage == 0 and r.microbatch == 2)
    b0_end = next(r.end_s for r in device0 if r.kind == "B" and r.stage == 2 and r.microbatch == 0)
    assert f2_send.start_s >= b0_end


def test_the_key_is_read_checked_and_written_only_when_set():
    assert "paired_exchange" not in OverlapSpec().to_json()
    assert OverlapSpec(paired_exchange=True).to_json()["paired_exchange"] is True
    with pytest.raises(DappleError, match="paired_exchange"):
        OverlapSpec(paired_exchange="yes")
    with pytest.raises(DappleError, match="paired_exchange"):
        parse_scenario(SCENARIO.replace("FLAG", "3"))

"""What ``dapple-plan`` prints: a plan in one short line, its metrics and degrees beside it,
one row per planner within 120 columns, and a closing line that never claims a win over the
same plan."""

from __future__ import annotations

import logging

import pytest

from conftest import SCENARIOS
from planner.cli import WIDTH, _margin, _rate, _table
from planner.search.budget import Spend
from planner.search.describe import plan_summary, wrap_summary
from planner.search.evaluation import EvaluationRow, PlanMetrics, evaluate, evaluation_row
from planner.search.ranking import PlannerResult
from planner.search.report import PlannerEntry, PlannerReport, build_report, spend_text
from planner.search.space import Candidate
from sim.core import jsonio
from sim.core.parallelism import Recompute, Sharding
from sim.input.scenario import load_scenario, parse_scenario

TINY = SCENARIOS / "gpt_tiny_cpu.yaml"
BERT = SCENARIOS / "paper" / "bert48_v100_2x8.yaml"

LLAMA_16K = """
name: llama-405b-like-16k
cluster: {preset: dgx-h100, nodes: 2048}
model: {preset: llama, layers: 126, hidden: 16384, heads: 128, kv_heads: 8, ffn_hidden: 53248, vocab: 128256,
        seq_len: 8192, dtype: bf16, optimizer: adam}
training: {global_batch_size: 2048, microbatch_size: 16}
"""


def test_a_uniform_4d_interleaved_plan_in_megatron_words():
    # 24 stages of 4 layers on 8 device sets (3 chunks each), 16 replicas of TP 8 units: 1,024 devices
    candidate = Candidate(bounds=tuple(range(0, 97, 4)), replicas=(16,) * 24, microbatch_size=16,
                          schedule="interleaved", chunks=3, tensor_parallel=8, sharding=Sharding.OPTIMIZER,
                          recompute=Recompute.SELECTIVE)
    assert plan_summary(candidate, global_batch_size=1536, cluster_devices=1024) == (
        "TP 8 × PP 8 (interleaved, 3 chunks) × DP 16 · ZeRO-1 · selective recompute · micro-batch 16 × 96")


def test_an_uneven_dapple_plan_names_its_replica_and_layer_counts():
    # DAPPLE's 15 : 1 plan (Fan et al. §4), with the communication-heavy warm-up and Fresh First
    candidate = Candidate(bounds=(0, 20, 53), replicas=(15, 1), microbatch_size=2,
                          params=(("policy", "2(s-i)-1"),), placement="fresh")
    assert plan_summary(candidate, global_batch_size=128, cluster_devices=16) == (
        "PP 2 (1F1B, warm-up 2(s-i)-1) × DP 1–15 (stages 15 + 1) · layers 20 + 33 · fresh placement"
        " · micro-batch 2 × 64")
    # many uneven stages: the range, and the replica counts tallied
    bounds = (0, 6) + tuple(range(8, 52, 2)) + (53,)
    many = Candidate(bounds=bounds, replicas=(3, 1, 2, 2, 2, 2) + (2,) * 18, microbatch_size=4, schedule="gpipe")
    assert plan_summary(many, global_batch_size=128) == (
        "PP 24 (GPipe) × DP 1–3 (22 stages of 2, 1 of 3, 1 of 1) · 24 stages of 2–6 layers · micro-batch 4 × 32")
    # layer counts as even as 53 layers allow (26 + 27) say nothing
    even = Candidate(bounds=(0, 26, 53), replicas=(8, 8), microbatch_size=8, schedule="gpipe")
    assert plan_summary(even, global_batch_size=128, cluster_devices=16) == "PP 2 (GPipe) × DP 8 · micro-batch 8 × 16"


def test_a_data_parallel_plan_is_its_degree_alone():
    dp = Candidate(bounds=(0, 53), replicas=(16,), microbatch_size=128, params=(("policy", "s-i"),),
                   sharding=Sharding.OPTIMIZER)
    assert plan_summary(dp, global_batch_size=128, cluster_devices=16) == "DP 16 · ZeRO-1 · micro-batch 128 × 1"
    gpipe = Candidate(bounds=(0, 53), replicas=(16,), microbatch_size=16, schedule="gpipe", sharding=Sharding.FULL,
                      recompute=Recompute.FULL)
    assert plan_summary(gpipe, global_batch_size=128) == (
        "DP 16 · GPipe schedule · ZeRO-3 · full recompute · micro-batch 16 × 8")


def test_a_plan_on_a_subset_of_the_devices_says_how_many_are_idle():
    # Turing-NLG-like: 641 servers of 8 (5,128 GPUs); TP 8 × PP 5 × DP 128 uses 5,120 of them
    candidate = Candidate(bounds=(0, 21, 42, 63, 84, 105), replicas=(128,) * 5, microbatch_size=128,
                          tensor_parallel=8, sharding=Sharding.OPTIMIZER)
    assert plan_summary(candidate, global_batch_size=1920, cluster_devices=5128) == (
        "TP 8 × PP 5 (1F1B) × DP 128 · ZeRO-1 · micro-batch 128 × 15 · 8 of 5,128 devices idle")


@pytest.fixture(scope="module")
def tiny():
    """Two tiny-GPT plans replayed by the fast path (a generated model: FLOPs and tokens known)."""
    scenario = load_scenario(TINY, ignore_plan=True)
    pipeline = evaluate(scenario, Candidate(bounds=(0, 3, 6), replicas=(1, 1), microbatch_size=4))
    single = evaluate(scenario, Candidate(bounds=(0, 6), replicas=(1,), microbatch_size=16, schedule="gpipe"))
    assert pipeline.ok and single.ok
    return scenario, pipeline, single


def test_metrics_carry_tokens_mfu_degrees_and_idle_devices(tiny):
    scenario, pipeline, single = tiny
    metrics = evaluation_row(pipeline, cluster_devices=2).metrics
    # tokens/s = global batch × sequence length / iteration time (16 × 32 tokens)
    assert metrics.tokens_per_s == pytest.approx(16 * 32 / metrics.iteration_time_s, rel=1e-12)
    assert 0 < metrics.mfu < 1 and metrics.mfu == pipeline.summary.mfu
    assert (metrics.tensor_parallel, metrics.context_parallel, metrics.pipeline_parallel, metrics.chunks,
            metrics.data_parallel, metrics.data_parallel_min) == (1, 1, 2, 1, 1, 1)
    assert (metrics.devices_used, metrics.idle_devices) == (2, 0)
    assert metrics.summary == "PP 2 (1F1B) × DP 1 · micro-batch 4 × 4"
    # one device of two: the other is idle, in the metrics and in the line
    alone = evaluation_row(single, cluster_devices=2).metrics
    assert (alone.devices_used, alone.idle_devices) == (1, 1)
    assert alone.summary == "DP 1 · GPipe schedule · micro-batch 16 × 1 · 1 of 2 devices idle"
    assert evaluation_row(single).metrics.idle_devices is None  # the cluster's size not given


def test_a_measured_profile_has_no_tokens_or_mfu_and_its_json_no_nan():
    scenario = load_scenario(BERT)
    found = evaluate(scenario, Candidate(bounds=(0, 53), replicas=(16,), microbatch_size=128))
    row = evaluation_row(found, cluster_devices=16)
    assert row.metrics.tokens_per_s is None and row.metrics.mfu is None
    data = row.to_json()["metrics"]
    assert data["tokens_per_s"] is None and data["mfu"] is None and data["idle_devices"] == 0
    assert "NaN" not in jsonio.dumps(data)  # jsonio refuses NaN: this dumps at all only without it


def test_two_planners_with_the_same_plan_say_so(tiny, caplog):
    scenario, pipeline, single = tiny
    assert pipeline.iteration_time_s < single.iteration_time_s
    spend = Spend(candidates=2428, partials=460_000, fast_replays=52, engine_replays=4)
    results = {"dapple": PlannerResult(planner="dapple", best=pipeline, evaluations=[pipeline], spend=spend),
               "megatron": PlannerResult(planner="megatron", best=pipeline, evaluations=[pipeline]),
               "even": PlannerResult(planner="even", best=single, evaluations=[single])}
    with caplog.at_level(logging.INFO, logger="planner.search.report"):
        report = build_report(scenario.name, results, 0.0, cluster_devices=2)
    assert [e.same_plan_as for e in report.planners] == [None, "dapple", None]
    assert report.to_json()["planners"]["megatron"]["same_plan_as"] == "dapple"
    assert report.to_json()["planners"]["dapple"]["spend"] == spend.to_json()
    assert "dapple: spend: 2,428 candidates · 0.46 M partial plans · 52 fast + 4 engine replays" in caplog.messages
    text = _table(report)
    lines = text.splitlines()
    assert next(line for line in lines if line.startswith("  megatron")).endswith("  same plan as dapple")
    assert "spend: dapple   2,428 candidates · 0.46 M partial plans · 52 fast + 4 engine replays" in lines
    ratio = single.iteration_time_s / pipeline.iteration_time_s
    assert ratio >= 1.10  # one micro-batch through one device against four through two
    assert lines[-2] == f"best: dapple (also found by megatron); {ratio:.2f}x faster than even, the next different plan"
    assert lines[-1] == "  PP 2 (1F1B) × DP 1 · micro-batch 4 × 4"
    assert "1.00x" not in text and "NaN" not in jsonio.dumps(report.to_json())


def test_the_margin_reads_in_percent_when_small_and_as_a_ratio_when_large():
    assert _margin(1.39, 1.0) == "1.39x faster than"
    assert _margin(1.10, 1.0) == "1.10x faster than"
    assert _margin(1.018, 1.0) == "1.8% faster than"
    assert _margin(1.0004, 1.0) == "0.04% faster than"
    assert _margin(2.0, 2.0) == "as fast as"


def test_spend_names_a_budget_it_reached():
    spend = Spend(candidates=50_000, fast_replays=64, engine_replays=3)
    spend.reach("candidates", 50_000)
    assert spend_text(spend.to_json()) == ("50,000 candidates · 64 fast + 3 engine replays"
                                           " (reached its budget of 50,000 candidates: best so far)")


def test_a_16384_gpu_plan_fits_the_table_at_120_columns():
    scenario = parse_scenario(LLAMA_16K)
    assert scenario.cluster.num_devices == 16_384
    # TP 8 × CP 2 units, 16 device sets of 63–64 replicas, 2 chunks each: 16,256 devices; 32 stages
    # of 3 or 4 layers, as even as 126 layers allow
    bounds = (0,) + tuple(range(3, 126, 4)) + (126,)
    candidate = Candidate(bounds=bounds, replicas=((64,) * 8 + (63,) * 8) * 2, microbatch_size=16,
                          schedule="interleaved", chunks=2, tensor_parallel=8, context_parallel=2,
                          sharding=Sharding.FULL, recompute=Recompute.SELECTIVE_OP, placement="scatter")
    summary = plan_summary(candidate, global_batch_size=2048, cluster_devices=scenario.cluster.num_devices)
    assert summary == ("TP 8 × CP 2 × PP 16 (interleaved, 2 chunks) × DP 63–64 (8 stages of 64, 8 of 63)"
                       " · ZeRO-3 · selective-op recompute · scatter placement"
                       " · micro-batch 16 × 128 · 128 of 16,384 devices idle")
    metrics = PlanMetrics(description=candidate.describe(), layout=candidate.layout(), placement="scatter",
                          iteration_time_s=12.345, throughput_samples_per_s=165.9, peak_memory_bytes=70.1 * 2**30,
                          speedup_over_dp=None, summary=summary, tokens_per_s=1.359e6, mfu=0.4123)
    entry = PlannerEntry(planner="megatron", row=EvaluationRow(plan={}, metrics=metrics), search_time_s=1.0,
                         candidates_scored=1, replays=1, rejected=0, rejected_by_kind={}, note="",
                         spend=Spend(candidates=1).to_json())
    report = PlannerReport(scenario=scenario.name, planners=(entry,), best_planner="megatron", search_time_s=1.0,
                           dp_fits=False, scenario_plan_ignored=False)
    lines = _table(report).splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    row = lines.index(next(line for line in lines if line.startswith("  megatron")))
    assert "  12.35s     165.9    1.36M   41%   70.1GiB      -  TP 8 × CP 2 × PP 16" in lines[row]
    # the line wraps at its separators, nothing cut: the pieces put back together are the line
    plan_column = lines[1].rindex("plan")
    pieces = [lines[row][plan_column:]] + [line[plan_column:] for line in lines[row + 1:]
                                           if line.startswith(" " * plan_column)]
    assert " ".join(pieces) == summary and "…" not in "".join(lines)


def test_a_piece_longer_than_the_line_is_cut():
    assert wrap_summary("DP 16 · micro-batch 128 × 1", 12) == ["DP 16", "· micro-bat…", "× 1"]
    assert wrap_summary("TP 8 × abcdefghijkl", 8) == ["TP 8", "× abcde…"]


def test_rates_fit_their_column():
    assert [_rate(v) for v in (57.0, 87.91, 1234.5, 12345.0, 999_700.0, 1.359e6, None)] == [
        "57", "87.91", "1,234", "12.3k", "1M", "1.36M", "-"]

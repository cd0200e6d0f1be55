"""The shipped presets against published runs (``dapple-sim published``), nothing fitted.

Acceptance of the fidelity issue: Korthikanti et al. 2022 (arXiv 2205.05198), Table 5's eight
iteration times within 5% on average and 10% at worst; Figure 1's memory numbers each within 5%.
A change to the cost model that breaks fidelity fails here.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from sim.app.cli import main
from sim.app.published import (
    DEFAULT_SUITE,
    RUN_METRICS,
    group_stats,
    megatron_v09_flops,
    narayanan_flops,
    parse_tokens_rate,
    read_suite,
    run_suite,
)
from sim.core.errors import UnitError
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario


@pytest.fixture(scope="module")
def results():
    """Korthikanti et al.'s rows (the default suite's); the whole suite is ``all_results``."""
    return run_suite(tuple(r for r in read_suite(DEFAULT_SUITE) if "2205.05198" in r.source))


@pytest.fixture(scope="module")
def all_results():
    """Every row of the suite: 36 replays up to 3,072 GPUs, half a minute; the tests on it are
    ``slow`` (``pytest -m slow``; ``benchmarks/published_bench.py`` prints the same numbers)."""
    return run_suite(read_suite(DEFAULT_SUITE))


def test_the_suite_names_a_source_table_and_row_for_every_number():
    rows = read_suite(DEFAULT_SUITE)
    assert sum(r.table == "Table 5" for r in rows) == 8
    assert sum(r.table == "Figure 1" for r in rows) == 12  # 3 per model: states, activations without and with
    korthikanti = [r for r in rows if r.table in ("Table 5", "Figure 1")]
    assert all("arXiv 2205.05198" in r.source and r.row and r.scenario.is_file() for r in korthikanti)
    assert all(r.source and r.row and r.scenario.is_file() for r in rows)
    assert {r.scenario.parent.name for r in rows} == {"published"}


def test_table_5_iteration_times_within_5_percent_on_average_and_10_at_worst(results):
    table5 = [r for r in results if r.row.table == "Table 5"]
    errors = [abs(r.error) for r in table5]
    assert len(errors) == 8
    assert sum(errors) / len(errors) <= 0.05, [(r.row.row, round(r.error, 3)) for r in table5]
    assert max(errors) <= 0.10, [(r.row.row, round(r.error, 3)) for r in table5]


def test_figure_1_memory_within_5_percent_each(results):
    figure1 = [r for r in results if r.row.table == "Figure 1"]
    assert len(figure1) == 12
    assert all(abs(r.error) <= 0.05 for r in figure1), [(r.row.row, round(r.error, 3)) for r in figure1]
    stats = {g.table: g for g in group_stats(results)}
    assert stats["Figure 1"].worst_abs_error == max(abs(r.error) for r in figure1)


def test_selective_recompute_with_sequence_parallelism_is_faster_than_full_recompute(results):
    # the paper's point (Table 5: 29-32% faster); the simulator must order every pair the same way
    times = {r.row.row: r.predicted for r in results if r.row.table == "Table 5"}
    for model in ("22B", "175B", "530B", "1T"):
        assert times[f"{model}, sequence parallel + selective"] < 0.85 * times[f"{model}, full recompute"]


def test_the_command_prints_rows_and_writes_json_and_a_plot(tmp_path, capsys):
    suite = tmp_path / "suite.yaml"
    scenario = DEFAULT_SUITE.parent / "korthikanti2022_22b_full.yaml"
    suite.write_text(f"""
sources: {{k: 'Korthikanti et al. 2022, arXiv 2205.05198'}}
rows:
  - {{scenario: {scenario}, metric: iteration_time, published: 1.42s, source: k, table: Table 5, row: '22B, full'}}
""")
    assert main(["published", "--suite", str(suite), "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "Table 5: 22B, full" in text and "1.42 s" in text and "mean |error|" in text
    data = json.loads((tmp_path / "out" / "published.json").read_text())
    assert data["rows"][0]["published"] == 1.42 and data["groups"][0]["rows"] == 1
    assert (tmp_path / "out" / "published.png").stat().st_size > 0
    assert main(["published", "--suite", str(suite), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["metric"] == "iteration_time"


@pytest.mark.parametrize(("row", "message"), [
    ("{scenario: x.yaml, metric: iteration_time, published: 1s, source: k, table: T, row: r}", "rows[0].scenario"),
    ("{scenario: S, metric: speed, published: 1s, source: k, table: T, row: r}", "rows[0].metric: unknown value"),
    ("{scenario: S, metric: iteration_time, published: 1, source: k, table: T, row: r}", "rows[0].published"),
    ("{scenario: S, metric: iteration_time, published: 1s, source: q, table: T, row: r}", "rows[0].source"),
    ("{scenario: S, metric: iteration_time, published: 1s, source: k, table: T}", "rows[0].row: missing"),
])
def test_a_bad_suite_row_is_one_line_naming_the_key(tmp_path, capsys, row, message):
    scenario = DEFAULT_SUITE.parent / "korthikanti2022_22b_full.yaml"
    suite = tmp_path / "suite.yaml"
    suite.write_text("sources: {k: paper}\nrows:\n  - " + row.replace("scenario: S", f"scenario: {scenario}") + "\n")
    assert main(["published", "--suite", str(suite)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


# Narayanan et al. 2021 (SC21) Tables 1 and 2 and torchtitan's 2024 H100 benchmark: every row
# loads, replays and gives a finite prediction. Their error bounds are not asserted yet (the
# mechanisms they need land separately); benchmarks/published_bench.py measures them.
NEW_TABLES = {("Narayanan", "Table 1"): 10, ("Narayanan", "Table 2"): 12, ("torchtitan", "Table 1"): 2,
              ("torchtitan", "Table 3"): 2}


def _new_rows(results):
    return [r for r in results if not r.row.source.startswith("Korthikanti")]


@pytest.mark.slow
def test_the_new_tables_have_every_row_with_its_source(all_results):
    results = all_results
    # issue 29's tables; the MoE rows (Megatron-Core's README, DeepSeek-V3's report) have their own tests
    rows = [r.row for r in _new_rows(results) if r.row.source.startswith(("Narayanan", "torchtitan"))]
    counts = {key: sum(r.source.startswith(key[0]) and r.table == key[1] for r in rows) for key in NEW_TABLES}
    assert counts == NEW_TABLES
    assert {r.metric for r in rows if r.source.startswith("Narayanan")} == {"tflops_per_gpu"}
    assert sorted(r.metric for r in rows if r.source.startswith("torchtitan")) == [
        "peak_memory", "peak_memory", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu"]
    for r in rows:  # each scenario names its source, table and row at its head
        head = r.scenario.read_text()
        assert r.scenario.name.startswith(("narayanan2021_t", "torchtitan2024_llama3_8b_"))
        assert r.table in head and ("arXiv 2104.04473" in head or "llama3_h100_202412_torchtitan.md" in head)


@pytest.mark.slow
def test_every_new_row_replays_to_a_finite_prediction(all_results):
    results = all_results
    rows = _new_rows(results)
    shown = [(r.row.table, r.row.row, f"{r.error:+.1%}", "OOM" if r.oom else "") for r in rows]
    assert all(math.isfinite(r.predicted) and r.predicted > 0 for r in rows), shown
    assert all(math.isfinite(r.error) for r in rows), shown


def test_narayanan_flops_is_section_5_1_equation_3():
    # F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)), Table 1's 1.7B row: B 512, s 2048, l 24, h 2304, V 51200
    b, s, l, h, v = 512, 2048, 24, 2304, 51200
    expected = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert narayanan_flops(batch=b, seq_len=s, layers=l, hidden=h, vocab=v) == pytest.approx(expected, rel=1e-12)
    # the paper's own check: at 137 TFLOP/s on 32 GPUs the aggregate is Table 1's 4.4 PFLOP/s
    assert 137e12 * 32 == pytest.approx(4.4e15, rel=0.01)


def test_the_new_metrics_read_the_replay():
    wanted = {"1.7B", "Llama 3.1 8B, 8 H100, FSDP", "Llama 3.1 8B, 8 H100, FSDP, memory"}
    results = run_suite(tuple(r for r in read_suite(DEFAULT_SUITE) if r.row in wanted))
    by_row = {(r.row.table, r.row.row): r for r in results}
    one = next(r for r in results if r.row.row == "1.7B")
    scenario = load_scenario(one.row.scenario)
    summary = run_scenario(scenario, engine="fast").summarize()
    flops = narayanan_flops(batch=512, seq_len=2048, layers=24, hidden=2304, vocab=51200)
    assert one.predicted == pytest.approx(flops / summary.iteration_time_s / 32, rel=1e-12)
    tokens = by_row[("Table 1", "Llama 3.1 8B, 8 H100, FSDP")]
    memory = by_row[("Table 1", "Llama 3.1 8B, 8 H100, FSDP, memory")]
    summary = run_scenario(load_scenario(tokens.row.scenario), engine="fast").summarize()
    assert tokens.predicted == pytest.approx(16 * 8192 / summary.iteration_time_s / 8, rel=1e-12)
    # torchtitan's memory is the allocator's peak reserved bytes: live bytes and 1.83 GiB per 75.31 allocated,
    # and the freed bf16 logits' block cached beside the head backward's peak (2 x 8192 tokens x 128,256 x 2 bytes)
    assert memory.predicted == pytest.approx(summary.peak_memory_bytes * (1 + 1.83 / 75.31) + 2 * 8192 * 128256 * 2,
                                             rel=1e-12)
    assert tokens.row.published == 5762 and memory.row.published == pytest.approx(82.4 * 2**30)


@pytest.mark.parametrize(("text", "value"), [("5762tokens/s", 5762.0), ("5,605 tokens/s", 5605.0)])
def test_a_token_rate_is_read_with_its_unit(text, value):
    assert parse_tokens_rate(text) == value


@pytest.mark.parametrize("text", ["5762", "fast tokens/s", 5762, "inf tokens/s"])
def test_a_token_rate_without_its_unit_is_refused(text):
    with pytest.raises(UnitError, match="tokens/s"):
        parse_tokens_rate(text)


def test_only_a_measured_run_carries_an_out_of_memory_verdict():
    # Figure 1's no-recompute configuration does not fit in 80 GB (the paper's point); its
    # memory accounting row carries no verdict, the same scenario's run metric would
    rows = [r for r in read_suite() if r.metric == "activation_memory" and "no recompute" in r.row][:1]
    (result,) = run_suite(rows)
    assert result.oom is False and result.row.metric not in RUN_METRICS
    timed = replace(result.row, metric="iteration_time", published=1.0)
    assert run_suite((timed,))[0].oom is True


def _errors(results, source: str, table: str, row_has: str = "") -> list:
    return [r for r in results if source in r.row.source and r.row.table == table and row_has in r.row.row]


@pytest.mark.slow
def test_sc21_table_1_within_5_percent_on_average_and_10_at_worst(all_results):
    results = all_results
    # where the shipped presets stand on Narayanan et al.'s weak scaling (nothing fitted): -2% to
    # +9.5% (2021's gradient all-reduce after the flush and unfused gradient accumulation counted);
    # issue 29 asks for 3% and 8%, which this does not reach yet
    rows = _errors(results, "2104.04473", "Table 1")
    errors = [abs(r.error) for r in rows]
    assert len(errors) == 10 and not any(r.oom for r in rows)
    assert sum(errors) / len(errors) <= 0.05 and max(errors) <= 0.10, [(r.row.row, round(r.error, 3)) for r in rows]


@pytest.mark.slow
def test_sc21_table_2_ptd_rows_within_6_percent_on_average_and_11_at_worst(all_results):
    results = all_results
    rows = _errors(results, "2104.04473", "Table 2", "PTD")
    errors = [abs(r.error) for r in rows]
    assert len(errors) == 6 and not any(r.oom for r in rows)
    assert sum(errors) / len(errors) <= 0.06 and max(errors) <= 0.11, [(r.row.row, round(r.error, 3)) for r in rows]


@pytest.mark.slow
def test_torchtitan_rows_fit_in_memory_and_are_within_35_percent(all_results):
    results = all_results
    # before this mechanisms (fused attention, FSDP by unit, overlap, op-level
    # checkpointing, eager kernels) 4 of these 4 runs were predicted out of memory
    rows = [r for r in results if "torchtitan" in r.row.source]
    assert len(rows) == 4 and not any(r.oom for r in rows)
    assert all(abs(r.error) <= 0.35 for r in rows), [(r.row.row, round(r.error, 3)) for r in rows]
    # memory within issue 29's 5%: FSDP2's fp32 shards and the cached logits' block counted
    assert all(abs(r.error) <= 0.05 for r in rows if r.row.metric == "peak_memory"), \
        [(r.row.row, round(r.error, 3)) for r in rows]


@pytest.mark.slow
def test_no_published_run_is_predicted_out_of_memory(all_results):
    results = all_results
    # the 530B ZeRO-3 row on 640 GPUs was, with units of whole 5B-parameter blocks; DeepSpeed's
    # stage3_max_live_parameters gathers sub-module by sub-module (sim.cost.zero3). DeepSeek-V3's
    # row was (77.5 of 77.1 GiB) until its recipe's memory was counted: the gate applied in the
    # SwiGLU (no routed outputs stashed), BF16 moments (§3.3.3), the recipe's recompute (§3.2.3)
    ooms = [r.row.row for r in results if r.oom]
    assert ooms == [], ooms


@pytest.mark.slow
def test_sc21_table_2_zero3_rows_within_6_percent_on_average_and_halving_with_the_gpus(all_results):
    results = all_results
    # DeepSpeed v0.3's ZeRO-3 (sim.cost.zero3: gathers prefetched a sub-module ahead over one flat ring,
    # a block gathered again for its recompute, the gradients all-reduced): -9.4% to +2.2% per row;
    # with blocking gathers and a reduce-scatter -16% to +20%; before either, +41% to +293% and the
    # 640-GPU row out of memory
    rows = _errors(results, "2104.04473", "Table 2", "ZeRO-3")
    errors = [abs(r.error) for r in rows]
    assert len(errors) == 6 and not any(r.oom for r in rows)
    assert sum(errors) / len(errors) <= 0.06 and max(errors) <= 0.10, [(r.row.row, round(r.error, 3)) for r in rows]
    for model in ("174.6B", "529.6B"):  # 4x the GPUs at a fixed batch: the published rate falls 3.3x and
        first, *_, last = [r.predicted for r in rows if r.row.row.startswith(model)]  # 2.9x, ours 2.9x and 3.0x
        assert first / last >= 2.8


def test_the_moe_rows_count_flops_as_megatron_core_does():
    rows = [r for r in read_suite(DEFAULT_SUITE)
            if r.metric == "megatron_tflops_per_gpu" and "moe/README.md" in r.source]
    assert [r.scenario.name for r in rows] == ["megatron2024_mixtral_8x7b_64.yaml"] * 2
    # Megatron-LM moe/README.md: "468 TFLOPS for Mixtral 8X7B" (MCore v0.9), "438 TFLOPS as of MCore v0.8"
    assert [r.published for r in rows] == [468e12, 438e12]


def test_the_moe_rows_errors_as_docs_moe_md_records_them():
    # nothing fitted: Mixtral +12.1% (v0.9) and +19.8% (v0.8) with Megatron-Core's fp32 gradients and
    # buckets (stack: megatron-core), v0.9's unfused router and permutation kernels (experts.permute:
    # unfused), the fast path's ports shared as processor sharing, the interleaved schedule's
    # parameter all-gathers a chunk ahead (+12.0% and +19.7% before: each chunk waited), the fused
    # rotary embedding's passes and Megatron's cross-entropy pass by pass; the H100 preset's matrix
    # efficiency unmeasured; DeepSeek-V3 with its communication SMs (held while the MoE blocks
    # compute: DualPipe's dedicated SMs, §3.2.1, deepseek-ai/profile-data train.json), its profiled
    # 192/128 attention kernels, MTP module, FP8 stash and casts, recompute, the pre-DeepGEMM FP8 rate
    # (DeepGEMM README speedups over CUTLASS 3.6; bf16 e_max unmeasured: docs/moe.md) and MLA's rotary
    # embeddings and query/key copies; every kernel followed by the presets' 2 µs launch gap, the H100's e_max
    # 0.71 once the MAMF timings' own gap is taken out (both +0.8 points on Mixtral, -0.4 on DeepSeek-V3);
    # Mixtral's attention at cuDNN's rate, which Transformer Engine runs on Hopper (-0.5 points); K in the
    # products' size curve (-2.1 points on Mixtral; DeepSeek-V3's FP8 e_max derived with it, +0.1); Megatron-Core's
    # passes over its whole gradient buffer (zero, divide, NaN check) and the clipping norm (-0.5)
    rows = [r for r in read_suite(DEFAULT_SUITE)
            if (r.metric == "megatron_tflops_per_gpu" and "moe/README.md" in r.source)
            or r.scenario.name == "deepseek2024_v3_2048.yaml"]
    errors = [round(r.error, 3) for r in run_suite(tuple(rows))]
    assert errors == [pytest.approx(0.121, abs=0.01), pytest.approx(0.198, abs=0.01), pytest.approx(0.160, abs=0.03)]


def test_the_deepseek_v3_row_is_180k_gpu_hours_per_trillion_tokens():
    (row,) = [r for r in read_suite(DEFAULT_SUITE) if r.scenario.name == "deepseek2024_v3_2048.yaml"]
    assert row.metric == "tokens_per_s_per_gpu"
    assert row.published == pytest.approx(1e12 / (180e3 * 3600), abs=0.5)  # 1,543.2 tokens/s a GPU


def test_megatron_v09_flops_of_a_dense_gpt_is_equation_3_without_the_recompute():
    # dense, g = a, f = 4h, not gated: 12·B·s·l·h²·(2 + s/h + 4 + V/(2lh)) = 72·B·s·l·h²·(1 + s/(6h) + V/(12lh))
    b, s, l, h, v = 512, 2048, 24, 2304, 51200
    expected = 72 * b * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))
    got = megatron_v09_flops(batch=b, seq_len=s, layers=l, hidden=h, heads=24, kv_heads=24, ffn_hidden=4 * h,
                             vocab=v, gated=False)
    assert got == pytest.approx(expected, rel=1e-12)


def test_megatron_v09_flops_of_mixtral_counts_full_attention_and_two_swiglu_experts():
    # Mixtral 8x7B: (1 + 8/32 + 4096/4096) + (14336/4096)·2·3/2 + 32000/(2·32·4096) per 12·B·s·l·h²
    got = megatron_v09_flops(batch=1, seq_len=4096, layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                             vocab=32000, gated=True, top_k=2)
    assert got == pytest.approx(12 * 4096 * 32 * 4096**2 * (2.25 + 10.5 + 32000 / 262144), rel=1e-12)
    assert got == pytest.approx(3.3967e14, rel=1e-4)

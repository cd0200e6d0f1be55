"""Calibration of the fused-attention efficiencies and the memory reserve: recovered from runs
the simulator generated with known values, left alone where no run constrains them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from sim.app.cli import main
from sim.core.errors import DappleError
from sim.engine.compile import compile_workload
from sim.engine.fastpath import replay
from sim.input.scenario import parse_scenario
from sim.report.analysis.calibrate import MeasuredRun, calibrate, params_yaml, predict, read_runs, row_scenario

FLASH_TEXT = """
cluster: {preset: a100-nvlink-8}
model: {preset: llama, layers: 2, hidden: 256, heads: 4, seq_len: 1024, vocab: 1024, dtype: bf16, attention: flash}
training: {global_batch_size: 4, microbatch_size: 1}
"""
FLASH = parse_scenario(FLASH_TEXT, source="flash.yaml")
UNFUSED = parse_scenario(FLASH_TEXT.replace("llama", "gpt").replace("flash}", "unfused}"), source="unfused.yaml")
ATTENTION = ("attention_efficiency", "attention_backward_efficiency", "sdpa_efficiency", "sdpa_backward_efficiency")
HEADER = ("hidden,heads,layers,seq_len,vocab,microbatch_size,global_batch_size,tp,dp,pp,recompute,iteration_time_s,"
          "attention,peak_memory_bytes")


def _with_device(scenario, **values):
    return replace(scenario, cluster=replace(scenario.cluster, device=replace(scenario.cluster.device, **values)))


def _runs(hiddens, seqs, **fixed) -> list[MeasuredRun]:
    """Two layers, one stage, one replica; with and without recomputation (a recomputed forward
    counts its attention twice, which separates the forward's efficiency from the backward's)."""
    values = {"layers": 2, "vocab": 1024, "microbatch_size": 1, "global_batch_size": 4, "dp": 1, "pp": 1} | fixed
    return [MeasuredRun(hidden=h, heads=h // 64, seq_len=s, recompute=rc, iteration_time_s=1.0, line=2 + k, **values)
            for k, (h, s, rc) in enumerate((h, s, rc) for h in hiddens for s in seqs for rc in (False, True))]


def _measured(generator, runs, reserve_bytes=None):
    """``runs`` with the times (and, with ``reserve_bytes``, peaks: replayed + reserve) ``generator`` gives."""
    times = predict([row_scenario(generator, run) for run in runs])
    runs = [replace(run, iteration_time_s=t) for run, t in zip(runs, times)]
    if reserve_bytes is None:
        return runs
    return [replace(run, peak_memory_bytes=_replayed_peak(generator, run) + reserve_bytes) for run in runs]


def _replayed_peak(scenario, run) -> float:
    return replay(compile_workload(row_scenario(scenario, run), contention=False)).summarize().peak_memory_bytes


@pytest.mark.slow  # a fit of four efficiencies over a dozen replays: 15 s; the unfused and bound cases stay in the default suite
def test_flash_efficiencies_are_fitted_back_from_a_small_llama():
    # attention's share grows with s/h: sequences of 1K to 16K tokens over hidden 256 to 2048;
    # every configuration measured twice, as a user repeats a run (the prior weighs half as much)
    truth = {"attention_efficiency": 0.42, "attention_backward_efficiency": 0.37}
    runs = _measured(_with_device(FLASH, **truth), _runs((256, 512, 1024, 2048), (1024, 4096, 16384))) * 2
    assert FLASH.cluster.device.attention_efficiency == 0.554  # the fit starts from the A100's FlashAttention-2
    result = calibrate(FLASH, runs)
    for name, value in truth.items():
        assert result.params[name] == pytest.approx(value, abs=1e-3), name
    assert result.fit.mape < 1e-3
    # no run used sdpa or gave a peak: those are left alone and named
    assert result.not_constrained == ("sdpa_efficiency", "sdpa_backward_efficiency", "memory_reserved_bytes")
    assert "sdpa_efficiency not constrained by these runs (no run uses attention: sdpa); left at 0.554" in result.notes


@pytest.mark.slow  # 6 s of fitting
def test_unfused_runs_leave_every_attention_efficiency_alone():
    runs = _measured(_with_device(UNFUSED, attention_efficiency=0.2, sdpa_efficiency=0.2),
                     _runs((256, 512), (512, 2048)))
    result = calibrate(UNFUSED, runs)
    assert set(ATTENTION) <= set(result.not_constrained) and not set(ATTENTION) & set(result.params)
    for name in ATTENTION:  # reported, and left at the base's value (not the generator's 0.2)
        kept = getattr(UNFUSED.cluster.device, name)
        assert f"{name} not constrained by these runs (no run uses attention: " in "\n".join(result.notes)
        assert any(note.endswith(f"left at {kept:.6g}") for note in result.notes if note.startswith(name))
    snippet = params_yaml(result.params, runs=len(runs), mape=result.fit.mape)
    assert "attention" not in snippet and "memory_reserved" not in snippet
    assert yaml.safe_load(snippet)["cluster"]["device"].keys() == {
        "efficiency", "matmul_half_dim", "kernel_overhead", "memory_efficiency", "action_overhead", "kernel_issue"}


def test_a_run_with_attention_sdpa_frees_the_sdpa_efficiencies_only():
    runs = _measured(FLASH, _runs((256,), (2048,), layers=1))
    runs = [replace(run, attention="sdpa") for run in runs]
    result = calibrate(FLASH, runs)
    assert {"sdpa_efficiency", "sdpa_backward_efficiency"} <= set(result.params)
    assert result.not_constrained[:2] == ("attention_efficiency", "attention_backward_efficiency")
    assert row_scenario(FLASH, runs[0]).model.attention == "sdpa"  # the row's kernel over the base's
    assert row_scenario(FLASH, replace(runs[0], attention=None)).model.attention == "flash"


def test_memory_reserved_is_the_measured_peak_less_the_replayed_tensors():
    # closed form: minimising sum((p_i + r) / m_i - 1)^2 gives r = sum((m_i - p_i) / m_i^2) / sum(1 / m_i^2)
    runs = _runs((256, 512), (512,))
    peaks = [_replayed_peak(UNFUSED, run) for run in runs]
    offsets = [3 * 2**30, 3 * 2**30, 2 * 2**30, 4 * 2**30]
    measured = [p + d for p, d in zip(peaks, offsets)]
    expected = sum(d / m**2 for d, m in zip(offsets, measured)) / sum(1 / m**2 for m in measured)
    runs = [replace(run, peak_memory_bytes=m) for run, m in zip(_measured(UNFUSED, runs), measured)]
    result = calibrate(UNFUSED, runs)
    assert result.params["memory_reserved_bytes"] == pytest.approx(expected, rel=1e-12)
    assert "memory_reserved_bytes" not in result.not_constrained
    assert [s.predicted_peak_memory_bytes for s in result.fit.runs] == pytest.approx([p + expected for p in peaks])
    # one reserve for every run: recovered exactly
    exact = calibrate(UNFUSED, _measured(UNFUSED, _runs((256, 512), (512,)), reserve_bytes=5 * 2**30))
    assert exact.params["memory_reserved_bytes"] == pytest.approx(5 * 2**30, rel=1e-9)


@pytest.mark.slow  # 4 s of fitting
def test_memory_reserved_stays_within_a_quarter_of_the_memory_and_what_lets_every_run_fit():
    memory = UNFUSED.cluster.device.memory_bytes
    result = calibrate(UNFUSED, _measured(UNFUSED, _runs((256,), (512,)), reserve_bytes=0.4 * memory))
    assert result.params["memory_reserved_bytes"] == pytest.approx(memory / 4)  # 20 GiB of 80
    assert any(note.startswith("memory_reserved stopped at the end of its range (20GiB, a quarter of the memory)")
               for note in result.notes)
    below = calibrate(UNFUSED, _measured(UNFUSED, _runs((256,), (512,)), reserve_bytes=-2**20))
    assert below.params["memory_reserved_bytes"] == 0.0
    # a run that ran bounds the reserve: tensors + reserve <= memory (here below a quarter of it)
    runs = _runs((256,), (512,))
    top = max(_replayed_peak(UNFUSED, run) for run in runs)
    small = _with_device(UNFUSED, memory_bytes=top / 0.9, memory_reserved_bytes=0.0)
    fits = calibrate(small, _measured(small, runs, reserve_bytes=0.5 * top))
    assert fits.params["memory_reserved_bytes"] == pytest.approx(top / 0.9 - top)
    assert any("the most with which line 2's run still fits" in note for note in fits.notes)


def test_the_snippet_calibrate_writes_has_the_fitted_keys_and_loads_back(tmp_path, capsys):
    base = tmp_path / "base.yaml"
    base.write_text(FLASH_TEXT)
    generator = _with_device(FLASH, attention_efficiency=0.45, attention_backward_efficiency=0.4)
    runs = _measured(generator, _runs((256, 1024), (1024, 8192)), reserve_bytes=3 * 2**30)
    rows = [",".join(str(v) for v in (r.hidden, r.heads, r.layers, r.seq_len, r.vocab, r.microbatch_size,
                                      r.global_batch_size, 1, r.dp, r.pp, int(r.recompute), r.iteration_time_s,
                                      "flash" if k % 2 else "", r.peak_memory_bytes))
            for k, r in enumerate(runs)]
    (tmp_path / "fit.csv").write_text("\n".join([HEADER, *rows]) + "\n")
    assert [run.attention for run in read_runs(tmp_path / "fit.csv")][:2] == [None, "flash"]
    out = tmp_path / "params.yaml"
    assert main(["calibrate", str(base), "--fit", str(tmp_path / "fit.csv"), "--json", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["not_constrained"] == ["sdpa_efficiency", "sdpa_backward_efficiency", "cudnn_efficiency",
                                         "cudnn_backward_efficiency"]
    device = yaml.safe_load(out.read_text())["cluster"]["device"]
    assert {"attention_efficiency", "attention_backward_efficiency", "memory_reserved"} <= set(device)
    loaded = parse_scenario(FLASH_TEXT, source="x", overrides={
        f"cluster.device.{key}": str(value) for key, value in device.items()}).cluster.device
    for name in ("attention_efficiency", "attention_backward_efficiency", "memory_reserved_bytes"):
        assert getattr(loaded, name) == pytest.approx(report["params"][name], rel=1e-5), name
    assert loaded.memory_reserved_bytes == pytest.approx(3 * 2**30, rel=1e-5)


@pytest.mark.parametrize(("cells", "message"), [
    ("fast,", "fit.csv:2: attention: 'fast' is not one of flash, sdpa, cudnn, unfused"),
    ("flash,lots", "fit.csv:2: peak_memory_bytes: 'lots' is not a number"),
    ("flash,-5", "fit.csv:2: peak_memory_bytes: '-5' must be a positive number of bytes"),
])
def test_bad_optional_cells_are_one_line_naming_file_line_and_column(tmp_path, cells, message):
    path = tmp_path / "fit.csv"
    path.write_text(f"{HEADER}\n256,4,2,64,512,1,8,1,1,1,0,0.5,{cells}\n")
    with pytest.raises(DappleError, match=message):
        read_runs(path)

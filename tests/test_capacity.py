"""A whole run's days, cost, energy and goodput (issue 33 items 1, 2, 5): closed forms written out.

Young (1974) τ = sqrt(2δM) minimises the first-order loss δ/τ + τ/2M; Daly's (2006)
higher-order optimum minimises the exact renewal time (e^{(τ+δ)/M} − 1)(M + R)/τ per unit of
work; the seeded Monte Carlo's mean lands within 2% of that exact form; energy and cost of a
hand-computed two-server cluster; the run's keys refused in one line; simulate's Run block
and JSON ``run`` section, absent when no run length is set.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sim.app.cli import main
from sim.core.errors import DappleError, ScenarioError
from sim.core.reliability import RELIABILITY_PRESETS, ReliabilitySpec
from sim.core.specs import ClusterSpec, DeviceSpec, LinkSpec
from sim.core.training import TrainingSpec
from sim.cost import energy
from sim.cost.capacity import checkpoint_bytes, estimate_from
from sim.cost.goodput import (
    daly_interval_s,
    expected_failures,
    expected_run_time_s,
    first_order_lost_fraction,
    monte_carlo_times_s,
    young_interval_s,
)
from sim.input.scenario import parse_scenario

HOUR = 3600.0

TINY = """
name: tiny-run
cluster: {preset: a100-nvlink-8, nodes: 1, devices_per_node: 2, nics_per_node: 1}
model: {preset: gpt, layers: 2, hidden: 64, heads: 2, seq_len: 32, vocab: 128}
training: {global_batch_size: 4, microbatch_size: 2}
plan: {stages: [{layers: [0, 2], devices: [0]}, {layers: [2, 4], devices: [1]}], schedule: gpipe}
"""


def _scenario(extra: str = "", training: str = "{global_batch_size: 4, microbatch_size: 2}", **kw):
    text = TINY.replace("{global_batch_size: 4, microbatch_size: 2}", training) + extra
    return parse_scenario(text, source="run.yaml", **kw)


# --- Young / Daly ------------------------------------------------------------------------------

def test_young_and_daly_closed_forms():
    delta, mtbf = 60.0, 3 * HOUR
    assert young_interval_s(delta, mtbf) == pytest.approx(math.sqrt(2 * 60 * 10800))  # 1138.4 s
    x = 60 / (2 * 10800)
    assert daly_interval_s(delta, mtbf) == pytest.approx(math.sqrt(2 * 60 * 10800) * (1 + math.sqrt(x) / 3 + x / 9) - 60)
    assert daly_interval_s(3 * mtbf, mtbf) == mtbf  # δ >= 2M: checkpoint every M


def test_young_minimises_the_first_order_loss_and_daly_the_exact_time():
    delta, mtbf, restart = 120.0, 2 * HOUR, 300.0
    first = (lambda tau: delta / tau + tau / (2 * mtbf))
    young = young_interval_s(delta, mtbf)
    assert first(young) < first(0.9 * young) and first(young) < first(1.1 * young)
    exact = (lambda tau: math.expm1((tau + delta) / mtbf) * (mtbf + restart) / tau)  # wall time per work second
    daly = daly_interval_s(delta, mtbf)
    assert exact(daly) < exact(0.9 * daly) and exact(daly) < exact(1.1 * daly)
    assert exact(daly) < exact(young)  # the higher-order optimum beats Young's on the exact model


# --- goodput under a constant failure rate -----------------------------------------------------

def test_goodput_of_a_hand_computed_case():
    # 100 h of work, a checkpoint every hour blocking 0.1 h, cluster MTBF 50 h, restart 0.2 h
    work, tau, delta, mtbf, restart = 100 * HOUR, HOUR, 0.1 * HOUR, 50 * HOUR, 0.2 * HOUR
    assert first_order_lost_fraction(tau, delta, mtbf, restart) == pytest.approx(0.1 / 1 + (0.5 + 0.2) / 50)
    # 100 segments of 1.1 h, each (e^{1.1/50} − 1)(50 h + 0.2 h): 111.66 h
    segment = (math.exp(1.1 / 50) - 1) * 50.2 * HOUR
    assert expected_run_time_s(work, interval_s=tau, blocking_s=delta, mtbf_s=mtbf, loss_s=restart) == \
        pytest.approx(100 * segment, rel=1e-12)
    assert expected_failures(work, interval_s=tau, blocking_s=delta, mtbf_s=mtbf) == \
        pytest.approx(100 * (math.exp(1.1 / 50) - 1))
    # a remainder: 2.5 h of work is two full segments and a last half hour without its checkpoint
    two_and_a_half = expected_run_time_s(2.5 * HOUR, interval_s=tau, blocking_s=delta, mtbf_s=mtbf, loss_s=restart)
    assert two_and_a_half == pytest.approx(2 * segment + (math.exp(0.5 / 50) - 1) * 50.2 * HOUR)


def test_monte_carlo_mean_within_two_percent_of_the_closed_forms():
    # Llama 3's rate on 16,384 GPUs (M ≈ 3.1 h), a 30-day run: the exact renewal form
    mtbf = RELIABILITY_PRESETS["llama3-405b"].gpu_mtbf_s / 16_384
    work, delta, restart = 30 * 86400.0, 60.0, 600.0
    tau = daly_interval_s(delta, mtbf)
    times, counts = monte_carlo_times_s(work, interval_s=tau, blocking_s=delta, mtbf_s=mtbf, loss_s=restart,
                                        runs=1000, seed=7)
    exact = expected_run_time_s(work, interval_s=tau, blocking_s=delta, mtbf_s=mtbf, loss_s=restart)
    assert abs(times.mean() / exact - 1) < 0.02
    assert abs(counts.mean() / expected_failures(work, interval_s=tau, blocking_s=delta, mtbf_s=mtbf) - 1) < 0.02
    # rare failures (M = 1000 h): the first-order form is accurate too
    rare = 1000 * HOUR
    tau = young_interval_s(delta, rare)
    times, _ = monte_carlo_times_s(work, interval_s=tau, blocking_s=delta, mtbf_s=rare, loss_s=restart,
                                   runs=2000, seed=1)
    assert abs(times.mean() / (work / (1 - first_order_lost_fraction(tau, delta, rare, restart))) - 1) < 0.02


def test_monte_carlo_is_seeded_and_bounded():
    args = dict(interval_s=HOUR, blocking_s=60.0, mtbf_s=10 * HOUR, loss_s=600.0, runs=200)
    first, _ = monte_carlo_times_s(1000 * HOUR, seed=3, **args)
    again, _ = monte_carlo_times_s(1000 * HOUR, seed=3, **args)
    other, _ = monte_carlo_times_s(1000 * HOUR, seed=4, **args)
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    assert np.percentile(first, 5) < np.percentile(first, 95)
    with pytest.raises(DappleError, match="failures") as caught:  # ~1.1e6 failures a run: refused
        monte_carlo_times_s(1e7 * HOUR, seed=0, **args)
    assert "\n" not in str(caught.value)


def test_llama3_preset_is_the_published_rate_per_gpu():
    rate = RELIABILITY_PRESETS["llama3-405b"]
    assert rate.gpu_mtbf_s == pytest.approx(16_384 * 54 * 24 * HOUR / 419)  # 50,676 h
    assert "§3.3.4" in rate.source and "Table 5" in rate.source


# --- energy and cost ---------------------------------------------------------------------------

def _two_servers(**site) -> ClusterSpec:
    device = DeviceSpec(name="g", memory_bytes=2**34, peak_flop_per_s=1e14, peak_fp32_flop_per_s=1e13,
                        memory_bandwidth_bytes_per_s=1e12, power_w=400.0, idle_power_w=100.0)
    return ClusterSpec(nodes=2, devices_per_node=4, device=device, intra_node=LinkSpec(bandwidth_bytes_per_s=1e11),
                       inter_node=LinkSpec(bandwidth_bytes_per_s=1e10), **site)


def test_energy_and_cost_of_two_servers():
    cluster = _two_servers(price_per_gpu_hour=2.5, host_power_w=500.0, pue=1.2, carbon_g_per_kwh=400.0)
    training = TrainingSpec(global_batch_size=8, microbatch_size=1, steps=36_000)
    model = parse_scenario(TINY, source="t").model
    # 36,000 steps of 1 s = 10 h; busy shares summing to 4 over 8 devices (half busy on average)
    run = estimate_from(cluster=cluster, training=training, model=model, reliability=None, iteration_time_s=1.0,
                        busy_share_sum=4.0)
    totals = run.failure_free
    assert totals.time_s == 36_000.0 and totals.gpu_hours == 80.0 and totals.cost == 200.0
    # devices 8 × 100 W + (400 − 100) W × 4 = 2000 W, hosts 2 × 500 W; 3 kW × 10 h × PUE 1.2 = 36 kWh
    assert totals.energy_kwh == pytest.approx(36.0)
    assert totals.carbon_kg == pytest.approx(36.0 * 0.4)
    assert run.busy_share == 0.5
    # no idle power: every device at full power (an upper bound), said so
    bare = estimate_from(cluster=_two_servers(), training=training, model=model, reliability=None,
                         iteration_time_s=1.0, busy_share_sum=4.0)
    assert bare.failure_free.cost is None and any("no price set" in a for a in bare.assumptions)
    assert any("no PUE set" in a for a in bare.assumptions)
    assert energy.cluster_power_w(devices=8, busy_device_share_sum=4.0, power_w=400.0, idle_power_w=None,
                                  servers=2, host_power_w=0.0) == 3200.0


def test_goodput_folds_into_the_expected_totals():
    cluster = _two_servers(price_per_gpu_hour=1.0)
    model = parse_scenario(TINY, source="t").model
    spec = ReliabilitySpec(gpu_mtbf_s=800 * HOUR, source="test", write_bandwidth_bytes_per_s=1e8, restart_s=600.0)
    run = estimate_from(cluster=cluster, training=TrainingSpec(global_batch_size=8, microbatch_size=1, steps=720_000),
                        model=model, reliability=spec, iteration_time_s=1.0, busy_share_sum=8.0)
    mtbf = 800 * HOUR / 8
    delta = checkpoint_bytes(model) / 1e8
    assert run.goodput.cluster_mtbf_s == mtbf and run.checkpoint.blocking_s == pytest.approx(delta)
    assert run.checkpoint.interval_s == pytest.approx(daly_interval_s(delta, mtbf)) and run.checkpoint.rule == "daly"
    assert run.expected.time_s == pytest.approx(expected_run_time_s(
        720_000.0, interval_s=run.checkpoint.interval_s, blocking_s=delta, mtbf_s=mtbf, loss_s=600.0))
    assert run.expected.cost == pytest.approx(run.expected.time_s / HOUR * 8)
    assert run.goodput.goodput == pytest.approx(720_000.0 / run.expected.time_s)
    assert abs(run.monte_carlo.mean_s / run.expected.time_s - 1) < 0.02


# --- reading the keys --------------------------------------------------------------------------

def test_tokens_become_steps_rounded_up():
    scenario = _scenario(training="{global_batch_size: 4, microbatch_size: 2, tokens: 1M}")
    assert scenario.training.steps == math.ceil(1e6 / (4 * 32)) == 7813
    assert _scenario(training="{global_batch_size: 4, microbatch_size: 2, steps: 10}").training.steps == 10
    assert _scenario().training.steps is None and _scenario().reliability is None


@pytest.mark.parametrize("training, extra, message", [
    ("{global_batch_size: 4, microbatch_size: 2, tokens: 1M, steps: 3}", "", "training.tokens: give either"),
    ("{global_batch_size: 4, microbatch_size: 2, steps: -3}", "", "training.steps: must be an integer >= 1"),
    ("{global_batch_size: 4, microbatch_size: 2, tokens: 12Q}", "", "training.tokens: unknown count unit"),
], ids=["both", "negative-steps", "bad-unit"])
def test_bad_run_length_is_one_line(training, extra, message):
    with pytest.raises(ScenarioError, match=message) as caught:
        _scenario(extra, training=training)
    assert "\n" not in str(caught.value)


def test_tokens_on_a_model_without_a_sequence_suggests_steps():
    text = TINY.replace("{preset: gpt, layers: 2, hidden: 64, heads: 2, seq_len: 32, vocab: 128}",
                        "{preset: mlp, layers: 2, hidden: 64}").replace(
        "microbatch_size: 2}", "microbatch_size: 2, tokens: 1B}")
    with pytest.raises(ScenarioError, match="training.tokens: .*no sequence.*give training.steps") as caught:
        parse_scenario(text, source="run.yaml", ignore_plan=True)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("override, message", [
    ({"cluster.price_per_gpu_hour": "-2"}, "cluster.price_per_gpu_hour: must be a number in"),
    ({"cluster.pue": "0.9"}, "cluster.pue: must be a number in"),
    ({"cluster.device.power_w": "700 kg"}, "cluster.device.power_w: unknown power unit"),
    ({"cluster.device.idle_power_w": "800"}, "idle_power_w: 800 W needs a power_w at least as large"),
    ({"cluster.host_power_w": "-5W"}, "cluster.host_power_w: must be positive"),
], ids=["negative-price", "pue-below-1", "power-unit", "idle-above-full", "negative-host"])
def test_bad_site_keys_are_one_line(override, message):
    with pytest.raises(ScenarioError, match=message) as caught:
        _scenario(overrides=override)
    assert "\n" not in str(caught.value)


RELIABLE = """
reliability:
  preset: llama3-405b
  checkpoint: {interval: auto, write_bandwidth: 1GB/s}
  restart_s: 10min
"""


def test_reliability_section_reads_units_and_presets():
    spec = _scenario(RELIABLE).reliability
    assert spec.gpu_mtbf_s == RELIABILITY_PRESETS["llama3-405b"].gpu_mtbf_s and spec.restart_s == 600.0
    assert spec.checkpoint_interval_s is None and spec.write_bandwidth_bytes_per_s == 1e9
    given = _scenario(RELIABLE.replace("preset: llama3-405b", "interruptions_per_day: 8\n  gpus: 1024")
                      .replace("auto", "30min")).reliability
    assert given.gpu_mtbf_s == 1024 * 86400 / 8 and given.checkpoint_interval_s == 1800.0
    assert _scenario(RELIABLE.replace("preset: llama3-405b", "gpu_mtbf_h: 50000")).reliability.gpu_mtbf_s == 5e4 * HOUR


@pytest.mark.parametrize("old, new, message", [
    ("preset: llama3-405b", "preset: llama3-405b\n  gpu_mtbf_h: 5", "reliability: give one failure rate"),
    ("preset: llama3-405b", "preset: llama2", "reliability.preset: unknown value 'llama2'; valid: llama3-405b"),
    ("restart_s: 10min", "restart_s: -1", "reliability.restart_s: must"),
    ("interval: auto", "interval: often", "reliability.checkpoint.interval: cannot read"),
    ("preset: llama3-405b", "interruptions_per_day: 8", "reliability.gpus: missing"),
], ids=["two-rates", "unknown-preset", "negative-restart", "bad-interval", "rate-without-gpus"])
def test_bad_reliability_is_one_line(old, new, message):
    with pytest.raises(ScenarioError, match=message) as caught:
        _scenario(RELIABLE.replace(old, new))
    assert "\n" not in str(caught.value)


# --- simulate's Run block and JSON -------------------------------------------------------------

def _simulate(tmp_path, capsys, extra: str, *flags: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(TINY.replace("microbatch_size: 2}", "microbatch_size: 2, steps: 100000}") + extra)
    assert main(["simulate", str(path), "--engine", "fast", *flags]) == 0
    return capsys.readouterr().out


def test_simulate_prints_the_run_block_with_its_assumptions(tmp_path, capsys):
    out = _simulate(tmp_path, capsys, RELIABLE)
    assert "Run: 100,000 steps (1.28e+07 tokens) on 2 devices" in out
    assert "no price set (cluster.price_per_gpu_hour)" in out
    assert "device power 400 W at full load" in out and "no PUE set (cluster.pue): 1.0" in out
    assert "Dubey et al. 2024, §3.3.4, Table 5" in out and "Daly 2006's optimum" in out
    assert "p5-p95" in out and "goodput" in out


def test_simulate_json_has_a_run_section_only_when_set(tmp_path, capsys):
    data = json.loads(_simulate(tmp_path, capsys, RELIABLE, "--json"))
    run = data["run"]
    assert run["steps"] == 100_000 and run["devices"] == 2
    assert run["failure_free"]["time_s"] == pytest.approx(100_000 * data["iteration_time_s"])
    assert run["failure_free"]["gpu_hours"] == pytest.approx(2 * run["failure_free"]["time_s"] / HOUR)
    assert run["checkpoint"]["rule"] == "daly" and run["monte_carlo"]["runs"] == 1000
    path = tmp_path / "plain.yaml"
    path.write_text(TINY)
    assert main(["simulate", str(path), "--engine", "fast", "--json"]) == 0
    assert "run" not in json.loads(capsys.readouterr().out)


def test_check_lists_the_run_keys(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(TINY.replace("microbatch_size: 2}", "microbatch_size: 2, tokens: 1M}") + RELIABLE)
    assert main(["check", str(path), "--json"]) == 0
    keys = json.loads(capsys.readouterr().out)["run_keys"]
    assert keys["training.steps"] == "7,813" and keys["cluster.pue"] == "not set (1.0)"
    assert keys["reliability.restart_s"] == "600" and keys["reliability.checkpoint.interval"] == "auto"

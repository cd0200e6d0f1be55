"""Calibrate the kernel cost model on this CPU from real runs (issue: calibrated cost model).

1. measure the device and the gloo links between two processes, and write the base scenario
   ``scenarios/calibration/cpu_base.yaml`` (its cluster is what was measured);
2. run ``--configs`` small GPT configurations with the torch runtime (layers, hidden, heads,
   sequence, micro-batch, and pp x dp on the 2 ranks) and write their median iteration
   times to ``scenarios/calibration/cpu_runs.csv`` (``dapple-sim calibrate``'s format).
   Every configuration uses both cores: a process alone on this virtual machine runs about
   20% faster than two side by side (shared cache and clock), which is a different device.
   The configurations are measured in ``--rounds`` interleaved rounds and each keeps the
   median of its rounds, so that the host's slow drifts do not fall on a few of them;
3. fit on the first ``--fit`` rows and predict the others: prints both tables and the MAPE.

    python benchmarks/cpu_calibration.py [--configs 30] [--rounds 3] [--fit 5] [--skip-measure]
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "scenarios" / "calibration"
BASE = FOLDER / "cpu_base.yaml"
RUNS = FOLDER / "cpu_runs.csv"


def _links(device):
    from runtime.measure.bandwidth import measure_links

    return measure_links(device, repeats=10)


def measure_base() -> None:
    import torch

    from runtime.execution.launch import spawn
    from runtime.measure.bandwidth import cluster_yaml, measure_device

    torch.set_num_threads(1)
    links = spawn(_links, 2)[0]
    # the runs' tensors are a few MB at most and stay in cache, so bandwidth is measured on a
    # cache-sized copy rather than on DRAM (which is about 3x slower here)
    device = measure_device(torch.device("cpu"), copy_bytes=2 * 2**20)
    cluster = yaml.safe_load(cluster_yaml(device, links, nodes=1, devices_per_node=2, memory_share=2))["cluster"]
    cluster["device"].update(efficiency=0.5, matmul_half_dim=16, kernel_overhead="20us", memory_efficiency=0.5)
    doc = {"name": "cpu-calibration-base", "cluster": cluster,
           "model": {"preset": "gpt", "layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128,
                     "dtype": "fp32", "optimizer": "adam", "tied_embeddings": False},
           "training": {"global_batch_size": 8, "microbatch_size": 4}}
    BASE.write_text("# This machine's CPU core and gloo links, measured by benchmarks/cpu_calibration.py;\n"
                    "# the device's kernel-model values are starting points for dapple-sim calibrate.\n"
                    + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None))


def _configs(count: int) -> list[dict]:
    rng = random.Random(2026)
    out = []
    while len(out) < count:
        hidden = rng.choice([32, 64, 128, 256])
        layers = rng.choice([2, 4, 6])
        pp, dp = rng.choice([(2, 1), (1, 2)])
        microbatch_size = rng.choice([1, 2, 4, 8])
        out.append({"hidden": hidden, "heads": rng.choice([h for h in (2, 4, 8) if hidden // h >= 8]),
                    "layers": layers, "seq_len": rng.choice([16, 32, 64]), "vocab": rng.choice([128, 256]),
                    "microbatch_size": microbatch_size,
                    "global_batch_size": microbatch_size * dp * rng.choice([2, 4, 8]), "tp": 1,
                    "dp": dp, "pp": pp, "recompute": 0})
    return out


def _session(device, runnable):
    from runtime.execution.session import SessionOptions, run_session

    return run_session(runnable, SessionOptions(steps=10, warmup_steps=2), device)


def measure_runs(count: int, rounds: int) -> None:
    from runtime.execution.launch import spawn
    from runtime.model.config import load_runnable
    from sim.input.scenario import load_scenario
    from sim.report.analysis.calibrate import COLUMNS, row_scenario

    base = load_scenario(BASE)
    configs = _configs(count)
    runnables = []
    for config in configs:
        from sim.report.analysis.calibrate import MeasuredRun

        run = MeasuredRun(**{k: v for k, v in config.items() if k != "tp"} | {"iteration_time_s": 1.0,
                                                                             "recompute": False})
        scenario = row_scenario(base, run)
        stages = "[" + ", ".join(f"{{layers: [{s.layers[0]}, {s.layers[1]}], devices: {list(s.devices)}}}"
                                 for s in scenario.plan.stages) + "]"
        overrides = {"model.layers": str(config["layers"]), "model.hidden": str(config["hidden"]),
                     "model.heads": str(config["heads"]), "model.seq_len": str(config["seq_len"]),
                     "model.vocab": str(config["vocab"]), "training.microbatch_size":
                     str(scenario.training.microbatch_size), "training.global_batch_size":
                     str(config["global_batch_size"]), "cluster.devices_per_node": "2", "plan.stages": stages}
        runnables.append(load_runnable(ROOT / "scenarios" / "gpt_tiny_cpu.yaml", overrides))
    times: list[list[float]] = [[] for _ in configs]
    for round_ in range(rounds):
        for index, (config, runnable) in enumerate(zip(configs, runnables)):
            started = time.perf_counter()
            summary = spawn(_session, config["pp"] * config["dp"], runnable)[0]
            times[index].append(summary["median_iteration_time_s"])
            print(f"round {round_ + 1}/{rounds} {index + 1:>3}/{count} {config} -> "
                  f"{times[index][-1] * 1e3:.2f} ms ({time.perf_counter() - started:.1f} s)", file=sys.stderr)
    rows = [{**config, "iteration_time_s": f"{statistics.median(measured):.6f}"}
            for config, measured in zip(configs, times)]
    with open(RUNS, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)


def fit_and_test(fit_rows: int) -> None:
    from sim.input.scenario import load_scenario
    from sim.report.analysis.calibrate import calibrate, params_yaml, read_runs, score_runs

    base = load_scenario(BASE)
    runs = read_runs(RUNS)
    fitted = calibrate(base, runs[:fit_rows], source=str(RUNS))
    parts = [("fit", fitted.fit)]
    if runs[fit_rows:]:
        parts.append(("test", score_runs(base, runs[fit_rows:], fitted.params, source=str(RUNS))))
    print(params_yaml(fitted.params, runs=len(runs[:fit_rows]), mape=fitted.fit.mape))
    for note in fitted.notes:  # a parameter at a bound of its physical range, too few runs
        print(f"note: {note}")
    for name, part in parts:
        tau = "-" if part.kendall_tau is None else f"{part.kendall_tau:.3f}"
        print(f"{name}: {len(part.runs)} runs, MAPE {part.mape:.2%}, Kendall tau {tau}")
        print(f"  {'hidden':>6} {'heads':>5} {'layers':>6} {'seq':>4} {'vocab':>5} {'mb':>3} {'gbs':>4} {'dp':>3} "
              f"{'pp':>3} {'measured ms':>12} {'predicted ms':>13} {'error':>7}")
        for scored in part.runs:
            r = scored.run
            print(f"  {r.hidden:>6} {r.heads:>5} {r.layers:>6} {r.seq_len:>4} {r.vocab:>5} "
                  f"{r.microbatch_size:>3} {r.global_batch_size:>4} {r.dp:>3} {r.pp:>3} "
                  f"{r.iteration_time_s * 1e3:>12.2f} {scored.predicted_s * 1e3:>13.2f} {scored.error_frac:>+7.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved measurements of each configuration")
    parser.add_argument("--fit", type=int, default=5)
    parser.add_argument("--skip-measure", action="store_true", help="fit the recorded CSV only")
    args = parser.parse_args()
    if not args.skip_measure:
        measure_base()
        measure_runs(args.configs, args.rounds)
    fit_and_test(args.fit)


if __name__ == "__main__":
    main()

"""Single-GPU stage timing: predicted vs measured per-stage time and peak memory (issue 6).

On one GPU, every stage of a 4-stage GPT plan runs its rank's action list of GPipe and of
DAPPLE at 4, 8 and 16 micro-batches, alone, with synthetic inputs and gradients instead of
its neighbours (``runtime.measure.stage_timing``). The simulator predicts the same numbers from a
profile measured on the same GPU. The table shows both with relative errors; the goals are
peak memory within 3% and compute time within 5%. Runs in a few minutes on an H100/H200.

Without a GPU it does a small dry run on the CPU (memory is then counted, not allocated).

    python benchmarks/gpu_stage_timing.py [--out DIR] [--microbatches 4 8 16]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
import yaml

GPU_MODEL = {"preset": "gpt", "layers": 14, "hidden": 2048, "heads": 16, "seq_len": 1024, "vocab": 32000,
             "dtype": "fp32", "optimizer": "adam"}
CPU_MODEL = {"preset": "gpt", "layers": 6, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128,
             "dtype": "fp32", "optimizer": "adam"}


def _scenario(model: dict, device_name: str, memory: str, stages: int, microbatch_size: int, microbatches: int) -> dict:
    layers = model["layers"] + 2
    bounds = [round(s * layers / stages) for s in range(stages + 1)]
    return {
        "name": f"stage-timing-{device_name}",
        "cluster": {"nodes": 1, "devices_per_node": stages,
                    "device": {"name": device_name, "memory": memory, "peak_flops": "1000TFLOP/s",
                               "peak_fp32_flops": "100TFLOP/s", "memory_bandwidth": "3000GB/s"},
                    "intra_node": {"bandwidth": "400GB/s", "latency": "5us"},
                    "inter_node": {"bandwidth": "50GB/s", "latency": "5us"}},
        "model": model,
        "training": {"global_batch_size": microbatch_size * microbatches, "microbatch_size": microbatch_size},
        "plan": {"schedule": "dapple",
                 "stages": [{"layers": [bounds[s], bounds[s + 1]], "devices": [s]} for s in range(stages)]},
    }


def main() -> None:
    from runtime.measure.profiler import profile_layers, write_profile
    from runtime.measure.stage_timing import predict_stages, time_stage
    from runtime.model.config import load_runnable
    from sim.input.scenario import load_scenario

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="folder for the profile and results.json")
    parser.add_argument("--microbatches", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--microbatch-size", type=int, default=2)
    parser.add_argument("--stages", type=int, default=4)
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    if not gpu:
        torch.set_num_threads(1)
    model = GPU_MODEL if gpu else CPU_MODEL
    name = torch.cuda.get_device_name(device) if gpu else "cpu"
    memory = f"{torch.cuda.get_device_properties(device).total_memory}B" if gpu else "64GiB"
    out = Path(args.out or tempfile.mkdtemp(prefix="stage-timing-"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    base = _scenario(model, name, memory, args.stages, args.microbatch_size, args.microbatches[0])
    (out / "scenario.yaml").write_text(yaml.safe_dump(base, sort_keys=False))
    runnable = load_runnable(out / "scenario.yaml")
    layers = profile_layers(runnable.model, args.microbatch_size, device, warmup=3, repeats=10)
    write_profile(layers, out / "profile", device=name)
    measured = dict(base, model={"profile": "profile/profile.txt", "profile_batch_size": args.microbatch_size,
                                 "dtype": "fp32", "optimizer": "adam"})
    mode = "allocator" if gpu else "counted"
    print(f"stage timing on {name}: {model['layers']} blocks of {model['hidden']}, micro-batch "
          f"{args.microbatch_size}, {args.stages} stages; memory: {mode}")
    print(f"{'schedule':<8} {'M':>3} {'stage':>5} {'pred ms':>9} {'meas ms':>9} {'err':>7} "
          f"{'pred MiB':>10} {'meas MiB':>10} {'err':>7}")
    rows = []
    for schedule in ("gpipe", "dapple"):
        for microbatches in args.microbatches:
            doc = dict(measured, training={"global_batch_size": args.microbatch_size * microbatches,
                                           "microbatch_size": args.microbatch_size})
            doc["plan"] = dict(measured["plan"], schedule=schedule)
            path = out / f"measured-{schedule}-{microbatches}.yaml"
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            predicted = predict_stages(load_scenario(path), memory=mode)
            run = load_runnable(out / "scenario.yaml", {"plan.schedule": schedule,
                                                         "training.global_batch_size":
                                                             str(args.microbatch_size * microbatches)})
            for stage in range(args.stages):
                got = time_stage(run, stage, schedule, microbatches, device)
                p = predicted[stage]
                row = {"schedule": schedule, "microbatches": microbatches, "stage": stage,
                       "predicted_s": p["compute_s"], "measured_s": got["compute_s"],
                       "predicted_bytes": p["peak_memory_bytes"], "measured_bytes": got["peak_memory_bytes"]}
                row["time_err"] = row["predicted_s"] / row["measured_s"] - 1
                row["memory_err"] = row["predicted_bytes"] / row["measured_bytes"] - 1
                rows.append(row)
                print(f"{schedule:<8} {microbatches:>3} {stage:>5} {row['predicted_s'] * 1e3:>9.2f} "
                      f"{row['measured_s'] * 1e3:>9.2f} {row['time_err']:>+7.1%} {row['predicted_bytes'] / 2**20:>10.1f} "
                      f"{row['measured_bytes'] / 2**20:>10.1f} {row['memory_err']:>+7.1%}")
    worst_time = max(abs(r["time_err"]) for r in rows)
    worst_memory = max(abs(r["memory_err"]) for r in rows)
    print(f"worst |error|: time {worst_time:.1%} (goal 5%), memory {worst_memory:.1%} (goal 3%); "
          f"{time.perf_counter() - started:.0f} s")
    (out / "results.json").write_text(json.dumps({"device": name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

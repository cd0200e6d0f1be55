"""Tensor-parallel plans on GPUs with NCCL: exact gradients, then predicted vs measured (issue 17).

The sibling of ``gpu_stage_timing.py`` for a session with several GPUs. On 2 GPUs it runs a
GPT plan with tensor parallelism 2 (one stage); on 4 or more, tensor 2 × pipeline 2; both
with and without sequence parallelism. For each plan:

1. ``dapple-run run --backend nccl --check``: the first step's loss and every gradient
   (gathered from the shards) against the unsplit model in one process (rtol 1e-5, fp32);
2. ``dapple-run validate --backend nccl``: layers profiled as one device's share with its
   group, the plan simulated and run; iteration-time error and per-device memory by kind
   (the allocator's peak on a GPU, so ``peak memory`` includes buffers the CPU count leaves
   out).

Without two GPUs it says so and exits 0 (``--cpu`` runs the same on gloo CPU ranks, small).

    python benchmarks/gpu_tensor_parallel.py [--out DIR] [--cpu] [--steps K]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

GPU_MODEL = {"preset": "gpt", "layers": 8, "hidden": 2048, "heads": 16, "seq_len": 1024, "vocab": 32000,
             "dtype": "fp32", "optimizer": "adam"}
CPU_MODEL = {"preset": "gpt", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128,
             "dtype": "fp32", "optimizer": "adam"}


def _scenario(model: dict, devices: int, pipeline: int, sequence_parallel: bool, memory: str) -> dict:
    layers = model["layers"] + 2
    per_stage = devices // pipeline
    bounds = [round(s * layers / pipeline) for s in range(pipeline + 1)]
    return {
        "name": f"tp2-pp{pipeline}{'-sp' if sequence_parallel else ''}",
        "cluster": {"nodes": 1, "devices_per_node": devices,
                    "device": {"name": "gpu", "memory": memory, "peak_flops": "1000TFLOP/s",
                               "peak_fp32_flops": "60TFLOP/s", "memory_bandwidth": "3000GB/s"},
                    "intra_node": {"bandwidth": "400GB/s", "latency": "5us"},
                    "inter_node": {"bandwidth": "50GB/s", "latency": "5us"}},
        "model": model,
        "training": {"global_batch_size": 8, "microbatch_size": 2},
        "plan": {"schedule": "dapple", "tensor_parallel": 2, "sequence_parallel": sequence_parallel,
                 "stages": [{"layers": [bounds[s], bounds[s + 1]],
                             "devices": list(range(s * per_stage, (s + 1) * per_stage))} for s in range(pipeline)]},
    }


def _dapple_run(*args: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "runtime", *args, "--json", "-q"], capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise SystemExit(f"dapple-run {' '.join(args[:2])} failed ({result.returncode}): {result.stderr.strip()}")
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="folder for the scenarios and results.json")
    parser.add_argument("--cpu", action="store_true", help="gloo CPU ranks and a small model instead of GPUs")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    import torch

    gpus = torch.cuda.device_count()
    if not args.cpu and gpus < 2:
        print(f"tensor-parallel benchmark skipped: {gpus} GPU(s) here, it needs 2 or more (or --cpu)")
        return
    backend = "gloo" if args.cpu else "nccl"
    devices = 4 if args.cpu or gpus >= 4 else 2
    memory = "64GiB" if args.cpu else f"{torch.cuda.get_device_properties(0).total_memory}B"
    out = Path(args.out or tempfile.mkdtemp(prefix="tensor-parallel-"))
    out.mkdir(parents=True, exist_ok=True)
    started, rows = time.perf_counter(), []
    for sequence_parallel in (False, True):
        doc = _scenario(CPU_MODEL if args.cpu else GPU_MODEL, devices, devices // 2, sequence_parallel, memory)
        path = out / f"{doc['name']}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        common = (str(path), "--nproc", str(devices), "--backend", backend)
        run = _dapple_run("run", *common, "--steps", "2", "--check", "--out", str(out / f"{doc['name']}-run"))
        report = _dapple_run("validate", *common, "--steps", str(args.steps), "--out", str(out / f"{doc['name']}-val"))
        row = {"plan": doc["name"], "check_passed": run["check_passed"], "max_rel_grad_diff": run["max_rel_grad_diff"],
               "iteration_time_frac": report["error"]["iteration_time_frac"],
               "memory_by_kind_frac": report["error"].get("memory_by_kind_frac"),
               "peak_memory_frac": report["error"]["peak_memory_frac"]}
        rows.append(row)
        print(f"{row['plan']:<12} check {'passed' if row['check_passed'] else 'FAILED'} "
              f"(max relative {row['max_rel_grad_diff']:.2g}); iteration error {row['iteration_time_frac']:+.1%}; "
              f"worst memory-by-kind error {row['memory_by_kind_frac'] or 0:.1%}; peak {row['peak_memory_frac']:+.1%}")
    print(f"{len(rows)} plans on {devices} {'CPU ranks' if args.cpu else 'GPUs'} in {time.perf_counter() - started:.0f} s")
    (out / "results.json").write_text(json.dumps({"backend": backend, "devices": devices, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

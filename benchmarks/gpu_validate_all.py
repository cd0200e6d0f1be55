"""Every plan kind on NCCL: exact gradients, then predicted against measured (issue 34 item 9).

On a machine with CUDA GPUs (1 to 8 are used) it runs, for each kind of ``KINDS`` whose
ranks the GPUs cover (the others print a ``skipped`` line), two commands in fresh processes:

1. ``dapple-run run --backend nccl --check --steps 2``: the first step's loss and every
   gradient against the unsplit model in one process, elementwise within 1e-5 of each
   tensor's largest value (``runtime.validation.grad_check``; fp32, TF32 matmuls off by
   torch's default for fp32 ``matmul``; no bf16 is used);
2. ``dapple-run validate --backend nccl --steps 4 --slices 1 --repeats 3``: links and
   collectives measured, layers profiled, the plan simulated and run; iteration time and
   the worst device's peak memory (the allocator's), predicted and measured.

The list of commands is fixed (no time budget: counts of steps and repeats), about 24
commands of 15-30 s each on 4 or more GPUs, and 6 kinds checked only (``CHECK_ONLY``): within 10 minutes. It prints one line per kind
and exits 1 when any gradient check failed or a command failed, 0 otherwise. Without CUDA it
prints ``no CUDA device: nothing run`` and exits 0 (``tests/test_gpu_validate_all.py``).

    python benchmarks/gpu_validate_all.py [--kinds data,fsdp-full] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPT = "scenarios/gpt_tiny_cpu.yaml"
MOE = "scenarios/moe_tiny_cpu.yaml"


def _stages(*parts: tuple[tuple[int, int], tuple[int, ...]]) -> str:
    return "plan.stages=[" + ", ".join(f"{{layers: [{a}, {b}], devices: {list(d)}}}" for (a, b), d in parts) + "]"


ONE = _stages(((0, 6), (0,)))
DATA2 = _stages(((0, 6), (0, 1)))
DATA4 = _stages(((0, 6), (0, 1, 2, 3)))
PIPE4 = _stages(((0, 2), (0,)), ((2, 3), (1,)), ((3, 4), (2,)), ((4, 6), (3,)))
TWO_BY_TWO = _stages(((0, 3), (0, 1)), ((3, 6), (2, 3)))
V_SHAPE = _stages(((0, 2), (0,)), ((2, 3), (1,)), ((3, 4), (1,)), ((4, 6), (0,)))
MTP_STAGES = _stages(((0, 3), (0, 1)), ((3, 7), (2, 3)))  # the mtp layer is 5, the head 6

KINDS: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "single": (GPT, 1, (ONE,)),
    "data": (GPT, 4, (DATA4,)),
    "pipeline-dapple": (GPT, 4, (PIPE4, "plan.schedule=dapple")),
    "pipeline-1f1b-interleaved": (GPT, 2, (_stages(((0, 2), (0,)), ((2, 3), (1,)), ((3, 4), (0,)), ((4, 6), (1,))),
                                           "plan.schedule=interleaved")),
    "tensor": (GPT, 4, (TWO_BY_TWO, "plan.tensor_parallel=2")),
    "tensor-sequence": (GPT, 4, (TWO_BY_TWO, "plan.tensor_parallel=2", "plan.sequence_parallel=true")),
    "zero1": (GPT, 2, (DATA2, "plan.sharding=optimizer")),
    "fsdp-gradients": (GPT, 2, (DATA2, "plan.sharding=gradients")),
    "fsdp-full": (GPT, 2, (DATA2, "plan.sharding=full")),
    "selective-recompute": (GPT, 4, (TWO_BY_TWO, "plan.recompute=selective")),
    "moe-ep2": (MOE, 2, ("plan.stages=[{layers: [0, 4], devices: [0, 1]}]", "plan.expert_parallel=2")),
    "context": (GPT, 4, (TWO_BY_TWO, "plan.context_parallel=2")),
    # gradients only (CHECK_ONLY): what the runtime learned since, on NCCL; their CPU validation is
    # benchmarks/validate_kinds.py's
    "fsdp-full-tensor": (GPT, 4, (DATA4, "plan.sharding=full", "plan.tensor_parallel=2")),
    "zb-v": (GPT, 2, (V_SHAPE, "plan.schedule={name: zb-v, chunks: 2}", "training.microbatch_size=2")),
    "fp8": (GPT, 4, (TWO_BY_TWO, "model.gemm_dtype=fp8", "cluster.device.peak_fp8_flops=1979TFLOP/s")),
    "mtp": (GPT, 4, (MTP_STAGES, "model.mtp_depth=1", "plan.tensor_parallel=2")),
    "mla": (GPT, 2, (DATA2, "model.mla={q_lora_rank: 24, kv_lora_rank: 16, rope_head_dim: 8, nope_head_dim: 16, "
                     "v_head_dim: 12}", "model.attention=sdpa")),
    "moe-expert-tensor": (MOE, 4, ("plan.stages=[{layers: [0, 4], devices: [0, 1, 2, 3]}]", "plan.expert_parallel=2",
                                   "plan.expert_tensor_parallel=2")),
}
"""Kind -> (scenario, GPUs it needs, ``--set`` overrides); each plan on devices 0..N-1 of one server."""

CHECK_ONLY = frozenset({"fsdp-full-tensor", "zb-v", "fp8", "mtp", "mla", "moe-expert-tensor"})
"""Kinds run with ``--check`` alone (a dozen seconds each), so that the whole list stays within 10
minutes; FP8 on CUDA is where ``torch._scaled_mm``'s row-wise scales meet real tensor cores."""

RUN_STEPS, VALIDATE_STEPS, VALIDATE_SLICES, VALIDATE_REPEATS = 2, 4, 1, 3
"""The fixed counts: steps of the checked run, of the validation, its profile turns and layer repeats."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated kinds (default all: {', '.join(KINDS)})")
    parser.add_argument("--out", type=Path, metavar="DIR", help="keep each kind's outputs in DIR/KIND")
    args = parser.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown or not args.kinds:
        parser.error(f"--kinds: unknown {', '.join(unknown) or '(none given)'}; valid: {', '.join(KINDS)}")
    return args


def _command(verb: str, kind: str, out: Path) -> list[str]:
    scenario, ranks, overrides = KINDS[kind]
    command = [sys.executable, "-m", "runtime", verb, scenario, "--nproc", str(ranks), "--backend", "nccl",
               "--set", f"cluster.devices_per_node={ranks}", "--out", str(out / verb), "--json", "-q"]
    for item in overrides:
        command += ["--set", item]
    if verb == "run":
        return command + ["--check", "--steps", str(RUN_STEPS), "--warmup", "1"]
    return command + ["--steps", str(VALIDATE_STEPS), "--slices", str(VALIDATE_SLICES), "--repeats",
                      str(VALIDATE_REPEATS)]


def _last_line(done: subprocess.CompletedProcess) -> str:
    return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:200]


def run_kind(kind: str, out: Path) -> tuple[str, bool]:
    """One kind's line and whether it passed (a refusal, exit 2, passes: the runtime names why)."""
    checked = subprocess.run(_command("run", kind, out), cwd=ROOT, capture_output=True, text=True)
    if checked.returncode == 2:
        return f"{kind:<26} refused: {_last_line(checked)}", True
    if checked.returncode != 0:
        return f"{kind:<26} FAILED check: {_last_line(checked)}", False
    if kind in CHECK_ONLY:
        return f"{kind:<26} grads ok  (checked only)", True
    validated = subprocess.run(_command("validate", kind, out), cwd=ROOT, capture_output=True, text=True)
    if validated.returncode != 0:
        return f"{kind:<26} grads ok; FAILED validate: {_last_line(validated)}", False
    report = json.loads(validated.stdout)
    peak = [max(d.get("peak_memory_bytes") or 0.0 for d in report[side]["devices"]) for side in ("predicted", "measured")]
    error = report["error"].get("peak_memory_frac")
    return (f"{kind:<26} grads ok  {report['predicted']['iteration_time_s'] * 1e3:>9.2f} "
            f"{report['measured']['iteration_time_s'] * 1e3:>9.2f} {report['error']['iteration_time_frac']:>+8.1%} "
            f"{peak[0] / 2**20:>9.1f} {peak[1] / 2**20:>9.1f} "
            + (f"{error:>+8.1%}" if error is not None else f"{'-':>8}")), True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # torch only to count the GPUs; every measurement runs in its own fresh process
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("no CUDA device: nothing run")
        return 0
    gpus = min(8, torch.cuda.device_count())
    print(f"{'kind':<26} {'check':<8}  {'pred ms':>9} {'meas ms':>9} {'time err':>8} {'pred MiB':>9} {'meas MiB':>9} "
          f"{'mem err':>8}   ({gpus} GPU(s), NCCL)")
    passed = True
    with tempfile.TemporaryDirectory(prefix="gpu-validate-all-") as scratch:
        for kind in args.kinds:
            needs = KINDS[kind][1]
            if needs > gpus:
                print(f"{kind:<26} skipped: needs {needs} GPUs, {gpus} here", flush=True)
                continue
            text, ok = run_kind(kind, (args.out if args.out is not None else Path(scratch)) / kind)
            passed = passed and ok
            print(text, flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

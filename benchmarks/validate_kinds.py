"""Predicted against measured for every plan kind: ``dapple-run validate`` on 4 gloo ranks (issue 34 item 8).

For each kind of plan the runtime runs (``KINDS``: data parallelism, a 4-stage DAPPLE (1F1B)
pipeline, tensor parallelism 2 × pipeline 2 with and without sequence parallelism, ZeRO-1,
FSDP2 gradients (``sharding: gradients``) and full, full sharding over tensor parallelism 2 (2D),
selective, selective-op and full recompute, the split-backward and interleaved schedules (zb-h1,
interleaved 1F1B, zb-v, dualpipe-v), FP8 products, multi-token prediction, multi-head latent
attention, expert parallelism 2 on the MoE scenario with and without expert tensor parallelism 2
and a capacity factor, context parallelism 2) it runs ``dapple-run validate`` on 4 local gloo
processes in a fresh process and prints one line: predicted and measured iteration time and
the worst device's peak memory, and their errors (memory: the device error of largest magnitude,
signed). A kind the runtime refuses (one line on stderr, exit 2) prints that line instead. Not
part of any test suite (minutes of CPU); ``tests/test_validate_kinds.py`` checks its arguments
and its lines only.

    python benchmarks/validate_kinds.py [--kinds data,fsdp-full] [--steps 6] [--slices 2]
        [--repeats 4] [--keep DIR] [--json FILE]
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
FOUR = "cluster.devices_per_node=4"
ONE_STAGE = "plan.stages=[{layers: [0, 6], devices: [0, 1, 2, 3]}]"
TWO_STAGES = "plan.stages=[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 6], devices: [2, 3]}]"
FOUR_STAGES = ("plan.stages=[{layers: [0, 2], devices: [0]}, {layers: [2, 3], devices: [1]}, "
               "{layers: [3, 4], devices: [2]}, {layers: [4, 6], devices: [3]}]")
TWO_BY_TWO = ("plan.stages=[{layers: [0, 2], devices: [0, 1]}, {layers: [2, 3], devices: [2, 3]}, "
              "{layers: [3, 5], devices: [0, 1]}, {layers: [5, 6], devices: [2, 3]}]")  # stage s on set s mod 2
V_SHAPE = ("plan.stages=[{layers: [0, 2], devices: [0, 1]}, {layers: [2, 3], devices: [2, 3]}, "
           "{layers: [3, 5], devices: [2, 3]}, {layers: [5, 6], devices: [0, 1]}]")  # stages s and 3 - s on set s
MTP_STAGES = "plan.stages=[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 7], devices: [2, 3]}]"  # the mtp layer: 7
MOE_ONE_STAGE = "plan.stages=[{layers: [0, 4], devices: [0, 1, 2, 3]}]"

KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "data": (GPT, (FOUR, ONE_STAGE)),
    "pipeline-dapple": (GPT, (FOUR, FOUR_STAGES, "plan.schedule=dapple")),
    "tensor": (GPT, (FOUR, TWO_STAGES, "plan.tensor_parallel=2")),
    "tensor-sequence": (GPT, (FOUR, TWO_STAGES, "plan.tensor_parallel=2", "plan.sequence_parallel=true")),
    "zero1": (GPT, (FOUR, ONE_STAGE, "plan.sharding=optimizer")),
    "fsdp-gradients": (GPT, (FOUR, ONE_STAGE, "plan.sharding=gradients")),
    "fsdp-full": (GPT, (FOUR, ONE_STAGE, "plan.sharding=full")),
    "selective-recompute": (GPT, (FOUR, TWO_STAGES, "plan.recompute=selective")),
    "moe-ep2": (MOE, (FOUR, MOE_ONE_STAGE, "plan.expert_parallel=2")),
    "context": (GPT, (FOUR, TWO_STAGES, "plan.context_parallel=2")),
    "full-recompute": (GPT, (FOUR, TWO_STAGES, "plan.recompute=full")),
    "selective-op": (GPT, (FOUR, TWO_STAGES, "plan.recompute=selective-op")),
    "fsdp-full-tensor": (GPT, (FOUR, ONE_STAGE, "plan.sharding=full", "plan.tensor_parallel=2")),
    "zb-h1": (GPT, (FOUR, FOUR_STAGES, "plan.schedule=zb-h1")),
    "interleaved": (GPT, (FOUR, TWO_BY_TWO, "plan.schedule={name: interleaved, chunks: 2}")),
    "zb-v": (GPT, (FOUR, V_SHAPE, "plan.schedule={name: zb-v, chunks: 2}", "training.microbatch_size=2")),
    "dualpipe-v": (GPT, (FOUR, V_SHAPE, "plan.schedule={name: dualpipe-v, chunks: 2}", "training.microbatch_size=2")),
    "fp8": (GPT, (FOUR, TWO_STAGES, "model.gemm_dtype=fp8", "cluster.device.peak_fp8_flops=50GFLOP/s")),
    "mtp": (GPT, (FOUR, MTP_STAGES, "model.mtp_depth=1")),
    "mla": (GPT, (FOUR, TWO_STAGES, "model.mla={q_lora_rank: 24, kv_lora_rank: 16, rope_head_dim: 8, "
                  "nope_head_dim: 16, v_head_dim: 12}", "model.attention=sdpa")),
    "moe-expert-tensor": (MOE, (FOUR, MOE_ONE_STAGE, "plan.expert_parallel=2", "plan.expert_tensor_parallel=2")),
    "moe-capacity": (MOE, (FOUR, MOE_ONE_STAGE, "plan.expert_parallel=2", "model.experts.capacity_factor=1.0")),
}
"""Kind -> (scenario, ``--set`` overrides): each a plan on devices 0..3 of one 4-device server."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated kinds to validate (default all: {', '.join(KINDS)})")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per validate (default 6)")
    parser.add_argument("--slices", type=int, default=2, help="profile turns per validate (default 2)")
    parser.add_argument("--repeats", type=int, default=4, help="timed runs per layer in all (default 4)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep each kind's outputs in DIR/KIND")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every kind's line as JSON")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        parser.error(f"--kinds: unknown {', '.join(unknown) or '(none given)'}; valid: {', '.join(KINDS)}")
    for name in ("steps", "slices", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: must be a positive integer")
    args.kinds = kinds
    return args


def validate_kind(kind: str, args: argparse.Namespace, out: Path) -> dict:
    """One ``dapple-run validate`` of ``kind`` in a fresh process: its line's numbers, or why not."""
    scenario, overrides = KINDS[kind]
    command = [sys.executable, "-m", "runtime", "validate", scenario, "--nproc", "4", "--backend", "gloo",
               "--steps", str(args.steps), "--slices", str(min(args.slices, args.steps)), "--repeats",
               str(args.repeats), "--out", str(out), "--json", "-q"]
    for item in overrides:
        command += ["--set", item]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        return {"kind": kind, "refused" if done.returncode == 2 else "failed": lines[-1][:300]}
    report = json.loads(done.stdout)
    predicted, measured = report["predicted"], report["measured"]
    return {
        "kind": kind,
        "predicted_s": predicted["iteration_time_s"], "measured_s": measured["iteration_time_s"],
        "time_error": report["error"]["iteration_time_frac"],
        "predicted_peak_bytes": max(d.get("peak_memory_bytes") or 0.0 for d in predicted["devices"]),
        "measured_peak_bytes": max(d.get("peak_memory_bytes") or 0.0 for d in measured["devices"]),
        "memory_error": worst_memory_error(report["error"]),
    }


def worst_memory_error(error: dict) -> float | None:
    """The device error of largest magnitude in peak memory, with its sign ((predicted − measured) /
    measured: + predicts high); the report's own ``peak_memory_frac`` is that magnitude."""
    fracs = [d["peak_memory_frac"] for d in error.get("devices", ()) if d.get("peak_memory_frac") is not None]
    return max(fracs, key=abs, default=error.get("peak_memory_frac"))


def line(row: dict) -> str:
    if "predicted_s" not in row:
        why = row.get("refused") or row.get("failed")
        return f"{row['kind']:<20} {'refused' if 'refused' in row else 'FAILED'}: {why}"
    return (f"{row['kind']:<20} {row['predicted_s'] * 1e3:>9.1f} {row['measured_s'] * 1e3:>9.1f} "
            f"{row['time_error']:>+8.1%} {row['predicted_peak_bytes'] / 2**20:>9.2f} "
            f"{row['measured_peak_bytes'] / 2**20:>9.2f} "
            + (f"{row['memory_error']:>+8.1%}" if row["memory_error"] is not None else f"{'-':>8}"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"{'kind':<20} {'pred ms':>9} {'meas ms':>9} {'time err':>8} {'pred MiB':>9} {'meas MiB':>9} {'mem err':>8}"
          "   (dapple-run validate, 4 gloo ranks; peak memory: the worst device's; mem err: the device error of "
          "largest magnitude, signed, + predicts high)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="validate-kinds-") as scratch:
        for kind in args.kinds:
            out = (args.keep if args.keep is not None else Path(scratch)) / kind
            rows.append(validate_kind(kind, args, out))
            print(line(rows[-1]), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 1 if any("failed" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

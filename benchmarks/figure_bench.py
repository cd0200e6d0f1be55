"""Benchmark the figures of a replay at scale: each figure's draw and save, in seconds and as a
ratio to drawing and saving an empty figure in the same process (the machine may be shared;
the ratio travels between machines, the seconds do not).

Cases (issue 35: every figure written in under 2 s): GPT-3 175B on 2,048 A100
(``scenarios/gpt3_175b_a100_2048.yaml``, TP 8 x PP 16 x DP 16, 1F1B, 128 micro-batches) and
Llama 3 405B on 16,384 H100 (the planner bench's scenario, TP 8 x PP 16 x DP 128 as Llama 3
trained it, 1F1B, 128 micro-batches of 128 sequences), each replayed on the fast path; the
figures are ``simulate --out``'s and ``dapple-plan --out``'s: the Gantt chart, memory over
time, and the plan under GPipe and 1F1B stacked (``schedules.png``). Each is drawn and saved
(PNG, 100 dpi) ``--repeat`` times and the fastest kept.

    python benchmarks/figure_bench.py [--repeat 3] [--cases 2048 16384]
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.engine.run import run_scenario  # noqa: E402
from sim.input.scenario import load_scenario  # noqa: E402
from sim.report.plots.style import pyplot  # noqa: E402
from sim.report.plots.timeline import gantt_figure, memory_figure, schedule_comparison_figure  # noqa: E402

LLAMA_405B_16K = Path(__file__).resolve().parent.parent / "scenarios" / "scale" / "llama3_405b_h100_16384.yaml"
LLAMA3_PLAN = {"training.global_batch_size": "16384", "training.microbatch_size": "128", "plan.schedule": "1f1b",
               "plan.tensor_parallel": "8", "plan.sequence_parallel": "true", "plan.recompute": "selective",
               "plan.pipeline_parallel": "16", "plan.data_parallel": "128", "plan.sharding": "optimizer"}
"""The planner bench's 405B on 16,384 H100 with Llama 3's plan (TP 8 x PP 16 x DP 128) and 128 micro-batches."""


def _scenario(case: str, schedule: str | None = None):
    overrides = {"plan.schedule": schedule} if schedule else {}
    if case == "2048":
        return load_scenario(Path(__file__).resolve().parent.parent / "scenarios" / "gpt3_175b_a100_2048.yaml",
                             overrides)
    return load_scenario(LLAMA_405B_16K, {**LLAMA3_PLAN, **overrides})


def _timed(draw, repeat: int) -> float:
    plt = pyplot()
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fig = draw()
        fig.savefig(io.BytesIO(), format="png", dpi=100)
        best = min(best, time.perf_counter() - started)
        plt.close(fig)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=["2048", "16384"], choices=["2048", "16384"])
    args = parser.parse_args()
    plt = pyplot()
    reference = _timed(lambda: plt.subplots(figsize=(12, 8))[0], args.repeat)
    print(f"reference: an empty 12 x 8 in figure drawn and saved in {reference * 1e3:.1f} ms")
    for case in args.cases:
        started = time.perf_counter()
        own = run_scenario(_scenario(case), engine="fast")
        gpipe = run_scenario(_scenario(case, "gpipe"), engine="fast")
        replayed = time.perf_counter() - started
        w = own.workload
        print(f"{w.name}: {w.num_devices:,} devices, {w.num_microbatches} micro-batches, {len(w.classes)} classes "
              f"(two fast replays {replayed:.1f} s)")
        for name, draw in (("gantt.png", lambda: gantt_figure(own)), ("memory.png", lambda: memory_figure(own)),
                           ("schedules.png", lambda: schedule_comparison_figure({"gpipe": gpipe, "1f1b": own}))):
            seconds = _timed(draw, args.repeat)
            print(f"  {name:<14} {seconds:6.2f} s  {seconds / reference:6.1f} x reference  "
                  f"{'ok' if seconds < 2.0 else 'OVER 2 s'}")


if __name__ == "__main__":
    main()

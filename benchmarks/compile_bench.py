"""Benchmark the engine's compile at planner scale: a Llama-3-405B-sized model on 1,024 to 16,384 H100.

The planner replays its best candidates with the fast path and the SimPy engine, and on the
16,384-GPU case of ``benchmarks/planner_bench.py`` (``LLAMA_405B_16K``) most of that time is
``sim.engine.compile.compile_workload``, not the replay (issue 30). This benchmark builds a
few candidates of that model the way the planner does (``planner.search.space.to_scenario``)
at tensor 8 x pipeline 16 x data ``gpus / 128`` (16 micro-batches of one sample per replica,
so the schedule is the same size at every scale), and times separately:

* ``compile-nc`` — ``compile_workload(contention=False)``, what the fast path replays;
* ``fast`` — the fast path's replay of it (``sim.engine.fastpath.replay``);
* ``compile`` — ``compile_workload(contention=True, optimistic=True)``, what SimPy replays;
* ``simpy`` — the SimPy engine's replay of it (``--no-simpy`` leaves it out).

The machine may be shared: every time is the fastest of ``--repeat`` runs and is printed
also as a ratio to ``ref``, a fixed pure-Python loop timed in the same process just before
(read the ratios, not the seconds, across runs). The last column per case says how the
ratio grows per device from the smallest GPU count (1.0: linear in devices).

    python benchmarks/compile_bench.py [--gpus 1024 4096 16384] [--repeat 3] [--no-simpy]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's code, not an installed copy's

from planner.search.space import Candidate, to_scenario  # noqa: E402
from sim.core.parallelism import Recompute, Sharding  # noqa: E402
from sim.engine.compile import compile_workload  # noqa: E402
from sim.engine.fastpath import replay  # noqa: E402
from sim.input.plan_section import balanced_cuts  # noqa: E402
from sim.input.scenario import parse_scenario  # noqa: E402

LLAMA_405B = """
name: llama405b-{gpus}-h100
cluster: {{preset: dgx-h100, nodes: {nodes}}}
model: {{preset: llama, layers: 126, hidden: 16384, heads: 128, kv_heads: 8, ffn_hidden: 53248,
        vocab: 128256, seq_len: 8192, dtype: bf16}}
training: {{global_batch_size: {gbs}}}
"""
"""``benchmarks/planner_bench.py``'s ``LLAMA_405B_16K`` at ``gpus`` GPUs, 16 samples per replica."""

CASES = {
    "1f1b-zero1-sel": dict(schedule="dapple", sharding=Sharding.OPTIMIZER, recompute=Recompute.SELECTIVE),
    "1f1b-full": dict(schedule="dapple", recompute=Recompute.FULL),
    "interleaved2-zero1-full": dict(schedule="interleaved", chunks=2, sharding=Sharding.OPTIMIZER,
                                    recompute=Recompute.FULL),
}
"""Candidates at tensor 8 x pipeline 16: 1F1B (DAPPLE's schedule) and interleaved, ZeRO-1, recompute."""


def scenario_for(gpus: int, case: str):
    """The case's candidate at ``gpus`` GPUs, as the planner builds it (``to_scenario``)."""
    data = gpus // 128
    base = parse_scenario(LLAMA_405B.format(gpus=gpus, nodes=gpus // 8, gbs=16 * data), ignore_plan=True)
    fields = CASES[case]
    chunks = fields.get("chunks", 1)
    weights = [layer.fwd_flop + 1.0 for layer in base.model.layers]
    candidate = Candidate(bounds=balanced_cuts(weights, 16 * chunks), replicas=(data,) * (16 * chunks),
                          microbatch_size=data, tensor_parallel=8, **fields)
    return to_scenario(base, candidate)


def reference_s() -> float:
    """A fixed pure-Python workload (dicts, tuples, sorting): the unit the ratios are in."""
    started = time.perf_counter()
    table: dict = {}
    for i in range(200_000):
        table[(i % 977, i % 13)] = table.get((i % 977, i % 13), 0) + i
    sorted(table.items())
    return time.perf_counter() - started


def _best(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def measure(gpus: int, case: str, repeat: int, simpy: bool) -> dict[str, float]:
    """Each step's fastest time over ``repeat`` runs, in units of ``reference_s``."""
    scenario = scenario_for(gpus, case)
    ref = min(reference_s() for _ in range(3))
    row: dict[str, float] = {"ref": ref}
    row["compile-nc"], nc = _best(lambda: compile_workload(scenario, contention=False), repeat)
    row["fast"], result = _best(lambda: replay(nc), repeat)
    row["compile"], workload = _best(lambda: compile_workload(scenario, contention=True, optimistic=True), repeat)
    if simpy:
        from sim.engine.replay import simulate  # SimPy only when asked for

        row["simpy"], _ = _best(lambda: simulate(workload, contention=True), repeat)
    row["classes"] = len(workload.classes)
    row["iteration_s"] = result.summary()["iteration_time_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-simpy", action="store_true", help="leave out the SimPy replay")
    args = parser.parse_args()
    steps = ["compile-nc", "fast", "compile"] + ([] if args.no_simpy else ["simpy"])
    print(f"{'case':<26} {'gpus':>6} {'ref s':>6} " + " ".join(f"{s + ' s':>11} {'x ref':>7}" for s in steps)
          + f" {'classes':>7} {'growth':>6}")
    for case in args.cases:
        first = None
        for gpus in sorted(args.gpus):
            row = measure(gpus, case, args.repeat, not args.no_simpy)
            ratios = {s: row[s] / row["ref"] for s in steps}
            total = ratios["compile-nc"] + ratios["compile"]
            first = first or (gpus, total)
            growth = (total / first[1]) / (gpus / first[0])
            print(f"{case:<26} {gpus:>6} {row['ref']:>6.3f} "
                  + " ".join(f"{row[s]:>11.3f} {ratios[s]:>7.1f}" for s in steps)
                  + f" {row['classes']:>7} {growth:>6.2f}", flush=True)


if __name__ == "__main__":
    main()

"""Benchmark our IR executor against torch.distributed.pipelining on 2 CPU ranks.

Same model, weights, data and micro-batching; our ``gpipe`` against torch's
``ScheduleGPipe`` and our ``dapple`` against ``Schedule1F1B``. Each step is timed from a
barrier to the end of the optimizer step on every rank; a step's time is the slowest
rank's. The four runtimes take turns in rounds of a few steps (so that a noisy moment of
the machine hits all of them), after warm-up steps that are not counted. Prints the median
step time of each and the ratio torch / ours (above 1: ours is faster).

    python benchmarks/runtime_bench.py [--scenario scenarios/gpt_tiny_cpu.yaml] [--steps 30]
        [--set model.layers=8 ...]

Like ``dapple-run run``, our executor counts saved activations only in a warm-up step, so the
timed steps of both runtimes run without saved-tensor hooks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _worker(device, scenario: str, overrides: dict, steps: int, warmup: int, rounds: int):
    import torch
    import torch.distributed as dist

    from runtime.execution.executor import ExecOptions, RankExecutor
    from runtime.execution.peer import PeerRunner
    from runtime.model.config import load_runnable

    runners = {}
    for schedule, peer in (("gpipe", "ScheduleGPipe"), ("dapple", "Schedule1F1B")):
        runnable = load_runnable(scenario, {**overrides, "plan.schedule": schedule})
        ours = RankExecutor(runnable, ExecOptions(), device)
        runners[f"ours {schedule}"] = lambda step, ex=ours: ex.step(step).time_s
        theirs = PeerRunner(runnable, device)
        runners[f"torch {peer}"] = lambda step, pr=theirs: pr.step(step)[0]
    times = {name: [] for name in runners}
    for name, run in runners.items():
        for step in range(warmup):
            run(step)
    per_round = -(-steps // rounds)
    for r in range(rounds):
        for name, run in runners.items():
            for k in range(per_round):
                times[name].append(run(warmup + r * per_round + k))
    names = sorted(times)
    table = torch.tensor([times[n] for n in names], dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    return {name: row.tolist() for name, row in zip(names, table)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default=str(REPO / "scenarios" / "gpt_tiny_cpu.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=30, help="measured steps per runtime (>= 20)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6, help="turns the runtimes take")
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.overrides)

    from runtime.execution.launch import spawn
    from runtime.model.config import load_runnable

    runnable = load_runnable(args.scenario, overrides)
    times = spawn(_worker, 2, args.scenario, overrides, args.steps, args.warmup, args.rounds)[0]
    training = runnable.scenario.training
    print(f"{runnable.scenario.name}: {runnable.scenario.model.name}, 2 CPU ranks (gloo, 1 thread each), "
          f"{training.num_microbatches} micro-batches of {training.microbatch_size}, "
          f"{len(next(iter(times.values())))} measured steps each (median; step = slowest rank)")
    print(f"{'schedule':<8} {'ours (ms)':>10} {'torch (ms)':>11} {'torch/ours':>11}   torch class")
    for schedule, peer in (("gpipe", "ScheduleGPipe"), ("dapple", "Schedule1F1B")):
        ours = statistics.median(times[f"ours {schedule}"])
        theirs = statistics.median(times[f"torch {peer}"])
        print(f"{schedule:<8} {ours * 1e3:>10.2f} {theirs * 1e3:>11.2f} {theirs / ours:>11.2f}   {peer}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "benchmarks"))
    main()

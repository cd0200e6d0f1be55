"""Benchmark a 200-point what-if sweep of the default scenario (BERT-48 on 2 x 8 V100).

5 inter-server bandwidths x 4 schedules (gpipe, dapple, dapple with warm-up 2(S-i)-1, zb-h1)
x 10 micro-batch counts (1 to 10 micro-batches of 16 samples) through the local process
pool, then optionally through a Dask LocalCluster; prints wall time and points per second,
and checks that both give the same table.

    python benchmarks/sweep_bench.py [--engine simpy|fast] [--workers N] [--dask] [--inline]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from planner.sweeps.run import run_sweep, sweep_from_dict

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "bert48_v100_2x8.yaml"


def sweep(engine: str):
    return sweep_from_dict(
        {
            "name": "bench-200",
            "base": str(SCENARIO),
            "mode": "simulate",
            "engine": engine,
            "axes": {
                "cluster.inter_node.bandwidth": ["10Gb/s", "25Gb/s", "50Gb/s", "100Gb/s", "200Gb/s"],
                "plan.schedule": ["gpipe", "dapple", {"name": "dapple", "policy": "2(s-i)-1"}, "zb-h1"],
                "training.global_batch_size": [16 * m for m in range(1, 11)],
            },
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("simpy", "fast"), default="simpy")
    parser.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 4))
    parser.add_argument("--dask", action="store_true", help="also run through a Dask LocalCluster and compare")
    parser.add_argument("--inline", action="store_true", help="also run in this process (one worker)")
    args = parser.parse_args()
    study = sweep(args.engine)
    runs = [("local pool", {"workers": args.workers})]
    if args.inline:
        runs.append(("in-process", {"workers": 1}))
    if args.dask:
        runs.append(("dask LocalCluster", {"workers": args.workers, "dask": "local"}))
    print(f"{len(study.points)} points, engine {args.engine}, {args.workers} workers, {os.cpu_count()} CPUs")
    tables = []
    for label, kwargs in runs:
        started = time.perf_counter()
        result = run_sweep(study, progress=False, **kwargs)
        wall = time.perf_counter() - started
        table = result.table
        print(f"{label:<18} {wall:7.2f} s  {len(table) / wall:7.1f} points/s  "
              f"(per point: median {table['wall_s'].median() * 1e3:.1f} ms, max {table['wall_s'].max() * 1e3:.1f} ms; "
              f"{int(table['oom'].fillna(False).astype(bool).sum())} OOM, {int(table['error'].notna().sum())} failed)")
        if table["error"].notna().any():
            print(f"  first error: {table['error'].dropna().iloc[0]}")
        tables.append(table.drop(columns="wall_s"))
    if len(tables) > 1:
        from pandas.testing import assert_frame_equal

        for table in tables[1:]:
            assert_frame_equal(tables[0], table)
        print("tables identical across executors")


if __name__ == "__main__":
    main()

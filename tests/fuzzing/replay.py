"""``python -m tests.fuzzing.replay SEED [--sample]``: replay one fuzz case in this process and
print its command line, files, exit code, output and verdict."""

from __future__ import annotations

import argparse
import sys

from .cases import case
from .execute import execute, judge


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzzing.replay")
    parser.add_argument("seed", type=int, nargs="+")
    parser.add_argument("--sample", action="store_true", help="a case of the default suite's sample")
    args = parser.parse_args(argv)
    bad = 0
    for seed in args.seed:
        c = case(seed, sample=args.sample)
        outcome = execute(c)
        verdict = judge(outcome, c.argv) if outcome.rc != "would launch" else None
        print(c.describe())
        print(f"exit {outcome.rc} in {outcome.seconds:.2f} s; peak RSS {outcome.peak_rss_bytes / 2**20:.0f} MiB")
        print("--- stdout (tail)\n" + outcome.out[-1500:] + "--- stderr\n" + outcome.err[-3000:] + outcome.crash)
        print(f"verdict: {'ok' if verdict is None else verdict}")
        bad += verdict is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

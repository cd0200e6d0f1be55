"""``dapple-plan``: search for the fastest plan that fits (not built yet)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dapple-plan",
        description="Search data x pipeline parallel plans for a scenario. Not built yet: the planner "
        "arrives with the issue 'DAPPLE planner tuned against the simulator'.",
    )
    parser.add_argument("scenario", metavar="SCENARIO", nargs="?", help="scenario YAML file")
    parser.parse_args(argv)
    print("dapple-plan: the planner is not built yet; write a plan in the scenario and use dapple-sim", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""``dapple-run``: execute, profile and validate plans with PyTorch (not built yet)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dapple-run",
        description="Run a scenario's plan for real with torch.distributed. Not built yet: the runtime "
        "arrives with the issue 'Real torch runtime that executes the same IR and plans'.",
    )
    parser.add_argument("command", metavar="COMMAND", nargs="?", help="run, validate or profile")
    parser.parse_args(argv)
    print("dapple-run: the runtime is not built yet; use dapple-sim to check scenarios", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

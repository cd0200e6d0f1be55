"""``dapple-sim schedule``: a named schedule printed as the IR's text (one line per rank, the
schedule-file format), a rank × step grid, or torch's pipeline-order CSV; bounded before it is
generated (``MAX_SCHEDULE_COMPUTE``), so a huge request is one line, exit 2."""

from __future__ import annotations

import argparse
import sys

from sim.core.errors import DappleError
from sim.schedule.check import check_schedule, format_grid
from sim.schedule.generators import DAPPLE_POLICIES, generate
from sim.schedule.passes import lower
from sim.schedule.torch_csv import to_csv

__all__ = ["MAX_SCHEDULE_COMPUTE", "policy_arg", "schedule_command"]

MAX_SCHEDULE_COMPUTE = 2**16
"""``dapple-sim schedule`` prints at most this many (stage, chunk, micro-batch) forwards: 256
ranks x 256 micro-batches lowered is a few seconds; 1024 x 1024 took 80 s and 2.7 GB."""


def schedule_command(args: argparse.Namespace) -> int:
    chunks = args.chunks if args.chunks is not None else 2 if args.name in ("zb-v", "dualpipe-v") else 1
    work = args.stages * args.microbatches * chunks
    if args.stages > 0 and args.microbatches > 0 and chunks > 0 and work > MAX_SCHEDULE_COMPUTE:
        raise DappleError(f"schedule {args.name}: --stages {args.stages} x --microbatches {args.microbatches} x "
                          f"{chunks} chunks is {work:,} forwards; at most {MAX_SCHEDULE_COMPUTE:,} "
                          f"(2^16): print fewer ranks or micro-batches")
    params: dict[str, object] = {}
    if args.chunks is not None:
        params["chunks"] = args.chunks
    if args.policy is not None:
        params["policy"] = args.policy
    schedule = generate(args.name, args.stages, args.microbatches, **params)
    if args.lower:
        schedule = lower(schedule)
    check_schedule(schedule)
    if args.csv:
        sys.stdout.write(to_csv(schedule))
        return 0
    print(format_grid(schedule) if args.grid else schedule.to_text())
    return 0


def policy_arg(text: str) -> str | tuple[str, ...]:
    """``--policy``: one DAPPLE policy, or one per stage separated by commas."""
    parts = tuple(part.strip() for part in text.split(","))
    bad = [part for part in parts if part not in DAPPLE_POLICIES]
    if bad:
        raise argparse.ArgumentTypeError(f"invalid policy {bad[0]!r}; valid: {', '.join(DAPPLE_POLICIES)}, "
                                         "or one per stage separated by commas")
    return parts[0] if len(parts) == 1 else parts

"""``dapple-run profile``: the command that measures a scenario's layers and links.

The measuring is ``runtime.measure.profile_run`` (layers and the device in this process, links
between two fresh ones) and the files it writes are what ``dapple-sim simulate`` reads;
this module starts it and prints the result: one row per layer (forward, backward, output,
saved and parameter bytes), the measured links, and the paths written.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from runtime.execution.launch import worker_env
from runtime.execution.worker import profile_worker
from runtime.measure import profile_run
from runtime.model.config import load_runnable
from sim.core import jsonio
from sim.core.command import Stopwatch, progress
from sim.core.units import format_bytes, format_time

__all__ = ["cmd_profile", "print_profile"]


def cmd_profile(args: argparse.Namespace) -> int:
    """``dapple-run profile``: measure here (or, under torchrun, as one worker) and print the result."""
    runnable = load_runnable(args.scenario, args.overrides, plan=args.plan_data)
    out = Path(args.out) if args.out else Path("out") / f"{runnable.scenario.name}-profile"

    if worker_env() is not None:
        return profile_worker(args, lambda measured: print_profile(
            profile_run.finish(runnable, args, out, measured["device"], measured["links"]), args.json))
    watch = Stopwatch()
    what = "the layers" + ("" if args.no_links else " and the links")
    with watch.phase(f"measure {what}"), progress(f"measuring {what}", unit="step"):
        result = profile_run.profile_here(runnable, args, out)
    watch.report()
    print_profile(result, args.json)
    return 0


def print_profile(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(jsonio.dumps(result, indent=2, sort_keys=True))
        return
    print(f"{'layer':<12} {'forward':>10} {'backward':>10} {'output':>10} {'saved':>10} {'params':>10}   "
          f"(batch of {result['batch_size']} on {result['device']['name']})")
    for layer in result["layers"]:
        print(f"{layer['name']:<12} {format_time(layer['fwd_s']):>10} {format_time(layer['bwd_s']):>10} "
              f"{format_bytes(layer['output_bytes']):>10} {format_bytes(layer['stash_bytes']):>10} "
              f"{format_bytes(layer['param_bytes']):>10}")
    links = result.get("links")
    if links:
        print(f"point-to-point ({links['backend']}): latency {format_time(links['p2p_latency_s'])}, bandwidth "
              f"{links['p2p_bandwidth_bytes_per_s'] / 1e9:.3g}GB/s; all-reduce latency "
              f"{format_time(links['allreduce_latency_s'])}")
        measured = links.get("collectives")
        if measured:
            print(f"collectives (latency + bytes / bandwidth; FSDP2 adds {measured['fsdp_call_overhead']} a call): "
                  + ", ".join(f"{f['kind']}×{f['ranks']} {f['latency']} + B/{f['bandwidth']}" for f in measured["fits"]))
    for key in ("profile", "profile_json", "cluster", "scenario"):
        if result.get(key):
            print(f"{key.replace('_', ' ')}: {result[key]}")

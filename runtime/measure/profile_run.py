"""``dapple-run profile``: measure layers, device and links, and write what the simulator reads.

The outputs close the validation loop (profile → simulate → run → compare): ``profile.txt``
is a profile in the simulator's format, ``cluster.yaml`` the measured ``cluster:`` section,
and ``scenario.yaml`` the original scenario (training, plan) on the measured profile and
cluster, which ``dapple-sim simulate`` accepts as it is. CPU measurements run with one
thread, as each CPU rank of ``dapple-run run`` does.

A measured profile's layers are whole, so the simulator cannot cut them (``sim.models``), and
the groups that cut them are measured instead, on one replica's t·c local ranks
(``runtime.measure.tp_profile``): each tensor-parallel group becomes one device of the measured
scenario (``runtime.validation.collapse``), and each context rank one data-parallel replica. A
context rank runs b samples of s/c tokens with its ring's shifts, which is what a replica of b/c
whole sequences is to the simulator: the same tokens, so the same per-token work, output and
saved bytes, the same pieces sent to the next stage's rank of its position, and the context
group's gradient all-reduce as the replicas' (``PlanSpec.gradient_groups`` spans data × context).
The profile says so: ``profile_batch_size`` b/c.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from runtime.execution.launch import spawn
from runtime.model.config import RunnableScenario
from runtime.validation.collapse import collapsed_stages
from sim.core import jsonio
from sim.core.errors import DappleError
from sim.input.scenario import load_scenario

__all__ = ["finish", "profile_here"]


def _links_worker(device, repeats: int) -> dict[str, Any]:
    # torch only where this runs: the command line and its checks before launch stay torch-free
    from runtime.measure.bandwidth import measure_links

    return measure_links(device, repeats=repeats)


def _collectives_worker(device, repeats: int):
    # torch only where this runs: the command line and its checks before launch stay torch-free
    from runtime.measure.collectives import measure_worker

    return measure_worker(device, repeats=repeats)


def measure_collectives_here(args: argparse.Namespace) -> dict[str, Any] | None:
    """The collectives the plan kinds call, timed on ``runtime.measure.collectives.RANKS`` fresh
    local processes (fewer GPUs: as many as there are, at least 2), as the link's
    ``collectives`` key; None with ``--no-links`` or ``--no-collectives``, or one GPU."""
    # torch only where this runs: the command line and its checks before launch stay torch-free
    import torch

    # torch too: the measuring module imports it
    from runtime.measure.collectives import RANKS, collectives_key

    if args.no_links or getattr(args, "no_collectives", False):
        return None
    ranks = RANKS if args.backend == "gloo" else min(RANKS, torch.cuda.device_count())
    if ranks < 2:
        return None
    measured = spawn(_collectives_worker, ranks, min(args.repeats, 10), backend=args.backend,
                     timeout_s=max(args.timeout, 120.0))[0]
    return collectives_key(measured)


def profile_here(runnable: RunnableScenario, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Measure links on 2 fresh local processes and the collectives on up to 4, then layers
    and the device in this one."""
    # torch only where this runs: the command line and its checks before launch stay torch-free
    import torch

    if args.backend == "nccl" and torch.cuda.device_count() < (1 if args.no_links else 2):
        raise DappleError("--backend nccl needs GPUs (2 for the link measurement); use --backend gloo")
    device = torch.device("cuda", 0) if args.backend == "nccl" else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)
    links = None if args.no_links else spawn(_links_worker, 2, args.repeats, backend=args.backend,
                                             timeout_s=args.timeout)[0]
    if links is not None:
        links = {**links, "collectives": measure_collectives_here(args)}
    sharded = None
    n = runnable.plan.group_size
    if n > 1:  # one replica's tensor and context ranks: its layers and collectives (runtime.measure.tp_profile)
        # torch only where this runs: the command line and its checks before launch stay torch-free
        from runtime.measure.tp_profile import tp_profile_worker

        if args.backend == "nccl" and torch.cuda.device_count() < n:
            raise DappleError(f"--backend nccl needs {n} GPUs for a replica's tensor and context ranks; "
                              "use --backend gloo")
        batch = args.batch_size or runnable.scenario.training.microbatch_size
        sharded = spawn(tp_profile_worker, n, runnable, batch, args.warmup, args.repeats, backend=args.backend,
                        timeout_s=max(args.timeout, 600.0))[0]
    return finish(runnable, args, out, device, links, sharded=sharded)


def finish(runnable: RunnableScenario, args: argparse.Namespace, out: Path, device, links: dict | None,
           sharded: dict[str, Any] | None = None) -> dict[str, Any]:
    """Profile the layers and the device on ``device`` and write every output into ``out``.

    ``sharded``: a tensor-parallel plan's layers and collectives, measured on one group
    (``runtime.measure.tp_profile``); the measured scenario then has one device per group
    (``runtime.validation.collapse``)."""
    # torch only where this runs: the command line and its checks before launch stay torch-free
    import torch

    # torch only where this runs: the command line and its checks before launch stay torch-free
    from runtime.measure.bandwidth import cluster_yaml, measure_device
    from runtime.measure.profiler import mtp_holds_table_copy, profile_layers, write_profile

    if device.type == "cpu":
        torch.set_num_threads(1)
    scenario, t, c = runnable.scenario, runnable.plan.tensor_parallel, runnable.plan.context_parallel
    batch = args.batch_size or scenario.training.microbatch_size
    if t * c > 1 and sharded is None:
        raise DappleError("a tensor- or context-parallel plan is profiled on one local group: run dapple-run "
                          "profile without torchrun")
    if batch % c:
        raise DappleError(f"--batch-size {batch}: the measured scenario runs each context rank as a replica of "
                          f"batch/{c} samples (runtime.measure.profile_run); profile a multiple of "
                          f"context_parallel {c}")
    layers = sharded["layers"] if sharded is not None else profile_layers(
        runnable.model, batch, device, warmup=args.warmup, repeats=args.repeats, seed=0,
        expert_parallel=runnable.plan.expert_parallel * runnable.plan.expert_tensor_parallel,
        recompute=runnable.plan.recompute, table_copy=mtp_holds_table_copy(runnable.model, runnable.plan))
    device_info = measure_device(device)
    profile_path, json_path = write_profile(layers, out, device=device_info["name"])
    result: dict[str, Any] = {
        "batch_size": batch, "device": device_info, "links": links, "profile": str(profile_path),
        "profile_json": str(json_path), "cluster": None, "scenario": None,
        "layers": json.loads(json_path.read_text(encoding="utf-8"))["layers"],
        "collectives": None if sharded is None else sharded["collectives"],
    }
    if sharded is not None:
        (out / "collectives.json").write_text(jsonio.dumps(sharded["collectives"], indent=2) + "\n", encoding="utf-8")
    if links is not None:
        cluster = scenario.cluster
        if cluster.devices_per_node % t:
            raise DappleError(f"cluster.devices_per_node: {cluster.devices_per_node} is not a multiple of "
                              f"tensor_parallel {t}; a tensor-parallel group must fit in a node")
        text = cluster_yaml(device_info, links, nodes=cluster.nodes, devices_per_node=cluster.devices_per_node // t,
                            memory_share=cluster.devices_per_node if device.type == "cpu" else 1,
                            collectives=links.get("collectives"))
        (out / "cluster.yaml").write_text(text, encoding="utf-8")
        (out / "links.json").write_text(jsonio.dumps(links, indent=2) + "\n", encoding="utf-8")
        result["cluster"] = str(out / "cluster.yaml")
        scenario_path = out / "scenario.yaml"
        scenario_path.write_text(_measured_scenario(runnable, yaml.safe_load(text)["cluster"], batch,
                                                    result["collectives"]), encoding="utf-8")
        load_scenario(scenario_path)  # what we write must load; a failure here is our bug
        result["scenario"] = str(scenario_path)
    return result


def _measured_scenario(runnable: RunnableScenario, cluster: dict, batch: int,
                       collectives: list[dict[str, Any]] | None = None) -> str:
    scenario, plan = runnable.scenario, runnable.plan
    schedule: Any = plan.schedule if not plan.schedule_params else {"name": plan.schedule, **plan.params}
    stages = collapsed_stages(plan) if plan.tensor_parallel > 1 else \
        [{"layers": list(s.layers), "devices": list(s.devices)} for s in plan.stages]
    plan_section: dict[str, Any] = {"recompute": plan.recompute.to_json(), "stages": stages}
    if plan.sharding.value != "none":
        plan_section["sharding"] = plan.sharding.value
    if plan.schedule_file:
        plan_section["schedule_file"] = str(Path(plan.schedule_file).resolve())
    else:
        plan_section["schedule"] = schedule
    c = plan.context_parallel  # each context rank a replica of batch/c whole sequences (the module docstring)
    doc = {
        "name": f"{scenario.name}-measured",
        "cluster": cluster,
        "model": {"profile": "profile.txt", "profile_batch_size": batch // c, "dtype": scenario.model.dtype,
                  "optimizer": scenario.model.optimizer},
        "training": {"global_batch_size": scenario.training.global_batch_size,
                     "microbatch_size": scenario.training.microbatch_size},
        "plan": plan_section,
    }
    header = f"# {scenario.name} on the layers and links measured by dapple-run profile.\n"
    if plan.tensor_parallel > 1:
        header += (f"# Tensor parallel {plan.tensor_parallel}"
                   f"{' with sequence parallelism' if plan.sequence_parallel else ''}: every device here is one "
                   "tensor-parallel group of the\n# plan (runtime.validation.collapse); profile.txt is one device's share of "
                   "each layer, its collectives inside its times:\n")
        for row in collectives or []:
            header += (f"#   {row['kind']} of {row['bytes']:.0f} B over {row['ranks']} ranks: {row['seconds'] * 1e6:.1f} us "
                       f"(bus bandwidth {row['bus_bandwidth_bytes_per_s'] / 1e9:.3g} GB/s)\n")
    if c > 1:
        header += (f"# Context parallel {c}: each context rank is a data-parallel replica here; profile.txt is one rank's "
                   f"layers on {batch} samples of\n# seq_len/{c} tokens, ring attention's shifts inside its times, "
                   f"written as {batch // c} whole sequences (the same tokens).\n")
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)

"""``dapple-run profile``: measure layers, device and links, and write what the simulator reads.

The outputs close the validation loop (profile → simulate → run → compare): ``profile.txt``
is a profile in the simulator's format, ``cluster.yaml`` the measured ``cluster:`` section,
and ``scenario.yaml`` the original scenario (training, plan) on the measured profile and
cluster, which ``dapple-sim simulate`` accepts as it is. CPU measurements run with one
thread, as each CPU rank of ``dapple-run run`` does.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from runtime.config import RunnableScenario
from sim import jsonio

__all__ = ["finish", "profile_here"]


def _links_worker(device, repeats: int) -> dict[str, Any]:
    from runtime.bandwidth import measure_links

    return measure_links(device, repeats=repeats)


def profile_here(runnable: RunnableScenario, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Measure links on 2 fresh local processes, then layers and the device in this one."""
    import torch

    from runtime.launch import spawn

    if args.backend == "nccl" and torch.cuda.device_count() < (1 if args.no_links else 2):
        from sim.errors import DappleError

        raise DappleError("--backend nccl needs GPUs (2 for the link measurement); use --backend gloo")
    device = torch.device("cuda", 0) if args.backend == "nccl" else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)
    links = None if args.no_links else spawn(_links_worker, 2, args.repeats, backend=args.backend,
                                             timeout_s=args.timeout)[0]
    return finish(runnable, args, out, device, links)


def finish(runnable: RunnableScenario, args: argparse.Namespace, out: Path, device, links: dict | None) -> dict[str, Any]:
    """Profile the layers and the device on ``device`` and write every output into ``out``."""
    import torch

    from runtime.bandwidth import cluster_yaml, measure_device
    from runtime.profiler import profile_layers, write_profile
    from sim.input.scenario import load_scenario

    if device.type == "cpu":
        torch.set_num_threads(1)
    scenario = runnable.scenario
    batch = args.batch_size or scenario.training.microbatch_size
    layers = profile_layers(runnable.model, batch, device, warmup=args.warmup, repeats=args.repeats, seed=0)
    device_info = measure_device(device)
    profile_path, json_path = write_profile(layers, out, device=device_info["name"])
    result: dict[str, Any] = {
        "batch_size": batch, "device": device_info, "links": links, "profile": str(profile_path),
        "profile_json": str(json_path), "cluster": None, "scenario": None,
        "layers": json.loads(json_path.read_text(encoding="utf-8"))["layers"],
    }
    if links is not None:
        cluster = scenario.cluster
        text = cluster_yaml(device_info, links, nodes=cluster.nodes, devices_per_node=cluster.devices_per_node,
                            memory_share=cluster.devices_per_node if device.type == "cpu" else 1)
        (out / "cluster.yaml").write_text(text, encoding="utf-8")
        (out / "links.json").write_text(jsonio.dumps(links, indent=2) + "\n", encoding="utf-8")
        result["cluster"] = str(out / "cluster.yaml")
        scenario_path = out / "scenario.yaml"
        scenario_path.write_text(_measured_scenario(runnable, yaml.safe_load(text)["cluster"], batch), encoding="utf-8")
        load_scenario(scenario_path)  # what we write must load; a failure here is our bug
        result["scenario"] = str(scenario_path)
    return result


def _measured_scenario(runnable: RunnableScenario, cluster: dict, batch: int) -> str:
    scenario, plan = runnable.scenario, runnable.plan
    schedule: Any = plan.schedule if not plan.schedule_params else {"name": plan.schedule, **plan.params}
    plan_section: dict[str, Any] = {"recompute": plan.recompute.to_json(),
                                    "stages": [{"layers": list(s.layers), "devices": list(s.devices)} for s in plan.stages]}
    if plan.schedule_file:
        plan_section["schedule_file"] = str(Path(plan.schedule_file).resolve())
    else:
        plan_section["schedule"] = schedule
    doc = {
        "name": f"{scenario.name}-measured",
        "cluster": cluster,
        "model": {"profile": "profile.txt", "profile_batch_size": batch, "dtype": scenario.model.dtype,
                  "optimizer": scenario.model.optimizer},
        "training": {"global_batch_size": scenario.training.global_batch_size,
                     "microbatch_size": scenario.training.microbatch_size},
        "plan": plan_section,
    }
    header = f"# {scenario.name} on the layers and links measured by dapple-run profile.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)

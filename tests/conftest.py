"""Shared test helpers: paths of the repository, its scenarios and the bad-scenario corpus, and
the runs that several test files read (each launched once per session: a launch costs seconds)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
BAD_SCENARIOS = Path(__file__).resolve().parent / "scenarios" / "bad"


def load_benchmark(name: str):
    """The script ``benchmarks/<name>.py`` as a module (benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def checked_tiny_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """``dapple-run run`` of the tiny CPU GPT on 2 torchrun processes, 2 steps, ``--check --json``:
    the finished command and its ``--out`` folder. Read by test_runtime_cli.py (the summary) and
    test_cli_outputs.py (the trace and events files); only ``dist`` tests ask for it."""
    out = tmp_path_factory.mktemp("checked_tiny_run")
    result = subprocess.run([sys.executable, "-m", "runtime", "run", str(SCENARIOS / "gpt_tiny_cpu.yaml"),
                             "--nproc", "2", "--steps", "2", "--json", "--check", "--out", str(out)],
                            capture_output=True, text=True, timeout=180, check=False)
    return result, out


def synthetic_scenario(
    *,
    fwd_s,
    bwd_s,
    replicas=None,
    schedule="dapple",
    params=(),
    microbatches=4,
    microbatch_size=None,
    devices_per_node=8,
    nodes=None,
    boundary_bytes=0.0,
    param_bytes=0.0,
    stash_bytes=1.0,
    wgrad_fraction=0.5,
    intra_bandwidth=1e12,
    inter_bandwidth=1e11,
    latency_s=0.0,
    recompute=False,
    memory_bytes=2.0**40,
    ranks=None,
    memory_bandwidth=1e15,
    send_overhead_s=0.0,
    send_bandwidth=None,
    recv_overhead_s=0.0,
):
    """A scenario with one layer per stage, built from specs (no YAML): layer s takes
    ``fwd_s[s]``/``bwd_s[s]`` seconds per sample; stage s has ``replicas[s]`` devices, placed
    in order; with ``ranks`` (interleaved), stage s uses the devices of rank ``ranks[s]``;
    ``send_overhead_s``, ``send_bandwidth`` and ``recv_overhead_s`` are both links' charges
    on the compute streams for sending and receiving."""
    from sim.core.model_spec import LayerSpec, ModelSpec
    from sim.core.parallelism import Recompute
    from sim.core.plan import PlanSpec, StageSpec
    from sim.core.specs import ClusterSpec, DeviceSpec, LinkSpec
    from sim.core.training import TrainingSpec
    from sim.input.scenario import Scenario

    num_stages = len(fwd_s)
    ranks = list(range(num_stages)) if ranks is None else list(ranks)
    num_ranks = max(ranks) + 1
    replicas = [1] * num_ranks if replicas is None else list(replicas)
    groups, next_device = [], 0
    for r in range(num_ranks):
        groups.append(tuple(range(next_device, next_device + replicas[r])))
        next_device += replicas[r]
    nodes = nodes or -(-next_device // devices_per_node)
    layers = tuple(
        LayerSpec(name=f"l{s}", param_bytes=param_bytes, output_bytes=boundary_bytes, stash_bytes=stash_bytes,
                  fwd_s=fwd_s[s], bwd_s=bwd_s[s], wgrad_fraction=wgrad_fraction)
        for s in range(num_stages)
    )
    model = ModelSpec(name="synthetic", layers=layers,
                      boundary_bytes=(0.0,) + (boundary_bytes,) * (num_stages - 1) + (0.0,), dtype="fp32", optimizer="sgd")
    device = DeviceSpec(name="dev", memory_bytes=memory_bytes, peak_flop_per_s=1e12, peak_fp32_flop_per_s=1e12,
                        memory_bandwidth_bytes_per_s=memory_bandwidth)
    cluster = ClusterSpec(nodes=nodes, devices_per_node=devices_per_node, device=device,
                          intra_node=LinkSpec(bandwidth_bytes_per_s=intra_bandwidth, latency_s=latency_s,
                                              send_overhead_s=send_overhead_s, send_bandwidth_bytes_per_s=send_bandwidth,
                                              recv_overhead_s=recv_overhead_s),
                          inter_node=LinkSpec(bandwidth_bytes_per_s=inter_bandwidth, latency_s=latency_s,
                                              send_overhead_s=send_overhead_s, send_bandwidth_bytes_per_s=send_bandwidth,
                                              recv_overhead_s=recv_overhead_s))
    microbatch_size = microbatch_size or max(replicas)
    plan = PlanSpec(stages=tuple(StageSpec(layers=(s, s + 1), devices=groups[ranks[s]]) for s in range(num_stages)),
                    schedule=schedule, schedule_params=tuple(sorted(dict(params).items())),
                    recompute=Recompute.of(recompute))
    training = TrainingSpec(global_batch_size=microbatch_size * microbatches, microbatch_size=microbatch_size)
    return Scenario(name="synthetic", cluster=cluster, model=model, training=training, plan=plan)


def checked_cases(device, path: str, cases: dict) -> dict:
    """A spawned rank's part of each case: ``path`` with the case's overrides run one step with
    ``--check`` (``runtime.execution.session.run_session``), by case name. One thread a rank:
    the ranks share the host's cores."""
    import torch  # the runtime's tests only: keeps torch off the other tests' import path

    from runtime.execution.session import SessionOptions, run_session
    from runtime.model.config import load_runnable

    torch.set_num_threads(1)
    return {name: run_session(load_runnable(path, overrides), SessionOptions(steps=1, check=True), device)
            for name, overrides in cases.items()}


def spawn_checked(path: str, nproc: int, cases: dict) -> dict:
    """``checked_cases`` on ``nproc`` gloo ranks; rank 0's summaries by case name."""
    from runtime.execution.launch import spawn

    return spawn(checked_cases, nproc, path, cases)[0]


def kinds_beside_prediction(path: str, overrides: dict, summary) -> list[tuple[dict, object]]:
    """Per device of a runtime run's ``summary``: (its measured ``memory_breakdown_bytes``, the
    fast path's predicted ``memory_breakdown`` of the same scenario), in device order."""
    from runtime.model.config import load_runnable
    from sim.engine.run import run_scenario

    predicted = run_scenario(load_runnable(path, overrides).scenario, engine="fast").summarize()
    return [(measured["memory_breakdown_bytes"], device.memory_breakdown)
            for measured, device in zip(summary["devices"], predicted.devices)]


def assert_matches_unsplit(summary) -> None:
    """A runtime run's ``--check`` against the unsplit single-process model: gradients within
    1e-5 (fp32) and the same loss."""
    assert summary["check_passed"], (summary["max_rel_grad_diff"], summary["worst_grad"])
    assert summary["max_rel_grad_diff"] <= 1e-5
    assert summary["loss"] == pytest.approx(summary["reference_loss"], rel=1e-5)

"""The fuzz's input kinds ("families"): each builds (program, argv, files) from a seeded RNG.

A scenario family writes a mutated scenario and runs one command on it (``scenario_argv``:
``check``, ``simulate``, ``compare``, ``dapple-plan``, ``dapple-run run|validate|profile``);
the others mutate the file that kind of command reads (plan JSON, schedule, calibration CSV,
sweep, suite) or the command line itself. ``sample`` keeps a case cheap: small scenarios, the
fast engine, cheap planners, no plots.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import mutate as mu

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
CHEAP = ("gpt_tiny_cpu.yaml", "mlp_tiny_cpu.yaml", "bert48_v100_2x8.yaml", "vgg_preset")
LARGER = ("gpt1.3b_h100_interleaved.yaml", "llama3_8b_h100_context_parallel.yaml", "vgg19_v100_16x1.yaml",
          "bert48_v100_straggler.yaml", "bert48_v100_15to1.yaml", "gpt3_175b_a100_tp8_pp8.yaml")
VGG_PRESET = """name: vgg-preset
cluster: {preset: v100-nvlink-8, nodes: 1}
model: {preset: vgg, depth: 16, image_size: 224, num_classes: 1000, optimizer: momentum}
training: {global_batch_size: 64, microbatch_size: 16}
plan:
  schedule: dapple
  stages:
    - {layers: [0, 10], devices: "0-3"}
    - {layers: [10, 21], devices: "4-7"}
"""
TEXT = {name: (SCENARIOS / name).read_text() for name in CHEAP[:3] + LARGER}
TEXT["vgg_preset"] = VGG_PRESET
SCHEDULES = ("gpipe", "dapple", "interleaved", "zb-h1", "zb-v", "dualpipe-v", "1f1b", "looped-bfs", "interleaved-zb")


@dataclass(frozen=True)
class Special:
    """A file that is not bytes: ``kind`` is ``fifo``, ``dir`` or ``symlink`` (to ``target``)."""

    kind: str
    target: str = ""


def template(rng: random.Random, sample: bool) -> str:
    names = CHEAP if sample or rng.random() < 0.6 else LARGER
    return rng.choice(names)


def scenario_argv(rng: random.Random, sample: bool, path: str, name: str = "") -> tuple[str, list[str]]:
    """One command on the scenario at ``path``: (program, argv)."""
    tiny = name in ("gpt_tiny_cpu.yaml", "mlp_tiny_cpu.yaml")
    commands = ["check"] * 4 + ["simulate"] * 3 + ["plan"] * 2 + ["run", "validate", "profile"] + (
        ["compare"] if tiny or not sample else [])
    command = rng.choice(commands)
    extra = ["--json"] if rng.random() < 0.5 else []
    extra += rng.choice([[], [], ["-q"], ["-v"]])
    if command == "check":
        return "dapple-sim", ["check", path] + extra
    if command == "simulate":
        engine = "fast" if sample or rng.random() < 0.5 else "simpy"
        more = rng.choice([[], ["--no-contention"], ["--fail-on-oom"], ["--no-symmetry"]] +
                          ([] if sample else [["--out", "out"], ["--out", "out", "--trace-all"]]))
        return "dapple-sim", ["simulate", path, "--engine", engine] + more + extra
    if command == "compare":
        chosen = rng.sample(SCHEDULES, rng.randint(1, 3))
        engine = "fast" if sample or rng.random() < 0.5 else "simpy"
        more = [] if sample or rng.random() < 0.7 else ["--out", "out"]
        return "dapple-sim", ["compare", path, "--schedules", ",".join(chosen), "--engine", engine] + more + extra
    if command == "plan":
        planners = ["even", "dp"] if sample or not tiny else ["even", "dp", "dapple", "megatron", "pipedream"]
        argv = [path] + [w for p in rng.sample(planners, rng.randint(1, 2)) for w in ("--planner", p)]
        if not sample and rng.random() < 0.2:
            argv += ["--out", "out"]
        return "dapple-plan", argv + extra
    nproc = rng.choice([[], ["--nproc", "0"], ["--nproc", "-1"], ["--nproc", "1"], ["--nproc", "2"],
                        ["--nproc", "3"], ["--nproc", "100000"]])
    return "dapple-run", [command, path] + (nproc if command != "profile" else []) + extra


def yaml_text(rng: random.Random, sample: bool):
    name = template(rng, sample)
    text = TEXT[name]
    for _ in range(rng.choice([1, 1, 2, 3])):
        text = mu.mutate_yaml_text(text, rng)
    return (*scenario_argv(rng, sample, "s.yaml", name), {"s.yaml": text})


def yaml_values(rng: random.Random, sample: bool):
    name = template(rng, sample)
    data = mu.mutate_data(yaml.safe_load(TEXT[name]), rng, rng.choice([1, 1, 2, 3]))
    return (*scenario_argv(rng, sample, "s.yaml", name), {"s.yaml": mu.dump_yaml(data)})


def _set_value(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return rng.choice(mu.TAGS)
    if kind == 1:
        return mu.nested(rng.choice([3, 65, 2000]), rng.choice(["list", "map"]))
    if kind == 2:
        return rng.choice(["", "[", "{a: 1", "'", "&a 1", "*a", "- x", "x: y: z", "\x00", "\udcff", "a\nb"])
    return json.dumps(mu.odd_value(rng), allow_nan=True)


def overrides(rng: random.Random, sample: bool):
    name = template(rng, sample)
    keys = [".".join(map(str, p)) for p, _ in mu.paths(yaml.safe_load(TEXT[name])) if p]
    keys += ["plan.fsdp", "model.optimizer.implementation", "training.microbatch_size", "x.y", "plan..stages",
             ".", "plan.stages.0.layers", "cluster.nodes" + mu.ZWSP, "faults", "model.preset", "cluster.device.memory"]
    sets = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.1:
            sets += ["--set", rng.choice(["x", "=1", "=", "a==b", " =1", "k"])]
        else:
            sets += ["--set", f"{rng.choice(keys)}={_set_value(rng)}"]
    program, argv = scenario_argv(rng, sample, str(SCENARIOS / name) if name in TEXT and name != "vgg_preset"
                                  else "s.yaml", name)
    return program, argv + sets, {"s.yaml": TEXT[name]}


BOUNDS = [
    ("gpt_tiny_cpu.yaml", ["cluster.nodes=131072", "cluster.devices_per_node=8"]),
    ("gpt_tiny_cpu.yaml", ["cluster.nodes=1048576"]),
    ("gpt_tiny_cpu.yaml", ["cluster.devices_per_node=1048576"]),
    ("gpt_tiny_cpu.yaml", ["cluster.nodes=16384", "cluster.devices_per_node=8"]),
    ("gpt_tiny_cpu.yaml", ["cluster.nodes=50000", "cluster.devices_per_node=8",
                           "plan.stages=[{layers: [0, 6], devices: '0-399999'}]"]),
    ("gpt_tiny_cpu.yaml", ["training.global_batch_size=400000"]),
    ("gpt_tiny_cpu.yaml", ["training.global_batch_size=65540"]),
    ("gpt_tiny_cpu.yaml", ["training.global_batch_size=4294967296"]),
    ("gpt_tiny_cpu.yaml", ["model.layers=100000", "plan.stages=[{layers: [0, 50000], devices: [0]}, "
                           "{layers: [50000, 100002], devices: [1]}]"]),
    ("gpt_tiny_cpu.yaml", ["model.layers=16385"]),
    ("gpt_tiny_cpu.yaml", ["model.hidden=1000000000"]),
    ("gpt_tiny_cpu.yaml", ["model.hidden=1e9"]),
    ("gpt_tiny_cpu.yaml", ["model.seq_len=1000000000"]),
    ("gpt_tiny_cpu.yaml", ["model.vocab=1000000000"]),
    ("gpt_tiny_cpu.yaml", ["model.heads=1048576", "model.hidden=1048576"]),
    ("gpt_tiny_cpu.yaml", ["training.microbatch_size=1e3"]),
    ("mlp_tiny_cpu.yaml", ["model.input_size=1000000000"]),
    ("mlp_tiny_cpu.yaml", ["model.num_classes=1000000000"]),
    ("vgg_preset", ["model.image_size=320000000"]),
    ("vgg_preset", ["model.image_size=3.2e8"]),
    ("vgg_preset", ["model.image_size=65568"]),
    ("vgg_preset", ["model.num_classes=1000000000000"]),
    ("bert48_v100_2x8.yaml", ["model.profile_batch_size=1000000000"]),
    ("bert48_v100_2x8.yaml", ["cluster.device.memory=1e30GB"]),
    ("bert48_v100_2x8.yaml", ["cluster.inter_node.bandwidth=1e-300GB/s"]),
    ("bert48_v100_2x8.yaml", ["cluster.inter_node.latency=1e300s"]),
]


def bounds(rng: random.Random, sample: bool):
    name, sets = rng.choice(BOUNDS)
    path = "s.yaml" if name == "vgg_preset" else str(SCENARIOS / name)
    program, argv = scenario_argv(rng, True, path, name)
    return program, argv + [w for s in sets for w in ("--set", s)], {"s.yaml": TEXT[name]}

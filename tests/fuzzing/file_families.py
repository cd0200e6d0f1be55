"""The fuzz's file kinds beside the scenario: plan JSON, schedule text and torch CSV,
calibration CSV, sweep files, published suites, hostile files, and the command line's own
flags (``dapple-sim schedule``'s numbers among them)."""

from __future__ import annotations

import json
import os
import random

from sim.schedule.generators import generate
from sim.schedule.passes import lower
from sim.schedule.torch_csv import to_csv

from . import mutate as mu
from .families import SCENARIOS, SCHEDULES, TEXT, Special, scenario_argv

PLANS = {
    "gpt_tiny_cpu.yaml": {"microbatch_size": 4, "num_microbatches": 4, "recompute": False,
                          "schedule": {"name": "dapple", "policy": "2(s-i)-1"}, "sharding": "none",
                          "stages": [{"devices": [0], "layers": [0, 3]}, {"devices": [1], "layers": [3, 6]}]},
    "bert48_v100_2x8.yaml": {"microbatch_size": 16, "schedule": "dapple", "recompute": False,
                             "stages": [{"devices": list(range(8)), "layers": [0, 27]},
                                        {"devices": "8-15", "layers": [27, 53]}]},
}
CALIBRATION = SCENARIOS / "calibration"
RUNS = (CALIBRATION / "cpu_runs.csv").read_text().splitlines()


def plan_json(rng: random.Random, sample: bool):
    name = rng.choice(sorted(PLANS))
    plan = PLANS[name]
    if rng.random() < 0.5:
        text = json.dumps(mu.mutate_data(plan, rng, rng.choice([1, 2])), allow_nan=True)
    else:
        text = mu.mutate_json_text(json.dumps(plan), rng)
    if rng.random() < 0.3:
        text = '{"best": ' + text + ', "planners": {}}'
    program, argv = scenario_argv(rng, sample, str(SCENARIOS / name), name)
    if program == "dapple-plan" or argv[0] == "profile":
        program, argv = "dapple-sim", ["check", str(SCENARIOS / name)]
    return program, argv + ["--plan", "plan.json"], {"plan.json": text}


def _schedule_text(rng: random.Random, stages: int, microbatches: int, big: bool) -> tuple[str, str]:
    schedule = generate(rng.choice(["gpipe", "dapple", "1f1b", "zb-h1"]), stages, microbatches)
    if rng.random() < 0.4:
        if rng.random() < 0.5:
            schedule = lower(schedule)
        return "sched.csv", mu.mutate_tokens(to_csv(schedule), rng, sep=",", big=big)
    return "sched.txt", mu.mutate_tokens(schedule.to_text(), rng, big=big)


def schedule_file(rng: random.Random, sample: bool):
    name = rng.choice(["gpt_tiny_cpu.yaml", "bert48_v100_2x8.yaml"])
    microbatches = 4 if name.startswith("gpt") else 8
    file, text = _schedule_text(rng, 2, microbatches, big=not sample)
    scenario = TEXT[name].replace("schedule: dapple", f"schedule_file: {file}")
    program, argv = scenario_argv(rng, sample, "s.yaml", name)
    return program, argv, {"s.yaml": scenario, file: text}


def calibration(rng: random.Random, sample: bool):
    rows = RUNS[:1] + rng.sample(RUNS[1:], rng.randint(1, 3))
    fit = "\n".join(rows) + "\n"
    for _ in range(rng.choice([1, 1, 2]) if sample or rng.random() < 0.7 else 0):
        fit = mu.mutate_csv(fit, rng)
    if sample:  # a fit takes seconds: the sample's CSVs are refused while read (a bad hidden size)
        rows = fit.splitlines()
        k = rng.randrange(1, len(rows)) if len(rows) > 1 else 0
        rows[k] = rng.choice(["nan", "-1", "abc", "", "inf", "0", "1e308"]) + "," + rows[k].partition(",")[2]
        fit = "\n".join(rows) + "\n"
    files = {"fit.csv": fit}
    base = str(CALIBRATION / "cpu_base.yaml")
    if rng.random() < 0.2:
        files["base.yaml"] = mu.mutate_yaml_text((CALIBRATION / "cpu_base.yaml").read_text(), rng)
        base = "base.yaml"
    argv = ["calibrate", base, "--fit", "fit.csv"]
    if rng.random() < 0.3:
        files["test.csv"] = mu.mutate_csv("\n".join(RUNS[:1] + RUNS[5:7]) + "\n", rng)
        argv += ["--test", "test.csv"]
    argv += rng.choice([[], ["--json"], ["--out", "params.yaml"], ["--out", "."], ["--out", "missing/dir/p.yaml"]])
    return "dapple-sim", argv, files


def sweep(rng: random.Random, sample: bool):
    tiny = str(SCENARIOS / "gpt_tiny_cpu.yaml")
    data = rng.choice([
        {"name": "s", "base": tiny, "mode": "simulate", "engine": "fast",
         "axes": {"training.global_batch_size": [8, 16], "plan.schedule": ["gpipe", "dapple"]}},
        {"name": "s", "base": tiny, "mode": "plan", "planner": "even",
         "axes": {"cluster.inter_node.bandwidth": ["1GB/s", "2GB/s"]}},
        {"name": "s", "base": tiny, "mode": "simulate", "points": [{"training.global_batch_size": 8}],
         "plots": [{"figure": "memory_vs_microbatches", "hue": "plan.schedule"}]},
    ])
    if rng.random() < 0.5:
        text = mu.dump_yaml(mu.mutate_data(data, rng, rng.choice([1, 2, 3])))
    else:
        text = mu.mutate_yaml_text(mu.dump_yaml(data), rng)
    argv = ["sweep", "sweep.yaml", "--out", rng.choice(["out", "out", "sweep.yaml", "/dev/null"])]
    argv += rng.choice([["--workers", "1"], ["--workers", "0"], ["--workers", "-2"], ["--workers", "x"],
                        ["--workers", "1", "--json"], ["--workers", "1", "-q"]])
    return "dapple-plan", argv, {"sweep.yaml": text}


def published(rng: random.Random, sample: bool):
    row = {"scenario": str(SCENARIOS / "published" / "torchtitan2024_llama3_8b_8.yaml"),
           "metric": "tokens_per_s_per_gpu", "published": 6000, "source": "t", "table": "Table 1", "row": "8B"}
    suite = {"sources": {"t": "torchtitan"}, "rows": [row]}
    if rng.random() < 0.5:
        text = mu.dump_yaml(mu.mutate_data(suite, rng, rng.choice([1, 2, 3])))
    else:
        text = mu.mutate_yaml_text(mu.dump_yaml(suite), rng)
    argv = ["published", "--suite", "suite.yaml"] + rng.choice([[], ["--json"], ["--out", "/dev/null"]] +
                                                               ([] if sample else [["--out", "out"]]))
    return "dapple-sim", argv, {"suite.yaml": text}


def _hostile_body(rng: random.Random, kind: str, big: bool):
    if kind == "empty":
        return b""
    if kind == "binary":
        return bytes(rng.randrange(256) for _ in range(rng.choice([1, 64, 4096])))
    if kind == "huge":
        return b"# " + b"x" * (4 * 2**20 + 10) + b"\n"
    if kind == "non_utf8":
        return "name: caf\xe9\nmodel: {preset: gpt}\n".encode("latin-1")
    if kind == "long_line":
        return b"name: " + b"a" * 2**20 + b"\n"
    if kind == "many_keys":
        return "".join(f"k{i}: {i}\n" for i in range(50_000 if big else 5_000)).encode()
    if kind == "fifo":
        return Special("fifo")
    if kind == "dir":
        return Special("dir")
    if kind == "devzero":
        return Special("symlink", "/dev/zero")
    if kind == "devnull":
        return Special("symlink", "/dev/null")
    if kind == "loop":
        return Special("symlink", "h.loop")
    return None  # missing


HOSTILE = ("empty", "binary", "huge", "non_utf8", "long_line", "many_keys", "fifo", "dir", "devzero", "devnull",
           "loop", "missing")


def hostile(rng: random.Random, sample: bool):
    kind = rng.choice(HOSTILE)
    body = _hostile_body(rng, kind, big=not sample)
    name = "h.loop" if kind == "loop" else "h"
    files = {} if body is None else {name: body}
    slot = rng.choice(["scenario", "plan", "fit", "test", "sweep", "suite", "schedule_file", "profile", "base"])
    tiny = str(SCENARIOS / "gpt_tiny_cpu.yaml")
    if slot == "scenario":
        program, argv = scenario_argv(rng, sample, name)
    elif slot == "plan":
        program, argv = scenario_argv(rng, sample, tiny, "gpt_tiny_cpu.yaml")
        program, argv = ("dapple-sim", ["check", tiny]) if program == "dapple-plan" else (program, argv)
        argv += ["--plan", name]
    elif slot in ("fit", "test", "base"):
        good = str(CALIBRATION / "cpu_runs.csv")
        base = name if slot == "base" else str(CALIBRATION / "cpu_base.yaml")
        program, argv = "dapple-sim", ["calibrate", base, "--fit", name if slot == "fit" else good]
        argv += ["--test", name] if slot == "test" else []
    elif slot == "sweep":
        program, argv = "dapple-plan", ["sweep", name, "--out", "out", "--workers", "1"]
    elif slot == "suite":
        program, argv = "dapple-sim", ["published", "--suite", name]
    else:
        text = TEXT["gpt_tiny_cpu.yaml" if slot == "schedule_file" else "bert48_v100_2x8.yaml"]
        key = "schedule: dapple" if slot == "schedule_file" else "profile: profiles/dapple-v100/bert-48-pbs-2.txt"
        replaced = "schedule_file: " if slot == "schedule_file" else "profile: "
        files["s.yaml"] = text.replace(key, replaced + name)
        program, argv = scenario_argv(rng, sample, "s.yaml", "gpt_tiny_cpu.yaml")
    return program, argv, files


BAD_FLAGS = {
    "dapple-sim": [["--engine", "warp"], ["--unknown"], ["--json", "--json"], ["--out"], ["--set"], ["-v", "-q"],
                   ["--schedules", ""], ["--schedules", "gpipe,,nope"], ["--schedules", "dapple,dapple"],
                   ["--out", "/dev/null"], ["--out", "/proc/x"], ["--plan"], ["--plan", "."], ["--no-contention=1"],
                   ["--out", "s.yaml"], ["--out", "x" * 5000], ["--fail-on-oom", "--fail-on-oom"]],
    "dapple-plan": [["--planner", "nope"], ["--planner"], ["--microbatch-size", "0"], ["--microbatch-size", "-3"],
                    ["--microbatch-size", "1e3"], ["--microbatch-size", "1000000000"], ["--max-candidates", "0"],
                    ["--max-partials", "-1"], ["--max-replays", "x"], ["--max-candidates", "99999999999999999999"],
                    ["--out", "/dev/null"], ["--plan", "p.json"], ["--unknown"], ["--json", "--json"], ["-q", "-v"]],
    "dapple-run": [["--nproc", "x"], ["--nproc", "0"], ["--steps", "0"], ["--steps", "-1"], ["--warmup", "-1"],
                   ["--timeout", "0"], ["--timeout", "nan"], ["--timeout", "inf"], ["--timeout", "-inf"],
                   ["--timeout", "1e309"], ["--fail-at", "x"], ["--fail-at", "99999999999999999999:0F0"],
                   ["--backend", "mpi"], ["--rounds", "0"], ["--slices", "0"], ["--repeats", "0"],
                   ["--batch-size", "0"], ["--seed", "x"], ["--csv"], ["--unknown"], ["--nproc", "2", "--nproc", "-2"]],
}


def flags(rng: random.Random, sample: bool):
    name = rng.choice(["gpt_tiny_cpu.yaml", "mlp_tiny_cpu.yaml", "bert48_v100_2x8.yaml"])
    program, argv = scenario_argv(rng, sample, str(SCENARIOS / name), name)
    choices = [f for f in BAD_FLAGS[program] if not (sample and "--out" in f)]  # --out loads the plotting libraries
    bad = rng.choice(choices)
    at = rng.randint(0, len(argv))
    return program, argv[:at] + bad + argv[at:] if program != "dapple-run" or at > 0 else argv + bad, {}


NUMBERS = ["1", "2", "3", "4", "8", "0", "-1", "x", "1e3", "2.5", "64", "1000", "16384", "16385", "100000",
           "1000000000", "99999999999999999999"]


def schedule_command(rng: random.Random, sample: bool):
    name = rng.choice(list(SCHEDULES) + ["nope", "", "DAPPLE", "file"])
    argv = ["schedule", name]
    for flag in ("--stages", "--microbatches"):
        if rng.random() < 0.95:
            argv += [flag, rng.choice(NUMBERS[:6] if rng.random() < 0.6 else NUMBERS)]
    if rng.random() < 0.3:
        argv += ["--chunks", rng.choice(NUMBERS)]
    if rng.random() < 0.2:
        argv += ["--policy", rng.choice(["2(s-i)-1", "s-i", "x", "s-i,s-i", ",", "2(s-i)-1," * 3])]
    argv += rng.choice([[], ["--lower"], ["--grid"], ["--csv"], ["--lower", "--csv"], ["--grid", "--csv"]])
    return "dapple-sim", argv, {}


def special_argv(rng: random.Random, sample: bool):
    """Command lines without a file: no arguments, help, a missing subcommand, odd words."""
    program = rng.choice(["dapple-sim", "dapple-plan", "dapple-run"])
    argv = rng.choice([[], ["--help"], ["-h"], ["nope"], ["check"], ["sweep"], ["run"], ["--version"], ["-"],
                       ["check", ""], ["simulate", os.devnull], ["\x00"], ["check", "--", "-x"], ["sweep", "--help"]])
    return program, list(argv), {}

"""Fuzzing: mutated scenarios simulate or are rejected in one line; mutated schedules are
rejected or replay to the end; the engine never hangs.

The default suite runs about a thousand cases (``FUZZ_CASES`` per template); ``-m slow`` runs
twenty times as many.
"""

from __future__ import annotations

import copy
import random

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SCENARIOS, synthetic_scenario
from sim.core.errors import DappleError, ScheduleError
from sim.input.scenario import parse_scenario

TEMPLATES = [
    "bert48_v100_2x8.yaml",
    "bert48_v100_15to1.yaml",
    "gpt1.3b_h100_interleaved.yaml",
    "vgg19_v100_16x1.yaml",
    "bert48_v100_hand_written.yaml",
    "bert48_v100_straggler.yaml",
    "gpt_tiny_cpu.yaml",
]
RAW = {name: yaml.safe_load((SCENARIOS / name).read_text()) for name in TEMPLATES}
FUZZ_CASES = 150  # per template: the command fuzz (tests/test_command_fuzz.py) covers the commands above it
ODD_VALUES = [
    None, True, 0, -1, -2.5, 3, 10**12, 1e308, float("nan"), float("inf"), "", "x", "25Gbs", "16GB/s", "-5us",
    "1e400GB", "0-99999999999", "0-3", [], [0], [0, 0], [-1], {}, {"a": 1}, [[0, 1]], "profiles/missing.txt",
    "../tests/scenarios/binary_profile.txt", "../tests/scenarios/broken_profile.txt", "dapple", "interleaved",
    {"name": "dapple", "policy": "2(s-i)-1"}, "100Gb/s", "5GiB", "2ms",
]


def _paths(node, prefix=()):
    """Every (path, value) below ``node`` (mappings and lists)."""
    yield prefix, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, prefix + (index,))


def _set(root, path, value):
    node = root
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def _delete(root, path):
    node = root
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]


def mutate(raw: dict, rng: random.Random, steps: int) -> dict:
    """Delete keys, swap in odd values, empty or duplicate lists, scale numbers."""
    raw = copy.deepcopy(raw)
    for _ in range(steps):
        paths = [p for p, _ in _paths(raw) if p]
        if not paths:
            break
        path = rng.choice(paths)
        node = raw
        for part in path:
            node = node[part]
        action = rng.randrange(5)
        if action == 0:
            _delete(raw, path)
        elif action == 1:
            _set(raw, path, copy.deepcopy(rng.choice(ODD_VALUES)))
        elif action == 2 and isinstance(node, list):
            _set(raw, path, [] if rng.random() < 0.5 else node + node[:1])
        elif action == 3 and isinstance(node, (int, float)) and not isinstance(node, bool):
            _set(raw, path, rng.choice([-node, node * 10**9, node + 1, 0]))
        elif action == 4 and isinstance(node, str):
            cut = rng.randrange(len(node) + 1)
            _set(raw, path, node[:cut] + rng.choice(["", "x", "/", "0", " "]) + node[cut:])
    return raw


def _check_one_line(exc: DappleError, source: str) -> None:
    text = str(exc)
    assert text.startswith(source) or "schedule" in text or text, text
    if not isinstance(exc, ScheduleError) and "schedule_file" not in text:
        assert "\n" not in text, text


def _fuzz_scenario(template: str, seed: int, steps: int) -> None:
    from sim.engine.run import run_scenario

    rng = random.Random(seed)
    raw = mutate(RAW[template], rng, steps)
    try:
        text = yaml.safe_dump(raw, sort_keys=False)
    except yaml.YAMLError:
        return
    try:
        scenario = parse_scenario(text, source="fuzz.yaml", base_dir=SCENARIOS)
    except DappleError as exc:
        _check_one_line(exc, "fuzz.yaml")
        return
    if scenario.plan is None:
        return
    size = scenario.training.num_microbatches * scenario.plan.num_stages * scenario.cluster.num_devices
    engine = "simpy" if size <= 2_000 else "fast"
    if size > 200_000:
        return  # valid and large: replaying it is the benchmarks' job, not the fuzzer's
    try:
        result = run_scenario(scenario, engine=engine)
    except DappleError as exc:
        _check_one_line(exc, "fuzz.yaml")
        return
    summary = result.summary()
    assert summary.get("failure") or summary["iteration_time_s"] >= 0


FUZZ = settings(max_examples=FUZZ_CASES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.mark.parametrize("template", TEMPLATES)
@FUZZ
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 3))
def test_mutated_scenarios_simulate_or_are_rejected_in_one_line(template, seed, steps):
    _fuzz_scenario(template, seed, steps)


@pytest.mark.slow
@pytest.mark.parametrize("template", TEMPLATES)
@settings(max_examples=20 * FUZZ_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 6))
def test_many_more_mutated_scenarios(template, seed, steps):
    _fuzz_scenario(template, seed, steps)


# --- schedules ---------------------------------------------------------------------------------


def _mutate_schedule(schedule, rng: random.Random):
    from dataclasses import replace

    ranks = [list(acts) for acts in schedule.ranks]
    rank = rng.randrange(len(ranks))
    acts = ranks[rank]
    action = rng.randrange(5)
    if action == 0 and len(acts) > 1:  # swap two actions
        i, j = rng.randrange(len(acts)), rng.randrange(len(acts))
        acts[i], acts[j] = acts[j], acts[i]
    elif action == 1 and acts:  # delete
        del acts[rng.randrange(len(acts))]
    elif action == 2 and acts:  # duplicate
        i = rng.randrange(len(acts))
        acts.insert(rng.randrange(len(acts) + 1), acts[i])
    elif action == 3 and acts and len(ranks) > 1:  # move to another rank
        other = (rank + 1 + rng.randrange(len(ranks) - 1)) % len(ranks)
        ranks[other].insert(rng.randrange(len(ranks[other]) + 1), acts.pop(rng.randrange(len(acts))))
    elif acts:  # move within the rank
        item = acts.pop(rng.randrange(len(acts)))
        acts.insert(rng.randrange(len(acts) + 1), item)
    return replace(schedule, ranks=tuple(tuple(a) for a in ranks))


SCHEDULES = [("gpipe", {}), ("dapple", {}), ("dapple", {"policy": "2(s-i)-1"}), ("zb-h1", {}),
             ("interleaved", {"chunks": 2})]


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(which=st.integers(0, len(SCHEDULES) - 1), ranks=st.integers(2, 4), rounds=st.integers(1, 3),
       lowered=st.booleans(), seed=st.integers(0, 2**32 - 1), mutations=st.integers(1, 3))
def test_mutated_schedules_are_rejected_or_replay_to_the_end(which, ranks, rounds, lowered, seed, mutations):
    from dataclasses import replace

    from sim.engine.compile import compile_workload
    from sim.engine.replay import simulate
    from sim.schedule.check import check_schedule
    from sim.schedule.generators import generate
    from sim.schedule.passes import lower

    name, params = SCHEDULES[which]
    schedule = generate(name, ranks, ranks * rounds, **params)
    if lowered:
        schedule = lower(schedule)
    rng = random.Random(seed)
    for _ in range(mutations):
        schedule = _mutate_schedule(schedule, rng)
    try:
        check_schedule(schedule)
    except ScheduleError as exc:
        assert "\n" not in str(exc) and exc.detail  # one line, and the grid
        return
    stages = schedule.num_stages
    scenario = synthetic_scenario(fwd_s=[0.1] * stages, bwd_s=[0.2] * stages, microbatches=schedule.num_microbatches,
                                  ranks=list(schedule.stage_ranks), boundary_bytes=1e6)
    plan = replace(scenario.plan, schedule="file", custom_schedule=schedule)
    result = simulate(compile_workload(replace(scenario, plan=plan)))
    assert result.iteration_time_s > 0


def test_a_schedule_that_skipped_the_check_stops_with_the_grid():
    from dataclasses import replace

    from sim.engine.compile import compile_workload
    from sim.engine.replay import simulate
    from sim.schedule.text import parse_schedule

    # rank 1 waits for micro-batch 1 while rank 0 waits for micro-batch 0's gradient
    schedule = parse_schedule("0F0 0B0 0F1 0B1\n1F1 1B1 1F0 1B0")
    scenario = synthetic_scenario(fwd_s=[1.0, 1.0], bwd_s=[1.0, 1.0], microbatches=2)
    plan = replace(scenario.plan, schedule="file", custom_schedule=schedule)
    with pytest.raises(ScheduleError) as info:
        simulate(compile_workload(replace(scenario, plan=plan)))
    assert "stopped making progress" in str(info.value)
    assert "rank 1 (device 1) blocked at 1RECV_F1" in info.value.detail
    assert "[0RECV_B0]" in info.value.detail  # the grid marks the first blocked action


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_schedule_files_are_rejected_or_load(seed):
    rng = random.Random(seed)
    text = (SCENARIOS / "schedules" / "gpipe_then_1f1b_4x4.txt").read_text()
    words = text.split(" ")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(words))
        words[i] = rng.choice(["", "0F9", "9B0", "XYZ", "0REDUCE_GRAD", words[rng.randrange(len(words))], "#", "\n"])
    raw = copy.deepcopy(RAW["bert48_v100_hand_written.yaml"])
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "schedules").mkdir()
        (Path(folder) / "schedules" / "gpipe_then_1f1b_4x4.txt").write_text(" ".join(words))
        try:
            parse_scenario(yaml.safe_dump(raw), source="fuzz.yaml", base_dir=Path(folder))
        except DappleError as exc:
            assert str(exc).startswith("fuzz.yaml: plan.schedule_file")

"""Inputs a fuzz of generated files crashed or let through (issue 35, item 9): each is one line, exit 2.

YAML tags that skip the resolver (``!!int 1e3``), model shapes beyond any model
(``hidden: 1e9``), work that grows without bound (2^20 devices, 100 000 micro-batches) and
values of the wrong kind (a stage's ``layers`` holding a mapping, a key with a zero-width space).
Each is run through ``dapple-sim`` as a user would and must be refused at once, before any replay.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import SCENARIOS
from planner.cli import main as plan_main
from sim.app.cli import main

BERT = SCENARIOS / "bert48_v100_2x8.yaml"


def _refused(capsys, argv: list[str], *words: str) -> str:
    """Run ``dapple-sim argv``; assert exit 2 with one line on stderr holding ``words``, within a second."""
    started = time.process_time()
    assert main(argv) == 2
    spent_s = time.process_time() - started
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], lines[0]
    assert spent_s < 1.0, f"took {spent_s:.1f} s of CPU to refuse"  # CPU time: the refusal does no work
    return lines[0]


def _scenario(tmp_path: Path, old: str, new: str, source: Path = BERT) -> Path:
    text = source.read_text()
    assert old in text, old
    path = tmp_path / "s.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(("tagged", "tag"), [
    ("!!timestamp 99999-01-01", "!!timestamp"),  # AttributeError inside PyYAML before
    ("!!bool maybe", "!!bool"),                  # KeyError
    ("!!int 1e3", "!!int"),                      # ValueError
    ("!!float abc", "!!float"),
    ("!!int ''", "!!int"),                       # IndexError
])
def test_a_tag_the_value_does_not_match_is_one_line(tmp_path, capsys, tagged, tag):
    path = _scenario(tmp_path, "name: bert48-v100-2x8", f"name: {tagged}")
    _refused(capsys, ["check", str(path)], str(path), "at line 3, column 7", f"is not a valid {tag}", "quote")


def test_a_tag_the_value_matches_still_reads(tmp_path, capsys):
    path = _scenario(tmp_path, "global_batch_size: 128", "global_batch_size: !!int 128")
    assert main(["check", str(path)]) == 0


@pytest.mark.parametrize(("old", "new", "key", "limit"), [
    ("hidden: 64", "hidden: 1000000000", "model.hidden", "1,048,576"),  # planned, then exit 1 before
    ("seq_len: 32", "seq_len: 100000000", "model.seq_len", "16,777,216"),
])
def test_a_transformer_beyond_any_model_is_refused(tmp_path, capsys, old, new, key, limit):
    path = _scenario(tmp_path, old, new, SCENARIOS / "gpt_tiny_cpu.yaml")
    _refused(capsys, ["check", str(path)], f"{key}: ", f"use at most {limit}")


def test_a_vgg_image_beyond_any_camera_is_refused_by_the_planner(tmp_path, capsys):
    text = (SCENARIOS / "gpt_tiny_cpu.yaml").read_text()
    start, end = text.index("model:"), text.index("training:")
    path = tmp_path / "vgg.yaml"
    path.write_text(text[:start] + "model: {preset: vgg, image_size: 320000000}\n" + text[end:])
    started = time.process_time()
    assert plan_main([str(path)]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "model.image_size: 320000000" in line and "use at most 65,536" in line, line
    assert time.process_time() - started < 1.0


@pytest.mark.parametrize(("old", "new", "words"), [
    ("layers: [0, 3]", "layers: [0, {a: 1}]", ("plan.stages[0].layers: must be [start, end]",)),
    ("devices: [1]", "devices\u200b: [1]", ("plan.stages[1].devices", "unknown key", "did you mean 'devices'")),
])
def test_the_plan_the_planner_ignores_must_still_be_a_plan(tmp_path, capsys, old, new, words):
    """dapple-plan ignores the file's plan (it may be for another cluster) but not a typo in it: exit 0 before."""
    path = _scenario(tmp_path, old, new, SCENARIOS / "gpt_tiny_cpu.yaml")
    started = time.process_time()
    assert plan_main([str(path)]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and all(word in line for word in words), line
    assert time.process_time() - started < 1.0


@pytest.mark.parametrize(("old", "new", "words"), [
    ("nodes: 2\n  devices_per_node: 8", "nodes: 1024\n  devices_per_node: 1024", ("131,072 a cluster may have",)),  # 2^20 devices: check ran 12 s
    ("global_batch_size: 128", "global_batch_size: 1600000", ("more than the 16384",)),  # 100,000 micro-batches
])
def test_work_beyond_the_bounds_is_refused_before_it_starts(tmp_path, capsys, old, new, words):
    path = _scenario(tmp_path, old, new)
    for command in ("check", "simulate"):
        _refused(capsys, [command, str(path)], *words)


def test_a_model_of_100_000_layers_is_refused(tmp_path, capsys):
    path = _scenario(tmp_path, "layers: 4", "layers: 100000", SCENARIOS / "gpt_tiny_cpu.yaml")
    _refused(capsys, ["simulate", str(path)], "model.layers: 100000", "use at most 16,384")

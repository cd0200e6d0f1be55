"""A key written twice in one YAML mapping is refused (issue 35, item 4).

PyYAML keeps the last of two equal keys without a word, so ``nodes: 2`` then ``nodes: 4``
silently meant 4 nodes. Every YAML a user writes (scenario, sweep, ``--set`` value, published
suite) goes through ``sim.input.yaml_text.load_yaml``, which now names the key and both lines.
"""

from __future__ import annotations

import pytest

from conftest import SCENARIOS
from sim.core.errors import ScenarioError
from sim.input.yaml_text import load_yaml

BERT = SCENARIOS / "bert48_v100_2x8.yaml"


def _with_line_after(anchor: str, added: str) -> str:
    """BERT-48's scenario text with ``added`` written after the first line holding ``anchor``,
    and the added line's number (from 1)."""
    lines = BERT.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if anchor in line)
    return "".join(lines[: at + 1] + [added + "\n"] + lines[at + 1:]), at + 2


def _line_of(text: str, start: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(start))


@pytest.mark.parametrize(("anchor", "added", "key", "first_start"), [
    ("name:", "name: another", "name", "name:"),  # top level
    ("nodes:", "  nodes: 4", "nodes", "  nodes:"),  # nested under cluster
])
def test_simulate_refuses_a_repeated_key_naming_the_file_the_key_and_both_lines(tmp_path, capsys, anchor, added,
                                                                                key, first_start):
    from sim.app.cli import main

    text, second = _with_line_after(anchor, added)
    path = tmp_path / "repeated.yaml"
    path.write_text(text)
    first = _line_of(text, first_start)
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err
    assert f"key {key!r} appears at lines {first} and {second} in one mapping; keep one" in err


def test_keys_repeated_on_one_line_or_equal_as_values_are_refused_and_merges_still_override():
    with pytest.raises(ScenarioError, match=r"^f\.yaml: at line 1, column 11: key 'x' appears twice at line 1"):
        load_yaml("a: {x: 1, x: 2}\n", where="f.yaml")
    with pytest.raises(ScenarioError, match="key '1.0' appears at lines 1 and 2"):
        load_yaml("1: a\n1.0: b\n", where="f.yaml")  # one key to Python: the second would replace the first
    # a merge key brings keys in to be overridden: that is not a repeat
    assert load_yaml("b: &b {x: 1, y: 1}\nc:\n  <<: *b\n  x: 2\n", where="f.yaml") == \
        {"b": {"x": 1, "y": 1}, "c": {"x": 2, "y": 1}}


def test_a_sweep_file_with_a_repeated_key_is_one_line_exit_2(tmp_path, capsys):
    from planner.cli import main

    path = tmp_path / "sweep.yaml"
    path.write_text(f"base: {BERT}\naxes:\n  training.global_batch_size: [64]\n"
                    f"  training.global_batch_size: [128]\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err
    assert "key 'training.global_batch_size' appears at lines 3 and 4 in one mapping; keep one" in err
    assert not (tmp_path / "out").exists()

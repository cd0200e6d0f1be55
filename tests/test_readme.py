"""The README's first block: exactly two commands that work as written in a fresh checkout."""

from __future__ import annotations

import os
import shutil
import subprocess

from conftest import REPO


def _first_block():
    lines, inside = [], False
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("```"):
            if inside:
                return lines
            inside = True
        elif inside:
            lines.append(line)
    raise AssertionError("README.md has no code block")


def test_readme_opens_with_two_commands():
    text = (REPO / "README.md").read_text()
    assert text.index("```") < text.index("\n## "), "the commands must come first"
    install_and_run, install_and_test = _first_block()
    assert "pip install" in install_and_run and "scenarios/bert48_v100_2x8.yaml" in install_and_run
    assert "pip install" in install_and_test and "pytest" in install_and_test
    assert "torch" not in install_and_test or "runtime" in install_and_test  # torch only through the pinned extra


def test_ci_runs_the_readme_test_command():
    script = (REPO / ".ci" / "run").read_text()
    assert "README.md" in script and "sed -n 2p" in script
    assert os.access(REPO / ".ci" / "run", os.X_OK)


def _fresh_checkout(tmp_path):
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()
    for name in files:
        source = REPO / name
        if source.is_file():
            target = tmp_path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return tmp_path


def test_main_command_works_in_a_fresh_checkout(tmp_path):
    checkout = _fresh_checkout(tmp_path)
    command = _first_block()[0]
    result = subprocess.run(["bash", "-c", command], cwd=checkout, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "bert48-v100-2x8: plans by the SimPy engine" in result.stdout and "best: " in result.stdout
    for name in ("best_plan.json", "gantt_gpipe.png", "gantt_dapple.png", "memory_dapple.png"):
        assert (checkout / "out" / "bert48" / name).stat().st_size > 100

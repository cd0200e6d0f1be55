"""The README's first block: exactly two commands that work as written.

The default suite runs the first command's planning step, ``dapple-plan`` on the built-in
scenario, with this checkout's code on a terminal; the whole command in a fresh checkout (a new
virtual environment and ``pip install``, a minute) runs with ``pytest -m slow``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from terminal import run_on_a_terminal

INSTALL_AND_RUN = ("python3 -m venv .venv && .venv/bin/pip install -q -e . && "
                   ".venv/bin/dapple-plan scenarios/bert48_v100_2x8.yaml --out out/bert48")
"""The README's first command: install, then plan the built-in scenario (the main job)."""
INSTALL_AND_TEST = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev,runtime]' && .venv/bin/python -m pytest -q"
"""The README's second command: install the test dependencies, then run the default suite."""


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


def test_readme_commands_are_exactly_the_documented_ones():
    assert _first_block() == [INSTALL_AND_RUN, INSTALL_AND_TEST]
    # the program the first command ends with is dapple-plan, the console script of planner.cli:main
    assert "dapple-plan = planner.cli:main" in (REPO / "setup.cfg").read_text()


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


def _assert_planned_on_a_terminal(code: int, stdout: str, terminal: str, out) -> None:
    """What the main job shows and leaves: every planner's row and the winner on stdout, a
    progress bar on each long step (stderr is a terminal), and the files the README names."""
    assert code == 0, terminal[-2000:]
    assert "bert48-v100-2x8: plans by the SimPy engine" in stdout and "best: " in stdout
    # the planners' searches and the plots each had a progress bar
    for step in ("dapple: replays", "pipedream: replays", "writing plots", "drawing schedules.png"):
        assert step in terminal, f"no progress shown for {step!r}: {terminal[-2000:]}"
    readme = (REPO / "README.md").read_text()
    assert "best_plan.json" in readme and "gantt_<schedule>.png" in readme and "memory_<schedule>.png" in readme
    assert (out / "best_plan.json").stat().st_size > 100
    for kind in ("gantt", "memory"):  # the all-forwards-first order and the plan's own, each named in the README
        drawn = sorted(p.name for p in out.glob(f"{kind}_*.png"))
        assert len(drawn) == 2 and all((out / name).stat().st_size > 100 for name in drawn), drawn
        assert all(f"`gantt_{name[len(kind) + 1:]}`" in readme for name in drawn), drawn


def test_main_command_plans_the_built_in_scenario_on_a_terminal(tmp_path):
    """The first command's last step exactly as the README writes it, ``.venv/bin/dapple-plan``
    replaced by this checkout's ``planner.cli:main`` (the console script's target) and the
    output folder moved under ``tmp_path``: the default suite's check of the main job."""
    program, *arguments = shlex.split(INSTALL_AND_RUN.split("&&")[-1])
    assert program == ".venv/bin/dapple-plan" and arguments[-2:] == ["--out", "out/bert48"]
    out = tmp_path / "out" / "bert48"
    argv = [sys.executable, "-c", "import sys; from planner.cli import main; sys.exit(main())",
            *arguments[:-1], str(out)]
    _assert_planned_on_a_terminal(*run_on_a_terminal(argv, cwd=REPO, timeout=900), out)


@pytest.mark.slow  # a new virtual environment and pip install: a minute; the default suite plans on a terminal above
def test_main_command_works_in_a_fresh_checkout(tmp_path):
    """The README's first command as a new user runs it in a shell: it installs, plans,
    shows progress on the long steps (stderr is a terminal) and leaves the files the README
    names."""
    checkout = _fresh_checkout(tmp_path)
    command = _first_block()[0]
    code, stdout, terminal = run_on_a_terminal(["bash", "-c", command], cwd=checkout, timeout=900)
    _assert_planned_on_a_terminal(code, stdout, terminal, checkout / "out" / "bert48")

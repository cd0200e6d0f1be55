"""Every command ``docs/*.md`` shows works as written (issue 35: "``docs/`` true to the commands").

The docs show commands three ways: a usage line in a code span (``dapple-sim simulate SCENARIO
[--set K=V]... [--json]``), a fragment naming a sub-command and a flag (``dapple-plan --json``),
and fenced blocks of command lines or ``--set`` overrides. ``doc_commands`` extracts them all.
A usage line becomes one argv: its placeholders (``SCENARIO``, ``DIR``, ...) replaced by a
real file or value (``PLACEHOLDERS``; one the table does not know fails, so a new placeholder in
the docs is taught here), every optional group included with its first alternative. The
default suite checks that each one's sub-command and flags exist, parses every usage line with
the command's own argument parser, checks every file it names exists, and runs the cheap ones
(``check``, ``schedule``, ``simulate`` on the tiny GPT; every ``--set`` example through ``check``);
``pytest -m slow`` runs every usage line for real, outputs under ``tmp_path``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest

from conftest import REPO
from planner.cli import _parser as plan_parser
from planner.sweeps.command import sweep_parser
from runtime.commands.cli import _parser as run_parser
from sim.app.cli import _parser as sim_parser
from sim.app.cli import main as sim_main
from sim.input.plan_file import plan_to_dict
from sim.input.scenario import load_scenario

DOCS = sorted((REPO / "docs").glob("*.md"))
PROGRAMS = ("dapple-sim", "dapple-plan", "dapple-run", "torchrun", "python")
TINY = "scenarios/gpt_tiny_cpu.yaml"
"""The scenario a usage line's ``SCENARIO`` becomes: two CPU devices, runnable by ``dapple-run``."""

PLACEHOLDERS = {
    "SCENARIO": TINY, "BASE_SCENARIO": "scenarios/calibration/cpu_base.yaml",
    "FIT.csv": "scenarios/calibration/cpu_runs.csv", "TEST.csv": "scenarios/calibration/cpu_runs.csv",
    "SUITE.yaml": "scenarios/published/suite.yaml", "SWEEP.yaml": "sweeps/bert48_bandwidth.yaml",
    "PLAN.json": "{tmp}/plan.json", "DIR": "{tmp}/out", "PARAMS.yaml": "{tmp}/params.yaml",
    "FILE": "{tmp}/steps.csv", "K=V": "plan.schedule=gpipe", "A,B,...": "gpipe,dapple",
    "N": "2", "K": "2", "W": "1", "S": "2", "M": "4", "V": "2", "R": "1", "P": "2(s-i)-1",
    "TIME": "30d", "AMOUNT": "1000",
}
"""What a placeholder of a usage line becomes (``{tmp}``: the test's folder)."""
NAMES = {"schedule": "dapple", "--planner": "even"}
"""``NAME`` after this word: a schedule's name, a planner's."""
CHEAP = {("dapple-sim", "check"), ("dapple-sim", "schedule"), ("dapple-sim", "simulate")}
"""Usage lines the default suite runs for real (a second or so each on the tiny GPT)."""


def doc_commands() -> list[tuple[str, str]]:
    """``(where, command)`` for every command in ``docs/*.md``: code spans and fenced lines that
    start with a program, and fenced ``--set`` lines (as written, ``\\|`` read as ``|``)."""
    found = []
    for doc in DOCS:
        fenced = False
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{doc.name}:{number}"
            if line.startswith("```"):
                fenced = not fenced
            elif fenced:
                text = line.split("  #")[0].strip()
                if text.startswith(PROGRAMS) or text.startswith("--set "):
                    found.append((where, text))
            else:
                found += [(where, span.replace("\\|", "|")) for span in re.findall(r"`([^`]+)`", line)
                          if span.split(" ")[0] in PROGRAMS and " " in span]
    return found


def _tokens(command: str) -> list[str]:
    """A usage line's words, optional groups opened (``[--engine simpy|fast]`` -> ``--engine simpy``)."""
    words = []
    for word in command.replace("[", " ").replace("]", " ").split():
        if word.strip(".") == "":
            continue  # "..." (repeatable, or more options)
        if "|" in word and not word.startswith("-"):
            word = word.split("|")[0]
        words.append(word)
    return words


def _instantiate(words: list[str], tmp: str) -> list[str]:
    argv = []
    for previous, word in zip(["", *words], words):
        if word == "NAME":
            value = NAMES[previous]
        elif word.startswith("-") or not re.fullmatch(r"[A-Z_]+(\.\w+)?|K=V|A,B,\.\.\.", word):
            value = word
        else:
            assert word in PLACEHOLDERS, f"placeholder {word!r}: teach tests/test_docs_commands.py what it becomes"
            value = PLACEHOLDERS[word]
        argv.append(value.replace("{tmp}", tmp))
    return argv


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _parser_for(words: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser that reads ``words`` (program first) and the argv it reads."""
    program, rest = words[0], words[1:]
    if program == "dapple-plan":
        return (sweep_parser(), rest[1:]) if rest[:1] == ["sweep"] else (plan_parser(), rest)
    return {"dapple-sim": sim_parser, "dapple-run": run_parser}[program](), rest


def _is_usage(command: str) -> bool:
    """A whole usage line (its positionals named), not a fragment such as ``dapple-plan --json``
    or ``dapple-sim schedule NAME ... --csv`` (a ``...`` with words after it leaves some out)."""
    words = _tokens(command)
    if re.search(r"\s\.\.\.\s+\S", command):
        return False
    first = 1 if words[0] == "dapple-plan" and words[1:2] != ["sweep"] else 2  # the first positional
    return "[" in command or len(words) > first and not words[first].startswith("-")


COMMANDS = doc_commands()
USAGE = [(w, c) for w, c in COMMANDS if c.split()[0].startswith("dapple-") and _is_usage(c)]


def test_the_docs_show_commands() -> None:
    assert len(USAGE) >= 10 and any(c.startswith("--set ") for _, c in COMMANDS)


@pytest.mark.parametrize("where,command", [(w, c) for w, c in COMMANDS if c.startswith(PROGRAMS)])
def test_each_sub_command_and_flag_exists(where, command) -> None:
    words = _tokens(command)
    if words[0] in ("torchrun", "python"):
        assert words[1:3] == ["-m", "runtime"] and (REPO / "runtime" / "__main__.py").is_file(), where
        return
    parser, argv = _parser_for(words)
    subs = _subparsers(parser) if words[0] != "dapple-plan" else {}
    if subs:
        assert argv[0] in subs, f"{where}: {words[0]} has no sub-command {argv[0]!r}"
        parser, argv = subs[argv[0]], argv[1:]
    for flag in (w.split("=")[0] for w in argv if w.startswith("-")):
        assert flag in parser._option_string_actions, f"{where}: {command!r}: no flag {flag}"


@pytest.mark.parametrize("where,command", USAGE)
def test_each_usage_line_parses_and_names_files_that_exist(where, command, tmp_path) -> None:
    argv = _instantiate(_tokens(command), str(tmp_path))
    parser, rest = _parser_for(argv)
    try:
        parser.parse_args(rest)
    except SystemExit as exc:
        pytest.fail(f"{where}: {command!r} as {rest}: argparse exits {exc.code}")
    for word in rest:
        if "/" in word and not word.startswith(str(tmp_path)):
            assert (REPO / word).is_file(), f"{where}: {word} is not in the repository"


def _runs(argv: list[str]) -> list[list[str]]:
    """The argvs that run a usage line: itself, or, where it gives a schedule both a DAPPLE policy
    and a chunk count (no schedule takes both), once with each: dapple with ``--policy``,
    interleaved with ``--chunks``."""
    if "--chunks" not in argv or "--policy" not in argv:
        return [argv]
    def without(flag: str, name: str) -> list[str]:
        k = argv.index(flag)
        return [name if word == NAMES["schedule"] else word for word in argv[:k] + argv[k + 2:]]
    return [without("--chunks", "dapple"), without("--policy", "interleaved")]


@pytest.fixture
def plan_file(tmp_path):
    scenario = load_scenario(REPO / TINY)
    (tmp_path / "plan.json").write_text(json.dumps(plan_to_dict(scenario.plan, scenario.training)))
    return tmp_path


@pytest.mark.parametrize("where,command", [(w, c) for w, c in USAGE if tuple(_tokens(c)[:2]) in CHEAP])
def test_the_cheap_usage_lines_run(where, command, plan_file, capsys) -> None:
    for argv in _runs(_instantiate(_tokens(command), str(plan_file))):
        assert sim_main(argv[1:]) == 0, f"{where}: {argv}: {capsys.readouterr().err}"


@pytest.mark.parametrize("where,command", [(w, c) for w, c in COMMANDS if c.startswith("--set ")])
def test_each_override_example_is_taken_by_check(where, command, capsys) -> None:
    value = command.split(" ", 1)[1].strip().strip("'")
    assert sim_main(["check", "scenarios/bert48_v100_2x8.yaml", "--set", value]) == 0, \
        f"{where}: {capsys.readouterr().err}"


@pytest.mark.slow  # every usage line for real: dapple-run's processes, the published suite, a sweep: minutes
@pytest.mark.parametrize("where,command", USAGE)
def test_every_usage_line_runs(where, command, plan_file) -> None:
    for argv in _runs(_instantiate(_tokens(command), str(plan_file))):
        if "--objective" in argv:  # an objective needs a run length and --budget a price: the tiny scenario has neither
            argv = [*argv, "--set", "training.steps=1000", "--set", "cluster.price_per_gpu_hour=2.5"]
        module = {"dapple-sim": "sim.app.cli", "dapple-plan": "planner.cli", "dapple-run": "runtime.commands.cli"}[argv[0]]
        done = subprocess.run([sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())",
                               *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0 and "Traceback" not in done.stderr, f"{where}: {argv}: {done.stderr[-2000:]}"

"""Imports point one way: core -> engine -> planner, core -> runtime; only runtime touches torch."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from conftest import REPO

# package prefix -> import prefixes it must never use (lazy imports inside functions count too).
# Layers, lowest first: the core (sim, sim.input, sim.schedule), the engine (sim.engine), what is
# made of replays (sim.report.plots, sim.report.analysis), then the applications (sim.app, planner, runtime).
# Nothing imports an application's module but the application itself.
APPS = ("sim.app", "planner", "runtime")
ABOVE_CORE = ("sim.engine", "sim.report.plots", "sim.report.analysis")

FORBIDDEN = {
    "sim": (*ABOVE_CORE, *APPS, "simpy", "torch"),
    "sim.engine": ("sim.report.plots", "sim.report.analysis", *APPS, "torch"),
    "sim.report.plots": ("sim.report.analysis", *APPS, "simpy", "torch"),
    "sim.report.analysis": (*APPS, "simpy", "torch"),
    "sim.app": ("planner", "runtime", "torch"),
    "planner": ("sim.app", "runtime", "torch", "simpy"),
    "runtime": ("sim.app", "planner", "simpy"),
}


def _module_name(path):
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def _rules_for(module):
    # the most specific package prefix wins: sim.engine has its own rules, not sim's
    owner = max((p for p in FORBIDDEN if module == p or module.startswith(p + ".")), key=len)
    return FORBIDDEN[owner]


SOURCES = sorted(p for pkg in ("sim", "planner", "runtime") for p in (REPO / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_upward_imports(path):
    module = _module_name(path)
    forbidden = _rules_for(module)
    bad = [name for name in _imports(path) if any(name == f or name.startswith(f + ".") for f in forbidden)]
    assert not bad, f"{module} imports {bad}, which its layer must not"


def test_rules_catch_an_upward_import(tmp_path):
    # the checker itself can fail: a core module importing the engine is caught
    fake = tmp_path / "fake.py"
    fake.write_text("import sim.engine.replay\nfrom runtime import executor\n")
    names = list(_imports(fake))
    assert [n for n in names if n.startswith(_rules_for("sim.cost.compute"))] == names


def test_importing_the_core_loads_neither_simpy_nor_torch():
    code = (
        "import importlib, pkgutil, sys, sim\n"
        "for info in pkgutil.walk_packages(sim.__path__, 'sim.'):\n"
        "    if not info.name.startswith('sim.engine'):\n"
        "        importlib.import_module(info.name)\n"
        "from sim.input.scenario import load_scenario\n"
        "load_scenario('scenarios/bert48_v100_2x8.yaml')\n"
        "bad = [m for m in ('simpy', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "assert 'sim.app.cli' in sys.modules and 'sim.schedule.check' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr

"""The tree's shape: no import cycles, imports at the top, modules and functions of readable size.

A module's header tells its dependencies: every import of a project module is at module
level, except where a function-level import keeps an optional heavy dependency (torch,
SimPy, matplotlib, pandas, Dask, pyarrow, SciPy) off the import path of a module that does
not need it otherwise; such an import carries a comment that says so. With imports at the
top, an import cycle cannot hide, and there is none.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import REPO

PACKAGES = ("sim", "planner", "runtime")
HEAVY = ("torch", "simpy", "matplotlib", "pandas", "dask", "distributed", "pyarrow", "scipy")
"""Optional or slow-to-import dependencies a function-level import may keep off an import path."""
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _module_name(path: Path, root: Path = REPO) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(root: Path = REPO) -> dict[str, Path]:
    return {_module_name(p, root): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.AST, *, typing: bool = False):
    """(imported name, line, inside a function) for every import outside ``if TYPE_CHECKING:``
    (with ``typing``, those inside it alone)."""
    def walk(node, in_function, in_typing):
        for child in ast.iter_child_nodes(node):
            typed = in_typing or _is_type_checking(child)
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if typed == typing:
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        yield alias.name, child.lineno, in_function
                elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                    yield child.module, child.lineno, in_function
                    for alias in child.names:  # ``from sim.core import jsonio`` imports a module
                        yield f"{child.module}.{alias.name}", child.lineno, in_function
            yield from walk(child, inside, typed)
    yield from walk(tree, False, False)


class Graph:
    """The project's import graph, module-level and function-level edges apart."""

    def __init__(self, root: Path = REPO) -> None:
        self.paths = _sources(root)
        self.top: dict[str, set[str]] = defaultdict(set)
        self.lazy: list[tuple[str, str, int]] = []  # (importer, imported module or dependency, line)
        self.typing: dict[str, set[str]] = defaultdict(set)  # imports for annotations only
        for name, path in self.paths.items():
            tree = ast.parse(path.read_text(), filename=str(path))
            for imported, _, _ in _imports(tree, typing=True):
                target = self.resolve(imported)
                if target is not None and target != name:
                    self.typing[name].add(target)
            for imported, line, in_function in _imports(tree):
                target = self.resolve(imported)
                if target is None or target == name:
                    continue
                if in_function:
                    self.lazy.append((name, target, line))
                else:
                    self.top[name].add(target)

    def resolve(self, name: str) -> str | None:
        """The project module ``name`` loads (its longest known prefix), or another package's root
        (the standard library's or a dependency's: only the heavy ones may wait for a function)."""
        root = name.split(".")[0]
        if root not in PACKAGES:
            return root
        while name and name not in self.paths:
            name = name.rpartition(".")[0]
        return name or None

    def closure(self, module: str) -> set[str]:
        """Everything importing ``module`` loads at import time (module-level edges)."""
        seen, todo = set(), [module]
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            todo.extend(self.top.get(m, ()))
            todo.extend(_parents(m))  # importing a.b.c runs a/__init__ and a/b/__init__ first
        return seen

    def cycles(self) -> list[list[str]]:
        """Strongly connected components of more than one module, over every edge (imports for
        annotations under ``if TYPE_CHECKING:`` too: a cycle of types is a cycle of concepts)."""
        edges = defaultdict(set)
        for table in (self.top, self.typing):
            for m, targets in table.items():
                edges[m] |= targets
        for m, target, _ in self.lazy:
            edges[m].add(target)
        index, low, stack, on, found = {}, {}, [], set(), []
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

        def visit(v):
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            for w in sorted(edges.get(v, ())):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

        for m in sorted(self.paths):
            if m not in index:
                visit(m)
        return found

    def needless_lazy_imports(self) -> list[str]:
        """Function-level imports that keep no heavy dependency off their module's import path,
        or that do but carry no comment saying so."""
        by_site: dict[tuple[str, int], set[str]] = defaultdict(set)
        for importer, target, line in self.lazy:
            by_site[(importer, line)].add(target)
        bad = []
        for (importer, line), targets in sorted(by_site.items()):
            loads = set()
            for target in targets:
                loads |= {target} if target in HEAVY else self.closure(target) & set(HEAVY)
            already = self.closure(importer) & set(HEAVY)
            source = self.paths[importer].read_text().splitlines()
            commented = _commented(source, line)
            shown = ", ".join(sorted(targets))
            if loads <= already:
                bad.append(f"{importer}:{line} imports {shown} in a function; import it at the top")
            elif not commented:
                bad.append(f"{importer}:{line} imports {shown} in a function without a comment saying "
                           f"it keeps {', '.join(sorted(loads - already))} off the import path")
        return bad


def _commented(source: list[str], line: int) -> bool:
    """Whether the import at ``line`` (1-based) has a comment: on its line, or on the line above
    the block of import lines it belongs to (sorted imports put a blank line between groups)."""
    if "#" in source[line - 1]:
        return True
    above = line - 2
    while above >= 0 and (source[above].strip().startswith(("import ", "from ")) or not source[above].strip()):
        if "#" in source[above]:
            return True
        above -= 1
    return above >= 0 and source[above].strip().startswith("#")


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


GRAPH = Graph()


def test_no_import_cycles():
    assert GRAPH.cycles() == []


def test_imports_are_at_the_top():
    bad = GRAPH.needless_lazy_imports()
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", sorted(GRAPH.paths), ids=str)
def test_modules_and_functions_fit_on_a_page(name):
    path = GRAPH.paths[name]
    text = path.read_text()
    lines = text.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{name} has {lines} lines; split it along its concepts"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{name}: {', '.join(long)} over {MAX_FUNCTION_LINES} lines"


def test_the_code_keeps_its_written_style_rules():
    """pyproject.toml's ``[tool.ruff]``: no unused or undefined names, imports sorted."""
    pytest.importorskip("ruff")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *PACKAGES, "tests", "benchmarks"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]


# --- the checks themselves can fail ---------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Graph:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir(exist_ok=True)
        (tmp_path / pkg / "__init__.py").touch()
    return Graph(tmp_path)


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    graph = _tree(tmp_path, {"sim/a.py": "import sim.b\n", "sim/b.py": "def f():\n    from sim import a\n"})
    assert graph.cycles() == [["sim.a", "sim.b"]]


def test_a_cycle_through_annotations_is_found(tmp_path):
    graph = _tree(tmp_path, {"sim/a.py": "import sim.b\n",
                             "sim/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sim.a import X\n"})
    assert graph.cycles() == [["sim.a", "sim.b"]]


def test_a_needless_function_level_import_is_found(tmp_path):
    graph = _tree(tmp_path, {
        "sim/a.py": "def f():\n    import sim.b\n",
        "sim/b.py": "X = 1\n",
        "sim/plot.py": "import matplotlib\n",
        "sim/c.py": "def f():\n    # matplotlib only for the figure\n    import sim.plot\n",
        "sim/d.py": "def f():\n    import sim.plot\n",
        "sim/e.py": "def f():\n    import statistics\n",
    })
    bad = graph.needless_lazy_imports()
    assert len(bad) == 3, bad
    assert bad[0].startswith("sim.a:2 imports sim.b in a function; import it at the top")
    assert bad[1].startswith("sim.d:2 imports sim.plot in a function without a comment")
    assert bad[2].startswith("sim.e:2 imports statistics in a function; import it at the top")


# --- docs/architecture.md's map of rooms is the tree ----------------------------------------


def _mapped_modules(text: str) -> set[str]:
    """Every ``*.py`` the "Map of rooms" names, as a path from the repository root.

    Each paragraph (a bold heading and its table) names its folder first (`` `sim/cost/` ``);
    a bare name is in the folder of the name before it in the same cell, or the paragraph's.
    """
    section = text.split("## Map of rooms", 1)[1].split("\n## ", 1)[0]
    found = set()
    for paragraph in re.split(r"\n(?=\*\*)", section):
        folders = re.findall(r"`((?:sim|planner|runtime)/(?:[\w/]*/)?)`", paragraph.split("\n", 1)[0])
        if not folders:
            continue  # the section's preamble: no folder, no rooms
        base = folders[0]
        for line in paragraph.splitlines():
            cell = line.split("|")[1] if line.startswith("|") else line
            here = base
            for name in re.findall(r"`([\w/]+\.py)`", cell):
                if name.split("/")[0] in PACKAGES:
                    path = name
                elif "/" in name:
                    path = base + name
                else:
                    path = here + name
                here = path.rsplit("/", 1)[0] + "/"
                found.add(path)
    return found


def test_the_map_of_rooms_lists_every_module():
    mapped = _mapped_modules((REPO / "docs" / "architecture.md").read_text())
    actual = {str(p.relative_to(REPO)) for p in GRAPH.paths.values() if p.name != "__init__.py"}
    assert not mapped - actual, f"the map names modules that do not exist: {sorted(mapped - actual)}"
    assert not actual - mapped, f"modules missing from docs/architecture.md's map: {sorted(actual - mapped)}"


def test_the_map_reader_resolves_folders():
    text = ("## Map of rooms\n\n**Rooms, `runtime/`**\n\n| module | what |\n|---|---|\n"
            "| `commands/cli.py`, `run.py`, `runtime/__main__.py` | x |\n| `model/config.py` | y |\n\n"
            "**More, `sim/models/`**: generators (`transformer.py`; `vgg.py`)\n\n## Next\n")
    assert _mapped_modules(text) == {"runtime/commands/cli.py", "runtime/commands/run.py", "runtime/__main__.py",
                                     "runtime/model/config.py", "sim/models/transformer.py", "sim/models/vgg.py"}

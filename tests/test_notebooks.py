"""The notebooks run headless, top to bottom, and write the figures they promise."""

from __future__ import annotations

import json

import pytest

from conftest import REPO

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = REPO / "notebooks"


def _validation_figures():
    data = json.loads((NOTEBOOKS / "data" / "validation_cpu.json").read_text())
    runs = data["runs"] if "runs" in data else [data]
    turns = ["03_validation_turns.png"] if any(run.get("slices") for run in runs) else []
    return [f"03_validation_{run['schedule']}.png" for run in runs] + turns


FIGURES = {
    "01_schedule_comparison.ipynb": [
        "01_schedule_comparison.png", "01_memory_vs_microbatches.png", "01_throughput_vs_microbatches.png",
    ],
    "02_capacity_study.ipynb": ["02_gpus_for_target.png", "02_network_4x.png", "02_oom_frontier.png"],
    "03_validation_report.ipynb": _validation_figures(),
    "capacity_70b.ipynb": ["capacity_70b.png"],
    "moe_ep.ipynb": ["moe_ep.png"],
}


def _png_size(path):
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def test_every_notebook_is_covered():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(FIGURES)


SLOW = {"02_capacity_study.ipynb", "01_schedule_comparison.ipynb"}  # the longest two
"""Notebooks run under ``-m slow`` only: 02 plans a sweep of GPT sizes on three clusters (11 s); the sweep
machinery it calls is tested in tests/test_sweep.py."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(FIGURES)])
def test_notebook_runs_and_writes_its_figures(name, tmp_path, monkeypatch):
    monkeypatch.setenv("DAPPLESIM_FIGURES", str(tmp_path))
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    written = sorted(p.name for p in tmp_path.glob("*.png"))
    assert written == sorted(FIGURES[name])
    for figure in FIGURES[name]:
        width, height = _png_size(tmp_path / figure)
        assert width > 400 and height > 250 and (tmp_path / figure).stat().st_size > 10_000
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]

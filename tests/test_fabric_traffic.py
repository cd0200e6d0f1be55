"""Traffic per fabric tier (``sim.core.fabric_traffic``, ``sim.engine.tier_traffic``): closed forms.

One ring all-reduce of ``P`` gradient bytes over 8 one-GPU servers, each with one NIC of ``B``,
in leaf groups of 4 at 1:4 under one spine. The ring 0→1→…→7→0 sends each member's neighbour
``2(n − 1)/n · P`` bytes (``n = 8``): all 8 flows reach the leaf tier, and 2 of them (3→4,
7→0) climb to the spine. The leaf tier's capacity is the 8 NICs, ``8 B``; the spine's the
2 leaf uplinks of ``4 B / 4 = B`` each, ``2 B``. The iteration is the ring at the uplink's share
``B`` (one flow up out of each group), plus NCCL's ring latency: ``T = 2(n − 1)/n · P / B + α``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conftest import synthetic_scenario
from sim.app.report import format_summary, write_outputs
from sim.core.fabric import FabricSpec, TierSpec
from sim.engine.run import run_scenario

B = 1e9  # NIC bandwidth, bytes/s
P = 1e9  # gradient bytes of the one stage
N = 8


def _ring(fabric: bool = True):
    scenario = synthetic_scenario(fwd_s=[0.0], bwd_s=[0.0], replicas=[N], microbatches=1, devices_per_node=1,
                                  param_bytes=P, inter_bandwidth=B)
    if not fabric:
        return scenario
    tiers = (TierSpec(name="leaf", size=4, oversubscription=4.0), TierSpec(name="spine", size=None))
    return replace(scenario, cluster=replace(scenario.cluster, fabric=FabricSpec(tiers=tiers)))


def test_one_ring_across_a_one_to_four_tier_closed_form():
    result = run_scenario(_ring())
    flow = 2 * (N - 1) / N * P
    # one flow on each leaf uplink of B, plus NCCL's latency of a Simple ring over N servers
    # (sim.cost.fabric_comm; tuning.cc: base 8.4 µs, 2(N − 1) network steps of 14 µs, plateau 1.4)
    T = flow / B + (8.4 + 2 * (N - 1) * 14.0) * 1.4e-6
    assert result.iteration_time_s == pytest.approx(T, rel=1e-5)
    leaf, spine = result.summarize().fabric.tiers
    assert (leaf.name, spine.name) == ("leaf", "spine")
    assert leaf.bytes == pytest.approx(N * flow) and spine.bytes == pytest.approx(2 * flow)
    assert leaf.bytes_by_kind == (("DP", pytest.approx(N * flow)),)
    assert leaf.capacity_bytes_per_s == pytest.approx(N * B) and spine.capacity_bytes_per_s == pytest.approx(2 * B)
    # a ring in device order crosses each group boundary once: both tiers are equally busy, all
    # but the ring's latency (0.29 ms of 1.75 s)
    assert leaf.utilisation == pytest.approx(N * flow / (N * B * result.iteration_time_s)) == pytest.approx(1.0, rel=1e-3)
    assert spine.utilisation == pytest.approx(2 * flow / (2 * B * result.iteration_time_s)) == pytest.approx(1.0, rel=1e-3)
    busiest = result.summarize().fabric.busiest
    assert len(busiest) == 5 and busiest[0].utilisation == pytest.approx(1.0, rel=1e-3)
    assert {b.name for b in busiest} <= {*(f"nic {i} {w}" for i in range(N) for w in ("out", "in")),
                                         "leaf 0 up", "leaf 1 up", "leaf 0 down", "leaf 1 down"}


def test_both_engines_count_the_same_traffic():
    simpy = run_scenario(_ring()).summary()["fabric"]
    fast = run_scenario(_ring(), engine="fast").summary()["fabric"]
    assert simpy == fast


def test_the_fabric_block_appears_only_with_a_fabric():
    with_fabric, without = run_scenario(_ring()), run_scenario(_ring(fabric=False))
    assert "fabric" in with_fabric.summary() and "fabric" not in without.summary()
    text = format_summary(with_fabric.summarize(), with_fabric)
    assert "fabric (per direction, per iteration):" in text and "spine" in text and "busiest links:" in text
    assert "fabric" not in format_summary(without.summarize(), without)


def test_tiers_figure_renders_with_its_labels_inside(tmp_path):
    from PIL import Image

    written = write_outputs(run_scenario(_ring()), tmp_path)
    assert tmp_path / "tiers.png" in written
    width, height = Image.open(tmp_path / "tiers.png").size
    assert 400 <= width <= 1400 and 300 <= height <= 1000
    assert "tiers.png" not in {p.name for p in write_outputs(run_scenario(_ring(fabric=False)), tmp_path / "none")}
    assert json.loads((tmp_path / "summary.json").read_text())["fabric"]["tiers"][1]["name"] == "spine"


def test_tiers_figure_keeps_every_label_inside():
    from sim.report.plots.tiers import tiers_figure

    fig = tiers_figure(run_scenario(_ring()))
    fig.canvas.draw()
    renderer, box = fig.canvas.get_renderer(), fig.bbox
    ax = fig.axes[0]
    low, high = ax.get_ylim()  # matplotlib keeps tick labels past the view, never drawn
    shown = [t for t in ax.get_yticklabels() if low <= t.get_position()[1] <= high]
    texts = [t for t in (*ax.get_xticklabels(), *shown, ax.title, ax.yaxis.label, *ax.get_legend().get_texts())
             if t.get_text()]
    assert any("spine" in t.get_text() for t in texts)
    for text in texts:
        extent = text.get_window_extent(renderer)
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1, \
            text.get_text()

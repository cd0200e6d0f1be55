"""Megatron-LM 2022's column-parallel backward beside its products (``plan.overlap.column_backward``).

``LinearWithGradAccumulationAndAsyncCommunication`` (megatron/mpu/layers.py at cfd2e21) launches
a column-parallel linear's input-gradient all-reduce (under sequence parallelism: the second
all-gather of its input and the input gradient's reduce-scatter) with ``async_op=True`` and
computes the products while it runs; the row-parallel linears' input gradients still block.
Korthikanti et al. 2022, §6.2 and Table 4, name it as why full recompute costs 39%, not 33%.
"""

from __future__ import annotations

import pytest

from sim.core.parallelism import BlockShape
from sim.cost.comm import tensor_parallel_bytes_and_steps, tensor_parallel_cost
from sim.cost.tensor_comm import tensor_parallel_collectives
from sim.engine.run import run_scenario
from sim.input.scenario import parse_scenario

SCENARIO = """
cluster: {preset: a100-nvlink-8, nodes: 1}
model: {preset: gpt, layers: 4, hidden: 2048, heads: 16, seq_len: 1024, vocab: 8192, dtype: fp16, attention: unfused}
training: {global_batch_size: 4, microbatch_size: 4}
plan: {schedule: 1f1b, tensor_parallel: 8, pipeline_parallel: 1, data_parallel: 1, sequence_parallel: SP,
       overlap: {column_backward: FLAG}}
"""


def _run(flag: bool, sp: bool, slowdown: str | None = None):
    text = SCENARIO.replace("FLAG", str(flag).lower()).replace("SP", str(sp).lower())
    if slowdown is not None:
        text = text.replace("nodes: 1}", f"nodes: 1, device: {{overlap_slowdown: {slowdown}}}}}")
    scenario = parse_scenario(text)
    return scenario, run_scenario(scenario, engine="fast").summarize().iteration_time_s


def _seconds(scenario, phases, beside) -> float:
    """The stage's tensor-parallel collectives of ``phases`` (marked ``beside`` or not) as one, alone."""
    layers = scenario.resolved.model.layers
    nbytes, steps = tensor_parallel_bytes_and_steps(layers, 8, phases, 4, beside=beside)
    return tensor_parallel_cost(nbytes, steps, scenario.cluster.intra_node, scenario.cluster).seconds


def test_the_column_linears_backward_collectives_are_marked_beside():
    shape = BlockShape(seq_len=1024, hidden=2048, heads=16, ffn_hidden=8192)
    plain = tensor_parallel_collectives(shape, tensor_parallel=8)
    assert [(c.phase, c.beside) for c in plain] == [("forward", False)] * 2 + [("backward", True)] * 2
    sp = tensor_parallel_collectives(shape, tensor_parallel=8, sequence_parallel=True)
    assert [(c.kind, c.phase, c.beside) for c in sp if c.phase != "forward"] == [
        ("all-gather", "backward", False), ("reduce-scatter", "backward", True),
        ("all-gather", "backward", False), ("reduce-scatter", "backward", True),
        ("all-gather", "regather", True), ("all-gather", "regather", True)]


def test_without_sequence_parallelism_the_backward_all_reduces_hide_all_but_the_slowdown():
    # one stage, one micro-batch: the iteration is F + B + the step. Off, B's all-reduces G block
    # after its compute; on, they run beside it and the compute slows by G·s/(1 + s)
    # (sim.cost.overlap.contended_s, G < (1 + s)·B here): the iteration shortens by G/(1 + s).
    off, off_s = _run(False, False)
    on, on_s = _run(True, False)
    g = _seconds(on, ("backward", "regather"), True)
    assert g == pytest.approx(_seconds(off, "backward", None))
    s = on.cluster.device.overlap_slowdown
    assert s > 0
    assert off_s - on_s == pytest.approx(g / (1 + s), rel=1e-9)
    _, free_s = _run(True, False, slowdown="0.0")
    assert off_s - free_s == pytest.approx(g, rel=1e-9)  # no slowdown: hidden whole


def test_with_sequence_parallelism_the_row_gathers_still_block_and_the_regather_runs_beside():
    # off: all four backward collectives block (and no second gather); on: the two all-gathers
    # of the row-parallel linears' input gradients block, the reduce-scatters and the two second
    # gathers of the column-parallel inputs run beside, slowing the compute by s/(1 + s) of them.
    off, off_s = _run(False, True, slowdown="0.0")
    on, on_s = _run(True, True, slowdown="0.0")
    blocking = _seconds(on, "backward", False)
    assert off_s - on_s == pytest.approx(_seconds(off, "backward", None) - blocking, rel=1e-9)
    slowed, slowed_s = _run(True, True)
    s = slowed.cluster.device.overlap_slowdown
    assert s > 0
    assert slowed_s - on_s == pytest.approx(_seconds(on, ("backward", "regather"), True) * s / (1 + s), rel=1e-9)

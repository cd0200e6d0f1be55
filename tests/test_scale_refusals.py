"""Work that grew with the cluster and its faults, bounded (issue 35, item 9).

* A straggler on a deep pipeline: the optimistic classes of a SimPy replay (``Symmetry.optimistic``)
  gave up after ``MAX_REFINE_ROUNDS`` rounds and gave every device its own class, so a
  16,384-GPU, 128-stage straggler plan replayed 16,384 devices in SimPy (17 s of a 21 s
  ``dapple-plan --planner even``). Without the gradient rings a fault travels one stage a round,
  so the refinement now runs for up to two rounds a stage and keeps the replicas merged.
* The contention-free refinement (``refine_behaviour``) runs in numpy: the same classes as the
  Python rounds it replaces, written out here.
"""

from __future__ import annotations

from planner.search.space import Candidate, to_scenario
from sim.engine.classes import MAX_REFINE_ROUNDS
from sim.engine.compile import compile_workload
from sim.engine.symmetry import refine_behaviour
from sim.input.scenario import parse_scenario

STAGES, REPLICAS = 64, 4
DEEP = f"""
name: deep-straggler
cluster:
  nodes: {STAGES * REPLICAS // 8}
  devices_per_node: 8
  device: {{name: A100-80GB}}
  intra_node: {{bandwidth: 300GB/s, latency: 5us}}
  inter_node: {{bandwidth: 25GB/s, latency: 10us}}
model: {{preset: gpt, layers: {STAGES - 2}, hidden: 256, heads: 4, seq_len: 128, vocab: 1024, dtype: bf16}}
training: {{global_batch_size: 16}}
faults: [{{type: straggler, device: 0, slowdown: 1.5}}]
"""


def _deep_plan():
    # the gpt preset adds the embedding and the head as layers: 62 blocks are 64 layers
    scenario = parse_scenario(DEEP, ignore_plan=True)
    candidate = Candidate(bounds=tuple(range(STAGES + 1)), replicas=(REPLICAS,) * STAGES, microbatch_size=4,
                          schedule="gpipe")
    return to_scenario(scenario, candidate)


def test_a_straggler_on_a_deep_pipeline_keeps_its_replicas_merged_with_contention():
    assert STAGES > MAX_REFINE_ROUNDS  # the depth at which the old cap gave every device a class
    workload = compile_workload(_deep_plan(), contention=True, optimistic=True)
    # the straggler's replica chain is one class per stage, the other three replicas another
    assert workload.optimistic
    assert len(workload.classes) == 2 * STAGES < STAGES * REPLICAS


def test_a_straggler_on_a_deep_pipeline_without_contention():
    workload = compile_workload(_deep_plan(), contention=False)
    assert len(workload.classes) == 2 * STAGES


def test_refine_behaviour_splits_a_chain_one_link_a_round():
    # 0 -> 1 -> 2 -> 3 and 4 -> 5 -> 6 -> 7: device 0 starts apart, so its chain splits from the other
    incoming = [[], [("x", 0)], [("x", 1)], [("x", 2)], [], [("x", 4)], [("x", 5)], [("x", 6)]]
    initial = ["slow", "b", "c", "d", "a", "b", "c", "d"]
    assert refine_behaviour(initial, incoming, []) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert refine_behaviour(["a", "b", "c", "d"] * 2, incoming, []) == [0, 1, 2, 3, 0, 1, 2, 3]


def test_refine_behaviour_groups_split_by_the_set_of_their_classes():
    # two tensor groups {0, 1} and {2, 3}; device 0 is slow: its group's set is {slow, plain}, the other's {plain}
    groups = [(("TP", 0), (0, 1)), (("TP", 0), (2, 3))]
    assert refine_behaviour(["slow", "p", "p", "p"], [[]] * 4, groups) == [0, 1, 2, 2]
    # a set, not a multiset: {a, a, b} and {a, b, b} are the same set, so 2 and 5 stay one class
    groups = [(("TP", 0), (0, 1, 2)), (("TP", 0), (3, 4, 5))]
    assert refine_behaviour(["a", "a", "b", "a", "b", "b"], [[]] * 6, groups) == [0, 0, 1, 0, 1, 1]

"""Full recompute of the transformer blocks alone (``model.recompute_blocks_only``).

Megatron-LM's ``--recompute-granularity full`` checkpoints ``ParallelTransformer``'s layers
(``_checkpointed_forward``, megatron/model/transformer.py at cfd2e21): the embedding, the final
norm, the head's logits and the loss run once and keep what they save. Without the key a
stage's other layers are one checkpointed segment, run again in the backward (Chen et al. 2016).
"""

from __future__ import annotations

import pytest

from planner.search.costs import CostTables
from planner.search.ranking import analytic_score
from planner.search.space import Candidate, to_scenario
from sim.core.parallelism import Recompute
from sim.cost.comm import tensor_parallel_bytes_and_steps, tensor_parallel_cost
from sim.cost.compute import layer_times_s
from sim.engine.run import run_scenario
from sim.input.scenario import parse_scenario

SCENARIO = """
cluster: {preset: a100-nvlink-8, nodes: 1}
model: {preset: gpt, layers: 4, hidden: 1024, heads: 16, seq_len: 1024, vocab: 32768, dtype: fp16BLOCKS}
training: {global_batch_size: 4, microbatch_size: 4}
plan: {schedule: 1f1b, tensor_parallel: 1, pipeline_parallel: 1, data_parallel: 1, recompute: full}
"""


def _scenario(blocks: bool):
    return parse_scenario(SCENARIO.replace("BLOCKS", ", recompute_blocks_only: true" if blocks else ""))


def test_the_backward_no_longer_runs_the_embedding_and_head_again():
    stage, blocks = _scenario(False), _scenario(True)
    model, device = blocks.resolved.model, blocks.cluster.device
    others = [layer for layer in model.layers if layer.checkpoint_bytes is None]
    assert [layer.name for layer in others] == ["embedding", "head"]
    again_s = sum(layer_times_s(layer, device, model.dtype, 4)[0] for layer in others)
    assert again_s > 0
    assert stage.resolved.stage_costs[0].bwd_s - blocks.resolved.stage_costs[0].bwd_s == pytest.approx(again_s, rel=1e-9)
    # one stage, one micro-batch: the iteration shortens by the same
    plain_s = run_scenario(stage, engine="fast").summarize().iteration_time_s
    blocks_s = run_scenario(blocks, engine="fast").summarize().iteration_time_s
    assert plain_s - blocks_s == pytest.approx(again_s, rel=1e-9)


def test_the_other_layers_keep_their_stash_beside_the_blocks_inputs():
    cost = _scenario(True).resolved.stage_costs[0]
    model = _scenario(True).resolved.model
    kept = sum(layer.checkpoint_bytes if layer.checkpoint_bytes is not None else layer.stash_bytes
               for layer in model.layers) * 4
    assert cost.stash_bytes == pytest.approx(kept, rel=1e-12)
    blocks = [layer for layer in model.layers if layer.checkpoint_bytes is not None]
    assert cost.rebuilt_bytes == pytest.approx(max(layer.stash_bytes * 4 + layer.backward_workspace_bytes * 4
                                                   for layer in blocks), rel=1e-12)


def test_under_tensor_parallelism_the_embeddings_all_reduce_is_not_repeated():
    # tensor parallelism 8: the recomputed blocks repeat their forward all-reduces in the backward,
    # the embedding's (its output's all-reduce, Megatron's vocabulary-parallel embedding) no more
    def run(blocks: bool):
        text = SCENARIO.replace("tensor_parallel: 1", "tensor_parallel: 8")
        scenario = parse_scenario(text.replace("BLOCKS", ", recompute_blocks_only: true" if blocks else ""))
        return scenario, run_scenario(scenario, engine="fast").summarize().iteration_time_s

    (_, plain_s), (blocks, blocks_s) = run(False), run(True)
    model, device = blocks.resolved.model, blocks.cluster.device
    others = [layer for layer in model.layers if layer.checkpoint_bytes is None]
    again_s = sum(layer_times_s(layer, device, model.dtype, 4)[0] for layer in others)
    everything = tensor_parallel_bytes_and_steps(model.layers, 8, "forward", 4)
    only_blocks = tensor_parallel_bytes_and_steps([layer for layer in model.layers if layer.checkpoint_bytes is not None],
                                                  8, "forward", 4)
    link, cluster = blocks.cluster.intra_node, blocks.cluster
    # the backward's blocking collectives are one collective: its alone time with and without the embedding's
    bwd = tensor_parallel_bytes_and_steps(model.layers, 8, "backward", 4)
    with_all = tensor_parallel_cost(bwd[0] + everything[0], bwd[1] + everything[1], link, cluster).seconds
    with_blocks = tensor_parallel_cost(bwd[0] + only_blocks[0], bwd[1] + only_blocks[1], link, cluster).seconds
    assert everything[0] > only_blocks[0]
    assert plain_s - blocks_s == pytest.approx(again_s + with_all - with_blocks, rel=1e-9)


@pytest.mark.parametrize("tensor_parallel", [1, 2])
def test_the_planner_prices_it_as_the_fast_path_replays_it(tensor_parallel):
    base = parse_scenario("""
cluster: {preset: a100-nvlink-8, nodes: 1, devices_per_node: 4, nics_per_node: 1}
model: {preset: gpt, layers: 6, hidden: 256, heads: 4, seq_len: 128, vocab: 512, dtype: fp16, recompute_blocks_only: true}
training: {global_batch_size: 32, microbatch_size: 8}
""", source="blocks.yaml")
    candidate = Candidate(bounds=(0, 8), replicas=(4 // tensor_parallel,), microbatch_size=8,
                          tensor_parallel=tensor_parallel, recompute=Recompute.FULL)
    tables = CostTables(base, tensor_parallel=tensor_parallel)
    estimate = analytic_score(tables, base, candidate)[0]
    replay = run_scenario(to_scenario(base, candidate), engine="fast").summarize().iteration_time_s
    assert estimate == pytest.approx(replay, rel=1e-9)
    cost = to_scenario(base, candidate).resolved.stage_costs[0]
    assert tables.stash_bytes(0, 8, cost.samples, recompute=Recompute.FULL) == pytest.approx(cost.stash_bytes, rel=1e-12)

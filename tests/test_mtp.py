"""DeepSeek-V3's multi-token prediction (``model.mtp_depth``, ``sim.models.mtp``; arXiv
2412.19437 §2.2): one more block like the last and a 2h -> h projection as the layer ``mtp`` before
the head, and the shared head run again, its projection to the vocabulary held once."""

from __future__ import annotations

import pytest

from sim.core.errors import ScenarioError
from sim.core.experts import ExpertSpec
from sim.input.scenario import parse_scenario
from sim.models import build_model

SMALL = dict(layers=2, hidden=1024, heads=8, kv_heads=8, ffn_hidden=2048, vocab=1000, seq_len=256, attention="flash")
EXPERTS = ExpertSpec(count=8, top_k=2, ffn_hidden=512, shared=1)


@pytest.mark.parametrize("experts", [None, EXPERTS])
def test_one_mtp_module_is_the_last_block_a_projection_and_the_head_again(experts):
    base = build_model("llama", experts=experts, **SMALL)
    mtp = build_model("llama", experts=experts, mtp_depth=1, **SMALL)
    s, h, v = 256, 1024, 1024  # the vocabulary padded to a multiple of 128, as Megatron-LM pads it
    d = {"bf16": 2, "fp16": 2, "fp32": 4}[base.dtype]
    assert [layer.name for layer in mtp.layers] == ["embedding", "block_0", "block_1", "mtp", "head"]
    last, head, extra, head2 = base.layers[-2], base.layers[-1], mtp.layers[-2], mtp.layers[-1]
    # the module: the last block's FLOPs and parameters plus the projection's 2·s·2h·h and 2h² + 2h
    assert extra.fwd_flop == pytest.approx(last.fwd_flop + 2 * s * 2 * h * h, rel=1e-12)
    assert extra.bwd_flop == pytest.approx(last.bwd_flop + 4 * s * 2 * h * h, rel=1e-12)
    assert extra.param_bytes == pytest.approx(last.param_bytes + (2 * h * h + 2 * h) * d, rel=1e-12)
    assert extra.expert_param_bytes == last.expert_param_bytes and extra.a2a_bytes == last.a2a_bytes
    assert extra.stash_bytes == pytest.approx(last.stash_bytes + 2 * 2 * s * h * d, rel=1e-12)
    assert extra.output_bytes == 2 * last.output_bytes  # the main hidden state passes beside the module's
    # the head twice, its vocabulary projection once (shared, §2.2); its own final norm's h
    assert head2.fwd_flop == pytest.approx(2 * head.fwd_flop, rel=1e-12)
    assert head2.stash_bytes == pytest.approx(2 * head.stash_bytes, rel=1e-12)
    assert head2.param_bytes == pytest.approx(head.param_bytes + h * d, rel=1e-12)
    assert head.param_bytes == pytest.approx((h + h * v) * d, rel=1e-12)


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp2", "tp2-sp"])
def test_a_tensor_parallel_device_holds_its_share_of_the_projection(sequence_parallel):
    # Megatron-Core's eh_proj is column-parallel (1/t of 2h·h) beside two whole norms (2h)
    from sim.core.parallelism import Shard
    from sim.models import shard_model

    t, s, h, d = 2, 256, 1024, 2
    base = shard_model(build_model("llama", **SMALL), Shard(tensor=t, sequence_parallel=sequence_parallel))
    mtp = shard_model(build_model("llama", mtp_depth=1, **SMALL), Shard(tensor=t, sequence_parallel=sequence_parallel))
    last, extra = base.layers[-2], mtp.layers[-2]
    assert extra.param_bytes == pytest.approx(last.param_bytes + (2 * h * h / t + 2 * h) * d, rel=1e-12)
    assert extra.fwd_flop == pytest.approx(last.fwd_flop + 2 * s * 2 * h * h / t, rel=1e-12)
    share = t if sequence_parallel else 1
    assert extra.stash_bytes == pytest.approx(last.stash_bytes + 2 * 2 * s * h * d / share, rel=1e-12)
    assert extra.output_bytes == 2 * s * h * d / t  # two hidden states, 1/t of the sequence at a boundary
    assert extra.tp_collectives[-len(last.tp_collectives):] == last.tp_collectives  # the projection's, then the block's
    added = [(c.kind, c.phase, c.bytes) for c in extra.tp_collectives[:-len(last.tp_collectives)]]
    hidden, joined = float(s * h * d), float(s * 2 * h * d)
    assert added == ([("reduce-scatter", "forward", hidden), ("all-gather", "backward", hidden),
                      ("all-gather", "forward", joined), ("reduce-scatter", "backward", joined),
                      ("all-gather", "forward", hidden), ("all-gather", "backward", hidden)] if sequence_parallel else
                     [("all-reduce", "forward", hidden), ("all-reduce", "backward", joined),
                      ("all-gather", "forward", hidden)])


def test_mtp_depth_is_read_for_gpt_and_llama_only():
    text = """
name: mtp
cluster: {preset: dgx-h100, nodes: 1}
model: {preset: %s, layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 512, mtp_depth: %s}
training: {global_batch_size: 8, microbatch_size: 8}
plan: {pipeline_parallel: 1, data_parallel: 8}
"""
    assert parse_scenario(text % ("llama", 1), source="m.yaml").model.mtp_depth == 1
    with pytest.raises(ScenarioError, match="mtp_depth"):
        parse_scenario(text % ("bert", 1), source="m.yaml")
    with pytest.raises(ScenarioError, match="mtp_depth"):
        parse_scenario(text % ("llama", -1), source="m.yaml")


_STAGES = """
name: mtp-copy
cluster: {preset: dgx-h100, nodes: 1}
model: {preset: llama, layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 512, mtp_depth: 1}
training: {global_batch_size: 8, microbatch_size: 1}
plan:
  schedule: %s
  stages:
%s
"""


def test_an_untied_mtp_layer_away_from_the_embedding_holds_a_copy_of_the_table():
    # Megatron-Core's MTP stage keeps its own word_embeddings (setup_embeddings_and_output_layer) and
    # all-reduces its gradient with the first stage's (_allreduce_word_embedding_grads): 512 x 256 bf16
    apart = parse_scenario(_STAGES % ("1f1b", "    - {layers: [0, 2], devices: [0]}\n"
                                               "    - {layers: [2, 5], devices: [1]}"), source="m.yaml")
    model, table = apart.resolved.model, 512 * 256 * 2
    assert model.tied_layers == (0, 3) and model.tied_bytes == table  # the embedding and mtp
    assert model.stage_param_bytes(2, 5) == model.param_bytes(2, 5) + table
    assert model.stage_param_bytes(0, 2) == model.param_bytes(0, 2)
    assert apart.resolved.stage_costs[1].tied_allreduce_s > 0 and apart.resolved.stage_costs[0].tied_allreduce_s > 0
    # DualPipe's V: the first and the last stage on one device, which reads the embedding's own table
    v = parse_scenario(_STAGES % ("{name: dualpipe-v, chunks: 2}",
                                  "    - {layers: [0, 1], devices: [0]}\n    - {layers: [1, 2], devices: [1]}\n"
                                  "    - {layers: [2, 3], devices: [1]}\n    - {layers: [3, 5], devices: [0]}"),
                       source="m.yaml").resolved
    assert v.model.tied_layers is None and v.model.stage_param_bytes(3, 5) == v.model.param_bytes(3, 5)
    assert all(cost.tied_allreduce_s == 0 for cost in v.stage_costs)


def test_under_fsdp_the_table_copy_is_in_the_mtp_layers_unit():
    # the runtime's mtp layer holds the copy in its own fully_shard unit (runtime.model.sharding)
    from sim.cost.memory import fsdp_unit_param_bytes

    apart = parse_scenario(_STAGES % ("1f1b", "    - {layers: [0, 2], devices: [0]}\n"
                                               "    - {layers: [2, 5], devices: [1]}"), source="m.yaml")
    model = apart.resolved.model
    block, mtp, head = (model.layers[k].param_bytes for k in (2, 3, 4))
    assert fsdp_unit_param_bytes(model, 2, 5) == (block, mtp + 512 * 256 * 2, head)


_APART = _STAGES % ("1f1b", "    - {layers: [0, 4], devices: [0]}\n    - {layers: [4, 5], devices: [1]}")


def test_a_plan_with_the_mtp_layer_apart_from_the_head_is_refused_in_one_line():
    # Megatron-Core builds its MTP layers on the last pipeline stage (mtp_on_this_rank), with the head
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(_APART, source="m.yaml")
    message = str(caught.value)
    assert message.startswith("m.yaml: plan.stages: the mtp layer (3) is on stage 0 ([0, 4]) and the head (4)")
    assert message.endswith("put layers 3 and 4 in one stage") and "Megatron-Core" in message and "\n" not in message
    # the same model with the mtp layer on the head's stage loads
    together = _STAGES % ("1f1b", "    - {layers: [0, 3], devices: [0]}\n    - {layers: [3, 5], devices: [1]}")
    assert parse_scenario(together, source="m.yaml").plan.stages[1].layers == (3, 5)


@pytest.mark.parametrize("command", ["simulate", "check"])
def test_the_cli_refuses_the_mtp_layer_apart_from_the_head_with_exit_code_2(command, tmp_path, capsys):
    from sim.app.cli import main

    path = tmp_path / "apart.yaml"
    path.write_text(_APART)
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert "plan.stages: the mtp layer (3)" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_balanced_cuts_keep_the_mtp_layer_with_the_head():
    from sim.input.plan_section import balanced_cuts, balanced_v_cuts

    # costs 1, 1, 5, 5 in two ranges: best [0, 3) | [3, 4) (largest sum 7); with boundary 3 joined the
    # units are 1, 1, 10: best [0, 2) | [2, 4) (largest sum 10)
    assert balanced_cuts([1, 1, 5, 5], 2) == (0, 3, 4)
    assert balanced_cuts([1, 1, 5, 5], 2, no_cut_at=(3,)) == (0, 2, 4)
    assert 4 not in balanced_v_cuts([1, 1, 1, 5, 5], 2, no_cut_at=(4,))
    # a grid plan of a model whose last two layers are mtp and the head: they share the last stage
    grid = parse_scenario(_STAGES.split("plan:")[0] + "plan: {pipeline_parallel: 4, data_parallel: 1}\n",
                          source="m.yaml")
    assert grid.model.no_cut_at == (4,) and grid.plan.stages[-1].layers == (3, 5)


_SLOW_LINKS = """
name: mtp-plan
cluster:
  nodes: 1
  devices_per_node: 4
  device: {name: cpu-core, memory: 4GiB, peak_flops: 50GFLOP/s, peak_fp32_flops: 50GFLOP/s, memory_bandwidth: 10GB/s}
  intra_node: {bandwidth: 100MB/s, latency: 30us, name: shared memory}
  inter_node: {bandwidth: 1GB/s, latency: 50us, name: loopback TCP}
model: {preset: gpt, layers: 2, hidden: 256, heads: 4, seq_len: 32, vocab: 16384, vocab_divisible_by: 1,
        dtype: fp32, optimizer: adam, mtp_depth: 2, tied_embeddings: false}
training: {global_batch_size: 16, microbatch_size: 4}
"""


@pytest.mark.parametrize("name", [pytest.param("exhaustive", marks=pytest.mark.slow),  # 10 s
                                  "dapple", "megatron", "pipedream", "even", "dp"])
def test_no_planner_cuts_between_the_mtp_layer_and_the_head(name):
    # on these slow links the exhaustive search's best was [0, 4) | [4, 5), mtp (3) apart from the head (4),
    # and DAPPLE's interleaved candidates cut there
    from planner.planners.registry import get_planner
    from planner.search.evaluation import RejectionKind
    from planner.search.space import PlannerOptions

    scenario = parse_scenario(_SLOW_LINKS, source="m.yaml")
    result = get_planner(name)(scenario, PlannerOptions())
    assert result.evaluations  # it searched, and no candidate was refused as an invalid plan
    assert all(e.rejection is None or e.rejection.kind is not RejectionKind.INVALID_PLAN for e in result.evaluations)
    assert all(4 not in e.candidate.bounds for e in result.evaluations)
    assert result.best is not None and 4 not in result.best.candidate.bounds


def test_compares_schedule_variants_keep_the_mtp_layer_with_the_head():
    # dapple-sim compare re-cuts the plan for each schedule (balanced_cuts over units): 4 stages of 4 units
    from sim.app.compare import plan_variants

    two = parse_scenario(_STAGES % ("1f1b", "    - {layers: [0, 3], devices: [0]}\n    - {layers: [3, 5], devices: [1]}"),
                         source="m.yaml")
    variants = {v.schedule: v for v in plan_variants(two, ("1f1b", "interleaved", "zb-v", "looped-bfs"))}
    assert variants["zb-v"].plan is not None and variants["interleaved"].plan is not None
    for variant in variants.values():
        assert variant.plan is not None, variant.error
        assert all(stage.layers[0] != 4 for stage in variant.plan.stages)

"""Training stacks (``stack:``, ``sim.input.stack``): a named bundle of defaults under the scenario's keys.

Each stack's values land in the specs; a key the scenario (or ``--set``, or a plan file) sets
wins; ``dapple-sim check`` lists what the stack set with its citation; an unknown stack is one
line and exit 2.
"""

from __future__ import annotations

import json

import pytest

from planner.search.space import Candidate, to_scenario
from sim.app.cli import main
from sim.input.plan_file import plan_to_dict
from sim.input.scenario import parse_scenario
from sim.input.stack import STACKS, apply_stack

BASE = """
cluster: {preset: dgx-h100, nodes: 1}
model: {preset: llama, layers: 4, hidden: 512, heads: 8, seq_len: 512, vocab: 1024}
training: {global_batch_size: 16, microbatch_size: 16}
plan: {sharding: SHARDING, pipeline_parallel: 1, data_parallel: 8}
"""


def _scenario(stack: str, sharding: str = "full", extra: str = "", **kwargs):
    text = f"stack: {stack}\n" + BASE.replace("SHARDING", sharding) + extra
    return parse_scenario(text, **kwargs)


def test_torchtitan_sets_fsdp2_per_block_foreach_adamw_fp32_reduction_and_op_level_recompute():
    s = _scenario("torchtitan")
    assert s.plan.overlap.grad_reduce is True and s.plan.overlap.param_gather is False
    assert s.plan.fsdp.unit_layers == 1 and s.plan.fsdp.reshard_after_forward is True
    assert s.plan.recompute.value == "selective-op"
    assert s.model.optimizer_implementation == "foreach" and s.model.grad_dtype == "fp32"
    assert [v.key for v in s.stack_values] == [v.key for v in STACKS["torchtitan"]]


def test_megatron_core_turns_on_the_recipe_overlaps_and_the_distributed_optimizer():
    s = parse_scenario("stack: megatron-core\n" + BASE.replace("sharding: SHARDING, ", ""))
    assert s.plan.overlap.grad_reduce and s.plan.overlap.param_gather and not s.plan.overlap.tensor_parallel
    assert s.plan.overlap.bucket_bytes == 160e6  # 40M fp32 main_grads
    assert s.plan.sharding.value == "optimizer"
    assert s.model.optimizer_implementation == "fused" and s.model.grad_dtype == "fp32"


def test_megatron_lm_overlaps_nothing():
    s = _scenario("megatron-lm", sharding="optimizer")
    assert not (s.plan.overlap.grad_reduce or s.plan.overlap.param_gather or s.plan.overlap.tensor_parallel)
    assert s.model.optimizer_implementation == "fused"


@pytest.mark.parametrize(("sharding", "overlapped"), [("full", True), ("gradients", False), ("none", False)])
def test_deepspeed_overlaps_communication_by_default_only_under_zero_3(sharding, overlapped):
    s = _scenario("deepspeed", sharding=sharding)
    assert s.plan.overlap.grad_reduce is overlapped
    assert s.plan.overlap.bucket_bytes == 1e9  # reduce_bucket_size 5e8 elements of 2 bytes
    assert [v.key for v in s.stack_values].count("plan.overlap.grad_reduce") == 1


def test_no_stack_is_the_same_as_none_and_sets_nothing():
    plain = parse_scenario(BASE.replace("SHARDING", "full"))
    none = _scenario("none")
    assert plain.plan == none.plan and plain.model == none.model
    assert none.stack == "none" and none.stack_values == ()


def test_a_scenario_key_overrides_the_stack_and_is_not_listed():
    s = _scenario("torchtitan", extra="", overrides={"plan.overlap": "{grad_reduce: false}",
                                                     "model.optimizer": "{name: adamw, implementation: fused}"})
    assert s.plan.overlap.grad_reduce is False and s.model.optimizer_implementation == "fused"
    keys = [v.key for v in s.stack_values]
    assert "plan.overlap.grad_reduce" not in keys and "model.optimizer.implementation" not in keys
    assert "plan.fsdp.unit_layers" in keys  # what the scenario left open still comes from the stack


def test_a_plan_file_wins_over_the_stack():
    plain = parse_scenario(BASE.replace("SHARDING", "full"))
    plan = {**plan_to_dict(plain.plan, plain.training), "recompute": "full", "overlap": {"grad_reduce": False}}
    s = _scenario("torchtitan", plan=plan)
    assert s.plan.recompute.value == "full" and s.plan.overlap.grad_reduce is False


def test_a_stack_never_creates_a_plan():
    s = parse_scenario("stack: torchtitan\n" + BASE.split("plan:")[0])
    # its overlap and FSDP settings still hold for the plans the planner makes
    assert s.plan is None and all(v.key.startswith(("plan.overlap.", "plan.fsdp.")) for v in s.stack_values
                                  if v.key.startswith("plan."))
    assert s.overlap.grad_reduce is True and s.fsdp.unit_layers == 1
    assert s.model.optimizer_implementation == "foreach"


def test_check_lists_what_the_stack_set_with_its_source(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("stack: torchtitan\n" + BASE.replace("SHARDING", "full"))
    assert main(["check", str(path)]) == 0
    text = capsys.readouterr().out
    assert "stack torchtitan: 10 defaults set" in text and "model.attention = sdpa" in text
    assert "plan.fsdp.fp32_shards = true" in text
    assert "model.kernels = eager" in text
    assert "plan.overlap.grad_reduce = true  (pytorch/torchtitan@9dec370 " in text
    assert "model.optimizer.implementation = foreach" in text
    assert main(["check", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["stack"]
    assert data["name"] == "torchtitan" and len(data["set"]) == 10
    assert data["set"][1] == {"key": "plan.overlap.grad_reduce", "value": True,
                              "source": STACKS["torchtitan"][1].source}


def test_check_without_a_stack_prints_no_stack_line(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(BASE.replace("SHARDING", "full"))
    assert main(["check", str(path), "--json"]) == 0
    assert "stack" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("value", ["megatron", "[torchtitan]", "1"])
def test_an_unknown_stack_is_one_line_and_exit_2(tmp_path, capsys, value):
    path = tmp_path / "s.yaml"
    path.write_text(f"stack: {value}\n" + BASE.replace("SHARDING", "full"))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "stack: unknown value" in err and "valid: deepspeed, megatron-core, megatron-lm, none, torchtitan" in err
    assert "\n" not in err


def test_every_stack_but_none_sets_its_attention_kernel_with_a_source():
    for name in sorted(set(STACKS) - {"none"}):
        kernels = [v for v in STACKS[name] if v.key == "model.attention"]
        assert len(kernels) == 1 and kernels[0].value in {"flash", "sdpa", "cudnn", "unfused"} and kernels[0].source
        assert _scenario(name, "none").model.attention == kernels[0].value


def test_a_stack_sets_no_attention_on_a_measured_profile():
    raw, _, used = apply_stack({"stack": "torchtitan", "model": {"profile": "x.json"}}, source="s")
    assert "attention" not in raw["model"] and all(v.key != "model.attention" for v in used)


def test_the_planner_plans_with_the_stack_s_overlap():
    s = parse_scenario("stack: megatron-core\n" + BASE.replace("SHARDING", "none"), ignore_plan=True)
    assert s.plan is None and s.overlap.grad_reduce and s.overlap.param_gather
    planned = to_scenario(s, Candidate(bounds=(0, s.model.num_layers), replicas=(8,), microbatch_size=2))
    assert planned.plan.overlap == s.overlap and planned.plan.fsdp == s.fsdp

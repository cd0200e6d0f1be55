"""The vocabulary padded as Megatron-LM pads it (``model.vocab_divisible_by``, ``sim.models.vocab``).

Megatron-LM's ``_vocab_size_with_padding``: the smallest multiple of
``make_vocab_size_divisible_by × tensor_model_parallel_size`` at least the vocabulary. The
numbers below are that rule worked by hand; the model's layers, ``check`` and ``simulate``
must all use the padded size, and a vocabulary t does not divide is never refused.
"""

from __future__ import annotations

import json

import pytest

from sim.app.cli import main
from sim.core.parallelism import Shard
from sim.input.scenario import parse_scenario
from sim.input.stack import STACKS
from sim.models import build_model, padded_vocab, shard_model
from sim.models.vocab import padded_vocab_size

H, S = 1024, 1024

GPT2_TP8 = f"""
cluster: {{preset: dgx-h100, nodes: 1}}
model: {{preset: gpt, layers: 2, hidden: {H}, heads: 16, seq_len: {S}, vocab: 50257, tied_embeddings: false,
         dtype: bf16EXTRA}}
training: {{global_batch_size: 8, microbatch_size: 1}}
plan:
  tensor_parallel: 8
  stages:
    - {{layers: [0, 4], devices: [0, 1, 2, 3, 4, 5, 6, 7]}}
"""


def _text(extra: str = "", stack: str = "") -> str:
    return (f"stack: {stack}\n" if stack else "") + GPT2_TP8.replace("EXTRA", extra)


@pytest.mark.parametrize("vocab, divisible_by, tensor_parallel, padded", [
    (50257, 128, 1, 50304),    # 393 × 128 = 50,304 ≥ 50,257 > 392 × 128
    (50257, 128, 8, 51200),    # 50 × 1024
    (128256, 128, 8, 129024),  # Llama 3's 1002 × 128 is not a multiple of 1024: 126 × 1024
    (50257, 1, 8, 50264),      # 6283 × 8: only a multiple of t
    (51200, 128, 8, 51200),    # already a multiple: unchanged
])
def test_the_padded_size_is_the_smallest_multiple_of_d_times_t(vocab, divisible_by, tensor_parallel, padded):
    assert padded_vocab_size(vocab, divisible_by, tensor_parallel) == padded


def test_a_vocabulary_t_does_not_divide_is_built_and_its_head_holds_the_padded_slice():
    scenario = parse_scenario(_text())
    shard = Shard(tensor=8, sequence_parallel=scenario.plan.sequence_parallel)
    device = shard_model(scenario.model, shard)  # what the engine and the planner's tables build
    head, embedding = device.layers[-1], device.layers[0]
    d = 2  # bf16
    assert head.param_bytes == (2 * H + H * 51200 / 8) * d  # LayerNorm's 2h plus h × padded/t
    assert head.fwd_flop == 2 * S * H * 51200 / 8
    assert embedding.param_bytes == (51200 / 8 * H + S * H) * d  # the token table's slice, the positions
    assert padded_vocab(device, 8) == padded_vocab(scenario.model.preset, 8) == 51200


def test_simulate_runs_and_says_the_padded_size_of_the_plans_degree(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(_text())
    assert main(["simulate", str(path), "--engine", "fast"]) == 0
    out = capsys.readouterr().out
    assert "vocabulary 50,257 padded to 51,200 at tensor parallel 8" in out


def test_without_tensor_parallelism_the_whole_model_is_padded_too():
    model = build_model("gpt", layers=1, hidden=64, heads=4, seq_len=32, vocab=50257, tied_embeddings=False)
    assert model.layers[-1].fwd_flop == 2 * 32 * 64 * 50304
    assert model.layers[-1].param_bytes == (2 * 64 + 64 * 50304) * 2  # fp16
    unpadded = build_model("gpt", layers=1, hidden=64, heads=4, seq_len=32, vocab=50257, tied_embeddings=False,
                           vocab_divisible_by=1)
    assert unpadded.layers[-1].fwd_flop == 2 * 32 * 64 * 50257


def test_check_names_the_vocabulary_and_its_padded_sizes(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(_text())
    assert main(["check", str(path)]) == 0
    assert ("vocabulary 50,257 padded to 50,304 (a multiple of 128; 51,200 at tensor parallel 8; "
            "Megatron-LM --make-vocab-size-divisible-by)") in capsys.readouterr().out
    assert main(["check", str(path), "--json"]) == 0
    padding = json.loads(capsys.readouterr().out)["model"]["vocab_padding"]
    assert padding == {"vocab": 50257, "divisible_by": 128, "padded": 50304, "tensor_parallel": 8,
                       "padded_at_tensor_parallel": 51200}


def test_check_says_nothing_of_a_vocabulary_that_needs_no_padding(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(_text().replace("50257", "51200"))
    assert main(["check", str(path), "--json"]) == 0
    assert "vocab_padding" not in json.loads(capsys.readouterr().out)["model"]
    assert main(["check", str(path)]) == 0
    assert "padded" not in capsys.readouterr().out


def test_stacks_set_megatrons_128_and_torchtitans_1():
    for name, expected in (("megatron-lm", 128), ("megatron-core", 128), ("deepspeed", 128), ("torchtitan", 1)):
        values = [v for v in STACKS[name] if v.key == "model.vocab_divisible_by"]
        assert len(values) == 1 and values[0].value == expected and values[0].source
    titan = parse_scenario(_text(stack="torchtitan"))
    assert titan.model.preset.values["vocab_divisible_by"] == 1
    assert padded_vocab(titan.model, 8) == 50264
    assert "model.vocab_divisible_by" in [v.key for v in titan.stack_values]
    own = parse_scenario(_text(", vocab_divisible_by: 64", stack="torchtitan"))  # the file's key wins
    assert own.model.preset.values["vocab_divisible_by"] == 64
    assert "model.vocab_divisible_by" not in [v.key for v in own.stack_values]


def test_models_without_a_vocabulary_have_no_padded_size():
    assert padded_vocab(build_model("mlp", layers=2, hidden=8), 1) is None
    assert padded_vocab(build_model("vgg", depth=11), 1) is None


@pytest.mark.parametrize("value", ["0", "-128", "1.5", "'128'", "true"])
def test_a_bad_vocab_divisible_by_is_one_line_naming_the_key_and_exit_2(tmp_path, capsys, value):
    path = tmp_path / "s.yaml"
    path.write_text(_text(f", vocab_divisible_by: {value}"))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "model.vocab_divisible_by" in err and "must be a positive integer" in err and "128" in err
    assert "\n" not in err


def test_a_preset_without_a_vocabulary_refuses_the_key(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("cluster: {preset: dgx-h100, nodes: 1}\n"
                    "model: {preset: mlp, layers: 2, hidden: 8, vocab_divisible_by: 128}\n"
                    "training: {global_batch_size: 8, microbatch_size: 1}\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "vocab_divisible_by" in err and "\n" not in err


def test_dapple_plan_says_the_best_plans_padded_vocabulary(tmp_path, capsys):
    from planner.cli import main as plan_main

    path = tmp_path / "gpt.yaml"
    path.write_text("name: gpt-vocab\ncluster: {preset: a100-nvlink-8, nodes: 1}\n"
                    "model: {preset: gpt, layers: 4, hidden: 1024, heads: 16, seq_len: 1024, vocab: 50257, dtype: bf16}\n"
                    "training: {global_batch_size: 16}\n")
    assert plan_main([str(path), "--planner", "dp", "--microbatch-size", "16"]) == 0
    assert "the best plan's vocabulary 50,257 padded to 50,304 (a multiple of 128;" in capsys.readouterr().out
    assert plan_main([str(path), "--planner", "dp", "--microbatch-size", "16", "--json"]) == 0
    padding = json.loads(capsys.readouterr().out)["vocab_padding"]
    assert padding["vocab"] == 50257 and padding["padded"] == 50304 and padding["tensor_parallel"] == 1

"""A generated model remembers its generator and every resolved parameter (``ModelSpec.preset``),
so the runtime builds what the simulator read from the checked scenario alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import SCENARIOS
from sim.core.errors import DappleError, SpecError
from sim.core.model_spec import ModelPreset
from sim.input.scenario import load_scenario, parse_scenario
from sim.models import PRESET_PARAMS, build_model

TINY_GPT = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 16, "vocab": 100}


def test_a_built_model_keeps_every_parameter_with_computed_defaults_resolved():
    model = build_model("gpt", **TINY_GPT)
    assert model.preset.name == "gpt"
    assert [key for key, _ in model.preset.params] == sorted(PRESET_PARAMS["gpt"])
    assert model.preset.values == {**TINY_GPT, "ffn_hidden": 4 * 64, "tied_embeddings": True, "dtype": "fp16",
                                   "vocab_divisible_by": 128,
                                   "optimizer": "adam"}
    assert build_model("mlp", layers=2, hidden=8).preset.values["input_size"] == 8
    assert build_model("vgg").preset.values["depth"] == 16


@pytest.mark.parametrize("preset", ["gpt", "bert", "mlp", "vgg"])
def test_the_kept_parameters_build_the_same_model_again(preset):
    params = {"gpt": TINY_GPT, "bert": TINY_GPT, "mlp": {"layers": 3, "hidden": 16}, "vgg": {"depth": 11}}[preset]
    model = build_model(preset, **params)
    again = build_model(model.preset.name, **model.preset.values)
    assert again == model and hash(again) == hash(model)


def test_a_profile_has_no_preset_and_a_renamed_model_keeps_its_own():
    assert load_scenario(SCENARIOS / "bert48_v100_2x8.yaml").model.preset is None
    scenario = load_scenario(SCENARIOS / "gpt_tiny_cpu.yaml", {"model.name": "renamed", "model.layers": "3",
                                                                "plan.stages.1.layers": "[3, 5]"})
    assert scenario.model.name == "renamed" and scenario.model.preset.values["layers"] == 3


def test_preset_parameters_must_be_sorted_unique_scalars():
    with pytest.raises(SpecError, match="sorted by unique name"):
        ModelPreset(name="gpt", params=(("layers", 2), ("hidden", 4)))
    with pytest.raises(SpecError, match="must be a number, a string or a boolean"):
        ModelPreset(name="gpt", params=(("layers", [2]),))
    model = build_model("gpt", **TINY_GPT)
    assert replace(model, preset=None) != model  # the preset takes part in equality (caches key on it)


def test_the_runtime_reads_the_model_from_a_scenario_without_a_file():
    from runtime.model.config import runnable_model

    text = (SCENARIOS / "gpt_tiny_cpu.yaml").read_text()
    scenario = parse_scenario(text, source="<text>", overrides={"model.hidden": "32", "model.heads": "2"})
    config = runnable_model(scenario.model, source="<text>")
    assert config.preset == "gpt" and config.values["hidden"] == 32 and config.values["ffn_hidden"] == 128
    with pytest.raises(DappleError, match="model.profile: a measured profile has no layers to run"):
        runnable_model(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml").model)
    with pytest.raises(DappleError, match="'vgg' cannot be built for real yet"):
        runnable_model(build_model("vgg", depth=11))

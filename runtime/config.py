"""What the runtime needs before any process starts: a runnable model and a plan that fits.

The simulator keeps only a ``ModelSpec`` (per-layer numbers), but a real run needs the
shape parameters that built it (``layers: 4, hidden: 64, ...``). They are read back from the
scenario file's ``model:`` section, after the same ``--plan`` and ``--set`` overrides the
scenario loader applied, and completed with the preset's defaults (``sim.models.PRESET_PARAMS``).

Everything here is checked without torch, in the launching process, so that a scenario
that cannot run (a measured profile instead of a preset, a plan that needs more processes
than were asked for) is rejected in one line before any process starts (exit code 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sim.errors import DappleError
from sim.models import PRESET_PARAMS, build_model
from sim.plan import PlanSpec
from sim.input.scenario import Scenario, apply_overrides, load_scenario

__all__ = ["RUNNABLE_PRESETS", "ModelConfig", "RunnableScenario", "check_world", "load_runnable", "model_config"]

RUNNABLE_PRESETS = ("gpt", "mlp")
"""Presets that ``runtime.models`` can build as torch modules."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """A built-in model's preset and its complete shape parameters (defaults filled in)."""

    preset: str
    """``gpt`` or ``mlp``."""
    params: tuple[tuple[str, Any], ...]
    """Sorted (name, value) pairs: every parameter of the preset, computed defaults resolved."""

    def __post_init__(self) -> None:
        if self.preset not in RUNNABLE_PRESETS:
            raise DappleError(
                f"model.preset: {self.preset!r} has no torch implementation yet; runnable presets: "
                f"{', '.join(RUNNABLE_PRESETS)}"
            )

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.params)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnableScenario:
    """A checked scenario with a plan, and the model parameters to build it for real."""

    scenario: Scenario
    """The scenario as the simulator reads it (its plan is not None)."""
    model: ModelConfig
    """What ``runtime.models.build_layers`` builds."""

    @property
    def plan(self) -> PlanSpec:
        assert self.scenario.plan is not None
        return self.scenario.plan


def model_config(raw_model: Mapping[str, Any], *, source: str = "<scenario>") -> ModelConfig:
    """The ``ModelConfig`` of a scenario's raw ``model:`` mapping (already checked by the loader)."""
    if "profile" in raw_model:
        raise DappleError(
            f"{source}: model.profile: a measured profile has no layers to run; use a built-in model "
            f"(model: {{preset: {' or '.join(RUNNABLE_PRESETS)}, ...}})"
        )
    preset = raw_model.get("preset")
    if preset not in RUNNABLE_PRESETS:
        raise DappleError(
            f"{source}: model.preset: {preset!r} cannot be built for real yet; runnable presets: "
            f"{', '.join(RUNNABLE_PRESETS)}"
        )
    table = PRESET_PARAMS[preset]
    params = {key: raw_model.get(key, default) for key, default in table.items()}
    if preset == "gpt" and params["ffn_hidden"] is None:
        params["ffn_hidden"] = 4 * params["hidden"]
    if preset == "mlp" and params["input_size"] is None:
        params["input_size"] = params["hidden"]
    return ModelConfig(preset=preset, params=tuple(sorted(params.items())))


def load_runnable(
    path: str | Path, overrides: Mapping[str, str] | None = None, *, plan: Mapping[str, Any] | None = None
) -> RunnableScenario:
    """Load ``path`` strictly (as ``dapple-sim`` does) and extract its runnable model.

    Raises ``DappleError`` (one line) when the scenario has no plan or no buildable model.
    """
    scenario = load_scenario(path, overrides, plan=plan)
    if scenario.plan is None:
        raise DappleError(
            f"{path}: plan: missing; a run needs stages and devices (add a plan: section or pass --plan PLAN.json)"
        )
    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if plan is not None:
        from sim.input.plan_file import merge_plan

        raw = merge_plan(raw, plan, source=str(path))
    if overrides:
        raw = apply_overrides(raw, overrides, source=str(path))
    config = model_config(raw["model"], source=str(path))
    rebuilt = build_model(config.preset, **{k: v for k, v in config.params})
    assert rebuilt.num_layers == scenario.model.num_layers, "model parameters re-read inconsistently"
    return RunnableScenario(scenario=scenario, model=config)


def check_world(plan: PlanSpec, world_size: int) -> None:
    """Reject a plan whose devices are not exactly the ranks ``0 .. world_size - 1``.

    Every process runs one device of the plan (global device id = torch rank), so the plan
    must use each launched rank and no other.
    """
    devices = sorted(plan.devices)
    if devices == list(range(world_size)):
        return
    wanted = len(devices)
    if devices == list(range(wanted)):
        raise DappleError(
            f"the plan uses {wanted} devices (0-{wanted - 1}) but {world_size} processes were launched; "
            f"use --nproc {wanted}"
        )
    beyond = [d for d in devices if d >= world_size]
    unused = sorted(set(range(world_size)) - set(devices))
    problem = f"devices {beyond} do not exist among ranks 0-{world_size - 1}" if beyond else f"ranks {unused} have no stage"
    raise DappleError(
        f"the plan's devices {devices} do not match the {world_size} launched ranks: {problem}; "
        "number the plan's devices 0 to N-1 and launch N processes"
    )

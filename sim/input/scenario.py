"""Scenario files: the user's YAML, read strictly into specs.

A scenario names a cluster, a model, a training set-up and optionally a plan (every key is
in ``docs/scenario.md``; examples in ``scenarios/``). Reading it is the one place where a user's typo
meets the program, so every problem becomes one line that names the file, the dotted key,
the bad value and what would be valid::

    run.yaml: cluster.device.memroy: unknown key; did you mean 'memory'? valid: efficiency, ...
    run.yaml: plan.stages[1].layers: [30, 53] leaves a gap after the previous stage's end 27; ...

Unknown keys, missing keys, wrong types, missing or wrong units, non-positive sizes, device
ids out of range or used twice, layer ranges with gaps or overlaps, more stages than
layers, and schedules that cannot run are all rejected here (``ScenarioError``, exit code 2
in the CLI). ``overrides`` (``--set key=value``) are applied to the raw mapping first, so
they are checked like the file itself.

Each section has its own reader: ``sim.input.cluster`` (devices, links, presets, a custom
device's defaults), ``sim.input.model`` (profile or generator), ``sim.input.plan_section``
(stages and schedule), ``sim.input.fault_section`` and ``sim.input.run_section`` (the run's
length, price, power and ``reliability``); ``training``'s two integers are read here.

Relative paths (``profile``, ``schedule_file``) are resolved against the scenario's folder;
a profile that is not there is looked up in the package's data folder, so
``profiles/dapple-v100/bert-48-pbs-2.txt`` works from anywhere.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from sim.core.command import MalformedOverride
from sim.core.errors import DappleError, ScenarioError
from sim.core.model_spec import ModelSpec
from sim.core.overlap import FsdpSpec, OverlapSpec
from sim.core.plan import PlanSpec
from sim.core.reliability import ReliabilitySpec
from sim.core.specs import ClusterSpec
from sim.core.training import TrainingSpec
from sim.core.userfiles import read_user_file
from sim.input.cluster import read_cluster
from sim.input.fault_section import read_faults
from sim.input.model import read_model
from sim.input.plan_file import merge_plan
from sim.input.plan_section import check_plan_shape, read_fsdp, read_overlap, read_plan
from sim.input.presets import DEVICE_PRESETS
from sim.input.run_section import read_reliability, read_run_length
from sim.input.stack import StackValue, apply_stack
from sim.input.strict import DATA_DIR, StrictReader, show_text, show_value
from sim.input.yaml_text import load_yaml
from sim.schedule.resolved import ResolvedPlan, resolve_plan

__all__ = ["DATA_DIR", "Scenario", "apply_overrides", "default_optimizer_implementation", "load_scenario",
           "parse_scenario"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """Everything one simulation needs, checked."""

    name: str
    """Display name; the file's stem when the file gives none."""
    cluster: ClusterSpec
    """The machines."""
    model: ModelSpec
    """The layers."""
    training: TrainingSpec
    """Global batch and micro-batch size."""
    plan: PlanSpec | None
    """Stages and schedule; None lets the planner decide."""
    faults: tuple = ()
    """Injected faults (``sim.core.faults``: stragglers, jitter, slow links, failures)."""
    path: str = ""
    """The file it was read from."""
    device_defaults: tuple[tuple[str, str], ...] = ()
    """``(key, value used)`` for each ``cluster.device`` key the file left out and a documented
    default filled in (``sim.input.cluster.CUSTOM_DEVICE_DEFAULTS``), in that table's order;
    empty for a preset device. ``dapple-sim check`` reports them."""
    ignored_plan: bool = False
    """The file had a plan that the loader was asked to ignore (the planner chooses its own)."""
    stack: str = "none"
    """The training stack whose defaults filled the keys the file left open (``sim.input.stack``)."""
    stack_values: tuple[StackValue, ...] = ()
    """The values the stack set, each with its citation (``dapple-sim check`` lists them)."""
    overlap: OverlapSpec = OverlapSpec()
    """What a plan of this scenario overlaps: the file's ``plan.overlap`` (its plan's, equal to
    ``plan.overlap``), else its stack's; the planner gives its candidates these."""
    fsdp: FsdpSpec = FsdpSpec()
    """How a plan of this scenario shards by unit: the file's ``plan.fsdp``, else its stack's."""
    reliability: ReliabilitySpec | None = None
    """How the run fails, checkpoints and restarts (``reliability:``); None: no failures modelled."""
    _resolved: ResolvedPlan | None = field(default=None, init=False, repr=False, compare=False)
    """The plan resolved on this scenario's model, cluster and training (:attr:`resolved`),
    once built. Not an ``__init__`` argument, so ``dataclasses.replace`` starts the copy
    without it: a copy with another plan, model, cluster or training resolves its own."""

    @property
    def resolved(self) -> ResolvedPlan:
        """The plan's schedule IR, lowered IR, K_i policies, sharded model and stage costs
        (``sim.schedule.resolved.resolve_plan``), built on first use and kept: the reader's,
        when it built one to check the plan. Raises ``DappleError`` when there is no plan."""
        if self._resolved is None:
            if self.plan is None:
                raise DappleError(f"{self.path or self.name}: plan: missing; a scenario without a plan has "
                                  "nothing to resolve (add a plan, or let the planner choose one)")
            _keep_resolved(self, resolve_plan(self.plan, self.model, self.cluster, self.training))
        return self._resolved

    def without_faults(self) -> Scenario:
        """This scenario with no faults, keeping its resolved plan (faults do not enter it)."""
        clean = replace(self, faults=())
        if self._resolved is not None:
            _keep_resolved(clean, self._resolved)
        return clean


def _keep_resolved(scenario: Scenario, resolved: ResolvedPlan) -> None:
    """Cache ``resolved`` on ``scenario``: a value derived from its frozen fields, so setting it
    once does not change what the scenario is."""
    assert resolved.plan is scenario.plan, "a resolved plan belongs to its scenario's plan"
    object.__setattr__(scenario, "_resolved", resolved)


# --- loading -------------------------------------------------------------------------------


def load_scenario(
    path: str | Path, overrides: Mapping[str, str] | None = None, *, plan: Mapping[str, Any] | None = None,
    ignore_plan: bool = False,
) -> Scenario:
    """Read and check the scenario at ``path``; ``overrides`` maps dotted keys to YAML values.

    ``plan`` (a plan file's mapping, see ``sim.input.plan_file``) replaces the scenario's plan;
    ``ignore_plan`` leaves the file's plan out before anything checks it (the planner's view:
    a plan written for another cluster must not stop a search on this one).
    """
    path = Path(path)
    text = read_user_file(path, "scenario file", ScenarioError)
    return parse_scenario(text, source=str(path), base_dir=path.resolve().parent, overrides=overrides, plan=plan,
                          ignore_plan=ignore_plan)


def parse_scenario(
    text: str,
    *,
    source: str = "<scenario>",
    base_dir: Path | None = None,
    overrides: Mapping[str, str] | None = None,
    plan: Mapping[str, Any] | None = None,
    ignore_plan: bool = False,
) -> Scenario:
    """Check scenario ``text`` (YAML, read within ``sim.input.yaml_text``'s limits) and build its specs."""
    raw = load_yaml(text, where=source, error=ScenarioError)
    reader = StrictReader(source, base_dir or Path.cwd())
    if raw is None:
        raise ScenarioError(f"{source}: the file is empty; a scenario is a mapping with cluster, model, training (and plan)")
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: a scenario is a mapping with cluster, model, training (and plan); got {show_value(raw)}")
    if plan is not None:
        raw = merge_plan(raw, plan, source=source)
    if overrides:
        raw = apply_overrides(raw, overrides, source=source)
    raw, stack, stack_values = apply_stack(raw, source=source)  # after --plan and --set: they win over it
    ignored = ignore_plan and raw.get("plan") is not None
    # how plans overlap and shard is the file's, else the stack's, even for the planner's own plans
    settings = raw.get("plan")
    if not isinstance(settings, dict):  # no plan: the stack's plan settings still hold for the planner's
        planless, _, values = apply_stack({"stack": stack, "plan": {}}, source=source)
        settings = planless["plan"]
        stack_values += tuple(v for v in values if v.key.startswith(_PLANNER_SETTINGS))
    overlap = read_overlap(reader, settings.get("overlap", {}))
    fsdp = read_fsdp(reader, settings.get("fsdp", {}))
    if ignore_plan:
        if ignored:  # not checked against this cluster, but a plan that is no plan is a typo
            check_plan_shape(reader, raw["plan"])
        raw = {key: value for key, value in raw.items() if key != "plan"}
    reader.keys(raw, "", allowed={"name", "cluster", "model", "training", "plan", "faults", "reliability"},
                required={"cluster", "model", "training"})
    name = reader.string(raw, "", "name", Path(source).stem)
    cluster, device_defaults = read_cluster(reader, raw["cluster"])
    model = read_model(reader, raw["model"], default_implementation=default_optimizer_implementation(cluster),
                       default_attention=cluster.device.default_attention)
    training = _training(reader, raw["training"], model, planning=ignore_plan)
    reliability = read_reliability(reader, raw.get("reliability"))
    faults = read_faults(reader, raw.get("faults", []), cluster)
    resolved = read_plan(reader, raw["plan"], cluster, model, training) if raw.get("plan") is not None else None
    scenario = Scenario(name=name, cluster=cluster, model=model, training=training,
                        plan=None if resolved is None else resolved.plan, faults=faults, path=source,
                        device_defaults=device_defaults, ignored_plan=ignored, stack=stack,
                        stack_values=tuple(v for v in stack_values if _kept(v, ignored)), overlap=overlap, fsdp=fsdp,
                        reliability=reliability)
    if resolved is not None:  # what the reader built to check the plan, kept for the compiler
        _keep_resolved(scenario, resolved)
    return scenario


_PLANNER_SETTINGS = ("plan.overlap.", "plan.fsdp.")
"""The plan keys a stack sets that hold for every plan, the planner's too."""


def _kept(value: StackValue, ignored: bool) -> bool:
    """Whether a stack's value still holds once the file's plan is ignored: its overlap and
    FSDP settings do (the planner's plans get them), the rest of its plan keys do not."""
    return not (ignored and value.key.startswith("plan.")) or value.key.startswith(_PLANNER_SETTINGS)


def default_optimizer_implementation(cluster: ClusterSpec) -> str:
    """The optimizer implementation a scenario gets when it names none: ``fused`` on a preset
    device (GPUs, where Megatron-LM and DeepSpeed run apex's or Transformer Engine's
    ``FusedAdam``), ``for-loop`` on a custom device (what torch runs on a CPU, the device
    ``dapple-run profile`` measures)."""
    return "fused" if cluster.device.name in DEVICE_PRESETS else "for-loop"


_SHORTHANDS = {("plan", "schedule"): "name", ("cluster", "device"): "name", ("model", "optimizer"): "name"}
"""Keys that take a name or a mapping: the mapping key a plain name stands for."""


def apply_overrides(raw: dict, overrides: Mapping[str, str], *, source: str = "<scenario>") -> dict:
    """Return a copy of ``raw`` with each dotted key set to its value read as YAML.

    ``plan.stages.0.devices=[0, 1]`` indexes lists by number; missing mappings are created.
    A ``--set`` that ``sim.core.command.parse_overrides`` could not split into KEY=VALUE is
    reported here, where the file it applies to is known. A value is read as YAML within
    ``sim.input.yaml_text``'s limits; what a message echoes of a key is at most 60 characters.
    """
    raw = copy.deepcopy(raw)
    for dotted, text in overrides.items():
        shown = show_text(str(dotted))
        if isinstance(text, MalformedOverride):
            raise ScenarioError(f"{source}: {text.problem}")
        value = load_yaml(text, where=f"{source}: --set {shown}", error=ScenarioError) if isinstance(text, str) \
            else text
        parts = [p for p in str(dotted).split(".")]
        if not all(parts):
            raise ScenarioError(f"{source}: --set {shown!r}: write a dotted key such as training.microbatch_size")
        node = raw
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            if isinstance(node, list):
                if not (part.isascii() and part.isdigit()) or len(part) > 18 or int(part) >= len(node):
                    raise ScenarioError(f"{source}: --set {shown}: {show_text(part)!r} is not an index of a "
                                        f"{len(node)}-item list")
                part = int(part)
            elif not isinstance(node, dict):
                raise ScenarioError(f"{source}: --set {shown}: {show_text('.'.join(parts[:depth]))} is not a mapping")
            if last:
                node[part] = value
            else:
                if isinstance(node, dict) and not isinstance(node.get(part), (dict, list)):
                    # a name written for a mapping keeps its meaning (``schedule: dapple`` is
                    # ``{name: dapple}``, so --set plan.schedule.policy=... extends it)
                    shorthand = _SHORTHANDS.get(tuple(str(x) for x in parts[:depth + 1]))
                    old = node.get(part)
                    node[part] = {shorthand: old} if shorthand and isinstance(old, str) else {}
                node = node[part]
    return raw


# --- sections ---------------------------------------------------------------------------


def _training(reader: StrictReader, data: Any, model: ModelSpec, *, planning: bool = False) -> TrainingSpec:
    """The training sizes and the run's length (``sim.input.run_section``); the planner
    (``planning``) chooses the micro-batch size itself, so there it may be left out (it then
    defaults to the global batch)."""
    data = reader.mapping(data, "training")
    reader.keys(data, "training", allowed={"global_batch_size", "microbatch_size", "tokens", "steps"},
                required={"global_batch_size"} if planning else {"global_batch_size", "microbatch_size"})
    global_batch_size = reader.integer(data, "training", "global_batch_size")
    microbatch = reader.integer(data, "training", "microbatch_size") if "microbatch_size" in data or not planning \
        else global_batch_size
    steps, tokens = read_run_length(reader, data, model, global_batch_size)
    return reader.build("training", TrainingSpec, global_batch_size=global_batch_size, microbatch_size=microbatch,
                        steps=steps, tokens=tokens)

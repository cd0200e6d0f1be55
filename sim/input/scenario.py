"""Scenario files: the user's YAML, read strictly into specs.

A scenario names a cluster, a model, a training set-up and optionally a plan (the layout is
in ARCHITECTURE.md and ``scenarios/``). Reading it is the one place where a user's typo
meets the program, so every problem becomes one line that names the file, the dotted key,
the bad value and what would be valid::

    run.yaml: cluster.device.memroy: unknown key; did you mean 'memory'? valid: efficiency, ...
    run.yaml: plan.stages[1].layers: [30, 53] leaves a gap after the previous stage's end 27; ...

Unknown keys, missing keys, wrong types, missing or wrong units, non-positive sizes, device
ids out of range or used twice, layer ranges with gaps or overlaps, more stages than
layers, and schedules that cannot run are all rejected here (``ScenarioError``, exit code 2
in the CLI). ``overrides`` (``--set key=value``) are applied to the raw mapping first, so
they are checked like the file itself.

Relative paths (``profile``, ``schedule_file``) are resolved against the scenario's folder;
a profile that is not there is looked up in the package's data folder, so
``profiles/dapple-v100/bert-48-pbs-2.txt`` works from anywhere.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from sim.errors import DappleError, ScenarioError, ScheduleError, SpecError, read_user_file
from sim.input.strict import DATA_DIR, StrictReader, join_key, show_value
from sim.input.presets import CLUSTER_PRESETS, DEVICE_PRESETS
from sim.specs import (
    ClusterSpec,
    DeviceSpec,
    LinkSpec,
    ModelSpec,
    TrainingSpec,
)
from sim.plan import PlanSpec, StageSpec, check_plan
from sim.units import parse_bandwidth, parse_bytes, parse_flop_rate, parse_time

__all__ = ["DATA_DIR", "Scenario", "load_scenario", "parse_scenario", "apply_overrides"]

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
    """Injected faults (``sim.faults``: stragglers, jitter, slow links, failures)."""
    path: str = ""
    """The file it was read from."""


# --- loading -------------------------------------------------------------------------------


def load_scenario(
    path: str | Path, overrides: Mapping[str, str] | None = None, *, plan: Mapping[str, Any] | None = None
) -> Scenario:
    """Read and check the scenario at ``path``; ``overrides`` maps dotted keys to YAML values.

    ``plan`` (a plan file's mapping, see ``sim.input.plan_file``) replaces the scenario's plan.
    """
    path = Path(path)
    text = read_user_file(path, "scenario file", ScenarioError)
    return parse_scenario(text, source=str(path), base_dir=path.resolve().parent, overrides=overrides, plan=plan)


def parse_scenario(
    text: str,
    *,
    source: str = "<scenario>",
    base_dir: Path | None = None,
    overrides: Mapping[str, str] | None = None,
    plan: Mapping[str, Any] | None = None,
) -> Scenario:
    """Check scenario ``text`` (YAML) and build its specs."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{source}: not valid YAML{where}: {problem}") from None
    reader = StrictReader(source, base_dir or Path.cwd())
    if raw is None:
        raise ScenarioError(f"{source}: the file is empty; a scenario is a mapping with cluster, model, training (and plan)")
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: a scenario is a mapping with cluster, model, training (and plan); got {show_value(raw)}")
    if plan is not None:
        from sim.input.plan_file import merge_plan

        raw = merge_plan(raw, plan, source=source)
    if overrides:
        raw = apply_overrides(raw, overrides, source=source)
    reader.keys(raw, "", allowed={"name", "cluster", "model", "training", "plan", "faults"},
                required={"cluster", "model", "training"})
    name = reader.string(raw, "", "name", Path(source).stem)
    cluster = _cluster(reader, raw["cluster"])
    model = _model(reader, raw["model"])
    training = _training(reader, raw["training"])
    faults = _faults(reader, raw.get("faults", []), cluster)
    plan = _plan(reader, raw["plan"], cluster, model, training) if raw.get("plan") is not None else None
    return Scenario(name=name, cluster=cluster, model=model, training=training, plan=plan, faults=faults, path=source)


def apply_overrides(raw: dict, overrides: Mapping[str, str], *, source: str = "<scenario>") -> dict:
    """Return a copy of ``raw`` with each dotted key set to its value read as YAML.

    ``plan.stages.0.devices=[0, 1]`` indexes lists by number; missing mappings are created.
    """
    raw = copy.deepcopy(raw)
    for dotted, text in overrides.items():
        try:
            value = yaml.safe_load(text) if isinstance(text, str) else text
        except yaml.YAMLError:
            raise ScenarioError(f"{source}: --set {dotted}: cannot read value {text!r} as YAML") from None
        parts = [p for p in str(dotted).split(".")]
        if not all(parts):
            raise ScenarioError(f"{source}: --set {dotted!r}: write a dotted key such as training.microbatch_size")
        node = raw
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ScenarioError(f"{source}: --set {dotted}: {part!r} is not an index of a {len(node)}-item list")
                part = int(part)
            elif not isinstance(node, dict):
                raise ScenarioError(f"{source}: --set {dotted}: {'.'.join(parts[:depth])} is not a mapping")
            if last:
                node[part] = value
            else:
                if isinstance(node, dict) and not isinstance(node.get(part), (dict, list)):
                    node[part] = {}
                node = node[part]
    return raw


# --- sections ------------------------------------------------------------------------------

_CLUSTER_KEYS = {"preset", "name", "nodes", "devices_per_node", "device", "intra_node", "inter_node", "nics_per_node"}
_DEVICE_KEYS = {"name", "memory", "peak_flops", "peak_fp32_flops", "memory_bandwidth", "efficiency",
                "matmul_half_dim", "kernel_overhead", "memory_efficiency", "action_overhead"}
_LINK_KEYS = {"bandwidth", "latency", "name", "send_overhead", "send_bandwidth", "recv_overhead"}


def _cluster(reader: StrictReader, data: Any) -> ClusterSpec:
    data = reader.mapping(data, "cluster")
    reader.keys(data, "cluster", allowed=_CLUSTER_KEYS)
    preset_name = data.get("preset")
    if preset_name is not None:
        preset_name = reader.string(data, "cluster", "preset", choices=CLUSTER_PRESETS)
        merged = {**copy.deepcopy(dict(CLUSTER_PRESETS[preset_name])), "name": preset_name}
        for name, value in data.items():
            if name in ("intra_node", "inter_node") and isinstance(value, dict):
                merged[name] = {**merged[name], **value}
            elif name == "device" and isinstance(value, dict) and "name" not in value:
                merged[name] = {"name": merged[name], **value}  # override some of the preset's device
            elif name != "preset":
                merged[name] = value
        data = merged
    reader.keys(data, "cluster", allowed=_CLUSTER_KEYS,
                required={"nodes", "devices_per_node", "device", "intra_node", "inter_node"})
    return reader.build(
        "cluster",
        ClusterSpec,
        name=reader.string(data, "cluster", "name") if "name" in data else "",
        nodes=reader.integer(data, "cluster", "nodes"),
        devices_per_node=reader.integer(data, "cluster", "devices_per_node"),
        nics_per_node=reader.integer(data, "cluster", "nics_per_node", 1),
        device=_device(reader, data["device"]),
        intra_node=_link(reader, data["intra_node"], "cluster.intra_node"),
        inter_node=_link(reader, data["inter_node"], "cluster.inter_node"),
    )


def _device(reader: StrictReader, data: Any) -> DeviceSpec:
    key = "cluster.device"
    if isinstance(data, str):
        data = {"name": data}
    data = reader.mapping(data, key)
    reader.keys(data, key, allowed=_DEVICE_KEYS, required={"name"})
    name = reader.string(data, key, "name")
    preset = DEVICE_PRESETS.get(name)
    if preset is None:
        missing = sorted({"memory", "peak_flops", "peak_fp32_flops", "memory_bandwidth"} - set(data))
        if missing:
            raise reader.fail(
                join_key(key, missing[0]),
                f"missing for device {name!r}, which is not a preset ({', '.join(sorted(DEVICE_PRESETS))}); "
                "a custom device needs memory, peak_flops, peak_fp32_flops and memory_bandwidth",
            )
        preset = {}
    values = {**preset, **data}
    numbers = {}
    for field, default in (("efficiency", 0.5), ("matmul_half_dim", 0.0), ("memory_efficiency", 1.0)):
        value = values.get(field, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise reader.fail(join_key(key, field), f"must be a number, got {show_value(value)}")
        numbers[field] = float(value)
    return reader.build(
        key,
        DeviceSpec,
        name=name,
        memory_bytes=reader.quantity(values, key, "memory", parse_bytes),
        peak_flop_per_s=reader.quantity(values, key, "peak_flops", parse_flop_rate),
        peak_fp32_flop_per_s=reader.quantity(values, key, "peak_fp32_flops", parse_flop_rate),
        memory_bandwidth_bytes_per_s=reader.quantity(values, key, "memory_bandwidth", parse_bandwidth),
        kernel_overhead_s=reader.quantity(values, key, "kernel_overhead", parse_time, "0s"),
        action_overhead_s=reader.quantity(values, key, "action_overhead", parse_time, "0s"),
        **numbers,
    )


def _link(reader: StrictReader, data: Any, key: str) -> LinkSpec:
    data = reader.mapping(data, key)
    reader.keys(data, key, allowed=_LINK_KEYS, required={"bandwidth"})
    label = data.get("name", "")
    if not isinstance(label, str):
        raise reader.fail(join_key(key, "name"), f"must be a string, got {show_value(label)}")
    return reader.build(
        key,
        LinkSpec,
        bandwidth_bytes_per_s=reader.quantity(data, key, "bandwidth", parse_bandwidth),
        latency_s=reader.quantity(data, key, "latency", parse_time, "0s"),
        name=label,
        send_overhead_s=reader.quantity(data, key, "send_overhead", parse_time, "0s"),
        send_bandwidth_bytes_per_s=reader.quantity(data, key, "send_bandwidth", parse_bandwidth)
        if "send_bandwidth" in data else None,
        recv_overhead_s=reader.quantity(data, key, "recv_overhead", parse_time, "0s"),
    )


def _model(reader: StrictReader, data: Any) -> ModelSpec:
    from sim.models import MODEL_PRESETS, PRESET_PARAMS, build_model
    from sim.input.profiles import load_profile

    data = reader.mapping(data, "model")
    if ("profile" in data) == ("preset" in data):
        raise reader.fail("model", "give either 'profile' (a measured profile file) or 'preset' (gpt, bert, vgg, mlp)")
    if "profile" in data:
        reader.keys(data, "model", allowed={"profile", "profile_batch_size", "optimizer", "dtype", "name"},
                    required={"profile", "profile_batch_size"})
        path = reader.path(data["profile"], "model.profile", data_fallback=True)
        try:
            model = load_profile(
                path,
                profile_batch_size=reader.integer(data, "model", "profile_batch_size"),
                dtype=reader.string(data, "model", "dtype", "fp32"),
                optimizer=reader.string(data, "model", "optimizer", "adam"),
            )
        except SpecError as exc:
            raise reader.fail(join_key("model", exc.key), exc.problem) from None
        except DappleError as exc:
            raise reader.fail("model.profile", str(exc)) from None
        return model if "name" not in data else _renamed(model, reader.string(data, "model", "name"))
    preset = reader.string(data, "model", "preset", choices=MODEL_PRESETS)
    params = {k: v for k, v in data.items() if k not in ("preset", "name")}
    reader.keys(params, "model", allowed=set(PRESET_PARAMS[preset]))
    try:
        model = build_model(preset, **params)
    except SpecError as exc:
        raise reader.fail(join_key("model", exc.key), exc.problem) from None
    except (TypeError, ValueError) as exc:
        raise reader.fail("model", f"cannot build preset {preset!r}: {exc}") from None
    return model if "name" not in data else _renamed(model, reader.string(data, "model", "name"))


def _renamed(model: ModelSpec, name: str) -> ModelSpec:
    from dataclasses import replace

    return replace(model, name=name)


def _training(reader: StrictReader, data: Any) -> TrainingSpec:
    data = reader.mapping(data, "training")
    reader.keys(data, "training", allowed={"global_batch_size", "microbatch_size"},
                required={"global_batch_size", "microbatch_size"})
    return reader.build(
        "training",
        TrainingSpec,
        global_batch_size=reader.integer(data, "training", "global_batch_size"),
        microbatch_size=reader.integer(data, "training", "microbatch_size"),
    )


_FAULT_KEYS = {
    "straggler": {"type", "device", "slowdown", "from"},
    "jitter": {"type", "distribution", "spread", "seed", "devices"},
    "slow_link": {"type", "nic", "device", "factor"},
    "failure": {"type", "device", "at"},
}


_FAULT_REQUIRED = {"straggler": {"device", "slowdown"}, "jitter": set(), "slow_link": {"factor"},
                   "failure": {"device", "at"}}


def _faults(reader: StrictReader, data: Any, cluster: ClusterSpec) -> tuple:
    """The ``faults:`` list (see ``sim.faults``), with device and NIC ids checked against the cluster."""
    from sim.faults import FAULT_TYPES, Failure, Jitter, SlowLink, Straggler

    if data is None:
        return ()
    if not isinstance(data, list):
        raise reader.fail("faults", f"must be a list of faults ({', '.join(FAULT_TYPES)}), got {show_value(data)}")
    faults = []
    for index, item in enumerate(data):
        key = f"faults[{index}]"
        item = reader.mapping(item, key)
        kind = reader.string(item, key, "type", choices=FAULT_TYPES)
        reader.keys(item, key, allowed=_FAULT_KEYS[kind], required=_FAULT_REQUIRED[kind])
        if kind == "straggler":
            fault = reader.build(key, Straggler, device=_fault_device(reader, item, key, "device", cluster.num_devices),
                                 slowdown=_number(reader, item, key, "slowdown"),
                                 from_s=reader.quantity(item, key, "from", parse_time, "0s"))
        elif kind == "failure":
            fault = reader.build(key, Failure, device=_fault_device(reader, item, key, "device", cluster.num_devices),
                                 at_s=reader.quantity(item, key, "at", parse_time))
        elif kind == "slow_link":
            nics = cluster.nodes * cluster.nics_per_node
            fault = reader.build(
                key, SlowLink, factor=_number(reader, item, key, "factor"),
                nic=_fault_device(reader, item, key, "nic", nics) if "nic" in item else None,
                device=_fault_device(reader, item, key, "device", cluster.num_devices) if "device" in item else None,
            )
        else:
            devices = _devices(reader, item["devices"], join_key(key, "devices"), cluster.num_devices) \
                if "devices" in item else None
            fault = reader.build(key, Jitter, distribution=reader.string(item, key, "distribution", "normal"),
                                 spread=_number(reader, item, key, "spread", 0.05),
                                 seed=reader.integer(item, key, "seed", 0, minimum=0), devices=devices)
        faults.append(fault)
    return tuple(faults)


def _number(reader: StrictReader, data: dict, key: str, name: str, default: Any = None) -> float:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise reader.fail(join_key(key, name), f"must be a number, got {show_value(value)}")
    return float(value)


def _fault_device(reader: StrictReader, data: dict, key: str, name: str, count: int) -> int:
    value = reader.integer(data, key, name, minimum=0)
    if value >= count:
        what = "network cards" if name == "nic" else "devices"
        raise reader.fail(join_key(key, name), f"{value} does not exist; the cluster has {what} 0 to {count - 1}")
    return value


def _plan(reader: StrictReader, data: Any, cluster: ClusterSpec, model: ModelSpec, training: TrainingSpec) -> PlanSpec:
    from sim.schedule.plan_schedule import parse_schedule_for_plan, schedule_for_plan

    data = reader.mapping(data, "plan")
    reader.keys(data, "plan", allowed={"schedule", "schedule_file", "stages", "recompute"}, required={"stages"})
    if "schedule" in data and "schedule_file" in data:
        raise reader.fail("plan", "give either 'schedule' (a generator name) or 'schedule_file', not both")
    stages_raw = data["stages"]
    if not isinstance(stages_raw, list) or not stages_raw:
        raise reader.fail("plan.stages", f"must be a non-empty list of {{layers: [start, end], devices: [...]}}, got {show_value(stages_raw)}")
    stages = tuple(_stage(reader, item, f"plan.stages[{i}]", cluster.num_devices) for i, item in enumerate(stages_raw))
    name, params = ("file", {}) if "schedule_file" in data else _schedule_name(reader, data.get("schedule", "dapple"))
    plan = reader.build(
        "plan",
        PlanSpec,
        stages=stages,
        schedule=name,
        schedule_params=tuple(sorted(params.items())),
        recompute=reader.boolean(data, "plan", "recompute", False),
        schedule_file=str(reader.path(data["schedule_file"], "plan.schedule_file", data_fallback=False))
        if "schedule_file" in data
        else None,
    )
    try:
        check_plan(plan, num_layers=model.num_layers, num_devices=cluster.num_devices)
    except SpecError as exc:
        raise reader.fail(join_key("plan", exc.key), exc.problem) from None
    try:
        if plan.schedule_file is not None:
            text = Path(plan.schedule_file).read_text(encoding="utf-8")
            from dataclasses import replace

            plan = replace(plan, custom_schedule=parse_schedule_for_plan(plan, training.num_microbatches, text))
        else:
            schedule_for_plan(plan, training.num_microbatches)
    except ScheduleError as exc:
        key = "plan.schedule_file" if plan.schedule_file else "plan.schedule"
        raise ScenarioError(f"{reader.source}: {key}: {exc}" + (f"\n{exc.detail}" if exc.detail else "")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise reader.fail("plan.schedule_file", f"cannot read ({exc.__class__.__name__})") from None
    return plan


def _schedule_name(reader: StrictReader, value: Any) -> tuple[str, dict]:
    from sim.schedule.generators import GENERATORS

    if isinstance(value, str):
        value = {"name": value}
    data = reader.mapping(value, "plan.schedule")
    reader.keys(data, "plan.schedule", allowed={"name", "policy", "chunks"}, required={"name"})
    name = reader.string(data, "plan.schedule", "name", choices=GENERATORS)
    params = {}
    if "policy" in data:
        params["policy"] = reader.string(data, "plan.schedule", "policy", choices={"s-i", "2(s-i)-1"})
    if "chunks" in data:
        params["chunks"] = reader.integer(data, "plan.schedule", "chunks")
    return name, params


def _stage(reader: StrictReader, data: Any, key: str, num_devices: int) -> StageSpec:
    data = reader.mapping(data, key)
    reader.keys(data, key, allowed={"layers", "devices"}, required={"layers", "devices"})
    layers = data["layers"]
    if (
        not isinstance(layers, list)
        or len(layers) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
    ):
        raise reader.fail(join_key(key, "layers"), f"must be [start, end] (two integers, end exclusive), got {show_value(layers)}")
    devices = _devices(reader, data["devices"], join_key(key, "devices"), num_devices)
    return reader.build(key, StageSpec, layers=(layers[0], layers[1]), devices=devices)


def _devices(reader: StrictReader, value: Any, key: str, count: int) -> tuple[int, ...]:
    """Device ids from a list (``[0, 1, 2]``), an integer, or ranges text (``"0-7, 16-23"``);
    ids must be below ``count`` (checked before a range is expanded)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, str):
        devices: list[int] = []
        for part in value.split(","):
            lo, _, hi = part.strip().partition("-")
            if not lo.strip().isdigit() or (hi and not hi.strip().isdigit()):
                raise reader.fail(key, f"cannot read {value!r}; write a list [0, 1] or ranges '0-7, 16-23'")
            first, last = int(lo), int(hi) if hi else int(lo)
            if last < first:
                raise reader.fail(key, f"range {part.strip()!r} runs backwards; write low-high")
            if last >= count:
                raise reader.fail(key, f"device {last} does not exist; the cluster has devices 0 to {count - 1}")
            devices.extend(range(first, last + 1))
        return tuple(devices)
    if not isinstance(value, list) or not value:
        raise reader.fail(key, f"must be a non-empty list of device ids, got {show_value(value)}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int):
            raise reader.fail(key, f"device ids are integers, got {show_value(item)} in {show_value(value)}")
        if not 0 <= item < count:
            raise reader.fail(key, f"device {item} does not exist; the cluster has devices 0 to {count - 1}")
    return tuple(value)

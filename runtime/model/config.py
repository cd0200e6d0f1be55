"""What the runtime needs before any process starts: a runnable model and a plan that fits.

A real run needs the shape parameters that built the model (``layers: 4, hidden: 64, ...``),
not only its per-layer numbers. The checked scenario carries them: a generated model keeps
its generator and every resolved parameter (``ModelSpec.preset``, set by ``sim.models``), so
the runtime reads only what ``sim.input.scenario.load_scenario`` returns, after the same
``--plan`` and ``--set`` overrides the simulator applies, and never the file a second time.

Everything here is checked without torch, in the launching process, so that a scenario
that cannot run (a measured profile instead of a preset, a plan that needs more processes
than were asked for) is rejected in one line before any process starts (exit code 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runtime.model.realisation import SPLIT_BACKWARD_SCHEDULES
from sim.core.errors import DappleError
from sim.core.experts import ExpertSpec
from sim.core.mla import MlaSpec
from sim.core.model_spec import ModelSpec
from sim.core.parallelism import Recompute, Sharding
from sim.core.plan import PlanSpec
from sim.core.specs import ClusterSpec
from sim.input.scenario import Scenario, load_scenario
from sim.models import build_model
from sim.models.vocab import padded_vocab_size

__all__ = [
    "RUNNABLE_PRESETS", "ModelConfig", "RunnableScenario", "check_world", "expert_servers", "load_runnable",
    "model_config",
    "runnable_model",
]

RUNNABLE_PRESETS = ("gpt", "llama", "mlp")
"""Presets that ``runtime.model.models`` can build as torch modules."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """A built-in model's preset and its complete shape parameters (defaults filled in)."""

    preset: str
    """``gpt``, ``llama`` or ``mlp``."""
    params: tuple[tuple[str, Any], ...]
    """Sorted (name, value) pairs: every parameter of the preset, computed defaults resolved
    (the checked model's ``ModelSpec.preset.params``)."""
    experts: ExpertSpec | None = None
    """The MoE blocks' router and experts (``model.experts``; None: a dense model)."""
    tensor_parallel: int = 1
    """The plan's tensor-parallel degree t, which the vocabulary is padded for (``padded_vocab``)."""
    mla: MlaSpec | None = None
    """The blocks' multi-head latent attention (``model.mla``, ``runtime.model.mla``; None:
    multi-head attention)."""
    expert_servers: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
    """Sorted (layer, device, server of each routed expert) triples: the server (0, 1, … within
    the device's expert-parallel group) that holds each expert, as that device routes its tokens
    under node-limited routing (``model.experts.node_limit``, ``expert_servers``; groups that lay
    their ranks over servers differently route with different maps); empty: every expert on one
    server."""
    mtp_depth: int = 0
    """DeepSeek-V3's multi-token-prediction modules (``model.mtp_depth``, ``runtime.model.mtp``); 0: none."""
    gemm_dtype: str | None = None
    """``fp8``: the blocks' weighted products in FP8 with DeepSeek-V3's fine-grained scales
    (``model.gemm_dtype``, ``runtime.model.fp8``); None: in the model's dtype."""
    expert_tensor_parallel: int = 1
    """The plan's expert-tensor-parallel degree, whose cuts of the routed experts FP8's tiles
    respect as they do ``tensor_parallel``'s (``runtime.model.fp8``)."""

    def __post_init__(self) -> None:
        if self.preset not in RUNNABLE_PRESETS:
            raise DappleError(
                f"model.preset: {self.preset!r} has no torch implementation yet; runnable presets: "
                f"{', '.join(RUNNABLE_PRESETS)}"
            )

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.params)

    def servers_of(self, layer: int, device: int | None = None) -> tuple[int, ...] | None:
        """Layer ``layer``'s server of each routed expert as ``device`` routes (None: not given,
        one server). Without a device (a layer built outside the plan: profiling, the unsplit
        reference before ``reference_step`` gives each token its own map) the lowest device's map:
        the map changes which experts a token reaches, not how many."""
        maps = {d: servers for k, d, servers in self.expert_servers if k == layer}
        if not maps:
            return None
        return maps[min(maps)] if device is None else maps.get(device)

    @property
    def padded_vocab(self) -> int | None:
        """Rows of the token table and the head: the vocabulary padded to a multiple of
        ``vocab_divisible_by`` × t, as the simulator counts it (``sim.models.vocab``, Megatron-LM's
        ``--make-vocab-size-divisible-by``); None for a model without a vocabulary (mlp)."""
        p = self.values
        return padded_vocab_size(p["vocab"], p.get("vocab_divisible_by", 1), self.tensor_parallel) \
            if "vocab" in p else None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnableScenario:
    """A checked scenario with a plan, and the model parameters to build it for real."""

    scenario: Scenario
    """The scenario as the simulator reads it (its plan is not None)."""
    model: ModelConfig
    """What ``runtime.model.models.build_layers`` builds."""

    @property
    def plan(self) -> PlanSpec:
        assert self.scenario.plan is not None
        return self.scenario.plan


def runnable_model(model: ModelSpec, *, source: str = "<scenario>", tensor_parallel: int = 1,
                   expert_tensor_parallel: int = 1) -> ModelConfig:
    """The ``ModelConfig`` of a checked model: its generator and resolved parameters (its
    vocabulary padded for ``tensor_parallel``, its FP8 tiles cut for both degrees)."""
    if model.preset is None:
        raise _not_runnable(source, None)
    if model.preset.name not in RUNNABLE_PRESETS:
        raise _not_runnable(source, model.preset.name)
    return ModelConfig(preset=model.preset.name, params=model.preset.params, experts=model.experts,
                       mla=model.mla, tensor_parallel=tensor_parallel, mtp_depth=model.mtp_depth,
                       gemm_dtype=model.gemm_dtype, expert_tensor_parallel=expert_tensor_parallel)


def model_config(raw_model: Mapping[str, Any], *, source: str = "<scenario>") -> ModelConfig:
    """The ``ModelConfig`` of a ``model:`` mapping as a scenario writes it (for tests and tools).

    ``sim.models`` builds the model as the scenario loader does, so every default comes from
    its one table.
    """
    if "profile" in raw_model:
        raise _not_runnable(source, None)
    preset = raw_model.get("preset")
    if preset not in RUNNABLE_PRESETS:
        raise _not_runnable(source, preset)
    params = {key: value for key, value in raw_model.items() if key not in ("preset", "name", "experts", "mla")}
    if "experts" in raw_model:  # the mapping as model.experts writes it (no imbalance draw)
        raw = dict(raw_model["experts"])
        if isinstance(raw.get("layers"), list):
            raw["layers"] = tuple(raw["layers"])
        params["experts"] = ExpertSpec(**raw)
    if "mla" in raw_model:
        params["mla"] = MlaSpec(**raw_model["mla"])
    return runnable_model(build_model(preset, **params), source=source)


def _not_runnable(source: str, preset: Any) -> DappleError:
    """The one-line error for a measured profile (``preset`` None) or a preset without torch layers."""
    if preset is None:
        return DappleError(
            f"{source}: model.profile: a measured profile has no layers to run; use a built-in model "
            f"(model: {{preset: {' or '.join(RUNNABLE_PRESETS)}, ...}})"
        )
    return DappleError(
        f"{source}: model.preset: {preset!r} cannot be built for real yet; runnable presets: "
        f"{', '.join(RUNNABLE_PRESETS)}"
    )


def load_runnable(
    path: str | Path, overrides: Mapping[str, str] | None = None, *, plan: Mapping[str, Any] | None = None
) -> RunnableScenario:
    """Load ``path`` strictly (as ``dapple-sim`` does) and take its runnable model from the result.

    Raises ``DappleError`` (one line) when the scenario has no plan or no buildable model.
    """
    scenario = load_scenario(path, overrides, plan=plan)
    if scenario.plan is None:
        raise DappleError(
            f"{path}: plan: missing; a run needs stages and devices (add a plan: section or pass --plan PLAN.json)"
        )
    _check_runtime_supports(scenario.plan, scenario.model, str(path))
    model = runnable_model(scenario.model, source=str(path), tensor_parallel=scenario.plan.tensor_parallel,
                           expert_tensor_parallel=scenario.plan.expert_tensor_parallel)
    if scenario.model.experts is not None and scenario.model.experts.node_limit is not None:
        blocks = model.values["layers"]
        model = replace(model, expert_servers=expert_servers(scenario.plan, scenario.cluster, scenario.model.experts,
                                                             blocks, str(path), mtp=bool(model.mtp_depth)))
    return RunnableScenario(scenario=scenario, model=model)


def expert_servers(plan: PlanSpec, cluster: ClusterSpec, experts: ExpertSpec, blocks: int,
                   source: str = "<scenario>", *, mtp: bool = False) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
    """Each MoE layer's (block k is layer k + 1, of ``blocks``; with ``mtp`` the MTP layer
    ``blocks + 1`` too where the last block is MoE) server of every routed expert as each device
    sees it, as the simulator lays them: expert e on expert-parallel rank e // (count/EP)
    (Megatron-Core's ``local_expert_indices``), that rank the device ``PlanSpec.expert_groups``
    names, its server ``ClusterSpec.node_of`` (numbered 0, 1, … in the group's order of servers).
    A device routes with its own group's map (DeepSeek-V3 §2.1.2: a token's experts on at most M
    of the servers its dispatch reaches), so groups that straddle servers differently each keep
    their own; the unsplit reference routes each token with the map of the group it is
    dispatched in (``runtime.validation.grad_check.token_servers``)."""
    per_rank, out = experts.count // plan.expert_parallel, []
    for s, stage in enumerate(plan.stages):
        layers = [k for k in range(*stage.layers) if 0 < k <= blocks + mtp and experts.is_moe(min(k, blocks) - 1)]
        for group in plan.expert_groups(s):
            nodes = sorted({cluster.node_of(d) for d in group})
            ranks = tuple(nodes.index(cluster.node_of(d)) for d in group)
            servers = tuple(ranks[e // per_rank] for e in range(experts.count))
            least = min(servers.count(n) for n in set(servers))
            if experts.node_limit < len(set(servers)) and experts.node_limit * least < experts.top_k:
                raise DappleError(f"{source}: model.experts.node_limit: {experts.node_limit} servers of {least} "
                                  f"experts cannot hold a token's top_k {experts.top_k} experts; raise node_limit")
            out += [(k, d, servers) for k in layers for d in group]
    return tuple(sorted(out))


def _check_runtime_supports(plan: PlanSpec, model: ModelSpec, source: str) -> None:
    """What the runtime runs: data × pipeline × context × tensor (with or without sequence
    parallelism) plans of gpt and llama, sharding none, optimizer (ZeRO-1), gradients or full (FSDP2),
    recompute none, selective, selective_op or full; with experts, expert parallelism under each of
    them (node-limited routing, capacity); multi-head latent attention (``runtime.model.mla``) where
    the simulator models it (no tensor or context parallelism); FP8 products (``model.gemm_dtype``,
    ``runtime.model.fp8``). Anything else is one line before
    launch (the simulator models it: ``dapple-sim simulate``)."""
    values = model.preset.values if model.preset is not None else {}
    fsdp = plan.sharding in (Sharding.GRADIENTS, Sharding.FULL)  # runtime.model.sharding.FSDP_SHARDINGS
    split_schedule = plan.schedule in SPLIT_BACKWARD_SCHEDULES or plan.schedule == "file"
    c, t = plan.context_parallel, plan.tensor_parallel
    unsupported = [
        ("model.seq_len", c > 1 and (values.get("seq_len", 0) // c) % t != 0,  # 2c chunks: the scenario's check
         f"stages exchange 1/tensor_parallel of a context rank's 1/context_parallel of the sequence "
         f"(runtime.model.context_parallel): make seq_len a multiple of {c * t}"),
        ("plan.sharding", fsdp and split_schedule,
         "torch 2.13's FSDP2 runs a unit's post-backward (reshard, reduce-scatter) when its input's gradient is done "
         "(RegisterPostBackwardFunction), at a split backward's I, before W computes the weight gradients; use "
         "gpipe, dapple, 1f1b, interleaved or looped-bfs"),
        ("plan.recompute", plan.recompute in (Recompute.SELECTIVE, Recompute.SELECTIVE_OP) and split_schedule,
         "torch's selective activation checkpointing allows one backward through a checkpointed region (\"Trying "
         "to backward an extra time\"), and a split backward's I and W are two; use recompute: full or none"),
        ("model.tied_embeddings", fsdp and _tied_apart(plan, values),
         "FSDP2 manages a parameter in one fully_shard unit, and a tied embedding and head in two stages "
         "of one device set would need it in both; put them in one stage or set tied_embeddings: false"),
        ("model.tied_embeddings", fsdp and bool(values.get("tied_embeddings"))
         and plan.num_replicas(0) != plan.num_replicas(plan.num_stages - 1),
         "FSDP2 shards the embedding's and the head's copies over their stages' replicas, which differ "
         "in number, so no two copies hold the same shard; give both stages as many replicas"),
        ("model.seq_len", plan.tensor_parallel > 1 and values.get("seq_len", 0) % plan.tensor_parallel != 0,
         f"stages exchange 1/tensor_parallel of the sequence: make seq_len a multiple of {plan.tensor_parallel}"),
        ("model.preset", plan.tensor_parallel > 1 and (model.preset is None or model.preset.name not in ("gpt", "llama")),
         "tensor parallelism runs the gpt and llama presets"),
        ("model.fp8_activations", model.fp8_activations,
         "torch has no E5M6 dtype, the 12-bit format DeepSeek-V3 §3.3.3 caches the output projection's input in; "
         "remove model.fp8_activations (model.gemm_dtype: fp8 runs without it)"),
        ("model.optimizer.moment_dtype", model.moment_dtype not in (None, "fp32"),
         "torch.optim's Adam and AdamW keep exp_avg and exp_avg_sq in each parameter's dtype (zeros_like), "
         "so moments narrower than the fp32 master weights cannot be asked of them; remove moment_dtype"),
        ("model.optimizer.grad_dtype", model.grad_dtype not in (None, model.dtype),
         "torch accumulates a parameter's .grad in the parameter's own dtype (Megatron-LM's fp32 main_grad is "
         "a buffer of its own); remove grad_dtype"),
    ]
    if fsdp:
        unsupported += _fsdp_limits(plan)
    if model.experts is not None:
        unsupported += _expert_limits(plan, model.experts)
    if model.mtp_depth:
        unsupported += _mtp_limits(plan, values)
    for key, present, why in unsupported:
        if present:
            raise DappleError(f"{source}: {key}: not supported by the runtime: {why}; dapple-sim simulate models "
                              "this plan")


def _fsdp_limits(plan: PlanSpec) -> list[tuple[str, bool, str]]:
    """The ``plan.fsdp`` knobs FSDP2 (``runtime.model.sharding``) does not run: (key, present, why), as
    ``_check_runtime_supports``. ``unit_layers``, ``reshard_after_forward``, ``reduce_every_microbatch`` and
    ``fp32_shards`` it honours; ``prefetch: false`` it cannot ask (a timing note: ``runtime.model.realisation``)."""
    fsdp = plan.fsdp
    return [
        ("plan.fsdp.path", fsdp.path != "hierarchical",
         "flat is DeepSpeed ZeRO-3's one ring over the group, and FSDP2's collectives take the process group's "
         "own (NCCL's) path; remove path"),
        ("plan.fsdp.max_live_parameters", fsdp.max_live_parameters is not None,
         "DeepSpeed stage 3's stage3_max_live_parameters caps gathered parameters by count, and FSDP2 gathers "
         "whole fully_shard units (two at most: the running one and the prefetched); remove max_live_parameters"),
        ("plan.fsdp.max_reuse_distance", fsdp.max_reuse_distance is not None,
         "DeepSpeed stage 3's stage3_max_reuse_distance gathers a block again for its recompute, and FSDP2 "
         "gathers a unit once per backward; remove max_reuse_distance"),
        ("plan.fsdp.reduce_scatter", not fsdp.reduce_scatter,
         "false is DeepSpeed's all-reduce of ZeRO's gradients, and FSDP2 reduce-scatters them; remove reduce_scatter"),
    ]


def _tied_apart(plan: PlanSpec, values: Mapping[str, Any]) -> bool:
    """A tied embedding and head in different stages of one device set (``interleaved``)."""
    first, last = plan.stages[0], plan.stages[-1]
    return bool(values.get("tied_embeddings")) and first is not last and sorted(first.devices) == sorted(last.devices)


def _expert_limits(plan: PlanSpec, experts: ExpertSpec) -> list[tuple[str, bool, str]]:
    """What ``runtime.model.experts`` does not run: (key, present, why), as ``_check_runtime_supports``."""
    return [
        ("model.experts.imbalance", experts.draw is not None or experts.imbalance != 1.0,
         "imbalance is a cost-model input (the busiest rank's load), not a runtime behaviour: the runtime's "
         "router decides where tokens go; remove imbalance"),
    ]


def _mtp_limits(plan: PlanSpec, values: Mapping[str, Any]) -> list[tuple[str, bool, str]]:
    """What ``runtime.model.mtp`` does not run: (key, present, why), as ``_check_runtime_supports``. The
    mtp layer apart from the head is the scenario loader's refusal already (``sim.models.mtp.check_mtp_stage``)."""
    fsdp, first, last = plan.sharding in (Sharding.GRADIENTS, Sharding.FULL), plan.stages[0], plan.stages[-1]
    return [
        ("plan.sharding", fsdp and first is not last and sorted(first.devices) == sorted(last.devices),
         "FSDP2 manages a parameter in one fully_shard unit, and the mtp layer would read the embedding's table "
         "from another stage of its devices, another unit; put them in one stage or use sharding: none or optimizer"),
        ("plan.sharding", fsdp and not values.get("tied_embeddings") and sorted(first.devices) != sorted(last.devices)
         and plan.num_replicas(0) != plan.num_replicas(plan.num_stages - 1),
         "FSDP2 shards the embedding's table and the mtp layer's copy over their stages' replicas, which differ "
         "in number, so no two copies hold the same shard; give both stages as many replicas"),
    ]


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

"""The layouts and memory levels a 4D search walks through.

A *layout* is how one data-parallel replica of a stage splits every layer: the tensor-parallel
degree t and the context-parallel degree c (sequence parallelism rides on t > 1,
``planner.search.space.Candidate.sequence_parallel``). The search tries:

* t: the degrees that divide the server's GPUs (Megatron-LM keeps a tensor-parallel group
  inside a server, on NVLink: Narayanan et al., SC'21, §3.2, "tensor model parallelism ...
  within a multi-GPU server") and the cluster, and that the model splits evenly (heads, MLP
  width, vocabulary: ``sim.models.shard_model`` says which);
* c: 1, and for sequences of ``CONTEXT_PARALLEL_FROM`` tokens or more the degrees whose t·c
  still divides the cluster (ring attention over the sequence: Megatron-Core's
  ``--context-parallel-size``);
* e, for a model with experts only (a dense model: e = 1, exactly the search without it): the
  expert-parallel degrees that divide the routed experts, inside a server first. Megatron-Core
  folds each stage's t·c·replicas devices into EP × expert-data-parallel for the MoE blocks
  (``PlanSpec.expert_groups``), so e must also divide a stage's devices: a layout (t, c, e) lets
  a stage take only replica counts that make t·c·replicas a multiple of e (``replica_step``).
  By default e stays inside a server (e divides the server's GPUs), where the all-to-all runs
  on NVLink: Megatron-Core's MoE guide keeps EP × TP within a node where it can (its
  "MoE Parallel Folding" and performance best practices, ``megatron/core/transformer/moe/README.md``),
  and DeepSeek-V3 bounds how many servers a token may reach for the same reason (node-limited
  routing, at most 4 servers a token, DeepSeek-AI 2024, §2.1.2 and §3.2.2). Degrees across
  servers are searched when ``PlannerOptions.expert_parallel`` names them;
* a measured profile only has the whole layout (t = c = e = 1).

A *level* is a (recompute, sharding) pair. Levels are ordered by what they cost in time:
recompute first (none, selective, full: each recomputes more), then sharding (none,
optimizer, gradients, full: ZeRO-1/2 need no more traffic than the all-reduce they replace,
ZeRO-3 gathers parameters every action). The search keeps the cheapest levels whose memory fits.
"""

from __future__ import annotations

import math

from planner.search.space import CONTEXT_PARALLEL_FROM, PlannerOptions
from sim.core.errors import DappleError, SpecError
from sim.core.parallelism import Recompute, Shard, Sharding
from sim.input.scenario import Scenario
from sim.models import shard_model

__all__ = ["Layout", "Level", "expert_degrees", "layouts", "levels", "replica_step"]

Layout = tuple[int, int, int]
"""(tensor, context, expert) degrees."""

Level = tuple[Recompute, Sharding]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _splits(scenario: Scenario, t: int, c: int, e: int = 1) -> bool:
    """Whether the model has a share for tensor degree t, context degree c and expert degree e."""
    if t == c == e == 1:
        return True

    try:
        shard_model(scenario.model, Shard(tensor=t, context=c, sequence_parallel=t > 1, expert=e))
    except (SpecError, DappleError):
        return False
    return True


def expert_degrees(scenario: Scenario, options: PlannerOptions) -> tuple[int, ...]:
    """The expert-parallel degrees to search: 1 for a dense model; else the options' degrees, or
    every divisor of the routed experts that divides the server's GPUs (the module docstring).
    A degree the model cannot take is refused in one line (``DappleError`` keyed ``expert_parallel``)."""
    experts = scenario.model.experts
    if experts is None:
        if options.expert_parallel not in (None, (1,)):
            raise DappleError(f"expert_parallel: {scenario.model.name} has no experts (model.experts); "
                              "search it with expert_parallel 1 or give the model experts")
        return (1,)
    cluster = scenario.cluster
    if options.expert_parallel is None:
        return tuple(e for e in _divisors(experts.count) if cluster.devices_per_node % e == 0)
    for e in options.expert_parallel:
        if isinstance(e, bool) or not isinstance(e, int) or e < 1 or experts.count % e \
                or cluster.num_devices % e:
            raise DappleError(f"expert_parallel: {e!r} is not a degree for {experts.count} routed experts on "
                              f"{cluster.num_devices} devices; use a divisor of both, such as "
                              f"{max(d for d in _divisors(experts.count) if cluster.num_devices % d == 0)}")
    return tuple(sorted(set(options.expert_parallel)))


def replica_step(layout: Layout) -> int:
    """The replica counts a stage of layout (t, c, e) may take are the multiples of this: the
    least k with e dividing t·c·k (``PlanSpec``'s check that EP divides a stage's devices)."""
    t, c, e = layout
    return e // math.gcd(e, t * c)


def _tensor_degrees(cluster) -> tuple[int, ...]:
    """Tensor degrees to search: the divisors of the server's GPUs; in a scale-up domain of several
    servers (``cluster.fabric.scale_up``, GB200 NVL72) also the powers of two below it that do not
    divide it (TP 16 in 72 GPUs: four groups a domain, ``space.place`` keeping each inside one)."""
    n, per_node = cluster.num_devices, cluster.devices_per_node
    found = {d for d in _divisors(per_node) if n % d == 0}
    if cluster.fabric is not None and cluster.fabric.servers_per_domain > 1:
        found |= {2 ** i for i in range(1, per_node.bit_length()) if 2 ** i < per_node and n % 2 ** i == 0}
    return tuple(sorted(found))


def layouts(scenario: Scenario, options: PlannerOptions) -> list[Layout]:
    """(t, c, e) triples to search, smallest tensor × context groups first, then by expert degree."""
    cluster = scenario.cluster
    n, per_node = cluster.num_devices, cluster.devices_per_node
    tensor = options.tensor_parallel or _tensor_degrees(cluster)
    preset = scenario.model.preset
    seq_len = int(preset.values.get("seq_len", 0)) if preset is not None else 0
    if options.context_parallel is not None:
        context = options.context_parallel
    elif seq_len >= CONTEXT_PARALLEL_FROM:
        context = tuple(d for d in _divisors(n) if d <= per_node)
    else:
        context = (1,)
    pairs = [(t, c) for t in tensor for c in context if n % (t * c) == 0 and _splits(scenario, t, c)]
    found = [(t, c, e) for t, c in sorted(pairs, key=lambda p: (p[0] * p[1], p)) for e in expert_degrees(scenario, options)
             if n % math.lcm(t * c, e) == 0 and _splits(scenario, t, c, e)]
    if not found and options.expert_parallel is not None:
        raise DappleError(f"expert_parallel: no layout of {', '.join(map(str, options.expert_parallel))} with the "
                          f"tensor and context degrees the model takes divides the {n} devices; use a divisor of {n}")
    return found


def levels(scenario: Scenario, options: PlannerOptions) -> list[Level]:
    """(recompute, sharding) pairs in the order of what they cost, cheapest first; selective
    recompute only for models that have attention to recompute."""
    recompute = [Recompute.of(r) for r in options.recompute]
    if not any(layer.selective_stash_bytes is not None for layer in scenario.model.layers):
        recompute = [r for r in recompute if r is not Recompute.SELECTIVE]
    order = {r: i for i, r in enumerate(Recompute)}
    shard_order = {s: i for i, s in enumerate(Sharding)}
    return [(r, s) for r in sorted(dict.fromkeys(recompute), key=order.get)
            for s in sorted(dict.fromkeys(options.sharding), key=shard_order.get)]

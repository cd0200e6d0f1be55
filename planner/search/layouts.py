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
* a measured profile only has the whole layout (t = c = 1).

A *level* is a (recompute, sharding) pair. Levels are ordered by what they cost in time:
recompute first (none, selective, full: each recomputes more), then sharding (none,
optimizer, gradients, full: ZeRO-1/2 need no more traffic than the all-reduce they replace,
ZeRO-3 gathers parameters every action). The search keeps the cheapest levels whose memory fits.
"""

from __future__ import annotations

from planner.search.space import CONTEXT_PARALLEL_FROM, PlannerOptions
from sim.core.errors import DappleError, SpecError
from sim.core.parallelism import Recompute, Shard, Sharding
from sim.input.scenario import Scenario
from sim.models import shard_model

__all__ = ["Level", "layouts", "levels"]

Level = tuple[Recompute, Sharding]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _splits(scenario: Scenario, t: int, c: int) -> bool:
    """Whether the model has a share for tensor degree t and context degree c."""
    if t == c == 1:
        return True

    try:
        shard_model(scenario.model, Shard(tensor=t, context=c, sequence_parallel=t > 1))
    except (SpecError, DappleError):
        return False
    return True


def layouts(scenario: Scenario, options: PlannerOptions) -> list[tuple[int, int]]:
    """(t, c) pairs to search, smallest groups first."""
    cluster = scenario.cluster
    n, per_node = cluster.num_devices, cluster.devices_per_node
    tensor = options.tensor_parallel or tuple(d for d in _divisors(per_node) if n % d == 0)
    preset = scenario.model.preset
    seq_len = int(preset.values.get("seq_len", 0)) if preset is not None else 0
    if options.context_parallel is not None:
        context = options.context_parallel
    elif seq_len >= CONTEXT_PARALLEL_FROM:
        context = tuple(d for d in _divisors(n) if d <= per_node)
    else:
        context = (1,)
    pairs = [(t, c) for t in tensor for c in context if n % (t * c) == 0 and _splits(scenario, t, c)]
    return sorted(pairs, key=lambda p: (p[0] * p[1], p))


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

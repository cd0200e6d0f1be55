"""Planning on a subset of the devices, when the cluster's size factors badly.

A plan's degrees multiply to the devices it uses: pipeline × data × tensor × context. A
cluster of 641 servers (5,128 GPUs; 641 is prime) leaves a planner pipeline depths of 1, 2,
4, 8 or 641 over whole servers, and a model that needs 35 stages to fit has no plan on all
of them; on 640 servers (2⁷·5) it has dozens. Large jobs are launched so: Megatron-Core
refuses a world size that is not a multiple of tensor × pipeline × context
(``megatron/core/parallel_state.py``, ``initialize_model_parallel``: "world_size (...) is not
divisible by tensor_model_parallel_size ..."), so a user leaves the rest of the allocation idle.

``subset_sizes`` gives the device counts to plan on besides all of them: when the number of
servers (of GPUs, on a one-server cluster) has a prime factor above ``SMOOTH_PRIMES``, the
largest count below it whose prime factors are all at most ``SMOOTH_PRIMES``. A plan found on
such a subset runs on the whole cluster with the last servers (or GPUs) idle
(``Candidate.on_devices``), so it is replayed and compared there, against the best on all.
"""

from __future__ import annotations

from dataclasses import replace

from planner.search.space import restrict_cluster
from sim.core.specs import ClusterSpec
from sim.input.scenario import Scenario

__all__ = ["SMOOTH_PRIMES", "restricted", "smooth", "subset_sizes"]

SMOOTH_PRIMES = 7
"""A count factors well when its prime factors are all at most this (2, 3, 5, 7: the pipeline
and data degrees people use)."""


def smooth(n: int) -> bool:
    """Whether every prime factor of ``n`` is at most ``SMOOTH_PRIMES``."""
    for p in (2, 3, 5, 7):
        while n % p == 0:
            n //= p
    return n == 1


def subset_sizes(cluster: ClusterSpec) -> tuple[int, ...]:
    """Device counts below the cluster's to plan on too (the module docstring); empty when its
    size factors well."""
    per_node = cluster.devices_per_node
    count = cluster.nodes if cluster.nodes > 1 else per_node
    if smooth(count) or count < 2:
        return ()
    below = next(k for k in range(count - 1, 0, -1) if smooth(k))
    return (below * per_node,) if cluster.nodes > 1 else (below,)


def restricted(scenario: Scenario, devices: int) -> Scenario:
    """``scenario`` on its cluster's first ``devices`` devices (``restrict_cluster``)."""
    return replace(scenario, cluster=restrict_cluster(scenario.cluster, devices))

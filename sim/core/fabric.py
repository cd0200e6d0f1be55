"""A cluster's network as it is built: switch tiers above the servers, rails, scale-up domains.

Without a fabric (``ClusterSpec.fabric`` None) servers talk through their NICs as if joined by
one non-blocking switch. Real training clusters are a Clos of switch *tiers*, counted from the
bottom:

* tier 0, the **leaf** (top-of-rack) switches, each joining a group of ``size`` servers;
* tier 1, the **spine**, each group of it joining ``size`` leaf groups; tier 2 (a **core** or
  aggregation layer) joining ``size`` spine groups; and so on. The top tier joins them all.

A transfer between two servers climbs to the lowest tier whose group holds both, crossing on
the way the *uplinks* of every tier below it (up on the sender's side, down on the receiver's).
A group's uplinks carry ``1 / oversubscription`` of what its downlinks can (Llama 3's pods have
``1:7`` between the pods and the aggregation layer: ``oversubscription: 7`` on the pod tier), or
the ``uplink_bandwidth`` its switches' uplink cables add up to.

``rail_optimised``: NIC ``k`` of every server of a leaf group sits on its own leaf switch, rail
``k`` (NVIDIA's DGX SuperPOD: "Traffic per rail ... is always one hop away from the other 31
nodes in a SU. Traffic between nodes, or between rails, traverses the spine layer"), so only
same-rail traffic stays on a leaf.

``scale_up``: an NVLink domain of ``size`` GPUs (GB200 NVL72: 72), possibly spanning servers:
its GPUs talk at the domain's bandwidth even across servers, never through a NIC.

The specs here are frozen data that check themselves; where a transfer goes and what a tier's
uplink carries is ``sim.cost.tiers``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.errors import SpecError

__all__ = ["COLLECTIVE_ALGORITHMS", "FabricSpec", "ScaleUpSpec", "TierSpec"]

COLLECTIVE_ALGORITHMS = ("auto", "ring", "tree")
"""``collective_algorithm``'s values: NCCL's tuner choosing by size (``auto``), or one forced, as
``NCCL_ALGO`` does (``sim.cost.fabric_comm``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TierSpec:
    """One switch tier: the groups it forms and what their uplinks carry."""

    name: str
    """What the tier is called in messages (``leaf``, ``spine``, ``core``)."""
    size: int | None
    """How many groups of the tier below (servers, for tier 0) one group of this tier joins;
    None on the top tier: all of them."""
    oversubscription: float = 1.0
    """Downlink over uplink capacity of one group of this tier, >= 1 (7 for 1:7): its uplinks
    carry ``downlink capacity / oversubscription``. 1: non-blocking. The top tier has no uplink (1)."""
    latency_s: float = 0.0
    """Seconds a point-to-point transfer that climbs to this tier or above spends in its switches."""
    uplink_bandwidth_bytes_per_s: float | None = None
    """What one group's uplinks carry per direction, bytes/s, all its cables together (on a
    rail-optimised leaf tier, one rail's leaf switch); None: its downlink capacity over
    ``oversubscription``. Give one of the two."""

    def __post_init__(self) -> None:
        if self.uplink_bandwidth_bytes_per_s is not None:
            if self.oversubscription != 1.0:
                raise SpecError("uplink_bandwidth", "give either uplink_bandwidth or oversubscription, not both")
            if not self.uplink_bandwidth_bytes_per_s > 0:
                raise SpecError("uplink_bandwidth", f"must be positive, got {self.uplink_bandwidth_bytes_per_s!r}")
        if not self.name:
            raise SpecError("name", "must be a non-empty string")
        if self.size is not None and (isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1):
            raise SpecError("size", f"must be an integer >= 1, got {self.size!r}")
        if not 1.0 <= self.oversubscription <= 1000.0:
            raise SpecError("oversubscription", f"must be a number from 1 (non-blocking) to 1000, "
                                                f"got {self.oversubscription!r}")
        if self.latency_s < 0:
            raise SpecError("latency", f"must not be negative, got {self.latency_s!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleUpSpec:
    """An NVLink domain: ``size`` GPUs that talk to each other at ``bandwidth_bytes_per_s`` each."""

    size: int
    """GPUs in one domain, a whole number of servers (72 for GB200 NVL72)."""
    bandwidth_bytes_per_s: float
    """Each GPU's bandwidth to the others of its domain, bytes/s per direction."""
    latency_s: float = 0.0
    """Fixed cost of a transfer inside the domain, seconds."""

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise SpecError("size", f"must be an integer >= 1, got {self.size!r}")
        if not self.bandwidth_bytes_per_s > 0:
            raise SpecError("bandwidth", f"must be positive, got {self.bandwidth_bytes_per_s!r}")
        if self.latency_s < 0:
            raise SpecError("latency", f"must not be negative, got {self.latency_s!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class FabricSpec:
    """The switch tiers above the servers, from the bottom, and how the servers hang off them.

    In a ``ClusterSpec`` the tiers count *servers as the cluster has them*: where a scale-up
    domain spans several servers, the reader (``sim.input.fabric_section``) makes each domain
    one server of the cluster and divides tier 0's ``size`` by the servers per domain."""

    tiers: tuple[TierSpec, ...]
    """Bottom (leaf) first; at least one."""
    rail_optimised: bool = False
    """NIC ``k`` of every server of a leaf group on leaf switch ``k`` (its rail)."""
    rails: int = 1
    """NICs per server as written (a rail per NIC), the rails of a rail-optimised leaf group."""
    scale_up: ScaleUpSpec | None = None
    """The NVLink domain; None: one server is one domain, at the cluster's ``intra_node`` link."""
    servers_per_domain: int = 1
    """Servers as written in one scale-up domain (display: the cluster counts domains as servers)."""
    collective_algorithm: str = "auto"
    """How a data-parallel group's collectives cross the tiers (``COLLECTIVE_ALGORITHMS``): ``auto``,
    NCCL's tuner picking ring, tree or NVLS tree by size; ``ring`` or ``tree`` forced."""

    def __post_init__(self) -> None:
        if self.collective_algorithm not in COLLECTIVE_ALGORITHMS:
            raise SpecError("collective_algorithm", f"unknown algorithm {self.collective_algorithm!r}; "
                                                    f"use one of {', '.join(COLLECTIVE_ALGORITHMS)}")
        if not self.tiers:
            raise SpecError("tiers", "must list at least one tier (the leaf), bottom first")
        names = [t.name for t in self.tiers]
        if len(set(names)) < len(names):
            raise SpecError("tiers", f"tier names must differ, got {names}")
        for tier in self.tiers[:-1]:
            if tier.size is None:
                raise SpecError("tiers", f"tier {tier.name!r} needs a size: only the top tier may join everything")
        if self.rail_optimised and len(self.tiers) < 2:
            raise SpecError("rail_optimised", "rails meet only above the leaf: add a spine tier above it")
        if self.tiers[-1].oversubscription != 1.0 or self.tiers[-1].uplink_bandwidth_bytes_per_s is not None:
            raise SpecError("tiers", f"the top tier {self.tiers[-1].name!r} has no uplink: "
                                     "put its oversubscription (or uplink_bandwidth) on the tier below, the one whose uplinks it is")

    def reach(self, tier: int) -> int | None:
        """Servers one group of ``tier`` holds (None: every server)."""
        servers = 1
        for t in self.tiers[:tier + 1]:
            if t.size is None:
                return None
            servers *= t.size
        return servers

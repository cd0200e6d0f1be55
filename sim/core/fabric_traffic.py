"""What crossed a fabric in one iteration: bytes and utilisation per tier, and the busiest links.

A cluster with a fabric (``sim.core.fabric``) has switch tiers above its servers. Every
transfer between servers reaches tier 0 (its leaf) through the servers' NICs, and climbs on
to the lowest tier whose group holds both ends (``sim.cost.tiers.climb``). Per iteration and
per direction:

* a tier's **bytes** are those of every transfer that reached it (climbed to it or above);
* its **capacity** is what carries them into the tier's switches: tier 0's is every server's
  NICs, tier ``i``'s the uplinks of tier ``i − 1`` (its downlinks over its oversubscription,
  ``sim.cost.tiers.uplink_capacity_bytes_per_s``);
* its **utilisation** is bytes over (capacity × iteration time): the share of the iteration
  its links would be busy if the load were spread over all of them. A ring whose members sit
  in device order crosses a group boundary once per group, so a 1:7 tier above it carries 1/7
  of the bytes on 1/7 of the capacity: the same utilisation as its leaves.

The **busiest links** are single NICs and group uplinks (one per group and direction, all its
cables together) by their own bytes over (capacity × iteration time), a slow link at its
slowed capacity. ``sim.engine.tier_traffic`` computes these from a replay's flows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FabricTraffic", "LinkLoad", "TierTraffic"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TierTraffic:
    """One tier's traffic in one iteration, per direction."""

    name: str
    """The tier's name (``leaf``, ``spine``, ``core``)."""
    bytes: float
    """Bytes of the transfers that reached the tier, per direction, per iteration."""
    bytes_by_kind: tuple[tuple[str, float], ...]
    """``bytes`` by the parallel group that sent them (``TP``, ``CP``, ``EP``, ``PP``, ``DP``), those with any."""
    capacity_bytes_per_s: float
    """What carries them into the tier, per direction, bytes/s: the NICs (tier 0), the tier below's uplinks."""
    utilisation: float
    """``bytes / (capacity × iteration time)``, 0 to 1 (more only where links are slowed below capacity)."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "bytes_by_kind": dict(self.bytes_by_kind),
                "capacity_bytes_per_s": self.capacity_bytes_per_s, "utilisation": self.utilisation}


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkLoad:
    """One NIC's or one group uplink's traffic in one iteration, in one direction."""

    name: str
    """``nic 12 out``, ``nic 12 in``, ``spine 3 up``, ``spine 3 down`` (the group's index, ``sim.cost.tiers.uplink_group``)."""
    bytes: float
    """Bytes it carried per iteration."""
    capacity_bytes_per_s: float
    """Its capacity, bytes/s (a slow link's factor applied)."""
    utilisation: float
    """``bytes / (capacity × iteration time)``."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "capacity_bytes_per_s": self.capacity_bytes_per_s,
                "utilisation": self.utilisation}


@dataclass(frozen=True, slots=True, kw_only=True)
class FabricTraffic:
    """A fabric's traffic in one iteration: every tier, bottom first, and the busiest links."""

    tiers: tuple[TierTraffic, ...]
    """Bottom (leaf) first."""
    busiest: tuple[LinkLoad, ...]
    """The most utilised NICs and uplinks, most utilised first (ties in link order: NICs out, NICs in,
    then each tier's uplinks up and down, by index), a few."""

    def to_json(self) -> dict[str, Any]:
        return {"tiers": [t.to_json() for t in self.tiers], "busiest_links": [b.to_json() for b in self.busiest]}

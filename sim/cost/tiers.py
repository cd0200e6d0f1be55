"""Where a transfer goes on a multi-tier fabric, and what the uplinks it crosses carry.

A cluster with a fabric (``sim.core.fabric``) has switch tiers above its servers. A transfer
between two servers climbs to the lowest tier whose group holds both (:func:`climb`): tier 0
when they share a leaf (and, on a rail-optimised fabric, a rail), tier 1 when they share a
spine group, and so on. On its way it crosses the uplinks of every tier below the one it
climbs to: up out of the sender's groups, down into the receiver's.

One uplink per group and direction stands for all the cables of the group's uplinks, with
their summed capacity (:func:`uplink_capacity_bytes_per_s`): a tier-0 group's downlinks are its
servers' NICs (on a rail-optimised fabric, one rail's NICs: each rail has its own leaf switch),
a higher group's downlinks are its children's uplinks, and every uplink carries its downlinks'
capacity over the tier's ``oversubscription``, or the tier's ``uplink_bandwidth``. Flows
through one uplink share it like any port (``sim.engine.ports``).

Only the uplinks of oversubscribed tiers (and of tiers with a slow link, ``sim.core.faults``)
are modelled as ports (:func:`modelled_tiers`): a non-blocking tier carries whatever its
downlinks can, and a fair network never lets it be the bottleneck; an equal share per flow
(the engine's rule) would make it one where the NICs below it are unevenly loaded.

:func:`group_crossing` answers for a whole group of devices (a tensor, context, expert or
gradient group, a pipeline boundary): the highest tier its members' traffic climbs to and the
bandwidth per GPU there when every GPU below sends at once. Pure Python, no SimPy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.core.specs import ClusterSpec

__all__ = ["INSIDE_SERVER", "Crossing", "climb", "crossing_text", "cumulative_oversubscription", "group_crossing",
           "modelled_tiers", "oversubscription_of", "plan_crossings", "rail_of", "uplink_capacity_bytes_per_s",
           "uplink_count", "uplink_group"]

INSIDE_SERVER = -1
""":func:`climb` of a transfer between GPUs of one server (or one scale-up domain)."""


def rail_of(cluster: ClusterSpec, device: int) -> int:
    """The rail of ``device``'s NIC: its index among its server's NICs as written (a scale-up
    domain of several servers has their NICs side by side, ``FabricSpec.rails`` each)."""
    local = device % cluster.devices_per_node
    rails = cluster.fabric.rails if cluster.fabric is not None else cluster.nics_per_node
    return (local * cluster.nics_per_node // cluster.devices_per_node) % rails


def climb(cluster: ClusterSpec, src: int, dst: int) -> int:
    """The tier a transfer ``src -> dst`` climbs to (``INSIDE_SERVER`` on one server; 0 on one
    leaf). Without a fabric every cross-server transfer is on the one switch: tier 0."""
    a, b = cluster.node_of(src), cluster.node_of(dst)
    if a == b:
        return INSIDE_SERVER
    fabric = cluster.fabric
    if fabric is None:
        return 0
    for tier in range(len(fabric.tiers)):
        reach = fabric.reach(tier)
        if reach is None or a // reach == b // reach:
            if tier == 0 and fabric.rail_optimised and rail_of(cluster, src) != rail_of(cluster, dst):
                continue  # two rails of one leaf group meet at the spine
            return tier
    return len(fabric.tiers) - 1


def uplink_count(cluster: ClusterSpec, tier: int) -> int:
    """Uplinks (one per group, per rail on a rail-optimised tier 0) of ``tier``."""
    fabric = cluster.fabric
    reach = fabric.reach(tier)
    groups = 1 if reach is None else -(-cluster.nodes // reach)
    return groups * (fabric.rails if tier == 0 and fabric.rail_optimised else 1)


def uplink_group(cluster: ClusterSpec, tier: int, device: int) -> int:
    """Which of ``tier``'s uplinks (0 to ``uplink_count - 1``) ``device``'s traffic climbs through."""
    fabric = cluster.fabric
    reach = fabric.reach(tier)
    group = 0 if reach is None else cluster.node_of(device) // reach
    if tier == 0 and fabric.rail_optimised:
        return group * fabric.rails + rail_of(cluster, device)
    return group


def _links(cluster: ClusterSpec) -> list[tuple[float, float]]:
    """``(downlink, uplink)`` capacity per direction of one group of each tier, bytes/s: tier 0's
    downlinks are its servers' NICs (one rail's, rail-optimised), tier i's its children's uplinks;
    an uplink carries ``uplink_bandwidth``, else the downlinks over ``oversubscription``."""
    fabric = cluster.fabric
    nics = cluster.nics_per_node // fabric.rails if fabric.rail_optimised else cluster.nics_per_node
    links, up = [], 0.0
    for i, t in enumerate(fabric.tiers):
        if i == 0:
            down = (t.size or cluster.nodes) * nics * cluster.inter_node.bandwidth_bytes_per_s
        else:
            children = t.size if t.size is not None else -(-cluster.nodes // fabric.reach(i - 1))
            if i == 1 and fabric.rail_optimised:
                children *= fabric.rails  # a spine group joins every rail's leaf of its leaf groups
            down = children * up
        up = t.uplink_bandwidth_bytes_per_s if t.uplink_bandwidth_bytes_per_s is not None else down / t.oversubscription
        links.append((down, up))
    return links


def uplink_capacity_bytes_per_s(cluster: ClusterSpec, tier: int) -> float:
    """What one uplink of ``tier`` carries per direction (``_links``)."""
    return _links(cluster)[tier][1]


def oversubscription_of(cluster: ClusterSpec, tier: int) -> float:
    """Downlink over uplink capacity of ``tier``'s groups, at least 1 (an undersubscribed tier is non-blocking)."""
    down, up = _links(cluster)[tier]
    return max(1.0, down / up)


def cumulative_oversubscription(cluster: ClusterSpec, below: int) -> float:
    """The product of the oversubscriptions of tiers ``0 .. below - 1``: how much less than its
    NIC a GPU gets at tier ``below`` when every GPU under it sends at once."""
    ratio = 1.0
    for tier in range(below) if cluster.fabric is not None else ():
        ratio *= oversubscription_of(cluster, tier)
    return ratio


def modelled_tiers(cluster: ClusterSpec, slowed: Iterable[int] = ()) -> tuple[int, ...]:
    """Tiers whose uplinks are ports of the engine: the oversubscribed ones and those with a slow link."""
    fabric = cluster.fabric
    if fabric is None:
        return ()
    slowed = set(slowed)
    return tuple(i for i in range(len(fabric.tiers) - 1) if oversubscription_of(cluster, i) > 1.0 or i in slowed)


@dataclass(frozen=True, slots=True, kw_only=True)
class Crossing:
    """Where a group's traffic goes: inside a server (scale-up domain) or up to a tier."""

    tier: int
    """The highest tier its members' traffic climbs to; ``INSIDE_SERVER`` (-1): none."""
    name: str
    """That tier's name, or ``server`` / ``scale-up domain``."""
    oversubscription: float
    """The product of the oversubscriptions of the tiers it crosses (1: non-blocking)."""
    bandwidth_bytes_per_s: float
    """Bandwidth per GPU where it crosses when every GPU under it sends at once: the scale-up or
    intra-node port's, else its NIC's over ``oversubscription``."""


def group_crossing(cluster: ClusterSpec, devices: Iterable[int]) -> Crossing:
    """Which tier ``devices``' traffic crosses: the lowest whose one group (and rail, on a
    rail-optimised tier 0) holds them all."""
    members = sorted(set(devices))
    fabric = cluster.fabric
    if len({cluster.node_of(d) for d in members}) <= 1:
        inside = "scale-up domain" if fabric is not None and fabric.servers_per_domain > 1 else "server"
        return Crossing(tier=INSIDE_SERVER, name=inside, oversubscription=1.0,
                        bandwidth_bytes_per_s=cluster.intra_node.bandwidth_bytes_per_s)
    # tiers nest (and rails split only tier 0), so the farthest pair includes the first member
    tier = max(climb(cluster, members[0], d) for d in members[1:])
    ratio = cumulative_oversubscription(cluster, tier)
    name = fabric.tiers[tier].name if fabric is not None else "network"
    return Crossing(tier=tier, name=name, oversubscription=ratio,
                    bandwidth_bytes_per_s=cluster.inter_node.bandwidth_bytes_per_s / ratio)


def _pipeline_pairs(plan):
    """Each pipeline boundary's sending and receiving devices, replica position by position."""
    for s in range(plan.num_stages - 1):
        if plan.stage_ranks[s] == plan.stage_ranks[s + 1]:
            continue
        senders, receivers = plan.replicas(s), plan.replicas(s + 1)
        for a, replica in enumerate(senders):
            for position, device in enumerate(replica):
                yield device, receivers[a % len(receivers)][position]


def plan_crossings(plan, cluster: ClusterSpec) -> tuple[tuple[str, Crossing], ...]:
    """Where each kind of the plan's traffic goes (``TP``, ``CP``, ``EP``, ``PP``, ``DP``), the
    farthest any of its groups climbs: "TP inside the scale-up domain; DP crosses the core at 1:7"."""
    kinds = {"TP": plan.tensor_groups, "CP": plan.context_groups, "EP": plan.expert_groups,
             "DP": plan.gradient_groups}
    result = []
    for kind in ("TP", "CP", "EP", "PP", "DP"):
        if kind == "PP":
            groups = list(_pipeline_pairs(plan))
        else:
            groups = [g for s in range(plan.num_stages) for g in kinds[kind](s) if len(g) > 1]
        if groups:
            result.append((kind, max((group_crossing(cluster, g) for g in groups), key=lambda c: c.tier)))
    return tuple(result)


def crossing_text(kind: str, crossing: Crossing) -> str:
    """``TP inside the server``, ``DP crosses the core at 1:7``, ``PP crosses the leaf (non-blocking)``."""
    if crossing.tier == INSIDE_SERVER:
        return f"{kind} inside the {crossing.name}"
    ratio = f"at 1:{crossing.oversubscription:g}" if crossing.oversubscription > 1 else "(non-blocking)"
    return f"{kind} crosses the {crossing.name} {ratio}"

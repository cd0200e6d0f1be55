"""The ``cluster.fabric`` section: switch tiers, rails and the scale-up domain (``sim.core.fabric``).

::

    cluster:
      preset: dgx-h100
      nodes: 2048
      fabric:
        tiers:
          - {name: rack, size: 2}                          # servers per top-of-rack switch
          - {name: pod, size: 192, oversubscription: 7}    # racks per pod; 1:7 up to the core
          - {name: core}                                   # the top tier joins every pod
        rail_optimised: false
        collective_algorithm: auto                         # or ring, tree (sim.cost.fabric_comm)
        scale_up: {size: 8, bandwidth: 450GB/s, latency: 3us}

Without the key a cluster is what it always was (one non-blocking switch). A scale-up domain
of several servers (``scale_up.size`` a multiple of ``devices_per_node``) becomes one server of
the cluster the rest of the simulator sees: its GPUs and NICs side by side, its GPUs' port the
domain's bandwidth, tier 0's ``size`` counted in domains, the host power per domain.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sim.core.fabric import COLLECTIVE_ALGORITHMS, FabricSpec, ScaleUpSpec, TierSpec
from sim.core.specs import ClusterSpec, LinkSpec
from sim.core.units import parse_bandwidth, parse_time
from sim.input.strict import StrictReader, join_key

__all__ = ["FABRIC_KEYS", "apply_fabric", "read_fabric"]

FABRIC_KEYS = {"tiers", "rail_optimised", "scale_up", "collective_algorithm"}
_TIER_KEYS = {"name", "size", "oversubscription", "uplink_bandwidth", "latency"}
_SCALE_UP_KEYS = {"size", "bandwidth", "latency"}
MAX_TIERS = 8
"""Most switch tiers (the largest published clusters have three)."""
MAX_GROUP = 100_000
"""Largest group a tier may form (``sim.input.cluster.MAX_NODES``)."""


def read_fabric(reader: StrictReader, data: Any) -> FabricSpec:
    """The fabric as written (tier 0's size in servers; no domain folded in yet)."""
    key = "cluster.fabric"
    data = reader.mapping(data, key)
    reader.keys(data, key, allowed=FABRIC_KEYS, required={"tiers"})
    items = data["tiers"]
    if not isinstance(items, list) or not items or len(items) > MAX_TIERS:
        raise reader.fail(join_key(key, "tiers"), f"must be a list of 1 to {MAX_TIERS} tiers, bottom (leaf) first, "
                                                  "e.g. [{name: leaf, size: 32}, {name: spine}]")
    tiers = []
    for i, item in enumerate(items):
        where = f"{key}.tiers[{i}]"
        item = reader.mapping(item, where)
        reader.keys(item, where, allowed=_TIER_KEYS, required={"name"})
        top = i == len(items) - 1
        if not top and item.get("size") is None:
            raise reader.fail(join_key(where, "size"), "missing; every tier but the top one says how many groups "
                                                       "of the tier below (servers, for the first) it joins")
        tiers.append(reader.build(
            where, TierSpec, name=reader.string(item, where, "name"),
            size=reader.integer(item, where, "size", maximum=MAX_GROUP) if item.get("size") is not None else None,
            oversubscription=reader.number(item, where, "oversubscription", 1.0, low=1.0, high=1000.0),
            latency_s=reader.quantity(item, where, "latency", parse_time, "0s"),
            uplink_bandwidth_bytes_per_s=reader.quantity(item, where, "uplink_bandwidth", parse_bandwidth)
            if item.get("uplink_bandwidth") is not None else None))
    scale_up = None
    if data.get("scale_up") is not None:
        where = f"{key}.scale_up"
        item = reader.mapping(data["scale_up"], where)
        reader.keys(item, where, allowed=_SCALE_UP_KEYS, required={"size", "bandwidth"})
        scale_up = reader.build(where, ScaleUpSpec, size=reader.integer(item, where, "size", maximum=1024),
                                bandwidth_bytes_per_s=reader.quantity(item, where, "bandwidth", parse_bandwidth),
                                latency_s=reader.quantity(item, where, "latency", parse_time, "0s"))
    return reader.build(key, FabricSpec, tiers=tuple(tiers), scale_up=scale_up,
                        rail_optimised=reader.boolean(data, key, "rail_optimised", False),
                        collective_algorithm=reader.string(data, key, "collective_algorithm", "auto",
                                                           choices=COLLECTIVE_ALGORITHMS))


def apply_fabric(reader: StrictReader, cluster: ClusterSpec, fabric: FabricSpec) -> ClusterSpec:
    """``cluster`` with ``fabric``: a scale-up domain of several servers folded into one server."""
    key = "cluster.fabric"
    per_node, nics = cluster.devices_per_node, cluster.nics_per_node
    domain, intra, host_power = 1, cluster.intra_node, cluster.host_power_w
    if fabric.scale_up is not None:
        size = fabric.scale_up.size
        if size % per_node:
            raise reader.fail(f"{key}.scale_up.size", f"{size} GPUs is not a whole number of {per_node}-GPU servers; "
                                                      f"use a multiple of devices_per_node ({per_node})")
        domain = size // per_node
        if cluster.nodes % domain:
            raise reader.fail("cluster.nodes", f"{cluster.nodes} servers do not fill whole scale-up domains of "
                                               f"{domain} servers; use a multiple of {domain}")
        intra = LinkSpec(bandwidth_bytes_per_s=fabric.scale_up.bandwidth_bytes_per_s,
                         latency_s=fabric.scale_up.latency_s, name=f"scale-up domain of {size}",
                         collective_efficiency=intra.collective_efficiency)
        host_power = None if host_power is None else host_power * domain
    first = fabric.tiers[0]
    if first.size is not None and first.size % domain:
        raise reader.fail(f"{key}.tiers[0].size", f"{first.size} servers is not a whole number of scale-up domains "
                                                  f"of {domain} servers; use a multiple of {domain}")
    tiers = (replace(first, size=first.size // domain if first.size is not None else None), *fabric.tiers[1:])
    folded = replace(fabric, tiers=tiers, rails=nics, servers_per_domain=domain)
    nodes = cluster.nodes // domain
    reach = folded.reach(len(tiers) - 1)
    if reach is not None and reach < nodes:
        raise reader.fail(f"{key}.tiers", f"the tiers join {reach * domain:,} servers, the cluster has "
                                          f"{cluster.nodes:,}; raise a size, or leave out the top tier's")
    return replace(cluster, nodes=nodes, devices_per_node=per_node * domain, nics_per_node=nics * domain,
                   intra_node=intra, host_power_w=host_power, fabric=folded)

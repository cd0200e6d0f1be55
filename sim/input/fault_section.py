"""The ``faults:`` section: what goes wrong during a simulated iteration.

A scenario may inject stragglers (a device computes ``slowdown`` times slower from a time
on), jitter (every action's time drawn around its cost, seeded), slow links (a NIC or a
device's port at a ``factor`` of its bandwidth) and failures (a device stops at a time);
``sim.core.faults`` defines them and how the engine applies them::

    faults:
    - {type: straggler, device: 3, slowdown: 1.5}
    - {type: jitter, spread: 0.05, seed: 7, devices: "0-7"}

Every device and NIC id is checked against the cluster, so a fault can only name hardware
that exists, and every number against its range (``sim.core.faults``): ``slowdown`` 1 to 1000,
``factor`` 0.001 to 1, ``spread`` 0 to 10, ``seed`` 0 to 2**63 - 1, ``from`` and ``at`` 0s
to 1e6s.
"""

from __future__ import annotations

from typing import Any

from sim.core.faults import (
    FACTOR_RANGE,
    FAULT_TYPES,
    JITTER_PER,
    MAX_FAULT_TIME_S,
    MAX_SEED,
    SLOWDOWN_RANGE,
    Failure,
    Jitter,
    SlowLink,
    Straggler,
)
from sim.core.specs import ClusterSpec
from sim.core.units import parse_time
from sim.cost.tiers import uplink_count
from sim.input.strict import StrictReader, device_ids, join_key, show_value

__all__ = ["read_faults"]

_FAULT_KEYS = {
    "straggler": {"type", "device", "slowdown", "from"},
    "jitter": {"type", "distribution", "spread", "seed", "devices", "per"},
    "slow_link": {"type", "nic", "device", "tier", "index", "factor"},
    "failure": {"type", "device", "at"},
}

_FAULT_REQUIRED = {"straggler": {"device", "slowdown"}, "jitter": set(), "slow_link": {"factor"},
                   "failure": {"device", "at"}}


def read_faults(reader: StrictReader, data: Any, cluster: ClusterSpec) -> tuple:
    """The ``faults:`` list (see ``sim.core.faults``), with device and NIC ids checked against the cluster."""
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
        faults.append(_fault(reader, kind, item, key, cluster))
    return tuple(faults)


def _fault(reader: StrictReader, kind: str, item: dict, key: str, cluster: ClusterSpec):
    times = (0.0, MAX_FAULT_TIME_S, "0s to 1e6s")
    if kind == "straggler":
        return reader.build(key, Straggler, device=_hardware_id(reader, item, key, "device", cluster.num_devices),
                            slowdown=reader.number(item, key, "slowdown", low=SLOWDOWN_RANGE[0],
                                                   high=SLOWDOWN_RANGE[1]),
                            from_s=reader.quantity(item, key, "from", parse_time, "0s", bounds=times))
    if kind == "failure":
        return reader.build(key, Failure, device=_hardware_id(reader, item, key, "device", cluster.num_devices),
                            at_s=reader.quantity(item, key, "at", parse_time, bounds=times))
    if kind == "slow_link":
        nics = cluster.nodes * cluster.nics_per_node
        return reader.build(
            key, SlowLink, factor=reader.number(item, key, "factor", low=FACTOR_RANGE[0], high=FACTOR_RANGE[1]),
            nic=_hardware_id(reader, item, key, "nic", nics) if "nic" in item else None,
            device=_hardware_id(reader, item, key, "device", cluster.num_devices) if "device" in item else None,
            **_uplink(reader, item, key, cluster),
        )
    devices = device_ids(reader, item["devices"], join_key(key, "devices"), cluster.num_devices) \
        if "devices" in item else None
    return reader.build(key, Jitter, distribution=reader.string(item, key, "distribution", "normal"),
                        spread=reader.number(item, key, "spread", 0.05, low=0.0, high=10.0),
                        seed=reader.integer(item, key, "seed", 0, minimum=0, maximum=MAX_SEED), devices=devices,
                        per=reader.string(item, key, "per", "device", choices=JITTER_PER))


def _hardware_id(reader: StrictReader, data: dict, key: str, name: str, count: int) -> int:
    value = reader.integer(data, key, name, minimum=0)
    if value >= count:
        what = {"nic": "network cards", "index": "uplinks"}.get(name, "devices")
        raise reader.fail(join_key(key, name), f"{value} does not exist; the cluster has {what} 0 to {count - 1}"
                                                 + (" on that tier" if name == "index" else ""))
    return value


def _uplink(reader: StrictReader, item: dict, key: str, cluster: ClusterSpec) -> dict:
    """``tier`` (by name) and ``index`` of a slow uplink, checked against the cluster's fabric."""
    if "tier" not in item and "index" not in item:
        return {}
    fabric = cluster.fabric
    if fabric is None:
        raise reader.fail(join_key(key, "tier"), "the cluster has no fabric; add cluster.fabric, or name a nic")
    names = [t.name for t in fabric.tiers[:-1]]
    tier = reader.string(item, key, "tier", choices=set(names)) if names else None
    if tier is None:
        raise reader.fail(join_key(key, "tier"), "a one-tier fabric has no uplinks; name a nic")
    number = names.index(tier)
    return {"tier": number, "index": _hardware_id(reader, item, key, "index", uplink_count(cluster, number))}

"""The scenario's faults as the compiler asks about them (``FaultView``): which devices straggle or
fail and from when, which ports and NICs are slow, and which devices draw the same jitter.

``sim.engine.flows`` reads the slow links, ``sim.engine.classes`` splits the symmetry classes by
each device's fault signature, and ``sim.engine.compile`` applies the rest."""

from __future__ import annotations

from sim.core.faults import Failure, Jitter, SlowLink, Straggler, jitter_key
from sim.cost.tiers import uplink_group

__all__ = ["FaultView"]


class FaultView:
    """The scenario's faults, as the compiler asks about them."""

    NEUTRAL = (None, None, 1.0, None)
    """The signature of a device without faults."""

    def __init__(self, faults: tuple, cluster, plan=None) -> None:
        self.stragglers = {f.device: f for f in faults if isinstance(f, Straggler)}
        self.failures = {f.device: f for f in faults if isinstance(f, Failure)}
        self.jitters = [f for f in faults if isinstance(f, Jitter)]
        self.any = bool(faults)
        """Whether the scenario has faults at all."""
        self.slow_ports: dict[int, float] = {}
        self.slow_nics: dict[int, float] = {}
        self.slow_uplinks: dict[tuple[int, int], float] = {}
        """``(tier, index)`` of a fabric group's uplinks (``sim.cost.tiers.uplink_group``) -> factor."""
        for f in faults:
            if isinstance(f, SlowLink):
                if f.tier is not None:
                    table, key = self.slow_uplinks, (f.tier, f.index)
                else:
                    table, key = (self.slow_nics, f.nic) if f.nic is not None else (self.slow_ports, f.device)
                table[key] = table.get(key, 1.0) * f.factor
        self.cluster = cluster
        # the lowest device of each device's replica and device set: what coarser jitter draws under
        self.first_of: dict[str, dict[int, int]] = {"device": {}, "replica": {}, "stage": {}}
        if plan is not None and self.jitters:
            for s in range(plan.num_stages):
                for replica in plan.replicas(s):
                    first = min(replica)
                    for d in replica:
                        self.first_of["replica"][d] = first
            for group in plan.device_groups:
                first = min(group)
                for d in group:
                    self.first_of["stage"][d] = first

    def jitter_for(self, device: int):
        """``(jitter, key of its draws)`` for ``device`` (``sim.core.faults.jitter_key``), or None."""
        jitter = next((j for j in self.jitters if j.applies_to(device)), None)
        if jitter is None:
            return None
        return jitter, jitter_key(jitter, device, self.first_of[jitter.per].get(device, device))

    def device_signature(self, device: int) -> tuple:
        """What makes a device unlike its replicas; devices that draw different jitter differ."""
        straggler, failure = self.stragglers.get(device), self.failures.get(device)
        jitter = self.jitter_for(device)
        return (
            (straggler.slowdown, straggler.from_s) if straggler else None,
            failure.at_s if failure else None,
            self.slow_ports.get(device, 1.0),
            (self.jitters.index(jitter[0]), jitter[1]) if jitter is not None else None,
        )

    def nic_factor(self, nic: int) -> float:
        return self.slow_nics.get(nic, 1.0)

    def card_signature(self, nic: int):
        """What tells network card ``nic`` apart: its factor and, with slow uplinks, the factors
        of the uplinks above its server (the devices behind it then differ from the others)."""
        if not self.slow_uplinks:
            return self.nic_factor(nic)
        cluster = self.cluster
        device = nic // cluster.nics_per_node * cluster.devices_per_node \
            + (nic % cluster.nics_per_node) * cluster.devices_per_node // cluster.nics_per_node
        above = tuple(self.slow_uplinks.get((tier, uplink_group(cluster, tier, device)), 1.0)
                      for tier in sorted({t for t, _ in self.slow_uplinks}))
        return self.nic_factor(nic), above

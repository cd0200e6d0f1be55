"""Collectives as measured on a link: a latency and a bandwidth per kind and group size.

The ring formulas of ``sim.cost.comm`` price a collective from a link's point-to-point
latency and bandwidth (Patarasuk & Yuan 2009). On the hosts ``dapple-run`` runs on (gloo
over local sockets, one CPU core a rank) a collective costs what its library makes of it,
not what the ring's steps add up to: gloo's all-gather over 2 ranks takes hundreds of
microseconds at 4 bytes, and FSDP2 adds its own work around each call (copy-in and copy-out
of the flat buffer, the DTensor views). ``dapple-run profile`` therefore times each kind the
plans use over groups of 2 and 4 ranks at a few sizes and fits ``seconds = latency + bytes /
bandwidth`` per kind and group size (``runtime.measure.collectives``); a link that carries
such fits (the ``collectives:`` key of a ``cluster:`` link, ``sim.input.cluster.read_collectives``)
prices its collectives from them (``sim.cost.measured_comm``) instead of the ring formulas.

``bytes`` is the collective's buffer: the tensor an all-reduce or broadcast sums or sends,
the gathered (whole) tensor of an all-gather or reduce-scatter, the message of a
point-to-point send, and for ``ring-shift`` the block each member of a ring sends to the next
while it receives the previous one's (one step of ring attention's key/value ring:
``batch_isend_irecv`` of an ``isend`` and an ``irecv``, ``runtime.model.ring_attention.Ring.shift``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.errors import SpecError

__all__ = ["COLLECTIVE_KINDS", "CollectiveFit", "MeasuredCollectives"]

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "point-to-point", "ring-shift")
"""The kinds a fit may be of: the collectives the runtime's plans call."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveFit:
    """One kind of collective over one group size: ``seconds = latency_s + bytes / bandwidth``."""

    kind: str
    """One of ``COLLECTIVE_KINDS``."""
    ranks: int
    """Group size it was measured over, >= 2."""
    latency_s: float
    """Seconds of one call at no bytes (the fit's intercept), >= 0."""
    bandwidth_bytes_per_s: float
    """Buffer bytes per second beyond the latency (the inverse of the fit's slope), bytes/s, > 0."""

    def __post_init__(self) -> None:
        if self.kind not in COLLECTIVE_KINDS:
            raise SpecError("collectives.kind", f"{self.kind!r} is not one of {', '.join(COLLECTIVE_KINDS)}")
        if isinstance(self.ranks, bool) or not isinstance(self.ranks, int) or self.ranks < 2:
            raise SpecError("collectives.ranks", f"must be an integer >= 2, got {self.ranks!r}")
        if not self.latency_s >= 0 or self.latency_s == float("inf"):
            raise SpecError("collectives.latency", f"must be a finite number >= 0, got {self.latency_s!r}")
        if not self.bandwidth_bytes_per_s > 0 or self.bandwidth_bytes_per_s == float("inf"):
            raise SpecError("collectives.bandwidth", f"must be a finite number > 0, got {self.bandwidth_bytes_per_s!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredCollectives:
    """What a link's collectives cost, measured: the fits, and FSDP2's own cost per call."""

    fits: tuple[CollectiveFit, ...]
    """One fit per (kind, ranks), sorted by kind then ranks; no two for the same pair."""
    fsdp_call_overhead_s: float = 0.0
    """Seconds FSDP2 (``fully_shard``) adds to each of its all-gathers and reduce-scatters
    beyond the collective itself (its copy-in, copy-out and DTensor bookkeeping), >= 0."""

    def __post_init__(self) -> None:
        pairs = [(f.kind, f.ranks) for f in self.fits]
        if len(set(pairs)) != len(pairs):
            raise SpecError("collectives", "two fits for the same kind and ranks; keep one of each")
        if not self.fsdp_call_overhead_s >= 0 or self.fsdp_call_overhead_s == float("inf"):
            raise SpecError("collectives.fsdp_call_overhead",
                            f"must be a finite number >= 0, got {self.fsdp_call_overhead_s!r}")

    def nearest(self, kind: str, ranks: int) -> CollectiveFit | None:
        """The fit of ``kind`` measured over the group size nearest ``ranks`` (the smaller on a
        tie); None when ``kind`` was not measured."""
        found = [f for f in self.fits if f.kind == kind]
        return min(found, key=lambda f: (abs(f.ranks - ranks), f.ranks)) if found else None

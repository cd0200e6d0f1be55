"""Symmetry: devices that must behave identically are simulated once.

A 1,024-GPU plan of 16 stages × 64 replicas has 64 copies of every stage doing the same
work at the same times: the same slice of each micro-batch, the same kind of partners, the
same kind of ports. Replaying all of them costs 64 times more and teaches nothing new. This
module finds the *classes* of interchangeable devices and network cards so the engine can
replay one representative per class and copy its timeline to the others.

The method is colour refinement (1-dimensional Weisfeiler-Leman): start from what a device
is on its own (its pipeline rank, its slice sizes, anything else the caller says, such as an
injected fault), then repeatedly split classes whose members see different multisets of
(edge label, direction, partner class), and split network cards whose servers hold
different multisets of device classes. The stable result is an *equitable partition*: every
member of a class has the same number of flows of every kind to every other class, and every
port of a port class carries the same number of flows of every kind. In a deterministic
replay where a flow's rate depends only on the loads of its ports, members of a class then
stay in lock-step forever (by induction over events), so one representative is exact.

Ties are broken by device id, so the classes (and everything printed from them) are
deterministic.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

__all__ = ["refine"]


def refine(
    initial: Sequence[Hashable],
    card_of: Sequence[int],
    edges: Sequence[tuple[int, int, Hashable]],
    num_cards: int,
    card_initial: Sequence[Hashable] | None = None,
) -> tuple[list[int], list[int]]:
    """Colour refinement of devices and network cards.

    ``initial[d]``: starting colour of device d; ``card_of[d]``: its network card;
    ``edges``: directed ``(src, dst, label)`` flows between devices; ``card_initial[c]``:
    starting colour of card c (e.g. a degraded one). Returns ``(device_class, card_class)``:
    class ids numbered by first appearance in id order.
    """
    num_devices = len(initial)
    outgoing: list[list[tuple[Hashable, int]]] = [[] for _ in range(num_devices)]
    incoming: list[list[tuple[Hashable, int]]] = [[] for _ in range(num_devices)]
    for src, dst, label in edges:
        outgoing[src].append((label, dst))
        incoming[dst].append((label, src))
    members: list[list[int]] = [[] for _ in range(num_cards)]
    for device, card in enumerate(card_of):
        members[card].append(device)

    device_class = _relabel(initial)
    card_class = _relabel(list(card_initial) if card_initial is not None else [()] * num_cards)
    count = -1
    while True:
        card_sig = [(card_class[c], tuple(sorted(device_class[d] for d in members[c]))) for c in range(num_cards)]
        card_class = _relabel(card_sig)
        device_sig = [
            (
                device_class[d],
                card_class[card_of[d]],
                tuple(sorted((repr(label), device_class[dst]) for label, dst in outgoing[d])),
                tuple(sorted((repr(label), device_class[src]) for label, src in incoming[d])),
            )
            for d in range(num_devices)
        ]
        device_class = _relabel(device_sig)
        new_count = max(device_class, default=-1) + max(card_class, default=-1) + 2
        if new_count == count:
            return device_class, card_class
        count = new_count


def _relabel(signatures: Sequence[Hashable]) -> list[int]:
    """Map signatures to small ints in order of first appearance (deterministic)."""
    ids: dict[Hashable, int] = {}
    return [ids.setdefault(sig, len(ids)) for sig in signatures]

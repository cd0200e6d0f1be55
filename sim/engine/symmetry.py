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

**Partial symmetry without contention** (:func:`refine_behaviour`). The equitable partition is
what exactness needs when flows contend: a ring neighbour of a straggler shares ports with
it, so it can differ. Without contention (the fast path, ``--no-contention``) a flow's rate is
fixed when it is compiled, and a collective ends at the same instant for all its members, so
far less tells devices apart: their own actions and faults, the multiset of flows they send
and receive (label, bytes, rate, latency), the classes of the devices that send to them (their
data arrives when those are ready), and the set of classes in each of their groups'
collectives (it starts when the last member joins). Refining on only these keeps a straggler's
mark on the devices that wait for it (its replica's chain through the pipeline, its tensor
group) and on no others: a 16,384-GPU straggler study replays a few classes per stage.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from sim.engine.flow_table import row_ids

__all__ = ["refine", "refine_arrays", "refine_behaviour"]


def refine(
    initial: Sequence[Hashable],
    card_of: Sequence[int],
    edges: Sequence[tuple[int, int, Hashable]],
    num_cards: int,
    card_initial: Sequence[Hashable] | None = None,
    max_rounds: int | None = None,
) -> tuple[list[int], list[int]]:
    """Colour refinement of devices and network cards.

    ``initial[d]``: starting colour of device d; ``card_of[d]``: its network card;
    ``edges``: directed ``(src, dst, label)`` flows between devices; ``card_initial[c]``:
    starting colour of card c (e.g. a degraded one). Returns ``(device_class, card_class)``:
    class ids numbered by first appearance in id order.

    Each round costs a pass over every edge, and a fault splits one ring neighbour per round,
    so a ring of n replicas takes about n/2 rounds. With ``max_rounds``, a partition still
    splitting after that many rounds gives way to every device and card its own class (also
    equitable, and by then the refinement is close to it anyway).
    """
    ids: dict[Hashable, int] = {}
    labels = [ids.setdefault(label, len(ids)) for _, _, label in edges]
    src = np.array([edge[0] for edge in edges], dtype=np.int64)
    dst = np.array([edge[1] for edge in edges], dtype=np.int64)
    return refine_arrays(initial, card_of, src, dst, np.array(labels, dtype=np.int64), num_cards,
                         card_initial, max_rounds)


def refine_arrays(initial: Sequence[Hashable], card_of: Sequence[int], src: np.ndarray, dst: np.ndarray,
                  label: np.ndarray, num_cards: int, card_initial: Sequence[Hashable] | None = None,
                  max_rounds: int | None = None) -> tuple[list[int], list[int]]:
    """:func:`refine` with the edges as arrays: ``src[e]``, ``dst[e]`` and ``label[e]`` (a small
    int per distinct label; only which labels are equal matters, not their numbering).

    A round runs in numpy, not in Python: each edge's ``(label, partner class)`` is one
    integer, a device's sorted integers are its multiset, and a device's class, its card's
    class and its two multisets are one row of a table whose equal rows are one new class
    (``row_ids``). The classes are those of the per-device tuples, numbered the same way (by
    first appearance in id order).
    """
    num_devices = len(initial)
    card_of = np.asarray(card_of, dtype=np.int64).reshape(num_devices)
    width = np.int64(max(num_devices, 1))  # a class id is below it: label * width + class is exact
    out_group = _Segments(src, num_devices)
    in_group = _Segments(dst, num_devices)
    card_group = _Segments(card_of, num_cards)
    device_class = np.array(_relabel(initial), dtype=np.int64)
    card_class = np.array(_relabel(list(card_initial) if card_initial is not None else [()] * num_cards),
                          dtype=np.int64)
    count, rounds = -1, 0
    while True:
        rounds += 1
        if max_rounds is not None and rounds > max_rounds:
            return list(range(num_devices)), list(range(num_cards))
        card_class = _classes([card_class], card_group, device_class)
        device_class = _classes([device_class, card_class[card_of]], out_group, label * width + device_class[dst],
                                in_group, label * width + device_class[src])
        new_count = int(device_class.max(initial=-1)) + int(card_class.max(initial=-1)) + 2
        if new_count == count:
            return device_class.tolist(), card_class.tolist()
        count = new_count


def _classes(own: list[np.ndarray], *multisets) -> np.ndarray:
    """Each item's new class: its ``own`` columns and its multisets (``(segments, values)``
    pairs), numbered by first appearance (:func:`_relabel`'s numbering)."""
    pairs = list(zip(multisets[::2], multisets[1::2]))
    columns = [group.columns(values) for group, values in pairs]
    if all(c is not None for c in columns):
        ids = row_ids(own + [column for matrix in columns for column in matrix])
    else:  # too wide to pad: the multisets' bytes as keys, in Python
        keys = [group.keys(values) for group, values in pairs]
        ids = np.array(_relabel(list(zip(*(c.tolist() for c in own), *keys))), dtype=np.int64)
    _, first, where = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[where.reshape(-1)]


class _Segments:
    """Items grouped by an owner (an edge by its sender, a device by its card): each owner's
    values as a sorted multiset, for one round of :func:`refine_arrays`. The values are
    non-negative, so a multiset padded with -1 to the widest owner's count is still itself."""

    MAX_CELLS = 1 << 22
    """The most cells of a padded table (owners x widest); wider ones are keyed by bytes."""

    def __init__(self, owner: np.ndarray, num_owners: int) -> None:
        self.owner = owner
        counts = np.bincount(owner, minlength=num_owners)
        bounds = np.concatenate(([0], np.cumsum(counts)))
        self.bounds = (bounds * 8).tolist()  # byte offsets of each owner's int64 values
        self.num_owners = num_owners
        self.width = int(counts.max(initial=0))
        self.sorted_owner = np.sort(owner, kind="stable")  # the owners in any lexsort by (values, owner)
        self.column = np.arange(len(owner)) - bounds[self.sorted_owner]

    def columns(self, values: np.ndarray) -> list[np.ndarray] | None:
        """Each owner's values sorted, padded with -1: a table's columns (None when too wide)."""
        if self.num_owners * self.width > self.MAX_CELLS:
            return None
        table = np.full((self.num_owners, self.width), -1, dtype=np.int64)
        table[self.sorted_owner, self.column] = values[np.lexsort((values, self.owner))]
        return list(table.T)

    def keys(self, values: np.ndarray) -> list[bytes]:
        """Each owner's values, sorted, as bytes: equal bytes, equal multisets."""
        ordered = values[np.lexsort((values, self.owner))].astype(np.int64).tobytes()
        b = self.bounds
        return [ordered[b[i]:b[i + 1]] for i in range(self.num_owners)]


def _relabel(signatures: Sequence[Hashable]) -> list[int]:
    """Map signatures to small ints in order of first appearance (deterministic)."""
    ids: dict[Hashable, int] = {}
    return [ids.setdefault(sig, len(ids)) for sig in signatures]


def refine_behaviour(
    initial: Sequence[Hashable],
    incoming: Sequence[Sequence[tuple[Hashable, int]]],
    groups: Sequence[tuple[Hashable, Sequence[int]]],
) -> list[int]:
    """Colour refinement for a contention-free replay (see the module docstring).

    ``initial[d]``: what device d is on its own, its flows' multisets included;
    ``incoming[d]``: ``(label, sender)`` of every point-to-point flow it receives;
    ``groups``: ``(label, members)`` of every per-action collective group (tensor, context,
    FSDP). Returns class ids numbered by first appearance in id order.

    A device's signature each round is its class, the multiset of ``(label, sender's class)``
    of what it receives, and the multiset of ``(label, the set of its group's classes)`` of its
    groups. A round runs in numpy as :func:`refine_arrays`' do (a straggler's mark moves one
    stage per round, so a 128-stage pipeline takes over a hundred rounds: in Python, 5 s at
    16,384 devices): each pair is one integer, equal rows of a table one new class.
    """
    num_devices = len(initial)
    label_id = _label_ids([label for flows in incoming for label, _ in flows] + [label for label, _ in groups])
    in_dst = np.array([d for d, flows in enumerate(incoming) for _ in flows], dtype=np.int64)
    in_src = np.array([src for flows in incoming for _, src in flows], dtype=np.int64)
    in_label = np.array([label_id[label] for flows in incoming for label, _ in flows], dtype=np.int64)
    member_group = np.array([g for g, (_, members) in enumerate(groups) for _ in members], dtype=np.int64)
    member_device = np.array([d for _, members in groups for d in members], dtype=np.int64)
    member_label = np.array([label_id[label] for label, members in groups for _ in members], dtype=np.int64)
    senders, memberships = _Segments(in_dst, num_devices), _Segments(member_device, num_devices)
    width = np.int64(max(num_devices, 1))  # a class id is below it: label * width + class is exact
    group_width = np.int64(max(len(groups), 1))  # and a group signature's id below this one
    device_class = np.array(_relabel(initial), dtype=np.int64)
    count = int(device_class.max(initial=-1)) + 1
    while True:
        # a group's signature is the *set* of its members' classes: its distinct (group, class) pairs
        pairs = np.unique(np.stack([member_group, device_class[member_device]]), axis=1)
        group_sig = _classes([np.zeros(len(groups), dtype=np.int64)], _Segments(pairs[0], len(groups)), pairs[1])
        device_class = _classes([device_class], senders, in_label * width + device_class[in_src],
                                memberships, member_label * group_width + group_sig[member_group])
        new_count = int(device_class.max(initial=-1)) + 1
        if new_count == count:
            return device_class.tolist()
        count = new_count


def _label_ids(labels) -> dict[Hashable, int]:
    """Small ints for labels, in sorted order of their text (the same ids on every run)."""
    return {label: i for i, label in enumerate(sorted(set(labels), key=repr))}

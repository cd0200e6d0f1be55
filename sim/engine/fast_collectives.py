"""The fast path's collectives (``sim.engine.fastpath``): gradient reductions and group collectives.

Without contention a collective's time is fixed once its last member has issued it, so the
fast path times each when that member reaches it, with the rule book's rules
(``sim.engine.rules``): ``collective_times``, ``reduce_issue_s`` for a bucketed reduction,
``after_group`` and ``beside_bounds`` for what a group collective does to the compute stream.
"""

from __future__ import annotations

from sim.engine import rules
from sim.engine.rules import collective_duration_s

__all__ = ["FastCollectives"]


class FastCollectives:
    """The collectives of ``sim.engine.fastpath._PlanState`` (a mixin): it reads and writes the
    replay's registers (``issued``, ``coll_free``, ``group_*``, ``pending_*``, ``records``, ``ready``)."""

    def _reduce(self, c: int, i: int, op, now: float) -> None:
        if op.collective < 0:
            self.records[c].op_times[i] = (now, now)
            return
        coll = self.w.collectives[op.collective]
        issued = self.issued.setdefault((coll.index, op.microbatch), [])
        ready = -float("inf")
        if op.source >= 0:  # in buckets: from its backward's first bucket (``rules.reduce_issue_s``)
            cls, (start, ready) = self.w.classes[c], self.records[c].op_times[op.source]
            now = rules.reduce_issue_s(now, start, rules.stretched_s(cls.durations[op.source], start, cls.slowdown,
                                                                     cls.slow_from_s), op.buckets, True)
        issued.append((c, i, now, ready + op.tail_s))
        if len(issued) < len(coll.participants):
            return
        start, end = rules.collective_times((t for _, _, t, _ in issued), collective_duration_s(self.w, coll),
                                            (self.coll_free[p] for p in coll.participants),
                                            max(floor for *_, floor in issued))
        for p, index, *_ in issued:
            self.coll_free[p] = end
            self.records[p].op_times[index] = (start, end)

    def _group_op(self, c: int, i: int, op, now: float) -> float | None:
        """The compute clock after GROUP op ``i`` of class ``c`` (None while its group has not all issued it)."""
        times = self._group(c, i, op, now)
        if times is None:
            return None
        if op.overlap:
            self.pending_start_s[c], self.pending_s[c] = rules.beside_bounds(
                self.pending_start_s[c], self.pending_s[c], *times, op.lead_s, op.tail_s)
            return now
        return rules.after_group(now, self.pending_s[c], times[1], False)[0]

    def _group(self, c: int, i: int, op, now: float) -> tuple[float, float] | None:
        """When one action's group collective starts and ends (None while some member has not issued it)."""
        g = self.w.classes[c].groups[op.collective]
        key = (g, op.microbatch, op.kind)
        times = self.group_end.get(key)
        if times is not None:
            return times
        coll = self.w.group_collectives[g]
        issued = self.group_issued.setdefault(key, {})
        issued.setdefault(c, (i, now))
        if len(issued) < len(coll.participants):
            self.group_waiting.setdefault(key, []).append(c)
            return None
        start, end = rules.collective_times((t for _, t in issued.values()), collective_duration_s(self.w, coll))
        self.group_end[key] = start, end
        for p, (index, _) in issued.items():
            self.records[p].op_times[index] = (start, end)
        self.ready += self.group_waiting.pop(key, [])
        return start, end


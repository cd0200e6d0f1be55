"""The schedule checker's old module name; the checker is :mod:`sim.schedule.check`.

Kept importable (``tests/test_layers.py`` expects the core to load it) until its callers
move to ``sim.schedule.check.check_schedule``; nothing in the project imports it.
"""

from sim.schedule.check import check_schedule, format_grid, run_ranks

__all__ = ["check_schedule", "format_grid", "run_ranks"]

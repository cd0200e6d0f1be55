"""Figures: one function per figure, each returning a matplotlib ``Figure``.

``sim.report.plots.timeline`` draws one replay (Gantt chart, memory over time, schedules stacked;
the Gantt drawing and its key are ``sim.report.plots.gantt``'s),
``sim.report.plots.tables`` a what-if study's table and the planners compared, and
``sim.report.plots.validation`` a prediction against its measurement and a faulty replay against
its fault-free twin. The names below are re-exported for notebooks (``from sim import plots``).
"""

from sim.report.plots.tables import (
    TABLE_FIGURES,
    memory_vs_microbatches_figure,
    oom_frontier_figure,
    planner_comparison_figure,
    throughput_vs_gpus_figure,
)
from sim.report.plots.timeline import gantt_figure, memory_figure, rows_to_plot, schedule_comparison_figure
from sim.report.plots.validation import (
    fault_impact_figure,
    validation_figure,
    validation_gantt_figure,
    validation_memory_figure,
)

__all__ = [
    "TABLE_FIGURES",
    "fault_impact_figure",
    "gantt_figure",
    "memory_figure",
    "memory_vs_microbatches_figure",
    "oom_frontier_figure",
    "planner_comparison_figure",
    "rows_to_plot",
    "schedule_comparison_figure",
    "throughput_vs_gpus_figure",
    "validation_figure",
    "validation_gantt_figure",
    "validation_memory_figure",
]

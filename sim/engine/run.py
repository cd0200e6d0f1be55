"""Running a scenario: compile its plan and replay it with the engine a user chose.

``run_scenario`` is the one entry to the engine for the command lines, the planner, the
sweeps, the runtime's validation and the notebooks. It imports the SimPy engine only when
it is asked for, so a fast-path replay loads no SimPy. The scenario's resolved plan
(``Scenario.resolved``: schedule, lowered schedule, stage costs) is built once and read by
every compilation of it: the optimistic classes, the equitable ones if those diverge, and the
fault-free baseline.
"""

from __future__ import annotations

import logging

from sim.core.errors import DappleError
from sim.core.faults import first_failure
from sim.engine.compile import compile_workload
from sim.engine.fastpath import replay
from sim.engine.result import SimResult
from sim.input.scenario import Scenario

__all__ = ["ENGINES", "run_scenario"]

log = logging.getLogger(__name__)

ENGINES = ("simpy", "fast")
"""``simpy``: the discrete-event engine; ``fast``: the contention-free replay (``sim.engine.fastpath``)."""


def run_scenario(
    scenario: Scenario, *, engine: str = "simpy", contention: bool = True, symmetric: bool = True,
    log_level: int = logging.INFO,
) -> SimResult:
    """Replay ``scenario``'s plan; raises ``DappleError`` when it has none.

    ``log_level`` is the level of the "N devices in K classes" line: INFO for a user's one
    replay, DEBUG from a planner or a sweep, which replay hundreds of candidates."""
    if scenario.plan is None:
        raise DappleError(
            f"{scenario.path or scenario.name}: plan: missing; add a plan (stages and schedule) to simulate, "
            "or let the planner choose one"
        )
    if engine not in ENGINES:
        raise DappleError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
    if engine == "fast":
        failing = first_failure(scenario.faults)
        if failing is not None:
            raise DappleError(
                f"{scenario.path or scenario.name}: faults[{failing}]: a device failure stops the iteration, and "
                "device failures need the SimPy engine to replay; use --engine simpy"
            )
    contended = contention and engine != "fast"
    # with contention a fault would split every device that shares a ring with one it touched:
    # try the optimistic classes first, and the equitable ones if the replay says they diverged
    workload = compile_workload(scenario, symmetric=symmetric, contention=contended, optimistic=contended)
    log.log(log_level, "%s: %d devices in %d classes", scenario.name, workload.num_devices, len(workload.classes))
    if engine == "fast":
        result = replay(workload)
    else:
        # SimPy only when the SimPy engine is asked for: a fast-path replay loads none
        from sim.engine.replay import Diverged, simulate

        try:
            result = simulate(workload, contention=contention)
        except Diverged as exc:
            log.log(log_level, "%s: %s; replaying the equitable classes", scenario.name, exc)
            workload = compile_workload(scenario, symmetric=symmetric, contention=True)
            log.log(log_level, "%s: %d devices in %d classes", scenario.name, workload.num_devices, len(workload.classes))
            result = simulate(workload, contention=contention)
            result.diverged = str(exc)
    if scenario.faults:
        # the same plan without faults, for the impact (iteration time, idle time per device);
        # faults do not enter the resolved plan, so the baseline keeps it
        result.baseline = run_scenario(scenario.without_faults(), engine=engine, contention=contention,
                                       symmetric=symmetric, log_level=log_level)
    return result

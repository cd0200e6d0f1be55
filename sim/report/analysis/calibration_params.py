"""The parameters ``dapple-sim calibrate`` fits, each with its physical range.

One row per parameter: the ``DeviceSpec`` field (or the intra-node ``LinkSpec``'s
``collective_efficiency``) it sets, the scenario key it is written back as, and the range it
is fitted in. The ranges are physical, not tuned: an efficiency (a share of a peak rate) in
[0.01, 1] — the range the scenario reader accepts (``sim.input.cluster.DEVICE_NUMBER_RANGES``;
below a hundredth of the peak a step would take years); a time non-negative, at most 2 ms per
kernel and 100 ms per action; ``matmul_half_dim`` from 0 to 10⁴ − 1 (fitted as
log10(D + 1), as tiling effects scale). ``memory_reserved`` is fitted apart from the times
(``sim.report.analysis.calibrate``) in [0, memory / 4]: every GPU preset reserves under a
tenth (the V100's 1.31 of 16 GiB is the largest share, ``sim.cost.reserved``), so a quarter
leaves room for a stack that keeps more buffers while refusing a reserve that would make
the device a fraction of itself.

The least-squares fit works in a scaled space (``FitParameter.scaled``): shares as they
are, times in microseconds, so that one step of the optimiser moves each parameter by a
comparable amount. Each row also holds its prior's width (``PRIOR_WEIGHT`` in
``sim.report.analysis.calibrate``) and two further starting points for the fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sim.core.units import format_bytes, format_time
from sim.input.cluster import DEVICE_NUMBER_RANGES
from sim.input.scenario import Scenario

__all__ = ["ATTENTION_PARAMS", "FIT_PARAMETERS", "MEMORY_RESERVED", "MEMORY_RESERVED_MAX_FRACTION", "PARAMS",
           "FitParameter", "base_value", "params_yaml", "with_params"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FitParameter:
    """One fitted parameter: where it lives, its range and how the fit scales it."""

    name: str
    """The ``DeviceSpec`` field it sets (``collective_efficiency``: the intra-node link's)."""
    key: str
    """The ``cluster.device`` (or ``cluster.intra_node``) key a scenario writes it as."""
    kind: str
    """``share`` (a fraction, as it is), ``log_dim`` (log10(D + 1)) or ``time`` (microseconds)."""
    lower: float
    """Lower end of its range, in the scaled space."""
    upper: float
    """Upper end of its range, in the scaled space."""
    prior_width: float
    """How far from the base value, in the scaled space, costs as much as a 2% error on one run."""
    x_scale: float
    """A typical step in the scaled space (``scipy.optimize.least_squares``'s ``x_scale``)."""
    starts: tuple[float, float]
    """Two starting points besides the base value, in the scaled space."""

    def scaled(self, value: float) -> float:
        """``value`` (seconds, shares, a dimension) in the fit's scaled space."""
        if self.kind == "log_dim":
            return math.log10(value + 1.0)
        return value * 1e6 if self.kind == "time" else value

    def value(self, x: float) -> float:
        """The parameter's value (seconds, shares, a dimension) at scaled ``x``."""
        if self.kind == "log_dim":
            return 10.0 ** float(x) - 1.0
        return float(x) * 1e-6 if self.kind == "time" else float(x)

    def yaml_value(self, value: float) -> str:
        """``value`` as the scenario key takes it (a time with its unit, six digits)."""
        if self.kind == "time":  # a time fitted to its lower bound prints as 0s, not 1e-11ns
            return format_time(value if value >= 1e-12 else 0.0, 6)
        return f"{value:.6g}"


def _share(name: str, starts: tuple[float, float]) -> FitParameter:
    low, high, _ = DEVICE_NUMBER_RANGES.get(name, (0.01, 1.0, False))  # collective_efficiency: a link's
    return FitParameter(name=name, key=name, kind="share", lower=low, upper=high, prior_width=0.3, x_scale=0.1,
                        starts=starts)


def _time(name: str, key: str, upper_us: float, width_us: float, scale_us: float,
          starts: tuple[float, float]) -> FitParameter:
    return FitParameter(name=name, key=key, kind="time", lower=0.0, upper=upper_us, prior_width=width_us,
                        x_scale=scale_us, starts=starts)


FIT_PARAMETERS: tuple[FitParameter, ...] = (
    _share("efficiency", (0.5, 0.9)),
    FitParameter(name="matmul_half_dim", key="matmul_half_dim", kind="log_dim", lower=0.0, upper=4.0,
                 prior_width=0.5, x_scale=0.3, starts=(2.0, 1.0)),
    _time("kernel_overhead_s", "kernel_overhead", 2000.0, 20.0, 10.0, (10.0, 1.0)),
    _share("memory_efficiency", (0.5, 0.9)),
    _time("action_overhead_s", "action_overhead", 100_000.0, 500.0, 100.0, (100.0, 10.0)),
    _time("kernel_issue_s", "kernel_issue", 2000.0, 20.0, 10.0, (0.0, 5.0)),
    _share("collective_efficiency", (0.8, 1.0)),
    _share("attention_efficiency", (0.5, 0.9)),
    _share("attention_backward_efficiency", (0.5, 0.9)),
    _share("sdpa_efficiency", (0.5, 0.9)),
    _share("sdpa_backward_efficiency", (0.5, 0.9)),
    _share("cudnn_efficiency", (0.5, 0.9)),
    _share("cudnn_backward_efficiency", (0.5, 0.9)),
)
"""Every parameter fitted by least squares, in the order the fit lays them out."""

PARAMS = tuple(p.name for p in FIT_PARAMETERS[:7])
"""The parameters every fit frees: ``DeviceSpec`` fields, and the intra-node ``LinkSpec``'s ``collective_efficiency``."""

ATTENTION_PARAMS = {"flash": ("attention_efficiency", "attention_backward_efficiency"),
                    "sdpa": ("sdpa_efficiency", "sdpa_backward_efficiency"),
                    "cudnn": ("cudnn_efficiency", "cudnn_backward_efficiency")}
"""Fused attention kernel -> the (forward, backward) efficiencies a run with it constrains."""

MEMORY_RESERVED = "memory_reserved_bytes"
"""The ``DeviceSpec`` field runs with a measured peak memory constrain (fitted in closed form)."""

MEMORY_RESERVED_MAX_FRACTION = 0.25
"""The largest reserve, as a share of the device's memory (see the module doc)."""


def base_value(scenario: Scenario, name: str) -> float:
    """Parameter ``name``'s value in ``scenario`` (its device's field, or its intra-node link's)."""
    if name == "collective_efficiency":
        return scenario.cluster.intra_node.collective_efficiency
    return getattr(scenario.cluster.device, name)


def with_params(scenario: Scenario, params: dict[str, float]) -> Scenario:
    """``scenario`` with fitted ``params``: the device's fields, the intra-node link's collective efficiency."""
    device_fields = {k: v for k, v in params.items() if k != "collective_efficiency"}
    cluster = replace(scenario.cluster, device=replace(scenario.cluster.device, **device_fields))
    if "collective_efficiency" in params:
        cluster = replace(cluster, intra_node=replace(cluster.intra_node,
                                                      collective_efficiency=params["collective_efficiency"]))
    return replace(scenario, cluster=cluster)


def params_yaml(params: dict[str, float], *, runs: int, mape: float) -> str:
    """The fitted values as a ``cluster`` snippet (``device`` and ``intra_node`` keys) to merge
    into a scenario; a parameter the fit left alone (not in ``params``) is not written."""
    device = [f"    {p.key}: {p.yaml_value(params[p.name])}" for p in FIT_PARAMETERS
              if p.name in params and p.name != "collective_efficiency"]
    if MEMORY_RESERVED in params:
        device.append(f"    memory_reserved: {format_bytes(params[MEMORY_RESERVED], 6)}")
    link = (["  intra_node:", f"    collective_efficiency: {params['collective_efficiency']:.6g}"]
            if "collective_efficiency" in params else [])
    return "\n".join([f"# Fitted by dapple-sim calibrate on {runs} measured runs (MAPE {mape:.1%}); merge under cluster.",
                      "cluster:", "  device:", *device, *link, ""])

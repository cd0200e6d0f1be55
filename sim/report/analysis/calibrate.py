"""Calibration: fit the kernel cost model's device parameters to measured iteration times.

A user measures a handful of training runs on their cluster (``dapple-run run --csv`` writes
them, or any framework's logs), one CSV row per run::

    hidden,heads,layers,seq_len,vocab,microbatch_size,global_batch_size,tp,dp,pp,recompute,iteration_time_s

``microbatch_size`` is per data-parallel replica, as Megatron-LM counts it, so a row's
pipeline micro-batch (what a scenario calls ``microbatch_size``) is ``microbatch_size × dp``
and it has ``global_batch_size / (microbatch_size × dp)`` micro-batches. Each row becomes a
scenario: the base scenario's cluster, device, dtype and optimizer; a GPT of the row's
dimensions; ``pp`` stages with the transformer blocks split as evenly as possible (the
embedding with the first stage, the head with the last), ``dp`` replicas per stage on
consecutive devices, DAPPLE's schedule. Rows with ``tp > 1`` are rejected: tensor
parallelism is not modelled yet.

The free parameters are the device's kernel-model parameters (``sim.cost.kernels``): the matrix
efficiency ``efficiency`` (e_max), ``matmul_half_dim`` (D), ``kernel_overhead`` (added to every
kernel), ``kernel_issue`` (the host's issue time, a kernel's floor) and ``memory_efficiency``;
the framework's fixed cost per forward or backward action, ``action_overhead`` (``sim.cost.compute``);
and the intra-node link's ``collective_efficiency`` (the share of its bandwidth the gradient
all-reduce reaches). Each is bounded to its physical range: efficiencies in [0.01, 1], times
non-negative and below 2 ms per kernel and 100 ms per action; a parameter that ends at a bound
is reported in the notes (the runs ask for a value the model's form cannot give). They are fitted by bounded least squares on the
relative errors ``predicted / measured − 1`` (``scipy.optimize.least_squares``,
trust-region reflective, from fixed starting points, so the same rows always give the same
fit), with every row replayed by the fast path (contention-free; ``sim.engine.fastpath``).

Five parameters from a handful of rows leave directions the rows do not pin down (a run
of 5 rows can be matched exactly in many ways), so the fit adds a weak prior: one residual
per parameter, ``PRIOR_WEIGHT · (x − x_base) / width``, pulling it towards the base
scenario's device value (the preset's defaults unless the base overrides them). Being off by
one width costs as much as a 2% error on one run, so the data decide wherever they can;
this is a maximum a posteriori fit with a Gaussian prior (ridge regression, Hoerl &
Kennard, Technometrics 1970).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import DappleError
from sim.core.parallelism import Recompute
from sim.core.plan import PlanSpec, StageSpec, check_plan
from sim.core.specs import TrainingSpec
from sim.core.units import format_time
from sim.core.userfiles import CSV_MAX_BYTES, read_user_file, show_path
from sim.engine.compile import compile_workload
from sim.engine.fastpath import replay
from sim.input.scenario import Scenario
from sim.models import build_model

__all__ = ["COLUMNS", "PARAMS", "CalibrationResult", "CalibrationScore", "MeasuredRun", "ScoredRun", "calibrate",
           "kendall_tau", "params_yaml", "predict", "read_runs", "row_scenario", "score_runs", "with_params"]

COLUMNS = ("hidden", "heads", "layers", "seq_len", "vocab", "microbatch_size", "global_batch_size", "tp", "dp",
           "pp", "recompute", "iteration_time_s")
"""The measured-run CSV's columns (any order; extra columns are ignored)."""

PARAMS = ("efficiency", "matmul_half_dim", "kernel_overhead_s", "memory_efficiency", "action_overhead_s",
          "kernel_issue_s", "collective_efficiency")
"""The fitted parameters: ``DeviceSpec`` fields, and the intra-node ``LinkSpec``'s ``collective_efficiency``."""

# fitted in a scaled space: efficiency, log10(D + 1), kernel overhead in µs, memory efficiency,
# action overhead in µs, kernel issue time in µs, collective efficiency
_LOWER = (0.01, 0.0, 0.0, 0.01, 0.0, 0.0, 0.01)
_UPPER = (1.0, 4.0, 2000.0, 1.0, 100_000.0, 2000.0, 1.0)
_PRIOR_WIDTH = (0.3, 0.5, 20.0, 0.3, 500.0, 20.0, 0.3)
_X_SCALE = (0.1, 0.3, 10.0, 0.1, 100.0, 10.0, 0.1)
PRIOR_WEIGHT = 0.02
"""Weight of the prior residuals (see the module doc)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRun:
    """One CSV row."""

    hidden: int
    heads: int
    layers: int
    seq_len: int
    vocab: int
    microbatch_size: int
    """Per data-parallel replica (Megatron's count)."""
    global_batch_size: int
    dp: int
    pp: int
    recompute: bool
    iteration_time_s: float
    line: int = 0
    """Line in its file, for error messages."""

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in COLUMNS if name != "tp"} | {"tp": 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoredRun:
    """One measured run against its prediction."""

    run: MeasuredRun
    predicted_s: float
    """The fast path's iteration time with the fitted parameters, seconds."""

    @property
    def error_frac(self) -> float:
        """``predicted / measured − 1``."""
        return self.predicted_s / self.run.iteration_time_s - 1.0

    def to_json(self) -> dict[str, Any]:
        return {**self.run.as_dict(), "measured_s": self.run.iteration_time_s, "predicted_s": self.predicted_s,
                "error_frac": self.error_frac}


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationScore:
    """How well predictions follow a set of measured runs."""

    mape: float
    """Mean |predicted / measured − 1| over the runs."""
    kendall_tau: float | None
    """Kendall's tau-a of measured and predicted times: 1 when they rank the runs alike (None below two)."""
    runs: tuple[ScoredRun, ...]
    """Every run in file order."""

    def to_json(self) -> dict[str, Any]:
        return {"mape": self.mape, "kendall_tau": self.kendall_tau, "rows": [run.to_json() for run in self.runs]}


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationResult:
    """A fit: the parameters, how well they follow the fitted runs (and held-out runs)."""

    params: dict[str, float]
    """Fitted values by ``PARAMS`` name, in the units a scenario's ``cluster.device`` takes (seconds, shares)."""
    fit: CalibrationScore
    """The fitted runs against their predictions."""
    x: tuple[float, ...]
    """The optimum in the fit's scaled space (see ``_LOWER``)."""
    notes: tuple[str, ...]
    """What the user should know: too few runs, a parameter at the end of its range."""
    test: CalibrationScore | None = None
    """Held-out runs against the fitted parameters' predictions (``score_runs``), when given."""

    def to_json(self) -> dict[str, Any]:
        """``dapple-sim calibrate --json``'s report: ``params``, ``fit`` and ``test`` when given."""
        data = {"params": dict(self.params), "fit": self.fit.to_json()}
        return data if self.test is None else {**data, "test": self.test.to_json()}


def _bool(text: str) -> bool | None:
    return {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}.get(text.strip().lower())


MAX_ROWS = 10_000
"""Most measured runs in one CSV (each distinct one is replayed at every step of the fit)."""
MAX_INTEGER = 10**9
"""Largest integer cell (a model dimension, a batch, a degree)."""
MAX_ITERATION_TIME_S = 1e6
"""Longest measured iteration, seconds."""


def read_runs(path: str | Path) -> list[MeasuredRun]:
    """Read a measured-run CSV (at most 16 MiB and ``MAX_ROWS`` runs); one line naming the
    file, line and column for any problem."""
    path = Path(path)
    shown = show_path(path)
    text = read_user_file(path, "CSV file", max_bytes=CSV_MAX_BYTES)
    reader = csv.DictReader(text.splitlines())
    try:
        fieldnames = reader.fieldnames or []
        missing = [c for c in COLUMNS if c not in fieldnames]
        if missing:
            raise DappleError(f"{shown}: missing column {missing[0]!r}; the columns are {', '.join(COLUMNS)}")
        runs = []
        for line, row in enumerate(reader, start=2):
            if len(runs) >= MAX_ROWS:
                raise DappleError(f"{shown}: more than {MAX_ROWS:,} runs; fit on a sample of them")
            runs.append(_run(row, f"{shown}:{line}", line))
    except csv.Error as exc:
        raise DappleError(f"{shown}:{reader.line_num}: not a readable CSV ({exc})") from None
    if not runs:
        raise DappleError(f"{shown}: no runs (a header line and one row per measured run)")
    return runs


def _run(row: dict, where: str, line: int) -> MeasuredRun:
    """One CSV row as a measured run; ``where`` is ``FILE:LINE`` for messages."""
    values: dict[str, Any] = {}
    for name in COLUMNS:
        raw = (row.get(name) or "").strip()
        shown = repr(raw if len(raw) <= 40 else raw[:37] + "...")
        if name == "recompute":
            flag = _bool(raw)
            if flag is None:
                raise DappleError(f"{where}: recompute: {shown} is not 0/1/true/false")
            values[name] = flag
        elif name == "iteration_time_s":
            try:
                values[name] = float(raw) if len(raw) <= 100 else math.nan
            except ValueError:
                raise DappleError(f"{where}: iteration_time_s: {shown} is not a number") from None
            if not 0 < values[name] <= MAX_ITERATION_TIME_S:  # NaN fails too
                raise DappleError(f"{where}: iteration_time_s: {shown} must be a positive time in seconds, at "
                                  f"most {MAX_ITERATION_TIME_S:g}")
        else:  # ASCII digits only: '²'.isdigit() is true, int('²') fails
            if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or not 1 <= int(raw) <= MAX_INTEGER:
                raise DappleError(f"{where}: {name}: {shown} must be a positive integer, at most {MAX_INTEGER:,}")
            values[name] = int(raw)
    if values.pop("tp") > 1:
        raise DappleError(f"{where}: tp: {row['tp'].strip()} > 1 is not modelled yet (tensor "
                          "parallelism); remove the row or measure with tp = 1")
    return MeasuredRun(line=line, **values)


def row_scenario(base: Scenario, run: MeasuredRun, *, source: str = "<csv>") -> Scenario:
    """The scenario of ``run`` on ``base``'s cluster, device, dtype and optimizer (see the module doc)."""
    where = f"{source}:{run.line}"
    if run.pp > run.layers:
        raise DappleError(f"{where}: pp: {run.pp} stages for {run.layers} transformer layers")
    try:
        model = build_model("gpt", layers=run.layers, hidden=run.hidden, heads=run.heads, seq_len=run.seq_len,
                            vocab=run.vocab, dtype=base.model.dtype, optimizer=base.model.optimizer,
                            tied_embeddings=_base_value(base, "tied_embeddings", True))
        model = replace(model, optimizer_implementation=base.model.optimizer_implementation,
                        grad_dtype=base.model.grad_dtype)
        training = TrainingSpec(global_batch_size=run.global_batch_size, microbatch_size=run.microbatch_size * run.dp)
    except DappleError as exc:
        raise DappleError(f"{where}: {exc}") from None
    per_node = base.cluster.devices_per_node
    cluster = replace(base.cluster, nodes=max(base.cluster.nodes, -(-run.pp * run.dp // per_node)))
    # blocks split as evenly as possible; the embedding (layer 0) joins the first stage, the head the last
    bounds = [0] + [1 + (k * run.layers) // run.pp for k in range(1, run.pp)] + [run.layers + 2]
    stages = tuple(StageSpec(layers=(bounds[s], bounds[s + 1]), devices=tuple(range(s * run.dp, (s + 1) * run.dp)))
                   for s in range(run.pp))
    plan = PlanSpec(stages=stages, schedule="dapple", recompute=Recompute.of(run.recompute))
    check_plan(plan, num_layers=model.num_layers, num_devices=cluster.num_devices)
    return replace(base, name=f"{base.name}-row{run.line}", cluster=cluster, model=model, training=training,
                   plan=plan, faults=())


def _base_value(base: Scenario, key: str, default: Any) -> Any:
    """A parameter of the base scenario's generated model (``default`` for a profile)."""
    return base.model.preset.values.get(key, default) if base.model.preset is not None else default


def _params(x) -> dict[str, float]:
    """The parameter values of a point ``x`` of the scaled space (``_LOWER``' comment)."""
    return {"efficiency": float(x[0]), "matmul_half_dim": 10.0 ** float(x[1]) - 1.0,
            "kernel_overhead_s": float(x[2]) * 1e-6, "memory_efficiency": float(x[3]),
            "action_overhead_s": float(x[4]) * 1e-6, "kernel_issue_s": float(x[5]) * 1e-6,
            "collective_efficiency": float(x[6])}


def with_params(scenario: Scenario, params: dict[str, float]) -> Scenario:
    """``scenario`` with fitted ``params``: the device's fields, the intra-node link's collective efficiency."""
    device_fields = {k: v for k, v in params.items() if k != "collective_efficiency"}
    cluster = replace(scenario.cluster, device=replace(scenario.cluster.device, **device_fields))
    if "collective_efficiency" in params:
        cluster = replace(cluster, intra_node=replace(cluster.intra_node,
                                                      collective_efficiency=params["collective_efficiency"]))
    return replace(scenario, cluster=cluster)


def _with_params(scenario: Scenario, x) -> Scenario:
    return with_params(scenario, _params(x))


def predict(scenarios: list[Scenario], x=None) -> list[float]:
    """Iteration time of each scenario by the fast path (with scaled parameters ``x`` if given)."""
    return [replay(compile_workload(s if x is None else _with_params(s, x), contention=False)).iteration_time_s for s in scenarios]


def _start(cluster) -> list[float]:
    device = cluster.device
    return [min(max(device.efficiency, 0.01), 1.0), math.log10(device.matmul_half_dim + 1.0),
            min(device.kernel_overhead_s * 1e6, 2000.0), min(max(device.memory_efficiency, 0.01), 1.0),
            min(device.action_overhead_s * 1e6, 100_000.0), min(device.kernel_issue_s * 1e6, 2000.0),
            min(max(cluster.intra_node.collective_efficiency, 0.01), 1.0)]


def calibrate(base: Scenario, runs: list[MeasuredRun], *, source: str = "<csv>") -> CalibrationResult:
    """Fit ``PARAMS`` to ``runs``; the fitted device values, the fit's error and predictions."""
    # SciPy only when a fit runs: keeps it off the import path of the commands
    from scipy.optimize import least_squares

    # a configuration measured more than once is simulated once
    first: dict[tuple, MeasuredRun] = {}
    for run in runs:
        first.setdefault(_config_key(run), run)
    position = {key: index for index, key in enumerate(first)}
    scenarios = [row_scenario(base, run, source=source) for run in first.values()]
    row_of = np.array([position[_config_key(run)] for run in runs])
    measured = np.array([run.iteration_time_s for run in runs])

    prior = np.clip(np.array(_start(base.cluster)), _LOWER, _UPPER)
    width = np.array(_PRIOR_WIDTH)

    def residuals(x):
        data = np.array(predict(scenarios, x))[row_of] / measured - 1.0
        return np.concatenate([data, PRIOR_WEIGHT * (x - prior) / width])

    starts = [_start(base.cluster), [0.5, 2.0, 10.0, 0.5, 100.0, 0.0, 0.8], [0.9, 1.0, 1.0, 0.9, 10.0, 5.0, 1.0]]
    best = None
    for x0 in starts:  # until two starts reach the same minimum
        x0 = np.clip(np.array(x0, dtype=float), _LOWER, _UPPER)
        fit = least_squares(residuals, x0, bounds=(_LOWER, _UPPER), method="trf", x_scale=list(_X_SCALE),
                            diff_step=1e-3, max_nfev=200)
        agrees = best is not None and abs(fit.cost - best.cost) <= 1e-6 * max(best.cost, 1e-12)
        if best is None or fit.cost < best.cost:
            best = fit
        if agrees:
            break
    x = best.x
    predicted = list(np.array(predict(scenarios, x))[row_of])
    params = _params(x)
    notes = []
    if len(first) < 2 * len(PARAMS):
        notes.append(f"{len(first)} distinct configurations for {len(PARAMS)} parameters: the base device's values "
                     "settle what they cannot pin down; 10 or more varied runs give a firmer fit")
    for name, value, low, high in zip(PARAMS, x, _LOWER, _UPPER):
        if min(value - low, high - value) <= 1e-6 * (high - low):
            notes.append(f"{name} stopped at the end of its range ({params[name]:.6g}); the model cannot "
                         "follow these runs further in that direction")
    return CalibrationResult(params=params, fit=_errors(runs, predicted), x=tuple(float(v) for v in x),
                             notes=tuple(notes))


def _config_key(run: MeasuredRun) -> tuple:
    return tuple(getattr(run, name) for name in COLUMNS if name not in ("tp", "iteration_time_s"))


def _errors(runs: list[MeasuredRun], predicted: list[float]) -> CalibrationScore:
    scored = tuple(ScoredRun(run=run, predicted_s=float(p)) for run, p in zip(runs, predicted))
    mape = sum(abs(s.error_frac) for s in scored) / len(scored)
    return CalibrationScore(mape=mape, kendall_tau=kendall_tau([run.iteration_time_s for run in runs], predicted),
                            runs=scored)


def score_runs(base: Scenario, runs: list[MeasuredRun], params: dict[str, float], *, source: str) -> CalibrationScore:
    """Predict ``runs`` with fitted ``params`` and report MAPE and Kendall's tau."""
    fitted = with_params(base, params)
    predicted = predict([row_scenario(fitted, run, source=source) for run in runs])
    return _errors(runs, predicted)


def kendall_tau(a: list[float], b: list[float]) -> float | None:
    """Kendall's tau-a rank correlation of two equally long lists (None below two items)."""
    n = len(a)
    if n < 2:
        return None
    concordant = discordant = 0
    for i in range(n):
        for j in range(i + 1, n):
            sign = (a[i] - a[j]) * (b[i] - b[j])
            concordant += sign > 0
            discordant += sign < 0
    return (concordant - discordant) / (n * (n - 1) / 2)


def params_yaml(params: dict[str, float], *, runs: int, mape: float) -> str:
    """The fitted values as a ``cluster`` snippet (``device`` and ``intra_node`` keys) to merge into a scenario."""
    def time(value_s: float) -> str:  # a time fitted to its lower bound prints as 0s, not 1e-11ns
        return format_time(value_s if value_s >= 1e-12 else 0.0, 6)

    return "\n".join([
        f"# Fitted by dapple-sim calibrate on {runs} measured runs (MAPE {mape:.1%}); merge under cluster.",
        "cluster:",
        "  device:",
        f"    efficiency: {params['efficiency']:.6g}",
        f"    matmul_half_dim: {params['matmul_half_dim']:.6g}",
        f"    kernel_overhead: {time(params['kernel_overhead_s'])}",
        f"    memory_efficiency: {params['memory_efficiency']:.6g}",
        f"    action_overhead: {time(params['action_overhead_s'])}",
        f"    kernel_issue: {time(params['kernel_issue_s'])}",
        "  intra_node:",
        f"    collective_efficiency: {params['collective_efficiency']:.6g}",
        "",
    ])

"""Calibration: fit the cost model's device parameters to measured iteration times and memory.

A user measures a handful of training runs on their cluster, one CSV row per run
(``sim.report.analysis.measured_runs``: the model's dimensions, the batch, dp, pp, recompute,
the iteration time, and optionally the attention kernel and the peak memory).
``microbatch_size`` is per data-parallel replica, as Megatron-LM counts it, so a row's
pipeline micro-batch (what a scenario calls ``microbatch_size``) is ``microbatch_size × dp``
and it has ``global_batch_size / (microbatch_size × dp)`` micro-batches. Each row becomes a
scenario: the base scenario's cluster, device, dtype and optimizer; a transformer of the
row's dimensions from the base's generator (``gpt``, ``bert`` or ``llama``, with multi-head
attention; ``gpt`` when the base is a profile or another model) running the row's
``attention`` kernel, else the base model's; ``pp`` stages with the transformer blocks split
as evenly as possible (the embedding with the first stage, the head with the last), ``dp``
replicas per stage on consecutive devices, DAPPLE's schedule. Rows with ``tp > 1`` are
rejected: tensor parallelism is not modelled yet.

The free parameters (``sim.report.analysis.calibration_params``, each in its physical range:
an efficiency in [0.01, 1], a time non-negative and bounded) are the device's kernel-model
parameters (``sim.cost.kernels``): the matrix efficiency ``efficiency`` (e_max),
``matmul_half_dim`` (D), ``kernel_overhead`` (added to every kernel), ``kernel_issue`` (the
host's issue time, a kernel's floor) and ``memory_efficiency``; the framework's fixed cost
per forward or backward action, ``action_overhead`` (``sim.cost.compute``); the intra-node
link's ``collective_efficiency`` (the share of its bandwidth the gradient all-reduce
reaches); and the fused attention kernels' efficiencies (``sim.cost.compute.fused_attention_s``)
for the kernels the runs use: ``attention_efficiency`` and ``attention_backward_efficiency``
when a run uses ``flash``, ``sdpa_efficiency`` and ``sdpa_backward_efficiency`` when one uses
``sdpa``. A parameter no run constrains keeps the base's value and is named in the notes
("not constrained by these runs"); one that ends at a bound of its range is named too (the
runs ask for a value the model's form cannot give). A fused forward's attention counts twice
in a recomputed run (once in the forward, once in the backward's recomputation) and once
otherwise, so runs with and without ``recompute`` separate the forward efficiency from the
backward's; runs of one kind pin only their sum, which the prior below then splits.

The times are fitted by bounded least squares on the relative errors
``predicted / measured − 1`` (``scipy.optimize.least_squares``, trust-region reflective, from
fixed starting points, so the same rows always give the same fit), with every row replayed
by the fast path (contention-free; ``sim.engine.fastpath``). Parameters a handful of rows do
not pin down (5 rows can be matched exactly in many ways) are held by a weak prior: one
residual per parameter, ``PRIOR_WEIGHT · (x − x_base) / width``, pulling it towards the base
scenario's device value. Being off by one width costs as much as a 2% error on one run, so the
data decide wherever they can; this is a maximum a posteriori fit with a Gaussian prior (ridge
regression, Hoerl & Kennard, Technometrics 1970).

``memory_reserved`` (``sim.cost.reserved``) is fitted after the times, from the rows that give
``peak_memory_bytes``: a run holds its tensors (the replay's peak, which the timing parameters
do not move) plus the reserve, so the reserve minimising Σ ((p_i + r) / m_i − 1)² over replayed
peaks p_i and measured peaks m_i is r = Σ (m_i − p_i) / m_i² / Σ 1 / m_i². Every row ran, so
each also bounds it from above: p_i + r ≤ memory. It is clipped to [0, min(memory / 4,
memory − max p_i)]; without a measured peak it is not constrained.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sim.core.errors import DappleError
from sim.core.parallelism import Recompute
from sim.core.plan import PlanSpec, StageSpec, check_plan
from sim.core.training import TrainingSpec
from sim.core.units import format_bytes
from sim.engine.compile import compile_workload
from sim.engine.fastpath import replay
from sim.input.scenario import Scenario
from sim.models import build_model
from sim.report.analysis.calibration_params import (
    ATTENTION_PARAMS,
    FIT_PARAMETERS,
    MEMORY_RESERVED,
    MEMORY_RESERVED_MAX_FRACTION,
    PARAMS,
    FitParameter,
    base_value,
    params_yaml,
    with_params,
)
from sim.report.analysis.measured_runs import COLUMNS, OPTIONAL_COLUMNS, MeasuredRun, read_runs

__all__ = ["ATTENTION_PARAMS", "COLUMNS", "OPTIONAL_COLUMNS", "PARAMS", "ROW_GENERATORS", "CalibrationResult",
           "CalibrationScore", "MeasuredRun", "ScoredRun", "calibrate", "kendall_tau", "params_yaml", "predict",
           "read_runs", "row_scenario", "score_runs", "with_params"]

PRIOR_WEIGHT = 0.02
"""Weight of the prior residuals (see the module doc)."""

ROW_GENERATORS = ("gpt", "bert", "llama")
"""Base models whose generator builds the rows; any other base's rows are GPTs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoredRun:
    """One measured run against its prediction."""

    run: MeasuredRun
    predicted_s: float
    """The fast path's iteration time with the fitted parameters, seconds."""
    predicted_peak_memory_bytes: float | None = None
    """The replay's peak memory plus ``memory_reserved``, bytes, for a run that gives its measured peak."""

    @property
    def error_frac(self) -> float:
        """``predicted / measured − 1``."""
        return self.predicted_s / self.run.iteration_time_s - 1.0

    def to_json(self) -> dict[str, Any]:
        data = {**self.run.as_dict(), "measured_s": self.run.iteration_time_s, "predicted_s": self.predicted_s,
                "error_frac": self.error_frac}
        if self.predicted_peak_memory_bytes is not None:
            data["predicted_peak_memory_bytes"] = self.predicted_peak_memory_bytes
        return data


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationScore:
    """How well predictions follow a set of measured runs."""

    mape: float
    """Mean |predicted / measured − 1| of the iteration times over the runs."""
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
    """Fitted values by ``DeviceSpec`` field name (``collective_efficiency``: the intra-node link's),
    in seconds, shares and bytes; only the parameters the runs constrain."""
    fit: CalibrationScore
    """The fitted runs against their predictions."""
    x: tuple[float, ...]
    """The times' optimum in the fit's scaled space (``FitParameter.scaled``), in ``params``' order."""
    notes: tuple[str, ...]
    """What the user should know: too few runs, a parameter at the end of its range or not constrained."""
    test: CalibrationScore | None = None
    """Held-out runs against the fitted parameters' predictions (``score_runs``), when given."""
    not_constrained: tuple[str, ...] = ()
    """Parameters no run constrains (an attention kernel no run uses, a reserve without a measured peak),
    left at the base scenario's values and not in ``params``."""

    def to_json(self) -> dict[str, Any]:
        """``dapple-sim calibrate --json``'s report: ``params``, ``not_constrained``, ``fit`` and ``test`` when given."""
        data = {"params": dict(self.params), "not_constrained": list(self.not_constrained), "fit": self.fit.to_json()}
        return data if self.test is None else {**data, "test": self.test.to_json()}


def row_scenario(base: Scenario, run: MeasuredRun, *, source: str = "<csv>") -> Scenario:
    """The scenario of ``run`` on ``base``'s cluster, device, dtype and optimizer (see the module doc)."""
    where = f"{source}:{run.line}"
    if run.pp > run.layers:
        raise DappleError(f"{where}: pp: {run.pp} stages for {run.layers} transformer layers")
    preset = base.model.preset
    generator = preset.name if preset is not None and preset.name in ROW_GENERATORS else "gpt"
    attention = run.attention or base.model.attention or base.cluster.device.default_attention
    try:
        model = build_model(generator, layers=run.layers, hidden=run.hidden, heads=run.heads, seq_len=run.seq_len,
                            vocab=run.vocab, dtype=base.model.dtype, optimizer=base.model.optimizer,
                            tied_embeddings=_base_value(base, "tied_embeddings", True), attention=attention)
        model = replace(model, optimizer_implementation=base.model.optimizer_implementation,
                        grad_dtype=base.model.grad_dtype, moment_dtype=base.model.moment_dtype,
                        grad_accumulation=base.model.grad_accumulation, grad_passes=base.model.grad_passes,
                        recompute_blocks_only=base.model.recompute_blocks_only)
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


def _replays(scenarios: list[Scenario], params: dict[str, float] | None = None) -> list:
    """Each scenario (with ``params`` if given) replayed by the fast path, contention-free."""
    return [replay(compile_workload(s if params is None else with_params(s, params), contention=False))
            for s in scenarios]


def predict(scenarios: list[Scenario], params: dict[str, float] | None = None) -> list[float]:
    """Iteration time of each scenario by the fast path (with fitted ``params`` if given)."""
    return [result.iteration_time_s for result in _replays(scenarios, params)]


def _free(scenarios: list[Scenario]) -> tuple[FitParameter, ...]:
    """The parameters these rows constrain: ``PARAMS`` and the efficiencies of the fused kernels they run."""
    names = set(PARAMS).union(*(ATTENTION_PARAMS.get(s.model.attention, ()) for s in scenarios))
    return tuple(p for p in FIT_PARAMETERS if p.name in names)


def _values(free: tuple[FitParameter, ...], x) -> dict[str, float]:
    return {p.name: p.value(v) for p, v in zip(free, x)}


FIT_EVALUATIONS = 100
"""Evaluations of the residuals each least-squares start may spend (a count of work, never
seconds): the shipped calibrations converge well within it; a fit the runs cannot settle
stops there instead of replaying for minutes (issue 35's fuzz: 3 runs took 11.5 s at 200)."""


def _fit_times(base: Scenario, scenarios: list[Scenario], row_of, measured, free: tuple[FitParameter, ...]):
    """The least-squares optimum (scaled space) of the times' relative errors plus the prior."""
    # SciPy only when a fit runs: keeps it off the import path of the commands
    from scipy.optimize import least_squares

    lower, upper = [p.lower for p in free], [p.upper for p in free]
    prior = np.clip(np.array([p.scaled(base_value(base, p.name)) for p in free]), lower, upper)
    width = np.array([p.prior_width for p in free])

    def residuals(x):
        data = np.array(predict(scenarios, _values(free, x)))[row_of] / measured - 1.0
        return np.concatenate([data, PRIOR_WEIGHT * (x - prior) / width])

    best = None
    for x0 in (prior, [p.starts[0] for p in free], [p.starts[1] for p in free]):  # until two starts agree
        x0 = np.clip(np.array(x0, dtype=float), lower, upper)
        fit = least_squares(residuals, x0, bounds=(lower, upper), method="trf", x_scale=[p.x_scale for p in free],
                            diff_step=1e-3, max_nfev=FIT_EVALUATIONS)
        agrees = best is not None and abs(fit.cost - best.cost) <= 1e-6 * max(best.cost, 1e-12)
        if best is None or fit.cost < best.cost:
            best = fit
        if agrees:
            break
    return best.x


def calibrate(base: Scenario, runs: list[MeasuredRun], *, source: str = "<csv>") -> CalibrationResult:
    """Fit the parameters ``runs`` constrain; the fitted values, the fit's error and predictions."""
    first: dict[tuple, MeasuredRun] = {}  # a configuration measured more than once is simulated once
    for run in runs:
        first.setdefault(_config_key(run), run)
    position = {key: index for index, key in enumerate(first)}
    scenarios = [row_scenario(base, run, source=source) for run in first.values()]
    row_of = np.array([position[_config_key(run)] for run in runs])
    free = _free(scenarios)
    x = _fit_times(base, scenarios, row_of, np.array([run.iteration_time_s for run in runs]), free)
    params = _values(free, x)
    results = _replays(scenarios, params)
    notes = []
    if len(first) < 2 * len(free):
        notes.append(f"{len(first)} distinct configurations for {len(free)} parameters: the base device's values "
                     "settle what they cannot pin down; 10 or more varied runs give a firmer fit")
    for p, value in zip(free, x):
        if min(value - p.lower, p.upper - value) <= 1e-6 * (p.upper - p.lower):
            notes.append(f"{p.name} stopped at the end of its range ({params[p.name]:.6g}); the model cannot "
                         "follow these runs further in that direction")
    peaks = [results[i].summarize().peak_memory_bytes for i in row_of] if _measures_memory(runs) else None
    if peaks is not None:
        params[MEMORY_RESERVED], memory_notes = _fit_reserve(base, runs, peaks)
        notes += memory_notes
    missing = tuple(name for name in (*(p.name for p in FIT_PARAMETERS if p not in free), MEMORY_RESERVED)
                    if name not in params)
    for name in missing:
        if name == MEMORY_RESERVED:
            why, kept = "no run gives peak_memory_bytes", format_bytes(base_value(base, name))
        else:
            why = f"no run uses attention: {next(k for k, v in ATTENTION_PARAMS.items() if name in v)}"
            kept = f"{base_value(base, name):.6g}"
        notes.append(f"{name} not constrained by these runs ({why}); left at {kept}")
    predicted = [results[i].iteration_time_s for i in row_of]
    reserve = params.get(MEMORY_RESERVED)
    return CalibrationResult(params=params, fit=_errors(runs, predicted, peaks, reserve), x=tuple(float(v) for v in x),
                             notes=tuple(notes), not_constrained=missing)


def _measures_memory(runs: list[MeasuredRun]) -> bool:
    return any(run.peak_memory_bytes is not None for run in runs)


def _fit_reserve(base: Scenario, runs: list[MeasuredRun], peaks: list[float]) -> tuple[float, list[str]]:
    """``memory_reserved`` from the runs' measured peaks and replayed ``peaks`` (closed form, module doc)."""
    memory = base.cluster.device.memory_bytes
    top = max(range(len(runs)), key=lambda i: (peaks[i], -i))
    upper = min(MEMORY_RESERVED_MAX_FRACTION * memory, memory - peaks[top])
    if upper < 0:
        return 0.0, [f"memory_reserved: the replay holds {format_bytes(peaks[top])} on line {runs[top].line}'s run, "
                     f"more than the device's {format_bytes(memory)}, though it ran; no reserve makes it fit: set to 0B"]
    pairs = [(run.peak_memory_bytes, peak) for run, peak in zip(runs, peaks) if run.peak_memory_bytes is not None]
    measured, replayed = np.array([m for m, _ in pairs]), np.array([p for _, p in pairs])
    best = float(np.sum((measured - replayed) / measured**2) / np.sum(1.0 / measured**2))
    reserve = min(max(best, 0.0), upper)
    if reserve != best:
        end = ("0B" if reserve == 0.0 else f"{format_bytes(reserve)}, "
               + ("a quarter of the memory" if upper == MEMORY_RESERVED_MAX_FRACTION * memory
                  else f"the most with which line {runs[top].line}'s run still fits"))
        return reserve, [f"memory_reserved stopped at the end of its range ({end}); the runs ask for "
                         f"{format_bytes(best)} beside the replayed tensors"]
    return reserve, []


def _config_key(run: MeasuredRun) -> tuple:
    return tuple(getattr(run, name) for name in (*COLUMNS, "attention") if name not in ("tp", "iteration_time_s"))


def _errors(runs: list[MeasuredRun], predicted: list[float], peaks: list[float] | None = None,
            reserve: float | None = None) -> CalibrationScore:
    """Scores: ``peaks`` (the replays', by run) and ``reserve`` predict the measured peaks where given."""
    scored = tuple(ScoredRun(run=run, predicted_s=float(p), predicted_peak_memory_bytes=(
        float(peaks[i] + reserve) if peaks is not None and reserve is not None and run.peak_memory_bytes is not None
        else None)) for i, (run, p) in enumerate(zip(runs, predicted)))
    mape = sum(abs(s.error_frac) for s in scored) / len(scored)
    return CalibrationScore(mape=mape, kendall_tau=kendall_tau([run.iteration_time_s for run in runs], predicted),
                            runs=scored)


def score_runs(base: Scenario, runs: list[MeasuredRun], params: dict[str, float], *, source: str) -> CalibrationScore:
    """Predict ``runs`` with fitted ``params`` and report MAPE and Kendall's tau (and peaks where measured)."""
    fitted = with_params(base, params)
    results = _replays([row_scenario(fitted, run, source=source) for run in runs])
    peaks = [r.summarize().peak_memory_bytes for r in results] if _measures_memory(runs) else None
    reserve = fitted.cluster.device.memory_reserved_bytes if peaks is not None else None
    return _errors(runs, [r.iteration_time_s for r in results], peaks, reserve)


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

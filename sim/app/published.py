"""``dapple-sim published``: the shipped presets against published training runs, nothing fitted.

Someone sizing a 500-GPU run has no measurements of their own yet; the presets must predict
well as shipped. This command is how that is checked: a suite file
(``scenarios/published/suite.yaml``) lists published numbers, each with its source (paper,
table, row), the scenario file that sets up the run and what to read from its replay:

* ``iteration_time`` — the replay's iteration time;
* ``state_memory`` — parameters, gradients and optimizer state of the first device of the
  middle pipeline rank (what a stage of transformer blocks holds: no embedding, no head);
* ``activation_memory`` — the peak of stashed activations on device 0 (the first pipeline
  rank keeps the most micro-batches in flight);
* ``tflops_per_gpu`` — the paper's own model FLOPs per iteration (Narayanan et al. 2021, §5.1,
  equation 3: ``F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``, ``narayanan_flops``, which counts
  the forward that full recomputation runs again) over the predicted iteration time and the
  cluster's GPUs; the scenario's model must be a built-in transformer (``gpt``, ``bert``, ``llama``);
* ``model_tflops_per_gpu`` — the replay's own count of the model's FLOPs (forward and backward,
  no recompute; an MoE block's router and its active experts) per second per GPU;
* ``megatron_tflops_per_gpu`` — Megatron-LM's own count (``megatron_v09_flops``: its
  ``num_floating_point_operations`` as Megatron-Core v0.9 ships it, the version whose TFLOPS its
  MoE README quotes) over the predicted iteration time and the cluster's GPUs: it counts the full
  s×s attention (not the causal half the replay's kernels run), no router, top_k experts' MLPs;
* ``tokens_per_s_per_gpu`` — global batch × sequence / iteration time / GPUs (torchtitan's TPS/GPU);
* ``peak_memory`` — the caching allocator's peak *reserved* bytes on the device that peaks highest
  (torchtitan reports the maximum over GPUs of ``reserved_bytes.all.peak``): the replay's live peak
  with the allocator's reserved-but-unallocated share on top, ``peak · (1 + FRAGMENTATION_FRACTION)``
  (``sim.cost.reserved``: 1.83 GiB beside 75.31 GiB allocated, the figure the presets'
  ``memory_reserved`` counts), and the blocks a device's layers leave cached at their backward's
  peak (``LayerSpec.allocator_cached_bytes``: eager cross-entropy's freed 16-bit logits,
  ``sim.cost.reserved.eager_logits_cached_bytes``). Other freed blocks the allocator keeps are not
  modelled, so a prediction below the published figure is still expected.

Every scenario is replayed once, with the fast path (contention-free: Korthikanti's plans have
one replica per stage, so the SimPy engine gives the same times; the data-parallel rows of
Narayanan et al. and torchtitan are replayed the same way, their gradient reductions costed
without competing flows), and each row gets its relative error ``predicted / published − 1``
and, for a row that reports what a run measured (``RUN_METRICS``), whether the replay ran out
of memory: a published run that ran must not. The memory accounting rows (``state_memory``,
``activation_memory``: Korthikanti et al.'s Figure 1 computes them for configurations, and its
no-recompute ones do not fit, as the paper shows) carry no such verdict. Rows are grouped by
source and table, each group with its mean and worst absolute error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core.errors import DappleError, ScenarioError, UnitError
from sim.core.jsonio import write_json
from sim.core.units import parse_bytes, parse_flop_rate, parse_time
from sim.core.userfiles import read_user_file, show_path
from sim.cost.reserved import FRAGMENTATION_FRACTION
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario
from sim.input.strict import StrictReader
from sim.input.yaml_text import load_yaml
from sim.models.vocab import VOCAB_DIVISIBLE_BY, padded_vocab_size
from sim.report.plots.published import published_figure
from sim.report.plots.style import pyplot

__all__ = ["DEFAULT_SUITE", "METRICS", "RUN_METRICS", "GroupStats", "PublishedRow", "RowResult", "format_results",
           "group_stats", "megatron_v09_flops", "narayanan_flops", "parse_tokens_rate", "read_suite", "run_suite", "suite_json", "write_outputs"]

DEFAULT_SUITE = Path(__file__).resolve().parents[2] / "scenarios" / "published" / "suite.yaml"
"""The suite shipped with the project."""


def parse_tokens_rate(value: object) -> float:
    """Tokens per second per GPU, written ``5762tokens/s`` (commas allowed: ``5,762 tokens/s``)."""
    text = value.replace(",", "").strip() if isinstance(value, str) else ""
    number = text.removesuffix("tokens/s").strip()
    try:
        rate = float(number) if text.endswith("tokens/s") and number else float("nan")
    except ValueError:
        rate = float("nan")
    if not math.isfinite(rate):
        raise UnitError(f"cannot read {str(value)[:60]!r} as a token rate; write e.g. 5762tokens/s")
    return rate


METRICS = {"iteration_time": (parse_time, "s", 1.0), "state_memory": (parse_bytes, "GiB", 2.0**30),
           "activation_memory": (parse_bytes, "GiB", 2.0**30), "tflops_per_gpu": (parse_flop_rate, "TFLOP/s", 1e12),
           "tokens_per_s_per_gpu": (parse_tokens_rate, "tok/s", 1.0), "peak_memory": (parse_bytes, "GiB", 2.0**30),
           "model_tflops_per_gpu": (parse_flop_rate, "TFLOP/s", 1e12),
           "megatron_tflops_per_gpu": (parse_flop_rate, "TFLOP/s", 1e12)}
"""Metric -> (how its published value is read, the unit it is shown in, that unit in SI)."""
RUN_METRICS = frozenset({"iteration_time", "tflops_per_gpu", "tokens_per_s_per_gpu", "peak_memory",
                         "model_tflops_per_gpu", "megatron_tflops_per_gpu"})
"""Metrics a run measured: the configuration ran, so the replay must fit in memory."""
_BOUNDS = {parse_time: (1e-6, 1e6, "1us to 1e6s"), parse_bytes: (1.0, 2.0**50, "1B to 1PiB"),
           parse_flop_rate: (1e9, 1e18, "1GFLOP/s to 1000PFLOP/s"), parse_tokens_rate: (1e-3, 1e9, "0.001 to 1e9 tokens/s")}
"""Range of a published value: a time, a size, a FLOP rate or a token rate."""
_JSON_UNITS = {parse_time: "s", parse_bytes: "bytes", parse_flop_rate: "FLOP/s", parse_tokens_rate: "tokens/s"}
"""The SI unit of a metric's values in ``--json``."""

_ROW_KEYS = {"scenario", "metric", "published", "source", "table", "row"}


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRow:
    """One published number and where it comes from."""

    scenario: Path
    """The scenario file that sets up the run."""
    metric: str
    """What to read from the replay (``METRICS``)."""
    published: float
    """The published value, SI (seconds, bytes)."""
    source: str
    """The paper."""
    table: str
    """Its table or figure."""
    row: str
    """The row (model and configuration) in it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RowResult:
    """A published row and the simulator's prediction of it."""

    row: PublishedRow
    predicted: float
    """SI, as ``row.published``."""
    oom: bool = False
    """The replay ran out of memory on some device and the row is a run's measurement
    (``RUN_METRICS``): a published run that ran must not."""

    @property
    def error(self) -> float:
        """Relative error, ``predicted / published − 1``."""
        return self.predicted / self.row.published - 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupStats:
    """The rows of one source's table."""

    source: str
    table: str
    rows: int
    mean_abs_error: float
    """Mean of |relative error|."""
    worst_abs_error: float
    """Largest |relative error|."""


def read_suite(path: str | Path = DEFAULT_SUITE) -> tuple[PublishedRow, ...]:
    """The suite file's rows, checked key by key (one line naming the file and key per mistake)."""
    path = Path(path)
    reader = StrictReader(show_path(path), path.parent)
    data = reader.mapping(load_yaml(read_user_file(path, "suite file", ScenarioError), where=show_path(path)), "")
    reader.keys(data, "", allowed={"sources", "rows"}, required={"sources", "rows"})
    sources = reader.mapping(data["sources"], "sources")
    for key, text in sources.items():
        if not isinstance(text, str) or not text:
            raise reader.fail(f"sources.{key}", "must be the paper's reference, a non-empty string")
    if not isinstance(data["rows"], list) or not data["rows"]:
        raise reader.fail("rows", "must be a non-empty list of {scenario, metric, published, source, table, row}")
    rows = []
    for i, item in enumerate(data["rows"]):
        key = f"rows[{i}]"
        item = reader.mapping(item, key)
        reader.keys(item, key, allowed=_ROW_KEYS, required=_ROW_KEYS)
        metric = reader.string(item, key, "metric", choices=METRICS)
        source = reader.string(item, key, "source", choices=set(sources))
        rows.append(PublishedRow(
            scenario=reader.path(item["scenario"], f"{key}.scenario", data_fallback=False),
            metric=metric,
            published=_published(reader, item, key, metric),
            source=sources[source],
            table=reader.string(item, key, "table"),
            row=reader.string(item, key, "row"),
        ))
    return tuple(rows)


def _published(reader: StrictReader, item: dict, key: str, metric: str) -> float:
    parse = METRICS[metric][0]
    if item.get("published") is None:
        raise reader.fail(f"{key}.published", f"missing; give the published value with its unit ({metric})")
    return reader.quantity(item, key, "published", parse, bounds=_BOUNDS[parse])


def narayanan_flops(*, batch: int, seq_len: int, layers: int, hidden: int, vocab: int) -> float:
    """Model FLOPs of one iteration as Narayanan et al. 2021 count them (SC21, §5.1, equation 3):
    ``F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``, the GEMMs of the transformer blocks and the
    logit layer, forward, backward and the forward full recomputation runs again (the paper: "a
    lower bound for the true FLOP count"). B global batch, s sequence, l layers, h hidden, V vocabulary."""
    return 96.0 * batch * seq_len * layers * hidden**2 * (1.0 + seq_len / (6.0 * hidden)
                                                          + vocab / (16.0 * layers * hidden))


def megatron_v09_flops(*, batch: int, seq_len: int, layers: int, hidden: int, heads: int, kv_heads: int,
                       ffn_hidden: int, vocab: int, gated: bool, top_k: int = 1) -> float:
    """Model FLOPs of one iteration as Megatron-LM counts them for its TFLOPS log line
    (``num_floating_point_operations``, ``megatron/training/training.py`` at tag core_v0.9.0):

        F = 12·B·s·l·h²·((1 + g/a + s/h)·(a·h_head/h) + (f/h)·k·m + V/(2·l·h)),

    the forward and two backward GEMMs (3) of pairs of matrices (2) at 2 FLOPs a multiply-add
    (2); g query groups of a heads, h_head = h/a, f the MLP width (an MoE's expert width, which
    v0.9 reads from ``ffn_hidden_size``), k the experts a token is routed to (``moe_router_topk``,
    1 for a dense MLP), m = 3/2 for a gated (SwiGLU) MLP, V the padded vocabulary. The s/h term
    is the full s×s score and value products: v0.9 does not halve it for the causal mask (the
    halving came with Megatron-LM commit 8873b55, March 2025), and the router is not counted."""
    attention = (1.0 + kv_heads / heads + seq_len / hidden) * (heads * (hidden // heads) / hidden)
    mlp = ffn_hidden / hidden * top_k * (1.5 if gated else 1.0)
    logit = vocab / (2.0 * layers * hidden)
    return 12.0 * batch * seq_len * layers * hidden**2 * (attention + mlp + logit)


def _megatron_flops(scenario) -> float:
    """``megatron_v09_flops`` of a built-in transformer scenario's global batch (vocabulary padded
    as Megatron-LM pads it, ``sim.models.vocab.padded_vocab_size``)."""
    shape = _transformer_shape(scenario)
    values = scenario.model.preset.values
    if not isinstance(values.get("heads"), int) or not isinstance(values.get("ffn_hidden"), int):
        raise ScenarioError(f"{scenario.path}: megatron_tflops_per_gpu needs model.heads and model.ffn_hidden; "
                            "write them in the scenario")
    experts = scenario.model.experts
    vocab = padded_vocab_size(shape.pop("vocab"), VOCAB_DIVISIBLE_BY, scenario.plan.shard.tensor)
    return megatron_v09_flops(batch=scenario.training.global_batch_size, vocab=vocab, heads=values["heads"],
                              kv_heads=values.get("kv_heads") or values["heads"],
                              ffn_hidden=experts.ffn_hidden if experts is not None else values["ffn_hidden"],
                              gated=scenario.model.preset.name == "llama",
                              top_k=experts.top_k if experts is not None else 1, **shape)


def _transformer_shape(scenario) -> dict[str, int]:
    preset = scenario.model.preset
    values = {} if preset is None else preset.values
    shape = {key: values.get(key) for key in ("seq_len", "layers", "hidden", "vocab")}
    if any(not isinstance(v, int) for v in shape.values()):
        raise ScenarioError(f"{scenario.path}: tflops_per_gpu needs a built-in transformer model (gpt, bert, llama) "
                            "with layers, hidden, seq_len and vocab; use iteration_time for this scenario")
    return shape


def _cached_bytes(scenario, stages) -> float:
    """What the allocator keeps cached beside a device's peak (``LayerSpec.allocator_cached_bytes``
    of its stages' layers, on its replica's slice of a micro-batch: eager cross-entropy's logits),
    taken at the peak: the eager loss's workspace puts the peak in the head's backward."""
    resolved = scenario.resolved
    return max((sum(layer.allocator_cached_bytes for layer in resolved.model.layers[slice(*resolved.plan.stages[s].layers)])
                * resolved.costs[s][0].samples for s in stages), default=0.0)


def _measure(metric: str, scenario, summary) -> float:
    groups = scenario.plan.device_groups
    by_id = {d.device: d for d in summary.devices}
    gpus = scenario.cluster.num_devices
    if metric == "iteration_time":
        return summary.iteration_time_s
    if metric == "tflops_per_gpu":
        flops = narayanan_flops(batch=scenario.training.global_batch_size, **_transformer_shape(scenario))
        return flops / summary.iteration_time_s / gpus
    if metric == "tokens_per_s_per_gpu":
        tokens = scenario.training.global_batch_size * _transformer_shape(scenario)["seq_len"]
        return tokens / summary.iteration_time_s / gpus
    if metric == "peak_memory":  # reserved, as torchtitan reads it: live bytes, fragmentation, cached blocks
        return max(d.peak_memory_bytes * (1 + FRAGMENTATION_FRACTION) + _cached_bytes(scenario, d.stages)
                   for d in summary.devices)
    if metric == "model_tflops_per_gpu":  # the replay's own model FLOPs (an MoE's active experts)
        return summary.model_flops_per_device_per_s
    if metric == "megatron_tflops_per_gpu":
        return _megatron_flops(scenario) / summary.iteration_time_s / gpus
    if metric == "state_memory":
        b = by_id[groups[len(groups) // 2][0]].memory_breakdown
        return b.parameters + b.gradients + b.optimizer
    return by_id[groups[0][0]].peak_activation_bytes


def run_suite(rows: tuple[PublishedRow, ...]) -> tuple[RowResult, ...]:
    """Replay every scenario the rows name (each once, fast path) and read each row's metric."""
    replays: dict[Path, tuple[Any, Any]] = {}
    results = []
    for row in rows:
        if row.scenario not in replays:
            scenario = load_scenario(row.scenario)
            if scenario.plan is None:
                raise ScenarioError(f"{row.scenario}: plan: missing; a published run needs its plan")
            replays[row.scenario] = (scenario, run_scenario(scenario, engine="fast").summarize())
        scenario, summary = replays[row.scenario]
        results.append(RowResult(row=row, predicted=_measure(row.metric, scenario, summary),
                                 oom=summary.oom and row.metric in RUN_METRICS))
    return tuple(results)


def group_stats(results: tuple[RowResult, ...]) -> tuple[GroupStats, ...]:
    """Mean and worst |error| per (source, table), in the order the tables first appear."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in results:
        groups.setdefault((r.row.source, r.row.table), []).append(abs(r.error))
    return tuple(GroupStats(source=source, table=table, rows=len(errors), mean_abs_error=sum(errors) / len(errors),
                            worst_abs_error=max(errors)) for (source, table), errors in groups.items())


def _shown(value: float, metric: str) -> str:
    unit, scale = METRICS[metric][1], METRICS[metric][2]
    return f"{value / scale:.2f} {unit}"


def format_results(results: tuple[RowResult, ...]) -> str:
    """The table ``dapple-sim published`` prints: one line per row, then each group's mean and worst."""
    width = max(len(f"{r.row.table}: {r.row.row}") for r in results)
    lines = [f"{'published run':<{width}}  {'predicted':>11}  {'published':>11}  {'error':>7}"]
    for r in results:
        lines.append(f"{r.row.table + ': ' + r.row.row:<{width}}  {_shown(r.predicted, r.row.metric):>11}  "
                     f"{_shown(r.row.published, r.row.metric):>11}  {r.error:>+7.1%}" + ("  out of memory" if r.oom else ""))
    for g in group_stats(results):
        lines.append(f"{g.table} ({g.source}): {g.rows} rows, mean |error| {g.mean_abs_error:.1%}, "
                     f"worst {g.worst_abs_error:.1%}")
    return "\n".join(lines)


def suite_json(results: tuple[RowResult, ...]) -> dict[str, Any]:
    """``--json``: every row (SI values) and every group's statistics."""
    return {
        "rows": [{"scenario": r.row.scenario.name, "metric": r.row.metric, "unit": _JSON_UNITS[METRICS[r.row.metric][0]],
                  "predicted": r.predicted, "published": r.row.published, "error_frac": r.error, "oom": r.oom,
                  "source": r.row.source, "table": r.row.table, "row": r.row.row} for r in results],
        "groups": [{"source": g.source, "table": g.table, "rows": g.rows, "mean_abs_error_frac": g.mean_abs_error,
                    "worst_abs_error_frac": g.worst_abs_error} for g in group_stats(results)],
    }


def write_outputs(results: tuple[RowResult, ...], out: str | Path) -> None:
    """``--out DIR``: ``published.json`` and ``published.png`` (each row's error, by table)."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DappleError(f"--out {out}: cannot create the folder ({exc.strerror})") from None
    write_json(out / "published.json", suite_json(results))
    plt = pyplot()
    fig = published_figure([(r.row.source, r.row.table, r.row.row, r.row.metric, r.error, r.oom) for r in results])
    try:
        fig.savefig(out / "published.png", dpi=100)
    except OSError as exc:
        raise DappleError(f"--out {out}: cannot write published.png ({exc.strerror})") from None
    finally:
        plt.close(fig)

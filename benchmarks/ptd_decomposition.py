"""Where SC21's PTD predictions miss: per micro-batch or per iteration (issue 29, Table 2's PTD rows).

SC21 Table 2 (Narayanan et al. 2021, arXiv 2104.04473) runs each model at three GPU counts with
the same global batch and the same pipeline (175B: TP 8, PP 12; 530B: TP 8, PP 35), so each
pipeline runs m = B / d micro-batches of one sample: the data-parallel degree d only changes m.
An iteration then lasts ``T(m) = a + b·m``: b the steady cost of one micro-batch through a rank
(its forwards and backwards over every chunk, their exchanges), a what an iteration pays once
(the pipeline's fill and drain, the gradient all-reduce, the optimizer step). A least-squares line
through the three published runs (their time from §5.1's FLOPs formula, ``narayanan_flops``, over
the published teraFLOP/s and the GPUs) and one through the three predictions separates the two:
a wrong b is a per-micro-batch cost (compute, tensor-parallel collectives, exchanges), a wrong a
a once-per-iteration one. Table 1's 529.6B row (d = 9, m = 280) is the 530B pipeline again; its
published rate beside Table 2's d = 8 row (m = 280) shows how far two runs of the same work differ.
Two of these pipelines also ran in 2022 (Korthikanti et al. 2022, arXiv 2205.05198, Table 5, full
recompute, one replica): the 1T model (TP 8, PP 64, 1F1B, m = 512) and the 530B one (TP 8, PP 35,
3 chunks, m = 280). Each pair is the same per-replica work on two versions of Megatron-LM, so
the measured difference (2021 − 2022) is what the 2021 code paid more, next to what the simulator
charges for it (separate fp16 gradient accumulation, the data-parallel all-reduce).
Table 1's rows (weak scaling: each a different model) are listed with their gap per pipeline step
(one forward and one backward of a chunk on a rank, m·v of them), their data-parallel degree and
hidden size, the two things the gaps line up with.

Published rates are whole teraFLOP/s, so each measured time is known to ±0.5 TFLOP/s: the
``band`` column is that, in seconds.

    python benchmarks/ptd_decomposition.py [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.app.published import narayanan_flops, read_suite  # noqa: E402
from sim.engine.run import run_scenario  # noqa: E402
from sim.input.scenario import load_scenario  # noqa: E402

FAMILIES = {
    "175B": ("narayanan2021_t2_175b_384_ptd", "narayanan2021_t2_175b_768_ptd", "narayanan2021_t2_175b_1536_ptd"),
    "530B": ("narayanan2021_t2_530b_560_ptd", "narayanan2021_t2_530b_1120_ptd", "narayanan2021_t2_530b_2240_ptd"),
}
"""Runs of one pipeline at several data-parallel degrees (Table 2's PTD rows)."""
SAME_WORK = ("narayanan2021_t1_530b", "narayanan2021_t2_530b_2240_ptd")
"""Table 1's 529.6B row and Table 2's 2,240-GPU row: the same pipeline and m = 280."""
PAPER_PAIRS = (("narayanan2021_t1_1t", "korthikanti2022_1t_full"),
               ("narayanan2021_t1_530b", "korthikanti2022_530b_full"),
               ("narayanan2021_t2_530b_2240_ptd", "korthikanti2022_530b_full"))
"""(SC21 run, Korthikanti et al. 2022 run) of the same pipeline and micro-batches per replica."""
HALF_UNIT = 0.5e12
"""Half of the unit the tables round to (whole teraFLOP/s per GPU), FLOP/s."""


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of ``y = a + b·x`` through ``points`` (at least two distinct x)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def measured_time_s(flops: float, published_flop_per_s: float, gpus: int) -> float:
    """The iteration time a published per-GPU rate stands for: the run's FLOPs over rate × GPUs."""
    return flops / (published_flop_per_s * gpus)


def _replay(stem: str, overrides: dict[str, str]):
    scenario = load_scenario(ROOT / "scenarios" / "published" / f"{stem}.yaml", overrides=overrides)
    return scenario, run_scenario(scenario, engine="fast").summarize()


def _row(stem: str, overrides: dict[str, str], published: dict[str, float]) -> dict[str, float]:
    scenario, summary = _replay(stem, overrides)
    values = scenario.model.preset.values
    flops = narayanan_flops(batch=scenario.training.global_batch_size,
                            **{k: values[k] for k in ("seq_len", "layers", "hidden", "vocab")})
    gpus = scenario.cluster.num_devices
    rate = published[stem]
    return {"m": summary.num_microbatches, "virtual": summary.num_stages, "gpus": gpus,
            "pipeline": summary.parallelism.pipeline, "replicas": scenario.plan.num_replicas(0),
            "hidden": values["hidden"],
            "predicted": summary.iteration_time_s, "measured": measured_time_s(flops, rate, gpus),
            "band": measured_time_s(flops, rate - HALF_UNIT, gpus) - measured_time_s(flops, rate + HALF_UNIT, gpus)}


def report(overrides: dict[str, str]) -> list[str]:
    published = {r.scenario.stem: r.published for r in read_suite() if r.metric == "tflops_per_gpu"}
    lines = []
    for name, stems in FAMILIES.items():
        rows = [_row(s, overrides, published) for s in stems]
        for stem, r in zip(stems, rows):
            lines.append(f"  {stem}: m {r['m']}, predicted {r['predicted']:.2f} s, measured {r['measured']:.2f} s "
                         f"(band {r['band']:.2f} s), gap {r['measured'] - r['predicted']:+.2f} s")
        a_p, b_p = fit_line([(r["m"], r["predicted"]) for r in rows])
        a_m, b_m = fit_line([(r["m"], r["measured"]) for r in rows])
        virtual = rows[0]["virtual"]
        lines.insert(len(lines) - len(rows), f"{name}: T = a + b·m over {len(rows)} runs, {virtual} virtual stages")
        lines.append(f"  per micro-batch b: predicted {b_p * 1e3:.2f} ms, measured {b_m * 1e3:.2f} ms "
                     f"({b_p / b_m - 1:+.1%})")
        lines.append(f"  per iteration a: predicted {a_p:.2f} s, measured {a_m:.2f} s "
                     f"(missing {a_m - a_p:+.2f} s, {(a_m - a_p) / virtual * 1e3:+.1f} ms per virtual stage, "
                     f"{(a_m - a_p) / (b_m / (virtual // rows[0]['pipeline'])) :.2f} steady chunk-steps)")
    same = [_row(s, overrides, published) for s in SAME_WORK]
    lines.append(f"same work (m {same[0]['m']}): {SAME_WORK[0]} measured {same[0]['measured']:.2f} s, "
                 f"{SAME_WORK[1]} {same[1]['measured']:.2f} s ({same[1]['measured'] / same[0]['measured'] - 1:+.1%}); "
                 f"predicted {same[0]['predicted']:.2f} s and {same[1]['predicted']:.2f} s")
    return lines


def paper_pairs(overrides: dict[str, str]) -> list[str]:
    """The same pipeline measured in 2021 (SC21) and 2022 (Korthikanti et al.), and predicted."""
    rates = {r.scenario.stem: r.published for r in read_suite() if r.metric == "tflops_per_gpu"}
    seconds = {r.scenario.stem: r.published for r in read_suite() if r.metric == "iteration_time"}
    lines = ["same pipeline, 2021 vs 2022: measured and predicted iteration, difference"]
    for old, new in PAPER_PAIRS:
        r = _row(old, overrides, rates)
        predicted_new = _replay(new, overrides)[1].iteration_time_s
        lines.append(f"  {old} vs {new}: measured {r['measured']:.2f} vs {seconds[new]:.2f} s "
                     f"({r['measured'] - seconds[new]:+.2f} s), predicted {r['predicted']:.2f} vs "
                     f"{predicted_new:.2f} s ({r['predicted'] - predicted_new:+.2f} s)")
    return lines


def table1(overrides: dict[str, str]) -> list[str]:
    """Table 1's rows: the gap between measured and predicted iteration, per pipeline step."""
    published = {r.scenario.stem: r.published for r in read_suite()
                 if r.metric == "tflops_per_gpu" and "narayanan2021_t1_" in r.scenario.stem}
    lines = ["Table 1: row, d, hidden, steps m·v, gap, gap per step"]
    for stem in sorted(published, key=_size):
        r = _row(stem, overrides, published)
        steps = r["m"] * r["virtual"] // r["pipeline"]
        gap = r["measured"] - r["predicted"]
        lines.append(f"  {stem}: d {r['replicas']}, h {r['hidden']}, "
                     f"steps {steps}, gap {gap:+.2f} s ({gap / r['predicted']:+.1%}), "
                     f"{gap / steps * 1e3:+.1f} ms per step")
    return lines


def _size(stem: str) -> float:
    """Table 1's row order: the parameter count in the file name (``1_7b`` 1.7, ``1t`` 1000)."""
    tag = stem.removeprefix("narayanan2021_t1_")
    return 1000.0 if tag == "1t" else float(tag.removesuffix("b").replace("_", "."))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.set)
    print("\n".join(report(overrides) + paper_pairs(overrides) + table1(overrides)))


if __name__ == "__main__":
    main()

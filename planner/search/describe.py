"""A plan in one short line, in the words the training frameworks use for it.

A plan of forty-eight stages with their layer ranges and device ids is what a plan file holds
(``Candidate.describe`` writes it all out, for ``--json``); a person choosing a plan wants its
shape first, as Megatron-LM's and torchtitan's launch flags state it:

    TP 8 × PP 8 (interleaved, 3 chunks) × DP 16 · ZeRO-1 · selective recompute · micro-batch 16 × 96

* the degrees, TP, CP, EP, PP then DP, the order Llama 3's 405B configurations are listed in
  (the Llama 3 paper's Table 4, as Balaji's SC'24 talk shows it; the order says nothing of
  which group is innermost: Megatron-LM nests ``tp-cp-ep-dp-pp``, its
  ``initialize_model_parallel(order=...)`` default): ``TP`` tensor parallelism (Megatron-LM ``--tensor-model-parallel-size``, torchtitan
  ``parallelism.tensor_parallel_degree``), ``CP`` context parallelism
  (``--context-parallel-size``, ``parallelism.context_parallel_degree``), ``EP`` expert
  parallelism of an MoE model (``--expert-model-parallel-size``; its devices are folded out of
  TP × CP × DP, so it multiplies no device count: ``TP 2 × EP 8 × PP 4 × DP 8`` runs on
  2 · 4 · 8 = 64 devices, each stage's 16 folded into two EP groups of 8), ``PP`` the device
  sets a pipeline runs on (``--pipeline-model-parallel-size``; torchtitan's
  ``parallelism.pipeline_parallel_degree`` counts ranks, "not the number of stages", under a
  looped schedule too), and ``DP`` the replicas of a stage (torchtitan's
  ``data_parallel_replicate_degree`` × ``data_parallel_shard_degree``). TP, CP, EP and PP are
  named only above 1; DP always. DAPPLE's uneven replication (Fan et al., PPoPP'21, §4: a
  "15 : 1" plan) reads as a range with the counts, ``DP 1–15 (stages 15 + 1)``;
* the schedule, beside PP: ``1F1B`` (DAPPLE's early backward, §3), ``GPipe``, ``ZB-H1``,
  ``interleaved, 3 chunks`` (Narayanan et al., SC'21, §2.2); DAPPLE's warm-up policy only when
  it is not the default K_i = S − i (``sim.schedule.policy``);
* stages whose layer counts differ by more than one: ``24 stages of 2–6 layers`` (up to four
  stages are listed, ``layers 20 + 33``); counts as even as the layers allow say nothing;
* the data-parallel sharding as ZeRO's stages (Rajbhandari et al., SC'20, §5: P_os, P_os+g,
  P_os+g+p, which DeepSpeed's ``zero_optimization.stage`` numbers 1, 2, 3): ``ZeRO-1``
  (optimizer states), ``ZeRO-2`` (and gradients), ``ZeRO-3`` (and parameters, FSDP);
* the recompute mode (``selective recompute``, Korthikanti et al. 2022, §5; ``full``;
  torchtitan's op-level ``selective-op``), the placement when it is not Append First (DAPPLE
  §4.2: ``fresh placement``, ``scatter placement``), the micro-batch ``size × count`` (the
  size as it enters the pipeline, as plan files hold it: a stage splits it over its replicas,
  so it is Megatron-LM's per-replica ``--micro-batch-size`` × DP where the replicas are even),
  and the devices the plan leaves idle, when it leaves some.
"""

from __future__ import annotations

import re
from collections import Counter

from planner.search.space import Candidate
from sim.core.parallelism import Recompute, Sharding
from sim.schedule.policy import DapplePolicy

__all__ = ["devices_used", "plan_summary", "stage_replicas", "wrap_summary"]

SCHEDULE_WORDS = {"dapple": "1F1B", "1f1b": "1F1B", "gpipe": "GPipe", "zb-h1": "ZB-H1", "interleaved": "interleaved",
                  "interleaved-zb": "interleaved zero bubble", "looped-bfs": "looped BFS", "zb-v": "ZB-V",
                  "dualpipe-v": "DualPipeV"}
"""A schedule's name as the papers and torch's ``schedules.py`` write it."""

ZERO_STAGES = {Sharding.OPTIMIZER: "ZeRO-1", Sharding.GRADIENTS: "ZeRO-2", Sharding.FULL: "ZeRO-3"}
"""Sharding mode -> ZeRO stage (Rajbhandari et al. 2020, §5)."""

LISTED = 4
"""Most stages whose counts are written out one by one (``stages 15 + 1``, ``layers 20 + 33``)."""


def stage_replicas(candidate: Candidate) -> tuple[int, ...]:
    """Replicas of every device set (a looped schedule's later chunks reuse the first sets)."""
    return candidate.replicas[:candidate.num_stages // candidate.chunks]


def devices_used(candidate: Candidate) -> int:
    """Devices the plan runs on: every device set's replicas, each a TP × CP unit."""
    return sum(stage_replicas(candidate)) * candidate.unit


def plan_summary(candidate: Candidate, *, global_batch_size: int, cluster_devices: int | None = None) -> str:
    """``candidate`` in one line (see the module's docstring); ``cluster_devices`` (None: not
    known) adds how many of the cluster's devices the plan leaves idle."""
    parts = [_degrees(candidate)]
    layers = _layers(candidate)
    if layers:
        parts.append(layers)
    if candidate.sharding in ZERO_STAGES:
        parts.append(ZERO_STAGES[candidate.sharding])
    if candidate.recompute is not Recompute.NONE:
        parts.append(f"{candidate.recompute.value} recompute")
    if candidate.placement != "append":
        parts.append(f"{candidate.placement} placement")
    size = candidate.microbatch_size
    parts.append(f"micro-batch {size} × {global_batch_size // size}")
    if cluster_devices is not None and devices_used(candidate) < cluster_devices:
        parts.append(f"{cluster_devices - devices_used(candidate):,} of {cluster_devices:,} devices idle")
    return " · ".join(parts)


def _degrees(candidate: Candidate) -> str:
    degrees = [f"{name} {value}" for name, value in (("TP", candidate.tensor_parallel),
                                                     ("CP", candidate.context_parallel),
                                                     ("EP", candidate.expert_parallel)) if value > 1]
    sets = stage_replicas(candidate)
    schedule = _schedule(candidate)
    if len(sets) > 1:
        degrees.append(f"PP {len(sets)}" + (f" ({schedule})" if schedule else ""))
    low, high = min(sets), max(sets)
    if low == high:
        degrees.append(f"DP {low}")
    else:
        degrees.append(f"DP {low}–{high} ({_counts(sets)})")
    line = " × ".join(degrees)
    if len(sets) == 1 and schedule and not schedule.startswith("1F1B"):
        line += f" · {schedule} schedule"  # one stage: the schedule only orders its micro-batches
    return line


def _schedule(candidate: Candidate) -> str:
    """The schedule in words: its name, its chunks, and any parameter that is not the default."""
    words = [SCHEDULE_WORDS.get(candidate.schedule, candidate.schedule)]
    if candidate.chunks > 1:
        words.append(f"{candidate.chunks} chunks")
    for key, value in sorted(candidate.params):
        if key == "policy":
            if value != DapplePolicy.S_MINUS_I.value:
                words.append(f"warm-up {value}")
        elif key != "chunks":  # the chunks are the candidate's own field, said above
            words.append(f"{key} {value}")
    return ", ".join(words)


def _layers(candidate: Candidate) -> str:
    counts = [b - a for a, b in zip(candidate.bounds, candidate.bounds[1:])]
    if max(counts) - min(counts) <= 1:
        return ""
    if len(counts) <= LISTED:
        return "layers " + " + ".join(str(c) for c in counts)
    return f"{len(counts)} stages of {min(counts)}–{max(counts)} layers"


def _counts(values: tuple[int, ...]) -> str:
    """``stages 15 + 1`` for a few values; for more, the most common first: ``8 stages of 64, 8 of 63``."""
    if len(values) <= LISTED:
        return "stages " + " + ".join(str(v) for v in values)
    tally = sorted(Counter(values).items(), key=lambda item: (-item[1], -item[0]))
    (first, count), rest = tally[0], tally[1:]
    return ", ".join([f"{count} stage{'s' if count > 1 else ''} of {first}"] + [f"{n} of {v}" for v, n in rest])


def wrap_summary(text: str, width: int) -> list[str]:
    """A short line in lines of at most ``width`` characters, broken before a `` · ``, a `` × ``
    or a parenthesis (the continuation starts with it, so it reads as one line); a piece longer
    than a line is cut with ``…``."""
    pieces = re.split(r" (?=[·×] |\()", text)
    lines = [pieces[0]]
    for piece in pieces[1:]:
        if len(lines[-1]) + 1 + len(piece) <= width:
            lines[-1] += " " + piece
        else:
            lines.append(piece)
    return [line if len(line) <= width else line[:max(width - 1, 0)] + "…" for line in lines]

"""Closed forms: what the pipeline papers predict, to check the simulator against.

A pipeline of S ranks working through M micro-batches is like an assembly line: once it
is full every station works, but filling and draining it leaves stations idle — the
*bubble*. For a uniform pipeline (every stage takes F seconds forward and B backward per
micro-batch, communication free) the papers give the iteration time in one line:

- GPipe (Huang et al., NeurIPS 2019) and 1F1B / DAPPLE (Fan et al., PPoPP 2021, §3):
  (M+S−1)(F+B); the bubble fraction is (S−1)/(M+S−1). Early backward does not shorten the
  iteration, it bounds the in-flight micro-batches of stage i by K_i instead of M.
- interleaved with v chunks per rank (Narayanan et al., SC 2021, §2.2): M(F+B) + (S−1)(F+B)/v,
  with F and B one micro-batch's time over all of a rank's chunks.
- ZB-H1 (Qi et al., ICLR 2024, §2.1): M(F+I+W) + (S−1)(F+I−W), the backward B = I + W split
  into input-gradient and weight-gradient parts.
- DualPipeV (deepseek-ai/DualPipe README at 3da1bbe, "Pipeline Bubbles and Memory Usage
  Comparison", after DeepSeek-V3's DualPipe, arXiv 2412.19437, §3.2.1, Table 2): a bubble of
  (PP/2 − 1)(F&B + B − 3W) over PP = 2S chunks of F, B, W each, F&B = F + B when the paired
  forward and backward do not hide each other's compute; DualPipe itself has the same bubble on
  PP ranks holding two copies of the parameters, so on the same S ranks its PP/2 − 1 = S/2 − 1
  rounds of chunks twice the size: (S − 2)/(S − 1) of the V's.

Throughout, ``bwd_s`` is the *full* backward time and ``wgrad_s`` its weight-gradient part,
so I = ``bwd_s − wgrad_s``; the same arguments mean the same thing for every schedule and
for :func:`sim.engine.fastpath.time_schedule`.

:func:`dapple_latency_s` is DAPPLE's planner model for non-uniform stages (§4), as the paper
states it. :func:`extend_pipeline` is the planners' form of the same model, built one stage
at a time with the transfers between stages in it (``planner.planners.dapple``, ``planner.search.ranking``).
Each formula here is checked against :mod:`sim.engine.fastpath` in ``tests/test_analytic.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sim.core.errors import DappleError, ScheduleError
from sim.schedule.policy import DapplePolicy, dapple_warmup, interleaved_peak_inflight

__all__ = [
    "PIPELINE_START",
    "DappleLatency",
    "PipelineFold",
    "bubble_fraction",
    "dapple_latency_s",
    "extend_pipeline",
    "makespan_s",
    "peak_inflight_microbatches",
]

_NAMES = ("1f1b", "dapple", "dualpipe-v", "gpipe", "interleaved", "zb-h1")


def _check(name: str, num_stages: int, num_microbatches: int, chunks: int) -> None:
    if name not in _NAMES:
        raise ScheduleError(f"unknown schedule {name!r}; closed forms exist for: "
                            f"{', '.join(_NAMES)}")
    for key, value in (("num_stages", num_stages), ("num_microbatches", num_microbatches),
                       ("chunks", chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(f"{name}: {key}={value!r} must be an integer >= 1")
    if chunks != 1 and name != "interleaved":
        raise ScheduleError(f"{name}: chunks={chunks} applies only to 'interleaved'")


def _check_times(**times: float) -> None:
    for key, value in times.items():
        if not (math.isfinite(value) and value >= 0):
            raise DappleError(f"{key}={value!r} must be a finite number of seconds >= 0")


def makespan_s(
    schedule_name: str,
    num_stages: int,
    num_microbatches: int,
    fwd_s: float,
    bwd_s: float,
    *,
    chunks: int = 1,
    wgrad_s: float = 0.0,
) -> float:
    """Iteration time of a uniform, communication-free pipeline, in seconds.

    ``fwd_s``/``bwd_s``: one micro-batch's forward / full backward on one rank (for
    ``interleaved``, over all its ``chunks``). ``wgrad_s``: the weight-gradient part of
    ``bwd_s`` (``zb-h1`` only).

    - ``gpipe``, ``dapple``, ``1f1b``: (M+S−1)(F+B) — GPipe (Huang et al., NeurIPS 2019),
      DAPPLE (Fan et al. PPoPP'21, §3).
    - ``interleaved``: M(F+B) + (S−1)(F+B)/v — Narayanan et al. SC'21, §2.2; holds when M is
      a multiple of S (Megatron's requirement), otherwise ScheduleError.
    - ``zb-h1``: M(F+I+W) + (S−1)(F+I−W) with I = B−W — Qi et al. ICLR'24, §2.1. Assumes
      M ≥ S and W ≤ min(F, I): then the delayed W's exactly fill the bubbles our ``zb-h1``
      generator leaves; outside that, ScheduleError (use ``sim.engine.fastpath``).
    - ``dualpipe-v``: M(F+B) + (S−1)(F + 2B − 3W)/2, ``fwd_s``/``bwd_s``/``wgrad_s`` over both
      of a rank's chunks: the DualPipe README's (PP/2 − 1)(F&B + B − 3W) with PP = 2S chunks of
      half those, F&B = F + B. The replay of torch's order (``sim.schedule.vshape``) gives it
      exactly where F = I = W, the zero-bubble papers' setting; outside that, ScheduleError.
    """
    _check(schedule_name, num_stages, num_microbatches, chunks)
    _check_times(fwd_s=fwd_s, bwd_s=bwd_s, wgrad_s=wgrad_s)
    s, m, f, b = num_stages, num_microbatches, fwd_s, bwd_s
    if schedule_name in ("gpipe", "dapple", "1f1b"):
        return (m + s - 1) * (f + b)
    if schedule_name == "interleaved":
        if m % s:
            raise ScheduleError(f"interleaved: the closed form needs num_microbatches={m} to be "
                                f"a multiple of num_stages={s}")
        return m * (f + b) + (s - 1) * (f + b) / chunks
    w = wgrad_s
    i = b - w
    if schedule_name == "dualpipe-v":
        if m < 2 * s or not math.isclose(w, f) or not math.isclose(i, f):
            raise ScheduleError(f"dualpipe-v: the closed form assumes M >= 2S and F = I = W; got M={m}, S={s}, "
                                f"F={f}, I={i}, W={w}")
        return m * (f + b) + (s - 1) * (f + 2 * b - 3 * w) / 2
    if w > b:
        raise DappleError(f"zb-h1: wgrad_s={w} exceeds bwd_s={b}; it is a part of the backward")
    if m < s or w > min(f, i):
        raise ScheduleError(f"zb-h1: the closed form assumes M >= S and W <= min(F, I); got "
                            f"M={m}, S={s}, F={f}, I={i}, W={w}")
    return m * (f + i + w) + (s - 1) * (f + i - w)


def bubble_fraction(
    schedule_name: str,
    num_stages: int,
    num_microbatches: int,
    fwd_s: float,
    bwd_s: float,
    *,
    chunks: int = 1,
    wgrad_s: float = 0.0,
) -> float:
    """Idle share of each rank: (makespan − M(F+B)) / makespan (same sources as :func:`makespan_s`).

    For ``gpipe`` and ``dapple`` this is (S−1)/(M+S−1), whatever F and B.
    """
    total = makespan_s(schedule_name, num_stages, num_microbatches, fwd_s, bwd_s,
                       chunks=chunks, wgrad_s=wgrad_s)
    if total == 0:
        return 0.0
    return (total - num_microbatches * (fwd_s + bwd_s)) / total


def peak_inflight_microbatches(
    schedule_name: str,
    num_stages: int,
    num_microbatches: int,
    stage: int,
    *,
    policy: str = DapplePolicy.S_MINUS_I,
    chunks: int = 1,
) -> int:
    """Most micro-batches stage ``stage`` holds activations for (F done, backward not done).

    - ``gpipe``: M — every forward runs before the first backward (Huang et al. 2019).
    - ``dapple``/``1f1b``: K_i = min(S−i, M), or min(2(S−i)−1, M) for
      ``policy="2(s-i)-1"`` (Fan et al. PPoPP'21, §5; ``sim.schedule.policy.dapple_warmup``).
    - ``zb-h1``: min(S, M) on every stage, counting a micro-batch until its W: stage i warms
      up with S−i forwards and holds back up to i W's (Qi et al. ICLR'24, §2.1).
    - ``interleaved`` with ``chunks=1``: min(2(S−i)−1, M), torch's warm-up of 2(S−1−i)
      forwards and one more (``sim.schedule.policy.interleaved_peak_inflight``); with more
      chunks there is no closed form per virtual stage here (ScheduleError;
      count it with ``sim.engine.fastpath.time_schedule``).
    """
    _check(schedule_name, num_stages, num_microbatches, chunks)
    s, m = num_stages, num_microbatches
    if not 0 <= stage < s:
        raise ScheduleError(f"{schedule_name}: stage={stage} must be in 0..{s - 1}")
    if schedule_name == "gpipe":
        return m
    if schedule_name in ("dapple", "1f1b"):
        return dapple_warmup(s, m, stage, policy)
    if schedule_name == "zb-h1":
        return min(s, m)
    if chunks != 1:
        raise ScheduleError("interleaved: no closed form for peak in-flight micro-batches with "
                            f"chunks={chunks}; use sim.engine.fastpath.time_schedule(...)")
    return interleaved_peak_inflight(s, stage, m, 1, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class DappleLatency:
    """DAPPLE's estimate of one iteration, split into its three phases (seconds)."""

    pivot_stage: int
    """Q: the stage whose steady phase sets the pace (0-based)."""
    warmup_s: float
    """T_w: until the first micro-batch reaches the pivot, Σ_{s<Q} F_s."""
    steady_s: float
    """T_s: the pivot's M forwards and backwards, M(F_Q + B_Q)."""
    ending_s: float
    """T_e: the last backward flowing from the pivot to stage 0, plus all-reduces."""
    total_s: float
    """L = T_w + T_s + T_e."""


def dapple_latency_s(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    allreduce_s: Sequence[float],
    num_microbatches: int,
) -> DappleLatency:
    """DAPPLE's planner latency L = T_w + T_s + T_e around a pivot stage Q (Fan et al., §4).

    Our reading of the paper's model, per stage s with one micro-batch's F_s, B_s and the
    gradient all-reduce time AR_s:

    - Q = argmax_s [Σ_{s'<s} F_s' + M(F_s + B_s) + Σ_{s'<s} B_s'], ties to the last stage
      (the stage whose own steady phase plus its fill and drain is longest);
    - T_w = Σ_{s<Q} F_s; T_s = M(F_Q + B_Q);
    - T_e = max( max_{s≤Q} [Σ_{s'=s}^{Q−1} B_s' + AR_s], max_{s>Q} AR_s ).

    With S equal stages and no all-reduce this is (M+S−1)(F+B), GPipe's and 1F1B's makespan.
    """
    stages = len(fwd_s)
    if stages == 0 or len(bwd_s) != stages or len(allreduce_s) != stages:
        raise DappleError(f"dapple_latency_s: fwd_s, bwd_s and allreduce_s need one entry per "
                          f"stage (>= 1); got {len(fwd_s)}, {len(bwd_s)}, {len(allreduce_s)}")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) \
            or num_microbatches < 1:
        raise DappleError(f"dapple_latency_s: num_microbatches={num_microbatches!r} must be >= 1")
    for name, values in (("fwd_s", fwd_s), ("bwd_s", bwd_s), ("allreduce_s", allreduce_s)):
        for value in values:
            _check_times(**{name: value})
    m = num_microbatches
    spans = [sum(fwd_s[:s]) + m * (fwd_s[s] + bwd_s[s]) + sum(bwd_s[:s]) for s in range(stages)]
    pivot = max(range(stages), key=lambda s: (spans[s], s))  # ties go to the last stage
    warmup = sum(fwd_s[:pivot])
    steady = m * (fwd_s[pivot] + bwd_s[pivot])
    ending = max(
        [sum(bwd_s[s:pivot]) + allreduce_s[s] for s in range(pivot + 1)]
        + [allreduce_s[s] for s in range(pivot + 1, stages)]
    )
    return DappleLatency(pivot_stage=pivot, warmup_s=warmup, steady_s=steady, ending_s=ending,
                         total_s=warmup + steady + ending)


class PipelineFold(NamedTuple):
    """DAPPLE's latency model over the stages so far, as :func:`extend_pipeline` builds it (seconds).

    A named tuple: the planner's DP extends hundreds of thousands of partial plans.
    """

    lmax_s: float
    """Max over stages and cuts u so far of Σ_{u'<u}(F+B) + M·busy_u: the pivot's steady phase
    with the fill before it and the drain after it."""
    sum_s: float
    """Σ (F + B) over the stages and cuts so far."""
    ending_s: float
    """Max over the stages so far of AR_s − Σ_{s'<s} B_s' (the drain before its last backward);
    −inf before the first stage."""
    drained_s: float
    """Σ B over the stages and cuts so far."""

    @property
    def total_s(self) -> float:
        """The latency estimate L of the stages so far: ``lmax_s + ending_s``."""
        return self.lmax_s + self.ending_s


PIPELINE_START = PipelineFold(lmax_s=0.0, sum_s=0.0, ending_s=-math.inf, drained_s=0.0)
"""The fold of no stages; extend it with the first stage (``comm_s=0``)."""

_new_fold = tuple.__new__  # builds a PipelineFold without its keyword handling (see below)


def extend_pipeline(fold: PipelineFold, fwd_s: float, bwd_s: float, comm_s: float, tail_s: float,
                    num_microbatches: int) -> PipelineFold:
    """``fold`` with one more stage: its F, B, the transfer ``comm_s`` of the cut in front of it
    (0 for the first stage) and ``tail_s``, its all-reduce and optimizer step after its last B.

    The planners' form of :func:`dapple_latency_s` (Fan et al., PPoPP'21, §4):

        L = max over stages and cuts u of ( Σ_{u'<u} (F_u' + B_u') + M·busy_u ) + max_s (AR_s − Σ_{s'<s} B_s'),

    where each cut is a pipeline stage of its own (F = B = C, busy C per micro-batch in each
    direction: transfers overlap compute, so a cut slows the steady phase only when it is
    slower than the stages), and every stage's all-reduce starts when the drain of backwards
    passes it — also after the pivot, where the paper's T_e waits for the whole AR_s. With
    equal stages, no transfers and no all-reduce, L = (M+S−1)(F+B).
    """
    # plain unpacking and tuple.__new__: the planner's DP calls this in its innermost loop
    lmax, total, ending, drained = fold
    m, fb = num_microbatches, fwd_s + bwd_s
    link_steady, fill = m * comm_s, 2 * comm_s
    stage_steady = fill + m * fb
    steady = total + (stage_steady if stage_steady > link_steady else link_steady)
    tail = tail_s - drained - comm_s  # its all-reduce starts as the drain passes it
    return _new_fold(PipelineFold, (  # lmax_s, sum_s, ending_s, drained_s
        lmax if lmax > steady else steady,
        total + fill + fb,
        ending if ending > tail else tail,
        drained + comm_s + bwd_s,
    ))

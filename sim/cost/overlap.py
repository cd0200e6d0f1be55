"""Overlap: how long an action takes when its communication is pipelined with its compute.

A framework hides a collective behind compute by cutting both into pieces and running the
pieces on two CUDA streams, one piece of communication beside one piece of compute. Two
shapes cover what the stacks do, and each has a closed form the engine's rule book
(``sim.engine.rules``) reproduces exactly when nothing else shares the links:

**The communication follows the compute** (gradient buckets). The backward of duration ``B``
produces its gradients progressively; torch DDP (``bucket_cap_mb=25``), Megatron-LM's
``--overlap-grad-reduce`` (``DistributedDataParallelConfig.bucket_size``: by default
max(40,000,000, 1,000,000 · dp) parameters, megatron/core/distributed/
distributed_data_parallel_config.py) and FSDP2 (one reduce-scatter per unit) launch a bucket's
reduction as soon as it is full. With ``K`` equal buckets, bucket ``k`` (1..K) is ready at
``B_start + k·B/K``; the buckets reduce one after another on one stream, each taking ``C/K``
of the whole reduction's alone-time ``C``. Bucket k ends at
``e_k = max(e_{k−1}, B_start + k·B/K) + C/K`` with ``e_0 = −∞``. If ``C/K ≥ B/K`` (the link
is the bottleneck) every bucket waits for the one before it: ``e_K = B_start + B/K + C``.
Otherwise every bucket is ready after the previous one has ended, so the last starts when
it is ready: ``e_K = B_start + B + C/K``. Both cases are
:func:`bucketed_reduce_end_s`: ``B_start + max(B/K + C, B + C/K)``.

**The communication feeds the compute** (FSDP's unit-by-unit gathers, tensor-parallel
all-gathers decomposed into chunks). The action's compute ``A`` needs ``U`` pieces gathered
one after another (alone-time ``G`` in all); piece ``u`` is gathered while piece ``u − 1``
computes (FSDP2 prefetches the next unit; Rajbhandari et al. 2020, §5.3, ZeRO-3's prefetch;
Wang et al., ASPLOS 2023, decompose a collective into one step per device and pipeline each
with the partial GEMM that consumes it). The gathers end at ``u·G/U``; compute of piece u
starts at max(end of its gather, end of piece u − 1's compute). By the same argument the
action ends at :func:`pipelined_s`: ``max(G/U + A, G + A/U)`` after the collective starts —
the first piece's gather exposed when compute dominates, the last piece's compute when
communication does. Its exposed communication is ``max(G − A, 0) + min(G, A)/U``.
Several collectives beside one action (FSDP's gather and tensor-parallel chunks, the context
ring, which is not cut in pieces) give :func:`beside_action_s`: the compute starts after the
longest first piece and ends after every collective's last piece.

**The communication beside another micro-batch's compute** (the experts' all-to-alls under
DualPipe, DeepSeek-AI 2024, arXiv 2412.19437v2, §3.2.1, and Megatron-LM's
``--overlap-moe-expert-parallel-comm``). The dispatch and combine of one micro-batch cannot
overlap the compute that produces or consumes them, but they can overlap a *different*
micro-batch's: DualPipe runs a forward chunk's all-to-all during a backward chunk's attention
and MLP and the reverse; Megatron's combined 1F1B pairs the forward of micro-batch i+1 with
the backward of micro-batch i. In a steady 1F1B every forward sits next to a backward, so the
compute an action's all-to-alls (``C`` alone) can hide under is taken as the action's own
(``A``, the length of its neighbour in the pairing up to the F/B ratio): the all-to-all runs on
the communication stream beside it, and the action ends at ``max(A, C)``; the exposed part is
:func:`exposed_beside_s`: ``max(0, C − A)``. The warm-up and cool-down actions, which have no
partner in the real schedules, are hidden the same way: an optimistic bound of at most
``(S − 1)`` actions' all-to-alls per rank.

**Compute slows down beside communication.** An overlapped collective's kernels hold SMs and
memory bandwidth the compute beside it would use (``DeviceSpec.overlap_slowdown`` s: compute
runs 1 + s times longer while they run). Compute ``A`` beside collectives of ``G`` alone seconds
in all: during the ``G`` they run, the compute does ``G/(1 + s)`` of its work, the rest at full
speed, so it takes ``A + G·s/(1 + s)``; if it all runs beside them (``G ≥ (1 + s)·A``), ``(1 + s)·A``:
:func:`contended_s`, ``A + min(G·s/(1 + s), s·A)``. The collectives counted are those that start
with the action (FSDP's gathers, the context ring, chunked tensor parallelism, ZeRO's parameter
gather, overlapped all-to-alls); a bucketed gradient reduction beside a backward does not slow
it here (not modelled yet).

**Communication SMs.** DeepSeek-V3 gives its all-to-all kernels a fixed share of the SMs: "only
20 SMs are sufficient to fully utilize the bandwidths of IB and NVLink" of the H800's 132
(DeepSeek-AI 2024, arXiv 2412.19437, §3.2.2; ``plan.overlap.communication_sms`` of
``DeviceSpec.sm_count``). While they run, the compute beside them has ``N − c`` of the ``N`` SMs
and runs ``N/(N − c)`` times as long: a slowdown ``s = c/(N − c)``
(:func:`communication_sms_slowdown`), in place of the device's generic ``overlap_slowdown`` for
the overlapped all-to-all. The share is held for the whole action, not only for the all-to-all's
``G`` alone seconds: DualPipe "manually adjust[s] the ratio of GPU SMs dedicated to communication
versus computation" for each overlapped chunk pair (§3.2.1), and the all-to-all kernels, launched
with the chunk, keep their SMs until every peer's tokens have arrived: in DeepSeek's own profile
of one such pair at the pre-training setting (deepseek-ai/profile-data ``train.json`` at 4496024:
EP 64, 4K sequence, two chunks of 4 MoE layers) the communication stream's kernels are busy
114.5 ms of the compute stream's 128.5 ms span, 89%, where the bytes alone at the NICs' 50 GB/s
take 49.9, and its FP8 GEMMs are persistent kernels of 112 CTAs (grids [112, 1, 1] and
[1, 112, 1]: one a compute SM, 132 − 20). So the compute of the MoE blocks beside an overlapped all-to-all runs on ``N − c``
SMs throughout, not only for its ``G``: ``A + share·A·c/(N − c)``, ``share`` the part of the
action's compute in the blocks with an all-to-all (:func:`held_sms_s`): the kernels are held as
long as those blocks compute (the profile's pair is all MoE blocks: the whole pair); an
embedding, a head or a dense block in the same chunk has the ``N`` SMs.

**A reduction per micro-batch** (ZeRO-2/3 reduce-scatter each backward's gradients). Backward
``k`` of ``M`` starts ``P`` after backward ``k − 1`` (one-stage 1F1B: ``P`` = forward + backward);
its reduction alone would end ``a`` after its backward starts; the reductions queue on one
stream, so ``x_k = max(a, x_{k−1} + C − P)`` and the last ends
:func:`queued_reductions_end_s`: ``a + (M − 1)·max(0, C − P)`` after the last backward starts.
"""

from __future__ import annotations

import math

from sim.core.errors import SpecError

__all__ = ["beside_action_s", "bucket_count", "bucketed_reduce_end_s", "communication_sms_slowdown", "contended_s", "exposed_beside_s", "exposed_pipelined_s", "held_sms_s",
           "pipelined_s",
           "queued_reductions_end_s", "reduce_end_s", "unit_count"]


def bucket_count(grad_bytes: float, bucket_bytes: float) -> int:
    """Buckets a stage's ``grad_bytes`` of gradients fill, ``ceil(grad_bytes / bucket_bytes)``
    (at least 1): DDP and Megatron-LM fill buckets up to their cap."""
    return max(1, math.ceil(grad_bytes / bucket_bytes)) if grad_bytes > 0 else 1


def unit_count(layers: int, unit_layers: int) -> int:
    """FSDP units a stage of ``layers`` layers holds when each ``fully_shard`` wraps
    ``unit_layers`` of them (``FsdpSpec.unit_layers``; the last unit may be shorter)."""
    return max(1, math.ceil(layers / unit_layers))


def bucketed_reduce_end_s(backward_s: float, reduce_s: float, buckets: int) -> float:
    """Seconds from the backward's start to the end of its gradients' bucketed reduction:
    ``max(B/K + C, B + C/K)`` (the module docstring derives it)."""
    return reduce_end_s(lead_s=0.0, compute_s=backward_s, end_s=backward_s, reduce_s=reduce_s, buckets=buckets)


def reduce_end_s(*, lead_s: float, compute_s: float, end_s: float, reduce_s: float, buckets: int) -> float:
    """Seconds from a backward action's start to the end of its bucketed reduction when its
    compute (``compute_s`` of work) starts ``lead_s`` in and ends ``end_s`` in (after the
    collectives beside it, :func:`beside_action_s`): the first bucket is issued once
    ``compute_s/K`` is done, the last leaves after the compute ends:
    ``max(lead + A/K + C, end + C/K)`` (``sim.engine.rules.reduce_issue_s`` and ``collective_times``'s
    floor). With nothing beside the backward it is :func:`bucketed_reduce_end_s`."""
    return max(lead_s + compute_s / buckets + reduce_s, end_s + reduce_s / buckets)


def pipelined_s(gather_s: float, compute_s: float, pieces: int) -> float:
    """Seconds of an action whose compute ``A`` consumes ``pieces`` gathered pieces (``G`` in
    all), the next gathered while the current one computes: ``max(G/U + A, G + A/U)``."""
    return max(gather_s / pieces + compute_s, gather_s + compute_s / pieces)


def exposed_pipelined_s(gather_s: float, compute_s: float, pieces: int) -> float:
    """The communication of :func:`pipelined_s` that compute does not hide:
    ``max(G − A, 0) + min(G, A)/U``."""
    return pipelined_s(gather_s, compute_s, pieces) - compute_s


def exposed_beside_s(comm_s: float, compute_s: float) -> float:
    """The communication of ``comm_s`` alone that ``compute_s`` of compute beside it, on another
    stream, does not hide: ``max(0, C − A)`` (the module docstring, the experts' all-to-alls)."""
    return max(0.0, comm_s - compute_s)


def contended_s(compute_s: float, beside_s: float, slowdown: float) -> float:
    """Seconds of ``compute_s`` of compute beside collectives of ``beside_s`` alone seconds that
    slow it by ``slowdown`` while they run: ``A + min(G·s/(1 + s), s·A)`` (the module docstring)."""
    if beside_s <= 0 or slowdown <= 0:
        return compute_s
    return compute_s + min(beside_s * slowdown / (1 + slowdown), slowdown * compute_s)


def held_sms_s(compute_s: float, beside_s: float, slowdown: float, share: float = 1.0) -> float:
    """Seconds of ``compute_s`` of compute beside an overlapped all-to-all (``beside_s`` alone
    seconds) whose kernels hold their SMs while the action's ``share`` of its compute with an
    all-to-all (its MoE blocks, ``sim.cost.compute.all_to_all_share``) runs: ``A + share·A·s``
    with ``s = c/(N − c)`` (:func:`communication_sms_slowdown`); ``A`` where no all-to-all runs
    beside it (the module docstring: DeepSeek-V3 §3.2.1, its profile)."""
    if beside_s <= 0 or slowdown <= 0:
        return compute_s
    return compute_s + share * compute_s * slowdown


def communication_sms_slowdown(sm_count: int, communication_sms: int) -> float:
    """The slowdown of compute left ``sm_count − communication_sms`` of ``sm_count`` SMs while
    the communication kernels hold the rest: ``c/(N − c)`` (the module docstring; DeepSeek-V3
    §3.2.2). Refused where the device gives no SM count or the communication would take them all."""
    if sm_count <= 0:
        raise SpecError("plan.overlap.communication_sms", f"{communication_sms} SMs need the device's SM count; "
                                                          "set cluster.device.sm_count, or remove communication_sms")
    if not 0 <= communication_sms < sm_count:
        raise SpecError("plan.overlap.communication_sms", f"must be in [0, {sm_count}) for a {sm_count}-SM device, "
                                                          f"got {communication_sms}; lower it")
    return communication_sms / (sm_count - communication_sms)


def beside_action_s(compute_s: float, beside: tuple[tuple[float, int], ...]) -> tuple[float, float]:
    """``(lead, end)``: seconds from an action's start to its compute's start and end when the
    collectives ``beside`` it (``(alone seconds, pieces)`` each, all started with the action;
    0 pieces: not cut, the compute waits only for its end) run beside it: it starts after the
    longest first piece ``max c_i/U_i`` and ends no earlier than each collective's end plus its
    last piece's compute ``c_i + A/U_i`` (``sim.engine.rules.beside_bounds``). One collective
    cut in ``U`` gives :func:`pipelined_s`."""
    lead = max((c / pieces for c, pieces in beside if pieces), default=0.0)
    end = lead + compute_s
    for c, pieces in beside:
        floor = c + compute_s / pieces if pieces else c
        if floor > end:
            end = floor
    return lead, end


def queued_reductions_end_s(first_end_s: float, reduce_s: float, period_s: float, microbatches: int) -> float:
    """Seconds from the last of ``microbatches`` backwards' start to the end of its reduction
    when each backward, ``period_s`` after the one before, issues one (``first_end_s``: one
    reduction's end after its backward starts, alone; ``reduce_s``: its alone time on the shared
    stream): ``a + (M − 1)·max(0, C − P)`` (the module docstring derives it)."""
    return first_end_s + (microbatches - 1) * max(0.0, reduce_s - period_s)

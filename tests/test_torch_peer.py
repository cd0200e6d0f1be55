"""Our generators produce the same compute order per rank as torch.distributed.pipelining.

torch's schedule classes normally need real pipeline stages and a process group; we build
them with ``__new__`` and set only the fields their order-computing methods read.
"""

from __future__ import annotations

import pytest

from sim.schedule import generate

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

COMPUTE = {"F", "B", "I", "W"}


def _compute_only(actions) -> list[str]:
    return [
        str(a) for a in actions if a is not None and a.computation_type.value in COMPUTE
    ]


def _torch_gpipe(num_stages: int, num_microbatches: int) -> dict[int, list[str]]:
    obj = schedules.ScheduleGPipe.__new__(schedules.ScheduleGPipe)
    obj._num_stages = num_stages
    obj._n_microbatches = num_microbatches
    return {rank: _compute_only(acts) for rank, acts in obj._get_pipeline_order().items()}


def _torch_interleaved(num_ranks: int, num_microbatches: int, chunks: int) -> dict[int, list[str]]:
    obj = schedules.ScheduleInterleaved1F1B.__new__(schedules.ScheduleInterleaved1F1B)
    obj.n_local_stages = chunks
    obj.pp_group_size = num_ranks
    obj._n_microbatches = num_microbatches
    # The same rounds torch's __init__ computes.
    obj.number_of_rounds = max(1, num_microbatches // num_ranks)
    obj.microbatches_per_round = num_microbatches // obj.number_of_rounds
    return {
        rank: _compute_only(obj._calculate_single_rank_operations(rank))
        for rank in range(num_ranks)
    }


def _ours(schedule) -> dict[int, list[str]]:
    return {rank: [str(a) for a in acts] for rank, acts in enumerate(schedule.ranks)}


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("num_microbatches", [1, 2, 5, 8, 16])
def test_gpipe_matches_torch(num_stages: int, num_microbatches: int) -> None:
    ours = _ours(generate("gpipe", num_stages, num_microbatches))
    assert ours == _torch_gpipe(num_stages, num_microbatches)


INTERLEAVED_CASES = [
    (s, m, v)
    for s in (2, 3, 4)
    for m in (s, 2 * s, 3 * s, 4 * s, s + 1, 2)  # multiples of S plus torch's flexible rounds
    for v in (1, 2, 3)
    if m % max(1, m // s) == 0
]


@pytest.mark.parametrize(("num_ranks", "num_microbatches", "chunks"), INTERLEAVED_CASES)
def test_interleaved_matches_torch(num_ranks: int, num_microbatches: int, chunks: int) -> None:
    ours = _ours(generate("interleaved", num_ranks, num_microbatches, chunks=chunks))
    assert ours == _torch_interleaved(num_ranks, num_microbatches, chunks)


def _to_torch(schedule, keep=lambda a: True) -> dict[int, list]:
    return {
        rank: [schedules._Action.from_str(str(a)) for a in acts if keep(a)]
        for rank, acts in enumerate(schedule.ranks)
    }


@pytest.mark.parametrize(
    ("name", "params"),
    [("gpipe", {}), ("dapple", {}), ("dapple", {"policy": "2(s-i)-1"}), ("zb-h1", {}),
     ("interleaved", {"chunks": 2})],
)
def test_torch_accepts_our_schedules(name: str, params: dict) -> None:
    from sim.schedule import lower
    from sim.schedule.ir import ActionKind

    schedule = generate(name, 4, 8, **params)
    ranks = schedule.num_ranks
    mapping = schedules._validate_schedule(
        _to_torch(schedule), ranks, schedule.num_stages, schedule.num_microbatches
    )
    assert mapping == dict(enumerate(schedule.stage_ranks))
    # torch's comms dry run (it has no REDUCE_GRAD) runs our lowered schedule to the end.
    lowered = _to_torch(lower(schedule), keep=lambda a: a.kind is not ActionKind.REDUCE_GRAD)
    simulated = schedules._simulate_comms_compute(
        lowered, lambda s: schedule.stage_ranks[s], schedule.num_stages
    )
    assert {r: [a for a in acts if a is not None] for r, acts in simulated.items()} == lowered

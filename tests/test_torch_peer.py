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


# --- the schedules torch 2.13 has beyond GPipe, 1F1B and interleaved ------------------------
#
# torch's own helper builds each schedule class on mock stages and returns its pipeline_order.

visualizer = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")

TORCH_NAMES = {
    "zb-v": "ZBVZeroBubble",
    "dualpipe-v": "DualPipeV",
    "interleaved-zb": "InterleavedZeroBubble",
    "looped-bfs": "LoopedBFS",
}
V_SHAPED = {"zb-v", "dualpipe-v"}


def _torch_orders(name: str, num_ranks: int, num_microbatches: int, chunks: int):
    """torch's compute order per rank, or the ValueError its constructor raises."""
    try:
        ops = visualizer.get_schedule_ops(TORCH_NAMES[name], num_ranks, num_microbatches,
                                          num_stages_per_rank=chunks)
    except ValueError as err:
        return err
    return {rank: [str(a) for a in acts if a is not None and a.is_compute_op] for rank, acts in enumerate(ops)}


NEW_CASES = [
    (name, s, m, v)
    for name in sorted(TORCH_NAMES)
    for s in (2, 4, 8)
    for m in (s, 2 * s, 4 * s)
    for v in ((2,) if name in V_SHAPED else (2, 3))
]


@pytest.mark.parametrize(("name", "num_ranks", "num_microbatches", "chunks"), NEW_CASES)
def test_new_schedules_match_torch(name: str, num_ranks: int, num_microbatches: int, chunks: int) -> None:
    from sim.core.errors import ScheduleError

    theirs = _torch_orders(name, num_ranks, num_microbatches, chunks)
    params = {} if name in V_SHAPED else {"chunks": chunks}
    if isinstance(theirs, ValueError):  # torch constrains M here; so do we, in one line
        with pytest.raises(ScheduleError) as err:
            generate(name, num_ranks, num_microbatches, **params)
        assert "\n" not in str(err.value) and "torch" in str(err.value)
        return
    schedule = generate(name, num_ranks, num_microbatches, **params)
    assert _ours(schedule) == theirs
    assert schedule.num_stages == num_ranks * chunks


def test_the_peer_cases_include_torch_s_constraint() -> None:
    # DualPipeV needs M >= 2S: M = S is refused by torch and by us; the others all run.
    refused = [c for c in NEW_CASES if isinstance(_torch_orders(*c), ValueError)]
    assert refused == [("dualpipe-v", s, s, 2) for s in (2, 4, 8)]


@pytest.mark.parametrize(("name", "num_ranks", "num_microbatches"),
                         [("interleaved-zb", 4, 9), ("interleaved-zb", 3, 7), ("dualpipe-v", 3, 5)])
def test_torch_and_we_refuse_the_same_microbatch_counts(name, num_ranks, num_microbatches) -> None:
    from sim.core.errors import ScheduleError

    assert isinstance(_torch_orders(name, num_ranks, num_microbatches, 2), ValueError)
    with pytest.raises(ScheduleError, match=f"num_microbatches={num_microbatches}"):
        generate(name, num_ranks, num_microbatches)


@pytest.mark.parametrize("name", sorted(TORCH_NAMES))
def test_torch_places_stages_where_we_do(name: str) -> None:
    schedule = generate(name, 4, 8)
    mapping = schedules._validate_schedule(
        _to_torch(schedule), schedule.num_ranks, schedule.num_stages, schedule.num_microbatches
    )
    assert mapping == dict(enumerate(schedule.stage_ranks))
    if name in V_SHAPED:  # torch's V: rank r holds stages r and 2S-1-r
        from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

        assert mapping == generate_stage_to_rank_mapping(4, 8, style="v")


@pytest.mark.parametrize("name", ["zb-v", "interleaved-zb", "looped-bfs"])
def test_torch_dry_runs_our_lowered_new_schedules(name: str) -> None:
    # torch's _simulate_comms_compute has no rule for OVERLAP_F_B, so dualpipe-v is left out
    # here; tests/test_torch_csv.py runs it through torch's own lowering instead.
    from sim.schedule import lower
    from sim.schedule.ir import ActionKind

    schedule = generate(name, 4, 8)
    lowered = _to_torch(lower(schedule), keep=lambda a: a.kind is not ActionKind.REDUCE_GRAD)
    simulated = schedules._simulate_comms_compute(
        lowered, lambda s: schedule.stage_ranks[s], schedule.num_stages
    )
    assert {r: [a for a in acts if a is not None] for r, acts in simulated.items()} == lowered


def test_torch_parses_our_overlapped_pairs_into_its_own_actions() -> None:
    from sim.schedule.ir import OverlapFB
    from sim.schedule.text import parse_action

    ours = [step for acts in generate("dualpipe-v", 4, 8).ranks for step in acts if isinstance(step, OverlapFB)]
    assert ours
    for step in ours:
        theirs = schedules._Action.from_str(str(step))
        assert theirs.computation_type is schedules._ComputationType.OVERLAP_F_B
        assert theirs.sub_actions == tuple(schedules._Action.from_str(str(p)) for p in step.parts)
        assert str(theirs) == str(step) and parse_action(str(theirs)) == step
    torch_pairs = [a for acts in visualizer.get_schedule_ops("DualPipeV", 4, 8) for a in acts
                   if a is not None and a.sub_actions is not None]
    assert [str(a) for a in torch_pairs] == [str(p) for p in ours]

"""torch's pipeline-order CSV, both ways: ours loads into torch's runtime class, torch's into ours.

torch's ``_PipelineScheduleRuntime`` normally needs real stages and a process group; like
torch's own schedule visualizer we give it autospec'd mock stages, which is all ``_load_csv``,
its lowering and ``_dump_csv`` read.
"""

from __future__ import annotations

import logging
from unittest import mock

import pytest

from sim.core.errors import ScheduleError
from sim.schedule import (
    GENERATORS,
    check_schedule,
    generate,
    lower,
    parse_csv,
    parse_schedule,
    strip_communication,
    to_csv,
)
from sim.schedule.torch_csv import is_csv

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
stage_module = pytest.importorskip("torch.distributed.pipelining.stage")


def _stages(num_ranks: int, num_stages: int) -> list:
    stage = mock.create_autospec(stage_module.PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, num_ranks, None, num_stages
    return [stage] * (num_stages // num_ranks)


def _through_torch(text: str, schedule, fmt: str, tmp_path) -> str:
    """Our CSV → torch's _load_csv → torch's _dump_csv, as text."""
    ours, theirs = tmp_path / "ours.csv", tmp_path / "theirs.csv"
    ours.write_bytes(text.encode())
    runtime = schedules._PipelineScheduleRuntime(
        _stages(schedule.num_ranks, schedule.num_stages), schedule.num_microbatches
    )
    runtime._load_csv(str(ours), format=fmt)  # validates, and (compute_only) lowers it
    runtime._dump_csv(str(theirs), format=fmt)
    return theirs.read_bytes().decode()


CASES = [
    ("gpipe", 3, 5, {}),
    ("dapple", 4, 8, {}),
    ("dapple", 4, 8, {"policy": ("2(s-i)-1", "2(s-i)-1", "s-i", "s-i")}),
    ("zb-h1", 4, 8, {}),
    ("interleaved", 2, 4, {"chunks": 3}),
    ("interleaved-zb", 4, 8, {}),
    ("looped-bfs", 2, 6, {}),
    ("zb-v", 4, 4, {}),
    ("zb-v", 2, 8, {}),
    ("dualpipe-v", 4, 8, {}),
    ("dualpipe-v", 2, 12, {}),
]


@pytest.mark.parametrize("lowered", [False, True], ids=["compute_only", "compute_comms"])
@pytest.mark.parametrize(("name", "ranks", "microbatches", "params"), CASES)
def test_our_csv_round_trips_through_torch(name, ranks, microbatches, params, lowered, tmp_path) -> None:
    schedule = generate(name, ranks, microbatches, **params)
    schedule = lower(schedule) if lowered else schedule
    text = to_csv(schedule)
    back = _through_torch(text, schedule, "compute_comms" if lowered else "compute_only", tmp_path)
    assert back == text  # byte for byte
    assert parse_csv(back, name=schedule.name) == schedule


def test_csv_is_the_excel_dialect_torch_writes() -> None:
    text = to_csv(generate("dualpipe-v", 2, 4))
    assert text.splitlines()[0].startswith("0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,")
    assert text.endswith("\r\n") and text.count("\r\n") == 2


TORCH_CLASSES = [
    ("zb-v", "ScheduleZBVZeroBubble", 4, 4),
    ("zb-v", "ScheduleZBVZeroBubble", 2, 8),
    ("dualpipe-v", "ScheduleDualPipeV", 4, 8),
    ("interleaved-zb", "ScheduleInterleavedZeroBubble", 4, 8),
    ("looped-bfs", "ScheduleLoopedBFS", 2, 4),
    ("interleaved", "ScheduleInterleaved1F1B", 4, 8),
]


@pytest.mark.parametrize(("name", "cls", "ranks", "microbatches"), TORCH_CLASSES)
def test_torch_s_dumped_csv_loads_into_ours(name, cls, ranks, microbatches, tmp_path, caplog) -> None:
    caplog.set_level(logging.ERROR)
    theirs = getattr(schedules, cls)(_stages(ranks, 2 * ranks), microbatches)
    for fmt in ("compute_only", "compute_comms"):
        path = tmp_path / f"{fmt}.csv"
        theirs._dump_csv(str(path), format=fmt)  # with None padding: empty cells
        text = path.read_bytes().decode()
        ours = parse_csv(text, name=name)
        check_schedule(ours)  # torch's lowering (receives placed early, UNSHARD/RESHARD dropped) runs here
        assert ours.is_lowered is (fmt == "compute_comms")
        assert strip_communication(ours) == generate(name, ranks, microbatches)


def test_parse_csv_skips_empty_cells_and_fsdp_actions_and_keeps_empty_rows() -> None:
    text = "0UNSHARD,0F0,,0SEND_F0,0B0,0REDUCE_GRAD,0RESHARD\r\n1RECV_F0,1F0,1B0\r\n"
    schedule = parse_csv(text)
    assert str(schedule) == "0F0 0SEND_F0 0B0 0REDUCE_GRAD\n1RECV_F0 1F0 1B0"
    assert parse_csv("0F0,0B0\n\n").num_ranks == 2  # row r is rank r, even when empty


def test_parse_csv_names_row_and_column_of_a_bad_cell() -> None:
    with pytest.raises(ScheduleError, match=r"s\.csv row 2 column 3: bad action '1Q0'"):
        parse_csv("0F0,0B0\n1F0,1B0,1Q0\n", name="s.csv")
    with pytest.raises(ScheduleError, match="no actions"):
        parse_csv(",,\n")


@pytest.mark.parametrize(
    ("text", "path", "expected"),
    [("0F0,0B0\n", None, True), ("0F0 0B0\n", None, False), ("0F0\n", "a.CSV", True),
     ("0F0 0B0  # no, commas, here\n", None, False), ("(0F1;1B0)OVERLAP_F_B 0F0\n", "s.txt", False)],
)
def test_csv_is_told_from_text_by_suffix_or_commas(text, path, expected) -> None:
    assert is_csv(text, path=path) is expected


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_csv_and_text_forms_agree(name) -> None:
    schedule = generate(name, 2, 4)
    named = schedule.name  # 1f1b is dapple
    assert parse_csv(to_csv(schedule), name=named) == parse_schedule(str(schedule), name=named) == schedule

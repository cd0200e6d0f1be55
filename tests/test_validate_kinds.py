"""``benchmarks/validate_kinds.py`` (issue 34 item 8): its arguments only; a run takes minutes."""

from __future__ import annotations

import pytest

from conftest import load_benchmark

validate_kinds = load_benchmark("validate_kinds")


def test_every_kind_by_default_and_a_chosen_few():
    assert validate_kinds.parse_args([]).kinds == list(validate_kinds.KINDS)
    assert len(validate_kinds.KINDS) == 22
    new = {"fp8", "mtp", "mla", "zb-h1", "interleaved", "moe-expert-tensor", "fsdp-full-tensor"}
    assert new <= set(validate_kinds.KINDS)
    args = validate_kinds.parse_args(["--kinds", "data, fsdp-full", "--steps", "3"])
    assert (args.kinds, args.steps, args.slices, args.repeats) == (["data", "fsdp-full"], 3, 2, 4)


@pytest.mark.parametrize("argv", [["--kinds", "data,zero3"], ["--kinds", ","], ["--steps", "0"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        validate_kinds.parse_args(argv)
    assert stop.value.code == 2
    assert "--" in capsys.readouterr().err


def test_a_refused_kind_prints_its_reason():
    assert validate_kinds.line({"kind": "context", "refused": "context parallelism needs CUDA"}) == \
        "context              refused: context parallelism needs CUDA"


def test_the_memory_error_keeps_the_sign_of_the_device_furthest_off():
    # the report's peak_memory_frac is the largest magnitude (0.3); the line shows it signed
    error = {"peak_memory_frac": 0.3, "devices": [{"peak_memory_frac": 0.1}, {"peak_memory_frac": -0.3},
                                                   {"peak_memory_frac": None}]}
    assert validate_kinds.worst_memory_error(error) == -0.3
    assert validate_kinds.worst_memory_error({"peak_memory_frac": None, "devices": []}) is None

"""``dapple-sim compare`` counts its work before it replays (issue 35, item 9).

A comparison replays every schedule's variant of the plan, and each replay's work grows with
its stages times its micro-batches. ``sim.app.compare.check_work`` sums those pairs over the
variants and refuses more than ``MAX_STAGE_MICROBATCHES`` in one line (exit 2) naming the count,
the limit and ``--max-stage-microbatches``, the flag that lifts it. The 1T GPT of Korthikanti
et al. 2022 with a mutated plan (gpipe instead of 1f1b, written as ``dapple-plan`` writes plans)
replayed six schedules for over 20 s; it is now refused before any replay.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conftest import SCENARIOS
from sim.app.cli import main
from sim.app.compare import DEFAULT_SCHEDULES, MAX_STAGE_MICROBATCHES, check_work, plan_variants
from sim.core.errors import DappleError
from sim.input.plan_file import plan_to_dict
from sim.input.scenario import load_scenario

ONE_T = str(SCENARIOS / "published" / "korthikanti2022_1t_full.yaml")
BERT48 = str(SCENARIOS / "bert48_v100_2x8.yaml")


def test_the_count_is_stages_times_microbatches_summed_over_the_schedules() -> None:
    scenario = load_scenario(BERT48)  # 2 device sets, 8 micro-batches
    variants = plan_variants(scenario, DEFAULT_SCHEDULES)
    # gpipe, dapple: 2 stages; interleaved: 2 chunks x 2 = 4; zb-h1: 2; zb-v, dualpipe-v: 2R = 4
    expected = (2 + 2 + 4 + 2 + 4 + 4) * 8
    assert check_work(variants, scenario.training.num_microbatches) == expected == 144
    assert check_work(variants, 8, limit=144) == 144
    with pytest.raises(DappleError, match=r"144 stage × micro-batch pairs .* over the limit of 143"):
        check_work(variants, 8, limit=143)


def test_a_mutated_1t_plan_is_refused_up_front_naming_the_limit_and_the_flag(tmp_path, capsys) -> None:
    scenario = load_scenario(ONE_T)  # 64 stages (1f1b), 512 micro-batches
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_to_dict(replace(scenario.plan, schedule="gpipe", schedule_params=()),
                                            scenario.training)))
    assert main(["compare", ONE_T, "--plan", str(plan)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    # 3 schedules of 64 stages and 3 of 128 (interleaved with 2 chunks, zb-v, dualpipe-v), 512 each
    total = (3 * 64 + 3 * 128) * 512
    assert f"{total:,} stage × micro-batch pairs" in err
    assert f"over the limit of {MAX_STAGE_MICROBATCHES:,}" in err
    assert f"--max-stage-microbatches {total}" in err


def test_a_raised_limit_lets_the_comparison_run(capsys) -> None:
    assert main(["compare", BERT48, "--schedules", "gpipe,dapple", "--engine", "fast",
                 "--max-stage-microbatches", "32", "--json"]) == 0
    assert [row["schedule"] for row in json.loads(capsys.readouterr().out)] == ["gpipe", "dapple"]
    assert main(["compare", BERT48, "--schedules", "gpipe,dapple", "--max-stage-microbatches", "31"]) == 2
    assert "over the limit of 31" in capsys.readouterr().err

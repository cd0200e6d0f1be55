"""``policy: auto``: DAPPLE's warm-up, chosen for the pipeline from its cuts' transfer times.

The rule (DAPPLE, Fan et al., PPoPP 2021, §5; derivation in
``sim.schedule.policy.choose_dapple_policies``): under K_i = S−i, stage i's steady period is
at least t + Σ_{j≥i} x_j / (S−i) for compute t and cut round trips x_j, so it idles for the
transfers that GPipe hides; K_i = 2(S−i)−1 adds (S−i−1)·t of slack, enough while x_j ≤ t.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.errors import ScheduleError
from sim.schedule import check_schedule, choose_dapple_policies, generate
from sim.schedule.policy import DapplePolicy, dapple_warmup

LIGHT, HEAVY = DapplePolicy.S_MINUS_I, DapplePolicy.COMM_HEAVY


def _choose(compute, transfer, m, **kw):
    return choose_dapple_policies(compute_s=compute, transfer_s=transfer, num_microbatches=m, **kw)


def test_free_cuts_keep_s_minus_i() -> None:
    assert _choose([1.0] * 4, [0.0] * 3, 16) == (LIGHT,) * 4


def test_costly_cuts_get_two_s_minus_i_minus_one_but_the_last_stage_keeps_one() -> None:
    assert _choose([1.0] * 4, [0.2] * 3, 16) == (HEAVY, HEAVY, HEAVY, LIGHT)


def test_heavy_ratio_sets_what_counts_as_heavy() -> None:
    # cut 0 costs 30% of stage 0's compute, cut 2 only 5% of stage 2's: one heavy cut is enough
    assert _choose([1.0] * 4, [0.3, 0.0, 0.05], 16, heavy_ratio=0.1) == (HEAVY, HEAVY, HEAVY, LIGHT)
    assert _choose([1.0] * 4, [0.05, 0.0, 0.05], 16, heavy_ratio=0.1) == (LIGHT,) * 4


def test_the_whole_pipeline_takes_one_policy() -> None:
    # one heavy cut anywhere: every stage but the last takes 2(S-i)-1 (a mix is slower than
    # either uniform order, see choose_dapple_policies)
    for transfer in ([0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]):
        assert _choose([1.0] * 4, transfer, 16) == (HEAVY, HEAVY, HEAVY, LIGHT)
    policies = _choose([1.0] * 6, [0.0, 0.0, 0.0, 1.0, 0.0], 32)
    assert [dapple_warmup(6, 32, i, policies) for i in range(6)] == [11, 9, 7, 5, 3, 1]


def test_memory_can_forbid_the_longer_warm_up() -> None:
    # stage 0 has room for 4 micro-batches: 2(4-0)-1 = 7 does not fit, so no stage takes it
    assert _choose([1.0] * 4, [0.5] * 3, 16, max_warmup=[4, 16, 16, 16]) == (LIGHT,) * 4
    assert _choose([1.0] * 4, [0.5] * 3, 16, max_warmup=[7, 5, 3, 1]) == (HEAVY, HEAVY, HEAVY, LIGHT)


def test_few_microbatches_cap_both_policies_alike() -> None:
    assert _choose([1.0] * 4, [1.0] * 3, 2) == (LIGHT,) * 4  # min(·, M) = 2 either way


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 8), st.integers(1, 40), st.data())
def test_the_choice_always_runs(num_stages, num_microbatches, data) -> None:
    seconds = st.floats(0, 2, allow_nan=False)
    compute = data.draw(st.lists(st.floats(0.01, 2), min_size=num_stages, max_size=num_stages))
    transfer = data.draw(st.lists(seconds, min_size=num_stages - 1, max_size=num_stages - 1))
    room = data.draw(st.lists(st.integers(1, 2 * num_stages), min_size=num_stages, max_size=num_stages))
    policies = _choose(compute, transfer, num_microbatches, max_warmup=room)
    assert len(policies) == num_stages
    schedule = generate("dapple", num_stages, num_microbatches, policy=policies)
    check_schedule(schedule)
    for i, policy in enumerate(policies):
        if policy is HEAVY:  # never beyond the memory it was given
            assert dapple_warmup(num_stages, num_microbatches, i, policy) <= room[i]


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"compute_s": [], "transfer_s": [], "num_microbatches": 4}, r"one entry per stage"),
        ({"compute_s": [1.0, 1.0], "transfer_s": [], "num_microbatches": 4}, r"transfer_s has 0 entries, expected one per cut \(1"),
        ({"compute_s": [1.0, -1.0], "transfer_s": [0.1], "num_microbatches": 4}, r"compute_s holds -1.0"),
        ({"compute_s": [1.0, 1.0], "transfer_s": [float("nan")], "num_microbatches": 4}, r"transfer_s holds nan"),
        ({"compute_s": [1.0], "transfer_s": [], "num_microbatches": 0}, r"num_microbatches=0"),
        ({"compute_s": [1.0], "transfer_s": [], "num_microbatches": 4, "max_warmup": [1, 2]}, r"max_warmup has 2"),
    ],
)
def test_bad_inputs_are_named(kwargs, pattern) -> None:
    with pytest.raises(ScheduleError, match=pattern):
        choose_dapple_policies(**kwargs)


# --- the point of it: auto is never slower than GPipe (contention-free replay) -------------

fastpath = pytest.importorskip("sim.engine.fastpath")


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(1, 24), st.data())
def test_auto_is_never_slower_than_gpipe(num_stages, num_microbatches, data) -> None:
    fwd = data.draw(st.lists(st.floats(0.5, 2), min_size=num_stages, max_size=num_stages))
    bwd = [2 * f for f in fwd]
    comm_s = data.draw(st.sampled_from([0.0, 0.05, 0.3, 0.75]))  # one way, per cut
    policies = _choose([f + b for f, b in zip(fwd, bwd)], [2 * comm_s] * (num_stages - 1), num_microbatches)

    def makespan(name, **params):
        schedule = generate(name, num_stages, num_microbatches, **params)
        return fastpath.time_schedule(schedule, fwd, bwd, comm_s=comm_s).makespan_s

    assert makespan("dapple", policy=policies) <= makespan("gpipe") * (1 + 1e-9)


def test_s_minus_i_alone_loses_to_gpipe_when_cuts_cost_time() -> None:
    # the observation in miniature: 4 balanced stages, transfers a tenth of compute
    fwd, bwd, comm_s = [1.0] * 4, [2.0] * 4, 0.15
    time = {
        name: fastpath.time_schedule(generate("dapple", 4, 16, **params), fwd, bwd, comm_s=comm_s).makespan_s
        for name, params in (("s-i", {}), ("auto", {"policy": _choose([3.0] * 4, [0.3] * 3, 16)}))
    }
    gpipe = fastpath.time_schedule(generate("gpipe", 4, 16), fwd, bwd, comm_s=comm_s).makespan_s
    assert time["s-i"] > gpipe >= time["auto"] - 1e-9


def test_default_scenario_dapple_is_at_least_as_fast_as_gpipe() -> None:
    """Issue 19's acceptance: the default scenario written ``schedule: dapple`` (now policy
    auto) takes no longer than GPipe (it was 1.764 s under s-i against GPipe's 1.686 s)."""
    from conftest import SCENARIOS
    from sim.engine.run import run_scenario
    from sim.input.scenario import load_scenario

    times = {}
    for schedule in ("gpipe", "dapple", "{name: dapple, policy: s-i}"):
        scenario = load_scenario(SCENARIOS / "bert48_v100_2x8.yaml", {"plan.schedule": schedule})
        times[schedule] = run_scenario(scenario).iteration_time_s
    assert times["dapple"] <= times["gpipe"] * (1 + 1e-9)
    assert times["{name: dapple, policy: s-i}"] > times["gpipe"]  # what auto fixes: s-i stays as written

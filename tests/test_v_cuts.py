"""A V schedule's default cut (``sim.input.plan_section.balanced_v_cuts``): device set s runs
stages s and 2p − 1 − s, so the two together are balanced, not each stage alone."""

from __future__ import annotations

from sim.input.plan_section import balanced_cuts, balanced_v_cuts


def _device_loads(costs, cuts, ranks):
    chunk = [sum(costs[a:b]) for a, b in zip(cuts, cuts[1:])]
    return [chunk[s] + chunk[2 * ranks - 1 - s] for s in range(ranks)]


def test_a_heavy_last_layer_is_paired_with_a_light_first_stage():
    costs = [1, 1, 1, 1, 1, 1, 4]  # a head as heavy as four blocks
    per_stage = balanced_cuts(costs, 4)
    assert max(_device_loads(costs, per_stage, 2)) == 8  # stage 0 filled up to the head's 4, beside it
    cuts = balanced_v_cuts(costs, 2)
    assert len(cuts) == 5 and cuts[0] == 0 and cuts[-1] == 7 and all(a < b for a, b in zip(cuts, cuts[1:]))
    # the least possible: device 0 runs one block and the head (1 + 4), device 1 the other five
    assert _device_loads(costs, cuts, 2) == [5, 5]


def test_uniform_layers_split_evenly_over_the_devices():
    cuts = balanced_v_cuts([1.0] * 16, 4)
    assert _device_loads([1.0] * 16, cuts, 4) == [4.0] * 4
    assert balanced_v_cuts([1.0] * 4, 2) == (0, 1, 2, 3, 4)  # one layer a stage

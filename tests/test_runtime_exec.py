"""The executor on real gloo ranks: every schedule trains one step exactly like the unsplit
model in one process, stage 0 keeps K_0/M of GPipe's activations under DAPPLE, and the torch
peer computes the same gradients.

All cases of one world size share one set of processes (one spawn per world size), so the
whole file costs a few seconds.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.pipelining")

from conftest import SCENARIOS

pytestmark = pytest.mark.dist

GPT = str(SCENARIOS / "gpt_tiny_cpu.yaml")
MLP = str(SCENARIOS / "mlp_tiny_cpu.yaml")
INTERLEAVED = (
    "[{layers: [0, 2], devices: [0]}, {layers: [2, 3], devices: [1]},"
    " {layers: [3, 4], devices: [0]}, {layers: [4, 6], devices: [1]}]"
)
VSHAPE = (  # zb-v and dualpipe-v: stages s and 2R-1-s on device set s
    "[{layers: [0, 2], devices: [0]}, {layers: [2, 3], devices: [1]},"
    " {layers: [3, 4], devices: [1]}, {layers: [4, 6], devices: [0]}]"
)
TWO_TO_ONE = "[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 6], devices: [2]}]"
ONE_TO_TWO = "[{layers: [0, 2], devices: [0]}, {layers: [2, 5], devices: [1, 2]}]"

TWO_RANKS = {
    "gpipe": (GPT, {"plan.schedule": "gpipe"}),
    # s-i written out: torch's Schedule1F1B peer and the K_0/M activation ratio are s-i's
    "dapple": (GPT, {"plan.schedule": "{name: dapple, policy: s-i}"}),
    "interleaved": (GPT, {"plan.schedule": "interleaved", "plan.stages": INTERLEAVED}),
    "zb-h1": (GPT, {"plan.schedule": "zb-h1"}),
    "zb-v": (GPT, {"plan.schedule": "zb-v", "plan.stages": VSHAPE}),
    "dualpipe-v": (GPT, {"plan.schedule": "dualpipe-v", "plan.stages": VSHAPE}),  # its pairs run in order
    "interleaved-zb": (GPT, {"plan.schedule": "interleaved-zb", "plan.stages": INTERLEAVED}),
    "looped-bfs": (GPT, {"plan.schedule": "looped-bfs", "plan.stages": INTERLEAVED}),
    "dapple-recompute": (GPT, {"plan.recompute": "true"}),
    "gpipe-tied": (GPT, {"plan.schedule": "gpipe", "model.tied_embeddings": "true"}),
}
ONE_RANK = {  # stages that share a rank hand tensors over locally; a tied head borrows the embedding
    "interleaved-tied": (GPT, {"cluster.devices_per_node": "1", "plan.schedule": "interleaved",
                               "model.tied_embeddings": "true",
                               "plan.stages": "[{layers: [0, 3], devices: [0]}, {layers: [3, 6], devices: [0]}]"}),
    "zb-h1-tied": (GPT, {"cluster.devices_per_node": "1", "plan.schedule": "zb-h1", "model.tied_embeddings": "true",
                         "plan.stages": "[{layers: [0, 6], devices: [0]}]"}),
}
THREE_RANKS = {
    "gpt-2:1": (GPT, {"cluster.devices_per_node": "3", "plan.stages": TWO_TO_ONE,
                      "training.microbatch_size": "3", "training.global_batch_size": "12"}),
    "gpt-2:1-tied-zb-h1": (GPT, {"cluster.devices_per_node": "3", "plan.stages": TWO_TO_ONE, "plan.schedule": "zb-h1",
                                 "model.tied_embeddings": "true", "training.microbatch_size": "3",
                                 "training.global_batch_size": "12"}),
    "mlp-2:1": (MLP, {}),
    "mlp-1:2-gpipe": (MLP, {"plan.stages": ONE_TO_TWO, "plan.schedule": "gpipe"}),
}


def _cases(device, cases: dict, peer: tuple[str, ...]):
    from runtime.execution.peer import run_peer
    from runtime.execution.session import SessionOptions, run_session
    from runtime.model.config import load_runnable

    results = {}
    for name, (path, overrides) in cases.items():
        summary = run_session(load_runnable(path, overrides), SessionOptions(steps=1, check=True), device)
        results[name] = summary
    for schedule in peer:
        runnable = load_runnable(GPT, TWO_RANKS[schedule][1])  # dapple: s-i, the order Schedule1F1B runs
        results[f"peer-{schedule}"] = run_peer(runnable, device, steps=1, keep_grads=True)
    if peer:  # which connections a gloo rank's activations and gradients travel on
        import torch.distributed as dist

        from runtime.execution.executor import ExecOptions, RankExecutor

        forward, backward = RankExecutor(load_runnable(GPT, {}), ExecOptions(), device).mailbox.groups
        results["directions"] = (forward is not None and backward is not None, forward is not backward,
                                 dist.group.WORLD not in (forward, backward))
    return results


@pytest.fixture(scope="module")
def two_ranks():
    from runtime.execution.launch import spawn

    return spawn(_cases, 2, TWO_RANKS, ("gpipe", "dapple"))


@pytest.fixture(scope="module")
def one_rank():
    from runtime.execution.launch import spawn

    return spawn(_cases, 1, ONE_RANK, ())[0]


@pytest.fixture(scope="module")
def three_ranks():
    from runtime.execution.launch import spawn

    return spawn(_cases, 3, THREE_RANKS, ())[0]


@pytest.mark.parametrize("name", sorted(TWO_RANKS))
def test_two_rank_schedules_match_the_unsplit_model(two_ranks, name):
    summary = two_ranks[0][name]
    assert summary["check_passed"], (summary["max_rel_grad_diff"], summary["worst_grad"])
    assert summary["max_abs_grad_diff"] < 1e-6
    assert summary["loss"] == pytest.approx(summary["reference_loss"], rel=1e-5)


@pytest.mark.parametrize("name", sorted(ONE_RANK))
def test_stages_on_one_rank_match_the_unsplit_model(one_rank, name):
    assert one_rank[name]["check_passed"], (one_rank[name]["max_rel_grad_diff"], one_rank[name]["worst_grad"])


@pytest.mark.parametrize("name", sorted(THREE_RANKS))
def test_uneven_replication_matches_the_unsplit_model(three_ranks, name):
    summary = three_ranks[name]
    assert summary["check_passed"], (summary["max_rel_grad_diff"], summary["worst_grad"])
    assert summary["loss"] == pytest.approx(summary["reference_loss"], rel=1e-5)


def test_activations_and_gradients_travel_on_connections_of_their_own(two_ranks):
    # gloo neighbours sending each other a message at once over one connection stall
    assert all(two_ranks[rank]["directions"] == (True, True, True) for rank in (0, 1))


def test_dapple_keeps_k0_over_m_of_gpipes_activations_on_stage_0(two_ranks):
    gpipe, dapple = two_ranks[0]["gpipe"], two_ranks[0]["dapple"]
    num_stages, num_microbatches = gpipe["num_stages"], gpipe["num_microbatches"]
    k0 = min(num_stages, num_microbatches)
    ratio = dapple["devices"][0]["peak_activation_bytes"] / gpipe["devices"][0]["peak_activation_bytes"]
    assert ratio == pytest.approx(k0 / num_microbatches, rel=0.05)


def test_trace_rows_follow_the_lowered_schedule(two_ranks):
    from runtime.model.config import load_runnable
    from sim.schedule.passes import lower
    from sim.schedule.plan_schedule import schedule_for_plan

    summary = two_ranks[0]["interleaved"]
    plan = load_runnable(GPT, TWO_RANKS["interleaved"][1]).plan
    lowered = lower(schedule_for_plan(plan, summary["num_microbatches"]))
    for device in (0, 1):
        rows = [r for r in summary["events"] if r["device"] == device]
        assert [r["action"] for r in rows] == [str(a) for a in lowered.ranks[device]] + ["OPTIM"]
        assert all(0 <= r["start_s"] <= r["end_s"] for r in rows)
        assert set(rows[0]) == {"device", "stage", "kind", "microbatch", "action", "stream", "start_s", "end_s"}


@pytest.mark.parametrize("schedule", ["gpipe", "dapple"])
def test_the_torch_peer_computes_the_same_gradients(two_ranks, schedule):
    from runtime.model.config import load_runnable
    from runtime.validation.grad_check import compare_grads, reference_step

    runnable = load_runnable(GPT, {"plan.schedule": schedule})
    reference = reference_step(runnable.model, runnable.scenario.training.global_batch_size)
    grads = [rank[f"peer-{schedule}"]["grads"] for rank in two_ranks]
    assert compare_grads(runnable.model, grads, reference).passed
    assert two_ranks[1][f"peer-{schedule}"]["losses"][0] == pytest.approx(reference.loss, rel=1e-5)

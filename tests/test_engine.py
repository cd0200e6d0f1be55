"""The SimPy engine against closed forms, contention rules and its own invariants.

Golden tests write the formulas out: with uniform stages and free communication GPipe and
DAPPLE take (M+S−1)(F+B); stage i holds M (GPipe) or min(S−i, M) (DAPPLE) micro-batches.
"""

from __future__ import annotations

import json

import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import synthetic_scenario
from sim.engine.compile import compile_workload
from sim.engine.fastpath import replay
from sim.engine.ports import Network
from sim.engine.replay import simulate
from sim.engine.workload import PortClass

F, B = 1.0, 2.0
CASES = [(s, m) for s in (1, 2, 4, 8) for m in sorted({1, s, 4 * s})]


def _run(scenario, **kw):
    return simulate(compile_workload(scenario), **kw)


@pytest.mark.parametrize(("S", "M"), CASES)
@pytest.mark.parametrize("schedule", ["gpipe", "dapple"])
def test_uniform_makespan(schedule, S, M):
    scenario = synthetic_scenario(fwd_s=[F] * S, bwd_s=[B] * S, schedule=schedule, microbatches=M)
    expected = (M + S - 1) * (F + B)
    result = _run(scenario)
    assert result.iteration_time_s == pytest.approx(expected, rel=1e-12)
    assert replay(compile_workload(scenario)).iteration_time_s == pytest.approx(expected, rel=1e-12)
    assert result.summary()["bubble_fraction"] == pytest.approx((S - 1) / (M + S - 1), abs=1e-12)


@pytest.mark.parametrize(("S", "M"), CASES)
@pytest.mark.parametrize(
    ("schedule", "params", "rule"),
    [
        ("gpipe", {}, lambda S, M, i: M),
        ("dapple", {}, lambda S, M, i: min(S - i, M)),
        ("dapple", {"policy": "2(s-i)-1"}, lambda S, M, i: min(2 * (S - i) - 1, M)),
    ],
)
def test_peak_inflight_microbatches(schedule, params, rule, S, M):
    scenario = synthetic_scenario(fwd_s=[F] * S, bwd_s=[B] * S, schedule=schedule, params=params, microbatches=M)
    devices = _run(scenario).summary()["devices"]
    assert [d["peak_activation_microbatches"] for d in devices] == [rule(S, M, i) for i in range(S)]
    # activations: one unit of stash per micro-batch alive, on top of nothing at rest
    assert [d["peak_memory_bytes"] for d in devices] == [rule(S, M, i) * 1.0 for i in range(S)]


@pytest.mark.parametrize(("S", "v", "M"), [(2, 2, 4), (4, 2, 8), (4, 3, 8), (3, 2, 6), (2, 4, 8)])
def test_interleaved_bubble(S, v, M):
    # each rank holds v chunks; a chunk costs F/v forward and B/v backward per micro-batch
    ranks = [s % S for s in range(S * v)]
    scenario = synthetic_scenario(fwd_s=[F / v] * (S * v), bwd_s=[B / v] * (S * v), schedule="interleaved",
                                  microbatches=M, ranks=ranks)
    expected = M * (F + B) + (S - 1) * (F + B) / v
    assert _run(scenario).iteration_time_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("S", "M"), [(2, 4), (4, 4), (4, 8), (8, 16)])
def test_zb_h1_is_shorter_than_dapple_when_f_b_w_are_equal(S, M):
    # full backward = I + W = 2F with W half of it: F = I = W
    dapple = _run(synthetic_scenario(fwd_s=[F] * S, bwd_s=[2 * F] * S, microbatches=M))
    zb = _run(synthetic_scenario(fwd_s=[F] * S, bwd_s=[2 * F] * S, schedule="zb-h1", microbatches=M))
    assert zb.iteration_time_s < dapple.iteration_time_s
    # Qi et al. ICLR'24 §2.1: M(F+I+W) + (S−1)(F+I−W)
    assert zb.iteration_time_s == pytest.approx(M * 3 * F + (S - 1) * F)


# --- contention --------------------------------------------------------------------------------


class _Kind:
    def __init__(self, index, nbytes, ports, rate=1.0):
        self.index = index
        self.bytes = nbytes
        self.ports = ports
        self.static_rate_bytes_per_s = rate


class _Ports:
    def __init__(self, *bandwidths):
        self.port_classes = tuple(
            PortClass(index=i, name=f"p{i}", bandwidth_bytes_per_s=b, size=1) for i, b in enumerate(bandwidths)
        )


def _finish_times(bandwidths, flows):
    """flows: (start_s, bytes, ports with weights) -> finish times under the contention model."""
    env = simpy.Environment()
    net = Network(env, _Ports(*bandwidths), contention=True)
    finished = {}

    def start(index, at, kind):
        yield env.timeout(at)
        net.transfer(kind, lambda *_: finished.__setitem__(index, env.now))

    for index, (at, nbytes, ports) in enumerate(flows):
        env.process(start(index, at, _Kind(index, nbytes, ports)))
    net.run()
    return [finished[i] for i in range(len(flows))]


def test_two_concurrent_transfers_through_one_port_take_twice_as_long():
    alone = _finish_times([10.0, 10.0, 10.0], [(0.0, 100.0, ((0, 1.0), (1, 1.0)))])
    assert alone == [pytest.approx(10.0)]
    both = _finish_times([10.0, 10.0, 10.0], [(0.0, 100.0, ((0, 1.0), (1, 1.0))), (0.0, 100.0, ((0, 1.0), (2, 1.0)))])
    assert both == [pytest.approx(20.0), pytest.approx(20.0)]


def test_transfers_on_disjoint_ports_do_not_slow_each_other():
    times = _finish_times([10.0] * 4, [(0.0, 100.0, ((0, 1.0), (1, 1.0))), (0.0, 100.0, ((2, 1.0), (3, 1.0)))])
    assert times == [pytest.approx(10.0), pytest.approx(10.0)]


def test_network_clock_runs_alarms_flows_and_simpy_events_in_time_order():
    env = simpy.Environment()
    net = Network(env, _Ports(10.0, 10.0), contention=True)
    seen = []

    def note(what):
        seen.append((what, env.now))

    def device():
        yield env.timeout(1.0)
        note("simpy")
        net.at(2.5, note, "late alarm")
        net.transfer(_Kind(0, 20.0, ((0, 1.0), (1, 1.0))), lambda *_: note("flow"))  # leaves at 3
        yield env.timeout(2.5)
        note("simpy")

    net.at(2.0, note, "alarm a")
    net.at(2.0, note, "alarm b")  # at one instant, in the order they were set
    env.process(device())
    net.run()
    assert seen == [("simpy", 1.0), ("alarm a", 2.0), ("alarm b", 2.0), ("late alarm", 2.5),
                    ("flow", pytest.approx(3.0)), ("simpy", 3.5)]


def test_a_late_flow_shares_only_while_both_run():
    # A alone for 5 s (half done), then both at half rate: A needs 10 s more, B is half done
    # by then and finishes alone 5 s later.
    times = _finish_times([10.0, 10.0], [(0.0, 100.0, ((0, 1.0), (1, 1.0))), (5.0, 100.0, ((0, 1.0), (1, 1.0)))])
    assert times == [pytest.approx(15.0), pytest.approx(20.0)]


def test_slowest_port_on_the_path_decides_and_weights_count_real_flows():
    assert _finish_times([10.0, 4.0], [(0.0, 100.0, ((0, 1.0), (1, 1.0)))]) == [pytest.approx(25.0)]
    # a flow kind standing for 8 real flows through one port gets an eighth of it
    assert _finish_times([80.0, 1e9], [(0.0, 100.0, ((0, 8.0), (1, 1.0)))]) == [pytest.approx(10.0)]


def _processor_sharing(bandwidths, flows):
    """The contention model written out flow by flow (no channels, no virtual time): at each
    start or finish every flow's rate is the smallest share on its path."""
    remaining = {i: nbytes for i, (_, nbytes, _) in enumerate(flows)}
    pending = sorted(range(len(flows)), key=lambda i: flows[i][0])
    active, finished, now = set(), {}, 0.0
    while pending or active:
        load = [0.0] * len(bandwidths)
        for i in active:
            for port, weight in flows[i][2]:
                load[port] += weight
        rate = {i: min(bandwidths[p] / load[p] for p, _ in flows[i][2]) for i in active}
        next_start = flows[pending[0]][0] if pending else float("inf")
        next_end = min((now + remaining[i] / rate[i] for i in active), default=float("inf"))
        step = min(next_start, next_end) - now
        for i in active:
            remaining[i] -= rate[i] * step
        now += step
        for i in [i for i in active if remaining[i] <= 1e-9 * flows[i][1]]:
            active.discard(i)
            finished[i] = now
        while pending and flows[pending[0]][0] <= now:
            active.add(pending.pop(0))
    return [finished[i] for i in range(len(flows))]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 50.0), st.floats(1.0, 200.0), st.integers(0, 3), st.integers(0, 3),
                          st.sampled_from([1.0, 2.0, 8.0])), min_size=1, max_size=14))
def test_channels_on_virtual_time_equal_processor_sharing_flow_by_flow(draws):
    # flows over 4 ports (some on one path, which share a channel), joining at random times
    bandwidths = [10.0, 4.0, 25.0, 7.0]
    flows = [(round(at, 3), nbytes, ((a, weight), (b, 1.0)) if a != b else ((a, weight),))
             for at, nbytes, a, b, weight in draws]
    got = _finish_times(bandwidths, flows)
    assert got == pytest.approx(_processor_sharing(bandwidths, flows), rel=1e-6)


def test_processor_sharing_spreads_finishes_further_apart_than_starts():
    # 8 equal flows through one port, each 1 us after the previous: the first leaves 7 us
    # before the second (what makes lockstep replicas and nearly lockstep ones differ)
    gap = 1e-6
    times = _finish_times([10.0], [(i * gap, 100.0, ((0, 1.0),)) for i in range(8)])
    assert times[1] - times[0] == pytest.approx(7 * gap, rel=1e-6)
    assert times[-1] == pytest.approx(80.0)  # the port never idles: all bytes by 8 x 100 / 10


def test_inter_node_transfer_is_limited_by_the_nic():
    # two servers with one GPU each: the activation crosses the NICs (1 GB/s), not NVLink
    scenario = synthetic_scenario(fwd_s=[0.0, 0.0], bwd_s=[0.0, 0.0], microbatches=1, devices_per_node=1,
                                  boundary_bytes=1e9, intra_bandwidth=1e12, inter_bandwidth=1e9, latency_s=1e-3)
    result = _run(scenario)
    send = [r for r in result.event_rows() if r.action == "0SEND_F0"][0]
    assert send.duration_s == pytest.approx(1.0)
    # forward and backward each cost latency + bytes / NIC bandwidth
    assert result.iteration_time_s == pytest.approx(2 * (1e-3 + 1.0))


def test_replicas_share_their_nic_even_without_contention():
    # 8 replicas per stage on two servers send together: 8 flows share each NIC in both
    # models, since identical replicas always send at the same instant
    scenario = synthetic_scenario(fwd_s=[0.0, 0.0], bwd_s=[0.0, 0.0], replicas=[8, 8], microbatches=1,
                                  microbatch_size=8, boundary_bytes=1e8, inter_bandwidth=1e10)
    result = _run(scenario, contention=False)
    send = [r for r in result.event_rows() if r.action == "0SEND_F0"][0]
    assert send.duration_s == pytest.approx(8 * 1e8 / 1e10)
    assert _run(scenario).iteration_time_s == pytest.approx(result.iteration_time_s)


def test_different_operations_contend_only_with_contention():
    from dataclasses import replace

    from sim.core.plan import StageSpec

    # stages 0 and 2 on server 0, stage 1 on server 1: stage 0's activations and stage 2's
    # gradients leave server 0 through the same NIC at the same time
    scenario = synthetic_scenario(fwd_s=[0.001, 0.001, 0.001], bwd_s=[0.002, 0.002, 0.002], microbatches=8,
                                  devices_per_node=2, nodes=2, boundary_bytes=1e9, inter_bandwidth=1e10)
    stages = tuple(StageSpec(layers=st.layers, devices=(d,)) for st, d in zip(scenario.plan.stages, (0, 2, 1)))
    scenario = replace(scenario, plan=replace(scenario.plan, stages=stages))
    free = _run(scenario, contention=False).iteration_time_s
    shared = _run(scenario, contention=True).iteration_time_s
    assert shared > free * 1.05
    assert replay(compile_workload(scenario)).iteration_time_s == pytest.approx(free, rel=1e-12)


# --- memory -------------------------------------------------------------------------------------


def test_out_of_memory_verdict_names_device_time_and_overshoot():
    scenario = synthetic_scenario(fwd_s=[1.0, 1.0], bwd_s=[1.0, 1.0], schedule="gpipe", microbatches=4,
                                  stash_bytes=100.0, memory_bytes=250.0)
    summary = _run(scenario).summary()
    assert summary["oom"] is True
    detail = summary["oom_detail"]
    assert detail["device"] == 0
    assert detail["time_s"] == pytest.approx(2.0)  # the third forward starts at t = 2
    assert detail["overshoot_bytes"] == pytest.approx(150.0)  # 4 micro-batches x 100 B on 250 B
    assert "device 0 runs out of memory" in detail["message"]


def test_recompute_trades_time_for_memory():
    common = dict(fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0], schedule="gpipe", microbatches=4, stash_bytes=100.0,
                  boundary_bytes=10.0)
    plain = _run(synthetic_scenario(**common))
    again = _run(synthetic_scenario(**common, recompute=True))
    assert again.iteration_time_s > plain.iteration_time_s
    assert again.summary()["peak_memory_bytes"] < plain.summary()["peak_memory_bytes"]


@pytest.mark.parametrize("engine", ["simpy", "fast"])
def test_sending_and_receiving_hold_up_the_compute_streams(engine):
    # 2 stages, 1 micro-batch, free transfers: stage 1 runs F0 (1 s) and B0 (1 s) after
    # stage 0's F0, then issues SEND_B0; its data leaves at once (stage 0's B0 is not delayed)
    # but stage 1's optimizer step waits for the issue: the iteration is
    # max(2f + 2b, 2f + b + issue) with issue = overhead + bytes / send bandwidth
    def iteration(**link):
        scenario = synthetic_scenario(fwd_s=[1.0, 1.0], bwd_s=[1.0, 1.0], microbatches=1, microbatch_size=1,
                                      boundary_bytes=1e9, intra_bandwidth=1e15, **link)
        workload = compile_workload(scenario)
        return (simulate(workload) if engine == "simpy" else replay(workload)).iteration_time_s

    assert iteration() == pytest.approx(4.0)
    assert iteration(send_overhead_s=0.5) == pytest.approx(4.0)  # hidden behind stage 0's backward
    assert iteration(send_overhead_s=2.0) == pytest.approx(5.0)
    assert iteration(send_overhead_s=2.0, send_bandwidth=1e9) == pytest.approx(6.0)  # + 1e9 bytes at 1e9 B/s
    # taking data in holds up the receiver: stage 1's F0 starts at 1.5, stage 0's B0 at 4
    assert iteration(recv_overhead_s=0.5) == pytest.approx(5.0)


# --- properties on random plans -----------------------------------------------------------------

SCHEDULES = ["gpipe", "dapple", "zb-h1", "dapple2", "interleaved"]


@st.composite
def random_plans(draw):
    schedule = draw(st.sampled_from(SCHEDULES))
    num_ranks = draw(st.integers(1, 3))
    chunks = draw(st.integers(1, 2)) if schedule == "interleaved" else 1
    num_stages = num_ranks * chunks
    replicas = draw(st.lists(st.integers(1, 3), min_size=num_ranks, max_size=num_ranks))
    microbatches = draw(st.integers(1, 5)) * (num_ranks if schedule == "interleaved" else 1)
    times = st.floats(0.01, 2.0, allow_nan=False)
    fwd = draw(st.lists(times, min_size=num_stages, max_size=num_stages))
    bwd = draw(st.lists(times, min_size=num_stages, max_size=num_stages))
    params = {"policy": "2(s-i)-1"} if schedule == "dapple2" else {}
    return synthetic_scenario(
        fwd_s=fwd, bwd_s=bwd, replicas=replicas, microbatches=microbatches,
        microbatch_size=draw(st.integers(1, 4)),
        schedule="dapple" if schedule == "dapple2" else schedule, params=params,
        devices_per_node=draw(st.sampled_from([1, 2, 4])),
        ranks=[s % num_ranks for s in range(num_stages)],
        boundary_bytes=draw(st.sampled_from([0.0, 1e6, 1e8])), param_bytes=draw(st.sampled_from([0.0, 1e7])),
        latency_s=draw(st.sampled_from([0.0, 1e-5])), recompute=draw(st.booleans()),
        inter_bandwidth=1e9, intra_bandwidth=1e10, memory_bandwidth=1e11,
        send_overhead_s=draw(st.sampled_from([0.0, 0.05])), send_bandwidth=draw(st.sampled_from([None, 1e9])),
        recv_overhead_s=draw(st.sampled_from([0.0, 0.03])),
    )


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(random_plans())
def test_bytes_sent_equal_bytes_received(scenario):
    devices = _run(scenario).summary()["devices"]
    assert sum(d["bytes_sent"] for d in devices) == pytest.approx(sum(d["bytes_received"] for d in devices))


@FAST
@given(random_plans())
def test_every_forward_and_backward_runs_once_per_replica(scenario):
    result = _run(scenario)
    counts = {}
    for row in result.event_rows():
        if row.kind in ("F", "B", "I", "W"):
            key = (row.device, row.stage, row.microbatch, row.kind)
            counts[key] = counts.get(key, 0) + 1
    M = scenario.training.num_microbatches
    for s, stage in enumerate(scenario.plan.stages):
        for device in stage.devices:
            for m in range(M):
                f = counts.get((device, s, m, "F"), 0)
                b = counts.get((device, s, m, "B"), 0)
                i, w = counts.get((device, s, m, "I"), 0), counts.get((device, s, m, "W"), 0)
                assert f == 1 and (b, i, w) in ((1, 0, 0), (0, 1, 1))


@FAST
@given(random_plans())
def test_memory_returns_to_its_static_baseline(scenario):
    result = _run(scenario)
    for cls in result.workload.classes:
        _, values = result.memory_timeline(cls.devices[0])
        assert values[-1] == pytest.approx(cls.static_bytes, abs=1e-6 * max(1.0, max(values)))
        assert min(values) >= cls.static_bytes - 1e-6 * max(1.0, max(values))


@FAST
@given(random_plans(), st.integers(0, 5), st.floats(0.01, 1.0))
def test_iteration_time_never_falls_when_a_compute_time_rises(scenario, which, extra):
    # holds exactly for the contention-free model (a max-plus system); see sim.engine.ports
    # for why a shared network need not be monotone
    from dataclasses import replace

    layers = list(scenario.model.layers)
    index = which % len(layers)
    layers[index] = replace(layers[index], fwd_s=layers[index].fwd_s + extra)
    slower = replace(scenario, model=replace(scenario.model, layers=tuple(layers)))
    before = _run(scenario, contention=False).iteration_time_s
    after = _run(slower, contention=False).iteration_time_s
    assert after >= before - 1e-12 * before
    assert replay(compile_workload(slower)).iteration_time_s >= before - 1e-12 * before


@FAST
@given(random_plans())
def test_fast_path_equals_engine_without_contention(scenario):
    workload = compile_workload(scenario)
    engine = simulate(workload, contention=False)
    fast = replay(workload)
    assert fast.iteration_time_s == pytest.approx(engine.iteration_time_s, rel=1e-12, abs=1e-15)
    assert fast.summary()["peak_memory_bytes"] == pytest.approx(engine.summary()["peak_memory_bytes"], rel=1e-12)


@FAST
@given(random_plans(), st.booleans())
def test_symmetry_reduction_is_exact(scenario, contention):
    reduced = simulate(compile_workload(scenario), contention=contention).summary()
    full = simulate(compile_workload(scenario, symmetric=False), contention=contention).summary()
    assert reduced["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)
    for a, b in zip(reduced["devices"], full["devices"]):
        assert a["peak_memory_bytes"] == pytest.approx(b["peak_memory_bytes"], rel=1e-9)
        assert a["busy_s"] == pytest.approx(b["busy_s"], rel=1e-9)


def _assert_close(a, b, path=""):
    """Two summaries equal up to rounding (the two replays add the same times in another order)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _assert_close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), path
    else:
        assert a == b, path


@FAST
@given(random_plans(), st.booleans(), st.integers(0, 2**16))
def test_running_ahead_equals_the_synchronous_replay(scenario, contention, seed):
    """Property: each device on its own clock (the default) gives the summary of replaying
    every action at its instant, with contention and without, stragglers and jitter included."""
    import random
    from dataclasses import replace

    from sim.core.faults import Jitter, Straggler

    rng = random.Random(seed)
    devices = scenario.cluster.num_devices
    faults = []
    if rng.random() < 0.5:
        faults.append(Straggler(device=rng.randrange(devices), slowdown=rng.choice([1.25, 2.0]),
                                from_s=rng.choice([0.0, 0.5])))
    if rng.random() < 0.5:
        faults.append(Jitter(spread=0.1, seed=seed))
    workload = compile_workload(replace(scenario, faults=tuple(faults)), contention=contention)
    ahead = simulate(workload, contention=contention).summary()
    sync = simulate(workload, contention=contention, run_ahead=False).summary()
    _assert_close(ahead, sync)


@FAST
@given(random_plans(), st.integers(0, 2**16))
def test_faulted_symmetry_reduction_with_contention_is_exact(scenario, seed):
    """Property: with contention, a faulted plan's classes (the optimistic ones, or the
    equitable ones after a divergence) give the summary of replaying every device."""
    import random
    from dataclasses import replace

    from sim.core.faults import Jitter, SlowLink, Straggler
    from sim.engine.run import run_scenario

    rng = random.Random(seed)
    devices = scenario.cluster.num_devices
    faults = [Straggler(device=rng.randrange(devices), slowdown=rng.choice([1.25, 2.0]), from_s=rng.choice([0.0, 0.5]))]
    if rng.random() < 0.3:
        faults.append(SlowLink(device=rng.randrange(devices), factor=0.5))
    if rng.random() < 0.3:
        faults.append(Jitter(spread=0.1, seed=seed, per="stage"))
    faulted = replace(scenario, faults=tuple(faults))
    reduced = run_scenario(faulted).summary()
    every = run_scenario(faulted, symmetric=False).summary()
    assert reduced.pop("device_classes") <= every.pop("device_classes")
    _assert_close(reduced, every)


@pytest.mark.parametrize("name", ["llama3_70b_h100_fsdp.yaml", "llama3_8b_h100_context_parallel.yaml",
                                  "gpt3_175b_a100_tp8_pp8.yaml", "bert48_v100_straggler.yaml"])
@pytest.mark.parametrize("contention", [False, True])
def test_running_ahead_equals_the_synchronous_replay_on_4d_plans(name, contention):
    from conftest import SCENARIOS
    from sim.input.scenario import load_scenario

    workload = compile_workload(load_scenario(SCENARIOS / name), contention=contention)
    _assert_close(simulate(workload, contention=contention).summary(),
                  simulate(workload, contention=contention, run_ahead=False).summary())


def test_symmetry_merges_replicas():
    scenario = synthetic_scenario(fwd_s=[1.0] * 4, bwd_s=[2.0] * 4, replicas=[8, 8, 8, 8], boundary_bytes=1e6)
    assert len(compile_workload(scenario).classes) == 4
    assert len(compile_workload(scenario, symmetric=False).classes) == 32


def test_same_input_gives_identical_output():
    scenario = synthetic_scenario(fwd_s=[1.0, 2.0, 1.5], bwd_s=[2.0, 3.0, 2.5], replicas=[2, 3, 1],
                                  boundary_bytes=1e7, param_bytes=1e7, microbatches=6)
    first = json.dumps(_run(scenario).summary(), sort_keys=True)
    assert json.dumps(_run(scenario).summary(), sort_keys=True) == first


# --- command line ------------------------------------------------------------------------------


def test_simulate_command_writes_summary_trace_events_and_plots(tmp_path, capsys):
    from conftest import SCENARIOS
    from sim.app.cli import main

    out = tmp_path / "out"
    assert main(["simulate", str(SCENARIOS / "bert48_v100_2x8.yaml"), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    for key in ("iteration_time_s", "throughput_samples_per_s", "bubble_fraction", "peak_memory_bytes", "mfu", "oom",
                "schedule", "num_stages", "num_microbatches", "devices"):
        assert key in summary
    assert summary["num_stages"] == 2 and summary["num_microbatches"] == 8 and len(summary["devices"]) == 16
    assert summary["throughput_samples_per_s"] == pytest.approx(128 / summary["iteration_time_s"])
    assert json.loads((out / "summary.json").read_text()) == summary
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    names = {e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"compute", "send", "recv", "allreduce", "group"}
    assert any(e["ph"] == "C" and e["name"] == "memory" for e in trace)
    assert any(e["ph"] == "X" and e["name"] == "0F0" and e["pid"] == 0 for e in trace)
    assert (out / "gantt.png").stat().st_size > 10_000 and (out / "memory.png").stat().st_size > 10_000
    assert "1B7" in (out / "events.csv").read_text()


def test_simulate_table_and_engines_agree_without_contention(capsys):
    from conftest import SCENARIOS
    from sim.app.cli import main

    path = str(SCENARIOS / "gpt1.3b_h100_interleaved.yaml")
    assert main(["simulate", path]) == 0
    table = capsys.readouterr().out
    assert "interleaved, 8 stages" in table and "MFU" in table
    assert main(["simulate", path, "--engine", "fast", "--json"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert main(["simulate", path, "--no-contention", "--json"]) == 0
    engine = json.loads(capsys.readouterr().out)
    assert fast["iteration_time_s"] == pytest.approx(engine["iteration_time_s"], rel=1e-12)


def test_simulate_without_a_plan_is_one_line_and_exit_2(tmp_path, capsys):
    from conftest import SCENARIOS
    from sim.app.cli import main

    text = (SCENARIOS / "bert48_v100_2x8.yaml").read_text()
    no_plan = tmp_path / "no_plan.yaml"
    no_plan.write_text(text[: text.index("plan:")].replace("profiles/", str(SCENARIOS.parent / "sim/data/profiles") + "/"))
    assert main(["simulate", str(no_plan)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plan: missing" in err


def test_a_replay_that_cannot_progress_raises_instead_of_hanging():
    from dataclasses import replace

    from sim.core.errors import ScheduleError
    from sim.engine.workload import SEND

    scenario = synthetic_scenario(fwd_s=[1.0, 1.0], bwd_s=[1.0, 1.0], boundary_bytes=1e3)
    workload = compile_workload(scenario)
    # drop stage 0's sends: stage 1 waits for activations that never come
    first = workload.classes[0]
    kept = [i for i, op in enumerate(first.ops) if op.code != SEND]
    broken = replace(first, ops=tuple(first.ops[i] for i in kept), durations=[first.durations[i] for i in kept])
    workload = replace(workload, classes=(broken,) + workload.classes[1:])
    with pytest.raises(ScheduleError, match="blocked at 1RECV_F0"):
        simulate(workload)
    with pytest.raises(ScheduleError, match="cannot make progress"):
        replay(workload)

"""Benchmark the SimPy engine and the fast path at scale, with and without symmetry.

Case (issue 20): BERT-48 (the DAPPLE authors' V100 profile) in 16 stages x R replicas on
servers of 8 V100s, 64 micro-batches of 2 samples per replica, DAPPLE's schedule. Regimes:

* ``symmetric`` — no faults: one class per stage;
* ``no-symmetry`` — every device replayed on its own (``symmetric=False``);
* ``jitter`` — seeded jitter on every device, drawn per device (every device its own class);
* ``straggler`` — one device 1.5 times slower: partial symmetry splits only what waits for it
  (with contention the classes of ``Symmetry.optimistic``, checked by the replay; the
  equitable ones if they diverge, the time of both counted).

Each case runs in its own process (so ``peak MB``, the process's peak resident memory before
the references run, is the case's) and prints compile and replay seconds, device classes, actions (every action of
every device), and the replay's time as a ratio to two references the benchmark runs on the
same actions in the same process: ``heapq``, a bare heapq event loop over every device's
compiled ops with the fast path's rules (no contention, no memory, no symmetry), and
``naive``, a naive SimPy model of the same rules as the row's engine (one process per device,
one event per action; for ``simpy`` the engine's contention model flow by flow, a process per
flow interrupted whenever a flow starts or ends on one of its ports);
where the references run, the replay and each reference are timed ``--repeat`` times and the
fastest run kept (the machine may be shared).
The SimPy engine runs with contention (``simpy``) and without (``simpy-nc``); the naive models
must agree with the engine. With contention and jitter they agree only to about 1e-3: when
flows that start almost together share a port, processor sharing spreads their finishes
further apart than their starts (up to the number of flows), so rounding differences grow
with every stage they cross. The fast path (``fast``, vectorised with numpy over classes that share their
ops when there are many, ``sim.engine.vector``) equals ``simpy-nc``, which the benchmark checks.

    python benchmarks/engine_bench.py [--gpus 1024 4096 16384] [--regimes ...] [--engines ...]
    python benchmarks/engine_bench.py --two-stages 65536    # 2 stages x 32,768 replicas
"""

from __future__ import annotations

import argparse
import heapq
import json
import resource
import subprocess
import sys
import time

TEMPLATE = """
name: bert48-{gpus}
cluster: {{preset: v100-nvlink-8, nodes: {nodes}}}
model: {{profile: profiles/dapple-v100/bert-48-pbs-2.txt, profile_batch_size: 2, optimizer: adam}}
training: {{global_batch_size: {gbs}, microbatch_size: {mbs}}}
plan:
  schedule: dapple
  stages:
{stages}
faults: {faults}
"""
FAULTS = {
    "symmetric": "[]",
    "no-symmetry": "[]",
    "jitter": "[{type: jitter, spread: 0.05, seed: 7}]",
    "straggler": "[{type: straggler, device: 70, slowdown: 1.5}]",
}
ENGINES = ("simpy", "simpy-nc", "fast")
LAYERS = 53


def scenario_text(gpus: int, regime: str, num_stages: int = 16, num_microbatches: int = 64) -> str:
    replicas = gpus // num_stages
    bounds = [round(i * LAYERS / num_stages) for i in range(num_stages + 1)]
    stages = "\n".join(
        f"    - {{layers: [{bounds[s]}, {bounds[s + 1]}], devices: '{s * replicas}-{(s + 1) * replicas - 1}'}}"
        for s in range(num_stages)
    )
    mbs = 2 * replicas
    return TEMPLATE.format(gpus=gpus, nodes=max(1, gpus // 8), gbs=mbs * num_microbatches, mbs=mbs,
                           stages=stages, faults=FAULTS[regime])


# --- references: the same actions, without the engine ------------------------------------------


def bare_heapq(workload) -> float:
    """A plain heapq event loop over every class's ops, one event per action, with the fast
    path's rules: ops in order, a SEND's flows arrive after bytes / static rate + latency
    (one SEND at a time per device), a RECV waits for every flow, an all-reduce or group
    collective starts when every member has issued it. Returns the last device's end."""
    from sim.engine.rules import collective_duration_s
    from sim.engine.workload import COMPUTE, GROUP, RECV, REDUCE, SEND

    classes, kinds = workload.classes, workload.kinds
    stride = max(workload.num_microbatches, 1)
    boxes: dict = {}
    box = [boxes.setdefault((k.dst_class, k.label[0], k.label[1]), len(boxes)) * stride for k in kinds]
    flow_s = [k.bytes / k.static_rate_bytes_per_s for k in kinds]
    coll_s = [collective_duration_s(workload, c) for c in workload.collectives]
    group_s = [collective_duration_s(workload, c) for c in workload.group_collectives]
    pos, send_free = [0] * len(classes), [0.0] * len(classes)
    arrived: dict = {}
    waiting: dict = {}
    expected: dict = {}
    joined: dict = {}
    heap = [(0.0, c) for c in range(len(classes))]
    last_op, reduced = [0.0] * len(classes), [0.0] * len(classes)
    while heap:
        now, c = heapq.heappop(heap)
        cls = classes[c]
        ops = cls.ops
        if pos[c] == len(ops):
            last_op[c] = now
            continue
        op = ops[pos[c]]
        code = op.code
        if code == COMPUTE:
            duration = cls.durations[pos[c]]
            pos[c] += 1
            heapq.heappush(heap, (now + duration * (cls.slowdown if now >= cls.slow_from_s else 1.0), c))
        elif code == SEND:
            start = max(now, send_free[c])
            for k in cls.slots[op.flows] if op.flows >= 0 else ():
                key = box[k] + op.microbatch
                got = arrived.setdefault(key, [0, 0.0])
                got[0] += 1
                got[1] = max(got[1], start + flow_s[k] + kinds[k].latency_s)
                send_free[c] = max(send_free[c], start + flow_s[k])
                if key in waiting and got[0] == expected[key]:
                    heapq.heappush(heap, (got[1], waiting.pop(key)))
            pos[c] += 1
            heapq.heappush(heap, (now, c))
        elif code == RECV and op.flows >= 0:
            flows = cls.slots[op.flows]
            key = box[flows[0]] + op.microbatch
            got = arrived.get(key)
            if got is None or got[0] < len(flows):
                expected[key] = len(flows)
                waiting[key] = c
                continue
            pos[c] += 1
            heapq.heappush(heap, (max(now, got[1]), c))
        elif code in (REDUCE, GROUP) and op.collective >= 0:
            index = op.collective if code == REDUCE else cls.groups[op.collective]
            coll = (workload.collectives if code == REDUCE else workload.group_collectives)[index]
            key = (code, index, op.microbatch, op.kind)
            members = joined.setdefault(key, [])
            members.append((now, c))
            pos[c] += 1
            if code == REDUCE:
                heapq.heappush(heap, (now, c))  # the all-reduce does not block the compute stream
            if len(members) == len(coll.participants):
                finish = max(t for t, _ in members) + (coll_s if code == REDUCE else group_s)[index]
                for _, member in members:
                    if code == GROUP:
                        heapq.heappush(heap, (finish, member))
                    else:
                        reduced[member] = finish
        else:
            pos[c] += 1
            heapq.heappush(heap, (now, c))
    return max(max(a, b) + cls.optimizer_s for a, b, cls in zip(last_op, reduced, classes))


def naive_simpy(workload, *, contention: bool = False) -> float:
    """A naive SimPy model of the same actions: one process per device, a timeout per compute
    action, an event per receive and per collective (no memory). Without contention a timeout
    per flow (bytes / static rate). With ``contention`` the engine's contention model flow by
    flow: a process per SEND (one at a time per device) and per flow, which waits out its bytes
    at the smallest share on its path and is interrupted to take its new rate whenever a flow
    starts or ends on one of its ports (``sim.engine.ports``' rules without channels, shared
    recomputations or devices running ahead)."""
    import simpy

    from sim.engine.rules import collective_duration_s
    from sim.engine.workload import COMPUTE, GROUP, RECV, REDUCE, SEND

    env = simpy.Environment()
    classes, kinds = workload.classes, workload.kinds
    stride = max(workload.num_microbatches, 1)
    boxes: dict = {}
    box = [boxes.setdefault((k.dst_class, k.label[0], k.label[1]), len(boxes)) * stride for k in kinds]
    need = {b: box.count(b) for b in set(box)}  # a RECV waits for every kind into its mailbox
    counts: dict = {}
    events: dict = {}
    joined: dict = {}
    bandwidth = [p.bandwidth_bytes_per_s for p in workload.port_classes]
    load = [0.0] * len(bandwidth)
    on_port: list[set] = [set() for _ in bandwidth]

    def arrive(key, need):
        counts[key] = counts.get(key, 0) + 1
        if key not in events:
            events[key] = env.event()
        if counts[key] == need:
            events[key].succeed()

    def others_change(me, kind):
        for port, _ in kind.ports:
            for other in on_port[port]:
                if other is not me and other.is_alive and other.target is not None:
                    other.interrupt()

    def flow(kind, key=None):
        """One flow; a point-to-point one arrives in mailbox ``key`` its latency after it has left."""
        me = env.active_process
        for port, weight in kind.ports:
            load[port] += weight
            on_port[port].add(me)
        others_change(me, kind)
        remaining = kind.bytes
        while remaining > 1e-9 * kind.bytes:
            rate = min(bandwidth[p] / load[p] for p, _ in kind.ports)
            start = env.now
            try:
                yield env.timeout(remaining / rate)
                remaining = 0.0
            except simpy.Interrupt:
                remaining -= rate * (env.now - start)
        for port, weight in kind.ports:
            load[port] -= weight
            on_port[port].discard(me)
        others_change(me, kind)
        if key is not None:
            env.timeout(kind.latency_s).callbacks.append(lambda _: arrive(key, need[box[kind.index]]))

    def send(c, op, previous):
        if previous is not None and not previous.processed:
            yield previous
        yield simpy.AllOf(env, [env.process(flow(kinds[k], box[k] + op.microbatch)) for k in classes[c].slots[op.flows]])

    def collective(coll, done):
        for phase, latency in coll.phases:
            if phase:
                yield simpy.AllOf(env, [env.process(flow(kinds[k])) for k in phase])
            yield env.timeout(latency)
        done.succeed()

    send_free = [0.0] * len(classes)

    def device(c):
        cls, last, sending = classes[c], None, None
        for op, duration in zip(cls.ops, cls.durations):
            if op.code == COMPUTE:
                yield env.timeout(duration * (cls.slowdown if env.now >= cls.slow_from_s else 1.0))
            elif op.code == SEND and contention and op.flows >= 0:
                sending = env.process(send(c, op, sending))
            elif op.code == SEND:  # one SEND at a time leaves a device
                start = max(env.now, send_free[c])
                for k in cls.slots[op.flows] if op.flows >= 0 else ():
                    kind, key = kinds[k], box[k] + op.microbatch
                    left = start + kind.bytes / kind.static_rate_bytes_per_s
                    send_free[c] = max(send_free[c], left)
                    t = env.timeout(left + kind.latency_s - env.now)
                    t.callbacks.append(lambda _, key=key, n=need[box[k]]: arrive(key, n))
            elif op.code == RECV and op.flows >= 0:
                flows = cls.slots[op.flows]
                key = box[flows[0]] + op.microbatch
                if counts.get(key, 0) < len(flows):
                    if key not in events:
                        events[key] = env.event()
                    yield events[key]
            elif op.code in (REDUCE, GROUP) and op.collective >= 0:
                index = op.collective if op.code == REDUCE else cls.groups[op.collective]
                coll = (workload.collectives if op.code == REDUCE else workload.group_collectives)[index]
                key = (op.code, index, op.microbatch, op.kind)
                joined.setdefault(key, [env.event(), 0])[1] += 1
                done = joined[key][0]
                if joined[key][1] == len(coll.participants):
                    if contention:
                        env.process(collective(coll, done))
                    else:
                        env.timeout(collective_duration_s(workload, coll)).callbacks.append(lambda _, e=done: e.succeed())
                if op.code == GROUP:
                    yield done
                else:
                    last = done
        if last is not None and not last.processed:
            yield last
        yield env.timeout(cls.optimizer_s)
        ends.append(env.now)

    ends: list[float] = []
    for c in range(len(classes)):
        env.process(device(c))
    env.run()  # with contention the timeouts that interrupted flows abandoned run on past the end
    return max(ends)


# --- one case ---------------------------------------------------------------------------------


def _best_of(repeat: int, run) -> tuple[float, object]:
    """The fastest of ``repeat`` runs (seconds) and the last result: the machine may be shared."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def run_case(gpus: int, regime: str, engine: str, num_stages: int, references: bool, repeat: int = 1) -> dict:
    from sim.engine.compile import compile_workload
    from sim.engine.fastpath import replay
    from sim.engine.replay import Diverged, simulate
    from sim.input.scenario import parse_scenario

    scenario = parse_scenario(scenario_text(gpus, regime, num_stages), source=f"bench-{gpus}")
    contention = engine == "simpy"
    symmetric = regime != "no-symmetry"
    t0 = time.perf_counter()
    # as ``sim.engine.run.run_scenario`` does: with contention the optimistic classes first
    workload = compile_workload(scenario, symmetric=symmetric, contention=contention, optimistic=contention)
    t1 = time.perf_counter()
    try:
        replay_s, result = _best_of(repeat, lambda: replay(workload) if engine == "fast"
                                    else simulate(workload, contention=contention))
    except Diverged:  # the optimistic classes did not hold: the equitable ones, timed as the engine's
        workload = compile_workload(scenario, symmetric=symmetric, contention=contention)
        result = simulate(workload, contention=contention)
        replay_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    summary = result.summarize()
    t3 = time.perf_counter()
    row = {"gpus": gpus, "regime": regime, "engine": engine, "classes": len(workload.classes),
           "actions": sum(len(c.ops) * len(c.devices) for c in workload.classes),
           "compile_s": t1 - t0, "replay_s": replay_s, "summary_s": t3 - t2,
           "iteration_s": summary.iteration_time_s}
    row["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the references
    if references:
        every = workload if regime in ("no-symmetry", "jitter") and not contention else \
            compile_workload(scenario, symmetric=False, contention=False)
        row["heapq_s"], row["heapq_iteration_s"] = _best_of(repeat, lambda: bare_heapq(every))
        if contention:  # the naive model of the same rules: contention flow by flow
            every = compile_workload(scenario, symmetric=False, contention=True)
            row["naive_s"], row["naive_iteration_s"] = _best_of(repeat, lambda: naive_simpy(every, contention=True))
        else:
            row["naive_s"], row["naive_iteration_s"] = _best_of(repeat, lambda: naive_simpy(every))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--regimes", nargs="+", default=list(FAULTS), choices=list(FAULTS))
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--two-stages", type=int, metavar="GPUS", help="only 2 stages of GPUS/2 replicas, symmetric")
    parser.add_argument("--no-references", action="store_true", help="skip the heapq loop and the naive model")
    parser.add_argument("--references-up-to", type=int, default=4096, help="largest GPU count to run them at")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per case")
    parser.add_argument("--repeat", type=int, default=3,
                        help="replays and references timed this many times where the references run (best kept)")
    parser.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        gpus, regime, engine, stages, refs, repeat = (args.case + ["1"])[:6]
        print(json.dumps(run_case(int(gpus), regime, engine, int(stages), refs == "1", int(repeat))))
        return
    cases = [(g, r, e, 16) for g in args.gpus for r in args.regimes for e in args.engines]
    if args.two_stages:
        cases = [(args.two_stages, "symmetric", e, 2) for e in args.engines]
    print(f"{'GPUs':>6} {'regime':<12} {'engine':<9} {'classes':>7} {'actions':>9} {'compile s':>9} {'replay s':>9} "
          f"{'total s':>8} {'peak MB':>8} {'/heapq':>7} {'/naive':>7} {'heapq s':>8} {'naive s':>8}")
    for gpus, regime, engine, stages in cases:
        refs = not args.no_references and gpus <= args.references_up_to and stages == 16
        command = [sys.executable, __file__, "--case", str(gpus), regime, engine, str(stages), "1" if refs else "0",
                   str(args.repeat if refs else 1)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"{gpus:>6} {regime:<12} {engine:<9} over {args.timeout:g} s")
            continue
        if done.returncode != 0:
            print(f"{gpus:>6} {regime:<12} {engine:<9} failed: {done.stderr.strip().splitlines()[-1]}")
            continue
        row = json.loads(done.stdout)
        total = row["compile_s"] + row["replay_s"] + row["summary_s"]
        ratio = (lambda key: f"{row['replay_s'] / row[key]:>7.2f}" if key in row else f"{'-':>7}")
        refs_s = (f"{row['heapq_s']:>8.2f} {row['naive_s']:>8.2f}" if "heapq_s" in row else f"{'-':>8} {'-':>8}")
        print(f"{gpus:>6} {regime:<12} {engine:<9} {row['classes']:>7} {row['actions']:>9} {row['compile_s']:>9.2f} "
              f"{row['replay_s']:>9.2f} {total:>8.2f} {row['peak_mb']:>8.0f} {ratio('heapq_s')} {ratio('naive_s')} {refs_s}",
              flush=True)
        if "naive_iteration_s" in row:
            # the naive model replays the same rules: it agrees with the engine (with contention
            # and jitter only to ~1e-3: sharing a port amplifies rounding differences, see above)
            agree = 1e-9 if engine != "simpy" or regime != "jitter" else 1e-2
            assert abs(row["naive_iteration_s"] - row["iteration_s"]) <= agree * row["iteration_s"], row
            if engine != "simpy":  # the bare loop has no contention
                assert abs(row["heapq_iteration_s"] - row["iteration_s"]) <= 1e-9 * row["iteration_s"], row


if __name__ == "__main__":
    main()

"""A straggler in an expert-parallel group across servers: why its group keeps a class per member.

``benchmarks/moe_bench.py``'s straggler row (one slow device among 16,384, EP 64 over 8 servers,
SimPy with contention) replays 1,040 classes: 15 untouched expert groups a stage share one class,
and each of the 64 members of the straggler's group (and of its replicas' groups down the
pipeline) is its own. That is the coarsest exact partition the flows allow, not a refinement that
went too far: an all-to-all is replayed as ring flows inside each server and rail flows to the
next server (``sim.engine.groups._expert_all_to_all``), a directed torus whose only symmetries are
its translations, and none of them but the identity keeps the straggler in place, so no two of its
peers sit alike with respect to it (the flows through their ports differ). Dropping the
all-to-all's flows from the optimistic refinement, as it drops the gradient rings, merges the
peers with the untouched groups and is not exact: on the scenario below the replay deadlocks.
"""

from __future__ import annotations

from sim.engine.compile import compile_workload
from sim.engine.run import run_scenario
from sim.engine.symmetry import refine
from sim.input.scenario import parse_scenario

STAGES, EXPERT_GROUP, REPLICAS = 2, 16, 32
SMALL = f"""
name: moe-straggler-small
cluster: {{preset: dgx-h800, nodes: {STAGES * REPLICAS // 8}}}
model:
  preset: llama
  layers: 4
  hidden: 1024
  heads: 16
  kv_heads: 16
  ffn_hidden: 4096
  vocab: 32000
  seq_len: 1024
  dtype: bf16
  optimizer: adam
  attention: flash
  experts: {{count: 32, top_k: 4, ffn_hidden: 1024}}
training: {{global_batch_size: {REPLICAS * 4}, microbatch_size: {REPLICAS}}}
plan: {{schedule: 1f1b, sharding: optimizer, pipeline_parallel: {STAGES}, data_parallel: {REPLICAS},
        expert_parallel: {EXPERT_GROUP}}}
faults: [{{type: straggler, device: 5, slowdown: 1.5}}]
"""


def test_a_straggler_keeps_one_class_per_member_of_its_expert_groups_and_the_replay_is_exact():
    scenario = parse_scenario(SMALL, source="moe-straggler-small")
    workload = compile_workload(scenario, contention=True, optimistic=True)
    sizes = sorted(len(c.devices) for c in workload.classes)
    # a stage a class for the untouched group (16 devices), a class per member of the straggler's group
    assert sizes == [1] * (STAGES * EXPERT_GROUP) + [REPLICAS - EXPERT_GROUP] * STAGES
    merged = run_scenario(scenario, engine="simpy")
    every = run_scenario(scenario, engine="simpy", symmetric=False)
    assert merged.diverged is None
    assert merged.summarize().device_classes == STAGES * EXPERT_GROUP + STAGES
    assert merged.summarize().devices == every.summarize().devices


def _torus(servers: int, per_server: int, marked: int | None) -> list[int]:
    """Device classes of one all-to-all's flows as compiled: a ring in each server, a rail to the next."""
    devices = [(j, i) for j in range(servers) for i in range(per_server)]
    index = {d: k for k, d in enumerate(devices)}
    edges = [(index[(j, i)], index[(j, (i + 1) % per_server)], "ring") for j, i in devices]
    edges += [(index[(j, i)], index[((j + 1) % servers, i)], "rail") for j, i in devices]
    initial = ["slow" if k == marked else "ok" for k in range(len(devices))]
    classes, _ = refine(initial, list(range(len(devices))), edges, len(devices))
    return classes


def test_an_all_to_all_with_one_marked_member_has_no_two_members_alike():
    # unmarked: the translations make every member alike; one marked member: every member apart
    assert _torus(4, 8, None) == [0] * 32
    assert sorted(_torus(4, 8, marked=5)) == list(range(32))

"""The compiler at planner scale: a 4,096-GPU plan replays exactly as it did before the compile got faster.

The golden scenarios are small (up to a few hundred GPUs); the compiler's per-class
shortcuts (``sim.engine.compile``, ``groups``, ``flows``, ``symmetry``) matter at thousands.
Here a Llama-3-405B-sized model (``benchmarks/compile_bench.py``'s case, tensor 8 x pipeline
16 x data 32 on 4,096 H100) is compiled and replayed by the fast path and the SimPy engine,
fault-free and with one straggler (its SimPy replays run with ``-m slow``), and each summary is compared with what main's code
produced at commit 3c43f3f, before the compile was made faster: a handful of headline numbers
written out, and the SHA-256 of the whole summary JSON (``json.dumps(summary, sort_keys=True)``),
so that any change in any device's figures fails here. If the summary's format is changed on
purpose, recompute the digests with the code of the commit before the change. The vocabulary
is left unpadded (``vocab_divisible_by: 1``; 128,256 shards evenly over 8), as it was then.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from planner.search.space import Candidate, to_scenario
from sim.core.parallelism import Recompute, Sharding
from sim.engine.run import run_scenario
from sim.input.plan_section import balanced_cuts
from sim.input.scenario import parse_scenario

LLAMA_405B_4096 = """
name: llama405b-4096-h100
cluster: {preset: dgx-h100, nodes: 512}
model: {preset: llama, layers: 126, hidden: 16384, heads: 128, kv_heads: 8, ffn_hidden: 53248,
        vocab: 128256, vocab_divisible_by: 1, seq_len: 8192, dtype: bf16}
training: {global_batch_size: 512}
faults: FAULTS
"""

CASES = {
    "1f1b-zero1-sel": dict(schedule="dapple", sharding=Sharding.OPTIMIZER, recompute=Recompute.SELECTIVE),
    "interleaved2-zero1-full": dict(schedule="interleaved", chunks=2, sharding=Sharding.OPTIMIZER,
                                    recompute=Recompute.FULL),
}
STRAGGLER = "[{type: straggler, device: 70, slowdown: 1.5}]"


def _scenario(case: str, faults: str):
    base = parse_scenario(LLAMA_405B_4096.replace("FAULTS", faults), ignore_plan=True)
    fields = CASES[case]
    chunks = fields.get("chunks", 1)
    weights = [layer.fwd_flop + 1.0 for layer in base.model.layers]
    return to_scenario(base, Candidate(bounds=balanced_cuts(weights, 16 * chunks), replicas=(32,) * (16 * chunks),
                                       microbatch_size=32, tensor_parallel=8, **fields))


# (case, faults, engine) -> (iteration_time_s, peak_memory_bytes, bubble_fraction, device_classes, sha256 of
# the summary JSON); computed by main at commit 3c43f3f (before the faster compile), recomputed when the
# model's kernels changed on purpose (branch mixs7: the fused Llama block's rotary kernels, then
# Megatron's cross-entropy pass by pass)
EXPECTED = {
    ('1f1b-zero1-sel', 'none', 'fast'): (9.339079619692566, 77998424064.0, 0.5755938059626251, 16,
        'b3967c6d5027ce34186670de7b996abf70bfd5b9bc88ee0294fd4f0b8e7796de'),
    ('1f1b-zero1-sel', 'none', 'simpy'): (9.349145949292538, 77998424064.0, 0.5760507688399426, 16,
        '8867d8a8c7a3b65fe91f74011eb8056d95a16f5fb10b0d2ee6cad9f571c07276'),
    ('1f1b-zero1-sel', 'straggler', 'fast'): (9.448810364370777, 77998424064.0, 0.5804771479090733, 48,
        '5ae36c4e782914c2496f7d4ccbabd77b26d74081f3d9300dd4fe78c13e5b0b20'),
    ('1f1b-zero1-sel', 'straggler', 'simpy'): (9.45887669397075, 77998424064.0, 0.5809236126892474, 144,
        '64de01af73724e97e06a4a50f9d0857da66704a7beb8ae20da03a1943c4f4744'),
    ('interleaved2-zero1-full', 'none', 'fast'): (9.363503835892013, 18808930304.0, 0.43685793516945315, 16,
        'c1203440b8e55e2a607d991c5dc5c5a319f2eef88ffc5badbadb77dcd4c89aa1'),
    ('interleaved2-zero1-full', 'none', 'simpy'): (9.383636495091974, 18808930304.0, 0.43806616049641733, 16,
        '33d99cfe3ba6e50419e85ae6f23a98ec6320814d8303cff87a297603b5b7ed20'),
    ('interleaved2-zero1-full', 'straggler', 'fast'): (9.982167624299231, 18808930304.0, 0.4717026138261101, 48,
        '42a6ccc4522cc3bdc801690680e0a04b1131d0572bd9d281512e4073f0455cf7'),
    ('interleaved2-zero1-full', 'straggler', 'simpy'): (9.982167624299217, 18808930304.0, 0.47170261382610934, 144,
        '1d20d4423362addf4325964be06b9de3ab7140d0562840e232a1bb9c5970fcc8'),
}
SLOW = {key for key in EXPECTED if key[1:] == ("straggler", "simpy")}
"""The SimPy replays with a straggler (about 7 s each: the optimistic classes, then the fault-free baseline): -m slow."""


@pytest.mark.parametrize("key", [pytest.param(key, marks=pytest.mark.slow) if key in SLOW else key
                                 for key in sorted(EXPECTED)], ids=lambda key: "-".join(key))
def test_4096_gpu_summary_unchanged(key):
    case, faults, engine = key
    summary = run_scenario(_scenario(case, STRAGGLER if faults == "straggler" else "[]"), engine=engine).summary()
    iteration_s, peak_bytes, bubble, classes, digest = EXPECTED[key]
    assert summary["iteration_time_s"] == iteration_s
    assert summary["peak_memory_bytes"] == peak_bytes
    assert summary["bubble_fraction"] == bubble
    assert summary["device_classes"] == classes
    assert hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest() == digest


def test_refinement_keyed_by_bytes_when_too_wide_to_pad(monkeypatch):
    """A table too wide to pad falls back to keying each multiset by its bytes: the same classes.

    A ring of 12 devices (one flow each way, one label) with one faulty device: on one card it
    splits the others by their distance from it (1 and 11, 2 and 10, ...), numbered by first
    appearance: [0, 1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1]; on 3 cards of 4 devices the cards tell
    the mirror images apart too, and every device is its own class (main's tuple code gives both)."""
    from sim.engine import symmetry

    n = 12
    ring = [(d, (d + 1) % n, "x") for d in range(n)] + [((d + 1) % n, d, "x") for d in range(n)]
    initial = ["faulty"] + ["healthy"] * (n - 1)
    cards = [d // 4 for d in range(n)]
    padded = symmetry.refine(initial, [0] * n, ring, 1)
    assert padded[0] == [0, 1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1]
    with_cards = symmetry.refine(initial, cards, ring, 3)
    assert with_cards == (list(range(n)), [0, 1, 2])
    monkeypatch.setattr(symmetry._Segments, "MAX_CELLS", 0)
    assert symmetry.refine(initial, [0] * n, ring, 1) == padded
    assert symmetry.refine(initial, cards, ring, 3) == with_cards

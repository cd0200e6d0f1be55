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
# Megatron's cross-entropy pass by pass; then the presets' 2 µs launch gap, sim.input.presets.KERNEL_GAP,
# and the H100 e_max it implies; then K in the matrix size curve)
EXPECTED = {
    ('1f1b-zero1-sel', 'none', 'fast'): (9.40418567807447, 77998424064.0, 0.5749701477447393, 16,
        'f0acda4720dd033be14f47d8209b4cfc80866db19e0b6dc164bef18397bfedb3'),
    ('1f1b-zero1-sel', 'none', 'simpy'): (9.414252007674442, 77998424064.0, 0.575424617263841, 16,
        '8b26f216e131772f351dcda96f50501198db116d0305b20e472bb724a12a5b52'),
    ('1f1b-zero1-sel', 'straggler', 'fast'): (9.514844805688817, 77998424064.0, 0.5798678808549543, 48,
        'c648f7ff7393ec611e65c422dc636a69df266605da9f428dc79a589c965d47b4'),
    ('1f1b-zero1-sel', 'straggler', 'simpy'): (9.524911135288788, 77998424064.0, 0.5803118942768937, 144,
        '8b6a026362d29a4164f676994118458b33c2eadb9c065edec9de7e5525a9e21a'),
    ('interleaved2-zero1-full', 'none', 'fast'): (9.430051633583695, 18808930304.0, 0.43598983394716384, 16,
        '4ca94600342b3d3d04b20029de02c5a1efc69d17a311acbebf1954e91db58712'),
    ('interleaved2-zero1-full', 'none', 'simpy'): (9.450184292783653, 18808930304.0, 0.4371914004041403, 16,
        '56d3591951c9eff2f2146c0f08e3931843b46b80c02a09b29adf444802d02f83'),
    ('interleaved2-zero1-full', 'straggler', 'fast'): (10.055759209538472, 18808930304.0, 0.4710274974512412, 48,
        '9d81401d7a8d8833c9dbeb9faf24099f39a60266ba43a25ec988739202b38cb8'),
    ('interleaved2-zero1-full', 'straggler', 'simpy'): (10.055759209538456, 18808930304.0, 0.4710274974512404, 144,
        'f2cd5d82f598caba5ad91038d512f866aed0e3787265b37ec1c250afa70c709a'),
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

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
# and the H100 e_max 0.71 it implies)
EXPECTED = {
    ('1f1b-zero1-sel', 'none', 'fast'): (9.252278224054399, 77998424064.0, 0.5764344605471073, 16,
        '1a9392198f942bc4a0088a125a4ec90d140d4aeb221ff251b70432c9ca21f7a5'),
    ('1f1b-zero1-sel', 'none', 'simpy'): (9.26234455365437, 77998424064.0, 0.5768947921945238, 16,
        'b8f281cd0a7c85d18ad33dee7fad3ed6beda7af53794587130584bf8eeb02cba'),
    ('1f1b-zero1-sel', 'straggler', 'fast'): (9.360777646485854, 77998424064.0, 0.5812986707915124, 48,
        '33f802f019cd2a15248ef464d3ec3b0863cc34b78dc73d5b52e9656a7d73e091'),
    ('1f1b-zero1-sel', 'straggler', 'simpy'): (9.370843976085824, 77998424064.0, 0.5817484473105232, 144,
        '602deaba9161824daf67e3a39963aa6a39c0ce62e368b1e23b08ae02d9cd6133'),
    ('interleaved2-zero1-full', 'none', 'fast'): (9.277600883874335, 18808930304.0, 0.43799206028980786, 16,
        'd63f3a102b91ce7e8e8c240ca7ed6b3d74de1980375a29309e0a1c938de56780'),
    ('interleaved2-zero1-full', 'none', 'simpy'): (9.297733543074298, 18808930304.0, 0.43920899281056036, 16,
        'c71456546ed430c71c2cf8c59206d4aa5af97e19dedda5684e1f3a4cc689d3f6'),
    ('interleaved2-zero1-full', 'straggler', 'fast'): (9.886577743036609, 18808930304.0, 0.47255265407085556, 48,
        '86f2a91e96ce065250fa61fe1f82d96000023616a45c744fd27d6abf68f58be5'),
    ('interleaved2-zero1-full', 'straggler', 'simpy'): (9.886577743036595, 18808930304.0, 0.4725526540708549, 144,
        '458b56073fc74341bf52f2acedbd7b73a7a747054e4c86354871976c77b11054'),
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

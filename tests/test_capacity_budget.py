"""A published training budget reproduced within 20% from first principles (issue 33's acceptance).

Llama 3.1 405B's model card gives 30.84M H100-80GB GPU-hours for the whole training
(``meta-llama/llama-models``, ``models/llama3_1/MODEL_CARD.md``). ``scenarios/published/
llama3_405b_budget.yaml`` holds the model's shape (Llama 3 paper, Table 3), its 15.6T
pre-training tokens (§1), Table 4's 16,384-GPU plan and §3.3.4's interruption rate; nothing in it
is fitted to the 30.84M. The replay's iteration, scaled to the run with failures and checkpoints
by ``sim.cost.capacity.estimate_run``, must land within 20%. Run with ``-s`` to read every
assumption, the estimate's and the comparison's.
"""

from __future__ import annotations

import math

from conftest import REPO
from sim.cost.capacity import estimate_run
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario

SCENARIO = REPO / "scenarios" / "published" / "llama3_405b_budget.yaml"
PUBLISHED_GPU_HOURS = 30.84e6
"""Llama 3.1 405B, "Training Time (GPU hours)", the model card's table."""

NOT_MODELLED = (
    "the 30.84M is the model card's 'total GPU time required for training' the model; the replay "
    "models the 15.6T-token pre-training at sequence 8,192 and batch 16M tokens only",
    "not modelled: the early pre-training at batch 4M tokens (sequence 4,096) and 8M tokens, on 8,192 GPUs "
    "(Llama 3 paper §3.4.1; Table 4's 8,192-GPU row, 430 TFLOP/s per GPU against 400 at 16,384)",
    "not modelled: the long-context pre-training up to 128K tokens (§3.4.2, about 800B tokens, Table 4's "
    "CP 16 row at 380 TFLOP/s per GPU), counted here as 8,192-token sequences",
    "not modelled: annealing (§3.4.3, the last 40M tokens; negligible next to 15.6T)",
    "not modelled: post-training (SFT, rejection sampling, DPO; §4), evaluation runs, ablations and "
    "restarted or abandoned runs, which the card's total may include: it does not say",
    "not modelled: the 47 planned interruptions of §3.3.4 (only the 419 unexpected ones fail the run) and "
    "the time to diagnose a failure beyond reliability.restart_s (10 min, an assumption)",
    "the plan's schedule (interleaved, 2 chunks), sequence parallelism, selective recompute and sharded "
    "optimizer state are not in Table 4: assumptions, chosen before the comparison",
)
"""What the published figure covers and the replay does not: printed with the answer."""


def test_llama3_405b_gpu_hours_within_20_percent_of_the_model_card():
    scenario = load_scenario(SCENARIO)
    assert scenario.training.steps == math.ceil(15.6e12 / (2048 * 8192)) == 929_833
    result = run_scenario(scenario, engine="fast")
    estimate = estimate_run(scenario, result.summarize())
    # the closed form the estimate rests on, written out: devices x steps x seconds per step / 3600
    assert estimate.failure_free.gpu_hours == 16_384 * 929_833 * result.iteration_time_s / 3600.0
    predicted = estimate.expected.gpu_hours
    error = predicted / PUBLISHED_GPU_HOURS - 1.0
    print(f"\nLlama 3.1 405B: predicted {predicted / 1e6:.2f}M GPU-hours with failures "
          f"({estimate.failure_free.gpu_hours / 1e6:.2f}M failure-free, goodput {estimate.goodput.goodput:.1%}, "
          f"{result.iteration_time_s:.3f} s per step) against the model card's 30.84M: {error:+.1%}")
    for note in estimate.assumptions + NOT_MODELLED:
        print(f"  - {note}")
    assert abs(error) <= 0.20, f"{predicted:,.0f} GPU-hours, {error:+.1%} from 30.84M"
    # the failure model takes what §3.3.4 says it should: more than 90% effective training time
    assert 0.90 < estimate.goodput.goodput < 1.0

"""What Megatron-Core pays in a Mixtral run that the published MoE rows need (issue 31).

Each test writes out the closed form of one mechanism, cited to Megatron-LM at tag core_v0.9.0.
"""

from __future__ import annotations

from sim.cost.compute import stage_cost
from sim.input.scenario import load_scenario
from sim.models import shard_model

MIXTRAL = "scenarios/published/megatron2024_mixtral_8x7b_64.yaml"


def test_the_mixtral_row_keeps_fp32_gradients_as_bf16_megatron_does():
    # megatron/training/arguments.py at core_v0.9.0: --bf16 sets accumulate_allreduce_grads_in_fp32,
    # so the DDP buffers hold 4-byte gradients beside 2-byte parameters (stack: megatron-core)
    scenario = load_scenario(MIXTRAL)
    assert scenario.model.grad_dtype == "fp32"
    model = shard_model(scenario.model, scenario.plan.shard)
    cost = stage_cost(model, scenario.cluster.device, 1, 2, 1, data_parallel=16, expert_data_parallel=2)
    assert cost.states.gradients == 2 * cost.states.parameters

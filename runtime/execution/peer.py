"""The peer: the same model and micro-batching through ``torch.distributed.pipelining``.

To know whether our executor is any good, run the same plan with PyTorch's own pipeline
runtime: each rank wraps its stage's layers (built from the same seeds as ours) in a
``PipelineStage`` and drives it with ``ScheduleGPipe`` (our ``gpipe``) or ``Schedule1F1B``
(our ``dapple``/``1f1b`` with K_i = min(S−i, M)). torch splits the batch into micro-batches
along dimension 0 exactly as we do, takes the mean loss per micro-batch and divides the
gradients by M (``scale_grads``), which equals our scaled losses for equal micro-batches.

Only uniform plans fit torch's single-stage schedules: one device per stage, one stage per
rank, and nothing tied across stages.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, schedules

from runtime.model.config import RunnableScenario
from runtime.model.models import (
    TRANSFORMERS,
    StageModule,
    build_layers,
    lm_loss,
    make_optimizer,
    num_layers,
    synthetic_batch,
)
from sim.core.errors import DappleError
from sim.schedule.policy import DapplePolicy

__all__ = ["PEER_SCHEDULES", "PeerRunner", "check_peer_plan", "run_peer"]

PEER_SCHEDULES = {"gpipe": "ScheduleGPipe", "dapple": "Schedule1F1B", "1f1b": "Schedule1F1B"}
"""Our schedule name -> the torch.distributed.pipelining schedule class that runs the same order."""


def check_peer_plan(runnable: RunnableScenario, world_size: int) -> None:
    """Raise ``DappleError`` unless torch's single-stage schedules can run this plan."""
    plan = runnable.plan
    plain = DapplePolicy.S_MINUS_I  # torch's Schedule1F1B warms up with K_i = S − i
    if plan.schedule not in PEER_SCHEDULES or plan.params.get("policy", plain) != plain:
        raise DappleError(
            f"schedule {plan.schedule!r} has no torch.distributed.pipelining peer; use one of "
            f"{', '.join(sorted(PEER_SCHEDULES))} (policy s-i)"
        )
    if any(len(stage.devices) != 1 for stage in plan.stages) or plan.num_stages != world_size:
        raise DappleError("the torch peer runs uniform plans only: one device per stage, one stage per rank")
    if sorted(d for stage in plan.stages for d in stage.devices) != list(range(world_size)):
        raise DappleError(f"the plan's devices must be the ranks 0-{world_size - 1}")
    if runnable.model.mtp_depth:  # torch's loss_fn sees logits only, not the MTP depths' hidden states
        raise DappleError("the torch peer scores the main logits only (loss_fn(logits, labels)), not the "
                          "multi-token-prediction losses; remove model.mtp_depth")
    if runnable.model.preset in TRANSFORMERS and runnable.model.values["tied_embeddings"]:
        raise DappleError("the torch peer cannot tie embeddings across stages; set tied_embeddings: false")


class _PeerStage(nn.Module):
    """A stage as torch wants it: the last one returns logits, the loss is ``loss_fn``'s."""

    def __init__(self, stage: StageModule) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage.logits(x) if self.stage.is_last else self.stage(x)


def _loss_fn(preset: str):
    if preset in TRANSFORMERS:
        return lm_loss
    return lambda logits, labels: torch.nn.functional.cross_entropy(logits.float(), labels)


class PeerRunner:
    """One rank's stage under torch's schedule; ``step`` trains one step and times it."""

    def __init__(self, runnable: RunnableScenario, device: torch.device, *, seed: int = 0, lr: float = 1e-3) -> None:
        rank, world = dist.get_rank(), dist.get_world_size()
        check_peer_plan(runnable, world)
        self.runnable, self.device, self.seed = runnable, device, seed
        scenario, plan, model = runnable.scenario, runnable.plan, runnable.model
        self.index = next(s for s, stage in enumerate(plan.stages) if rank in stage.devices)
        start, end = plan.stages[self.index].layers
        self.module = StageModule(build_layers(model, range(start, end), seed=seed, device=device),
                                  is_last=end == num_layers(model))
        stage = PipelineStage(_PeerStage(self.module), self.index, plan.num_stages, device)
        schedule_class = getattr(schedules, PEER_SCHEDULES[plan.schedule])
        self.schedule = schedule_class(stage, n_microbatches=scenario.training.num_microbatches,
                                       loss_fn=_loss_fn(model.preset), scale_grads=True)
        self.optimizer = make_optimizer(scenario.model.optimizer, list(self.module.parameters()), lr)

    def step(self, step: int, *, keep_grads: bool = False) -> tuple[float, float, dict | None]:
        """(seconds on this rank, mean loss on the last stage or 0, gradients by name if asked)."""
        scenario, model = self.runnable.scenario, self.runnable.model
        inputs, labels = synthetic_batch(model, scenario.training.global_batch_size, step=step, seed=self.seed,
                                         device=self.device)
        self.optimizer.zero_grad(set_to_none=True)
        losses: list = []
        dist.barrier()
        t0 = time.perf_counter()
        if self.index == 0:
            self.schedule.step(inputs)
        elif self.module.is_last:
            self.schedule.step(target=labels, losses=losses, return_outputs=False)
        else:
            self.schedule.step()
        grads = None
        if keep_grads:
            grads = {name: p.grad.detach().to("cpu", copy=True) for name, p in self.module.named_parameters()}
        self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        return seconds, float(torch.stack(losses).detach().mean()) if losses else 0.0, grads


def run_peer(
    runnable: RunnableScenario, device: torch.device, *, steps: int, warmup_steps: int = 1, seed: int = 0,
    lr: float = 1e-3, keep_grads: bool = False,
) -> dict[str, Any]:
    """Train ``warmup_steps + steps`` steps with torch's schedule; every rank returns
    ``{"times_s": slowest rank's time per measured step, "losses", "grads"}`` (grads of step 0)."""
    runner = PeerRunner(runnable, device, seed=seed, lr=lr)
    times, losses, grads = [], [], None
    for step in range(warmup_steps + steps):
        seconds, loss, step_grads = runner.step(step, keep_grads=keep_grads and step == 0)
        times.append(seconds)
        losses.append(loss)
        grads = grads if step_grads is None else step_grads
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {"times_s": slowest.tolist()[warmup_steps:], "losses": losses, "grads": grads}

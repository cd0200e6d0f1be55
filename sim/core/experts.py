"""Mixtures of experts: which blocks route their tokens to experts, and how unevenly.

A mixture-of-experts block (Shazeer et al. 2017; Fedus et al. 2022, "Switch Transformers";
Mixtral, Jiang et al. 2024; DeepSeek-V3, DeepSeek-AI 2024, §2.1.2) replaces the dense MLP of a
transformer block with a router and ``count`` experts, each an MLP of width ``ffn_hidden`` (a
SwiGLU for Llama, a GeLU MLP for GPT). The router, a linear map hidden → count, scores every
token; each token goes to its ``top_k`` best experts, and ``shared`` always-on experts (DeepSeek's)
see every token. A model of ``count`` experts holds ``count`` times the MLP's parameters but each
token runs through only ``top_k + shared`` of them: its *active* parameters.

Tokens do not spread evenly. ``imbalance`` is the busiest expert's tokens over the mean
(1.0: even, the aim of an auxiliary balancing loss or DeepSeek-V3's bias-based balancing,
§2.1.2), or a distribution of tokens over experts drawn once from a seed
(``ImbalanceDraw``), from which the busiest expert-parallel rank's load follows for each degree.
``capacity_factor`` caps an expert's tokens at capacity_factor × tokens·top_k/count and drops the
rest (GShard, Lepikhin et al. 2021, §2.2; Switch, §2.2); without it the layer is dropless, as
Megatron-Core's default (``--moe-expert-capacity-factor`` None).

``ExpertSpec`` is the model's; the plan's expert-parallel degrees are ``sim.core.plan.PlanSpec``'s
and one device's share is ``sim.core.parallelism.Shard``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.core.errors import SpecError

__all__ = ["DISTRIBUTIONS", "ExpertSpec", "ImbalanceDraw", "PERMUTE_MODES"]

DISTRIBUTIONS = ("lognormal", "zipf")
"""How ``ImbalanceDraw`` spreads tokens over the experts."""

PERMUTE_MODES = ("fused", "unfused")
"""How the router's element-wise work and the token permutation run (``ExpertSpec.permute``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ImbalanceDraw:
    """Tokens per expert drawn once: each expert's share proportional to a random weight."""

    distribution: str
    """``zipf``: the expert of rank r (in a seeded random order) gets weight r^−parameter;
    ``lognormal``: weights exp(parameter · N(0, 1))."""
    parameter: float
    """The Zipf exponent (> 0) or the log-normal's σ (> 0)."""
    seed: int = 0
    """Seed of ``numpy.random.default_rng``: the same seed, the same draw."""

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise SpecError("experts.imbalance.distribution",
                            f"unknown distribution {self.distribution!r}; valid: {', '.join(DISTRIBUTIONS)}")
        if isinstance(self.parameter, bool) or not isinstance(self.parameter, (int, float)) or not self.parameter > 0:
            raise SpecError("experts.imbalance.parameter", f"must be a number > 0, got {self.parameter!r}; "
                                                           "e.g. 1.0 (zipf) or 0.5 (lognormal)")

    def shares(self, count: int) -> np.ndarray:
        """Each expert's share of the routed tokens (sums to 1), in expert order."""
        rng = np.random.default_rng(self.seed)
        if self.distribution == "zipf":
            weights = np.arange(1, count + 1, dtype=float) ** -float(self.parameter)
            weights = weights[rng.permutation(count)]
        else:
            weights = np.exp(float(self.parameter) * rng.standard_normal(count))
        return weights / weights.sum()


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertSpec:
    """The experts of a model's MoE blocks (``model.experts``)."""

    count: int
    """Routed experts per MoE block."""
    top_k: int
    """Routed experts each token goes to, 1 ≤ top_k ≤ count."""
    ffn_hidden: int
    """Inner width of one expert's MLP."""
    shared: int = 0
    """Shared experts every token goes to (DeepSeek-V3: 1), each of width ``ffn_hidden``."""
    layers: tuple[int, ...] | str = "every"
    """Which blocks are MoE blocks: ``every``, ``every_other`` (blocks 1, 3, 5, …, as GShard and
    Switch alternate) or the block indices (0-based)."""
    capacity_factor: float | None = None
    """Tokens an expert takes at most, over the mean tokens·top_k/count; None: dropless."""
    imbalance: float = 1.0
    """The busiest expert's tokens over the mean (≥ 1), when ``draw`` is None."""
    draw: ImbalanceDraw | None = None
    """Tokens per expert drawn from a distribution instead of ``imbalance``."""
    node_limit: int | None = None
    """Node-limited routing (DeepSeek-V3 §2.1.2): each token goes to experts on at most this many
    servers, its copies sent once a server (``sim.cost.comm.node_limited_fraction``); None: no limit."""
    permute: str = "fused"
    """``fused``: the top-k and the permutation before and after the experts one memory pass each
    (fused kernels: DeepEP's dispatch and combine, Transformer Engine's permute); ``unfused``: the
    separate PyTorch kernels Megatron-Core launched before its permute fusion (tag core_v0.9.0:
    ``sim.models.moe.router_kernels``, ``permute_kernels``, ``unpermute_kernels``)."""

    def __post_init__(self) -> None:
        for key in ("count", "top_k", "ffn_hidden"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"experts.{key}", f"must be an integer >= 1, got {value!r}")
        if self.top_k > self.count:
            raise SpecError("experts.top_k", f"{self.top_k} is more than the {self.count} experts; use at most {self.count}")
        if isinstance(self.shared, bool) or not isinstance(self.shared, int) or self.shared < 0:
            raise SpecError("experts.shared", f"must be an integer >= 0, got {self.shared!r}")
        cf = self.capacity_factor
        if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float)) or not cf > 0):
            raise SpecError("experts.capacity_factor", f"must be a number > 0 (e.g. 1.25) or absent (dropless), got {cf!r}")
        if self.node_limit is not None and (isinstance(self.node_limit, bool) or not isinstance(self.node_limit, int)
                                            or self.node_limit < 1):
            raise SpecError("experts.node_limit", f"must be an integer >= 1 (DeepSeek-V3: 4) or absent, got "
                                                  f"{self.node_limit!r}")
        if self.permute not in PERMUTE_MODES:
            raise SpecError("experts.permute", f"unknown {self.permute!r}; valid: {', '.join(PERMUTE_MODES)}")
        x = self.imbalance
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= 1.0:
            raise SpecError("experts.imbalance", f"must be a number >= 1 (the busiest expert's tokens over the mean), "
                                                 f"got {x!r}; write 1.0 for an even spread")
        if isinstance(self.layers, str):
            if self.layers not in ("every", "every_other"):
                raise SpecError("experts.layers", f"unknown {self.layers!r}; valid: every, every_other, or a list of "
                                                  "block indices")
        elif not self.layers or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.layers):
            raise SpecError("experts.layers", f"must be every, every_other or a non-empty list of block indices >= 0, "
                                              f"got {list(self.layers)!r}")

    def is_moe(self, block: int) -> bool:
        """Whether block ``block`` (0-based) is an MoE block."""
        if self.layers == "every":
            return True
        if self.layers == "every_other":
            return block % 2 == 1
        return block in self.layers

    def check_blocks(self, num_blocks: int) -> None:
        """Refuse block indices past the model's blocks."""
        if isinstance(self.layers, tuple) and max(self.layers) >= num_blocks:
            raise SpecError("experts.layers", f"block {max(self.layers)} does not exist; the model has blocks 0 to "
                                              f"{num_blocks - 1}")

    def rank_imbalance(self, expert_parallel: int) -> float:
        """The busiest expert-parallel rank's routed tokens over the mean rank's.

        With a factor: ``imbalance`` itself (the rank waits for its busiest expert; exact with one
        expert per rank, an upper bound with more). With a draw: the experts are laid out
        ``count/EP`` consecutive ones per rank (Megatron-Core's ``local_expert_indices``), and the
        busiest rank's share of the tokens times EP."""
        if self.draw is None:
            return float(self.imbalance)
        shares = self.draw.shares(self.count).reshape(expert_parallel, -1).sum(axis=1)
        return float(shares.max() * expert_parallel)

    def kept_fraction(self, load: float) -> float:
        """Share of an expert's tokens it processes at ``load`` times the mean: all (dropless),
        or up to its capacity, capacity_factor × the mean."""
        if self.capacity_factor is None:
            return 1.0
        return min(1.0, float(self.capacity_factor) / load)

"""Multi-head latent attention (MLA): attention whose keys and values come from a low-rank latent.

DeepSeek-V2 (DeepSeek-AI 2024, arXiv 2405.04434, §2.1.2–2.1.3) and DeepSeek-V3 (arXiv 2412.19437,
§2.1.1) compress each token's hidden state h into a key-value latent c_KV of width
``kv_lora_rank`` (d_c) and a query latent c_Q of width ``q_lora_rank`` (d'_c); per head, the
queries and keys are a ``nope_head_dim`` part up-projected from the latents and a
``rope_head_dim`` part carrying the rotary embedding (the key's shared by all heads, projected
straight from h), and the values a ``v_head_dim`` part up-projected from c_KV. DeepSeek-V3's
values (§4.2): d_c 512, d'_c 1536, d_h^R 64, d_h 128 for the no-rope part and the values,
128 heads over hidden 7168.

``MlaSpec`` is the model's (``model.mla``); its blocks' parameters, FLOPs, kernels and stash are
``sim.models.mla``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.errors import SpecError

__all__ = ["MlaSpec"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MlaSpec:
    """The widths of a model's multi-head latent attention (``model.mla``)."""

    q_lora_rank: int
    """d'_c: width of the query latent c_Q (DeepSeek-V3: 1536)."""
    kv_lora_rank: int
    """d_c: width of the key-value latent c_KV (DeepSeek-V3: 512)."""
    rope_head_dim: int
    """d_h^R: per-head width of the rotary part of queries and keys (DeepSeek-V3: 64)."""
    nope_head_dim: int
    """d_h: per-head width of the queries' and keys' part up-projected from the latents (128)."""
    v_head_dim: int
    """Per-head width of the values (DeepSeek-V3: 128)."""

    def __post_init__(self) -> None:
        for key in ("q_lora_rank", "kv_lora_rank", "rope_head_dim", "nope_head_dim", "v_head_dim"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"mla.{key}", f"must be an integer >= 1, got {value!r} (DeepSeek-V3: q_lora_rank "
                                              "1536, kv_lora_rank 512, rope_head_dim 64, nope_head_dim 128, "
                                              "v_head_dim 128)")

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of a query or key: the no-rope part and the rotary part (192)."""
        return self.nope_head_dim + self.rope_head_dim

    def projection_params(self, hidden: int, heads: int) -> int:
        """Weights of the five projections (no biases), DeepSeek-V3 §2.1.1 eqs. 1–10: W^DQ
        (h × d'_c), W^UQ and W^QR (d'_c × heads·(d_h + d_h^R)), W^DKV and W^KR (h × (d_c + d_h^R)),
        W^UK and W^UV (d_c × heads·(d_h + d_v)), W^O (heads·d_v × h)."""
        a = heads
        return (hidden * self.q_lora_rank + self.q_lora_rank * a * self.qk_head_dim
                + hidden * (self.kv_lora_rank + self.rope_head_dim)
                + self.kv_lora_rank * a * (self.nope_head_dim + self.v_head_dim) + a * self.v_head_dim * hidden)

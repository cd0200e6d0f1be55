"""Multi-token prediction in torch: DeepSeek-V3's MTP modules and the head that scores them.

DeepSeek-AI 2024 ("DeepSeek-V3 Technical Report", arXiv 2412.19437, §2.2) follows the main model
with ``D`` sequential modules. Module ``k`` normalises the previous depth's hidden state of token
``i`` (the main model's for ``k = 1``) and the shared embedding of token ``i + k``, concatenates
them and projects ``2h → h`` with ``M_k`` (Eq. 21), runs one transformer block ``TRM_k`` (Eq. 22)
and the shared output head (Eq. 23); its loss is the cross-entropy against token ``i + k + 1``
summed over the ``T − k`` positions that have one and divided by ``T`` (Eq. 24), and the MTP loss
is ``λ/D · Σ_k L_k`` (Eq. 25), added to the main loss.

As in the simulator (``sim.models.mtp``) the ``D`` modules are one layer, ``mtp``, just before the
``head``; the layer passes the main model's hidden state on beside each module's, concatenated on
the last dimension (the simulator's cut after it carries ``1 + D`` hidden states). The runtime keeps
``mtp`` and ``head`` on one stage (the layer needs the labels, which only the last stage has: the
tokens ``i + k`` are the labels shifted by ``k − 1``), so that cut never crosses a link here.
Each module runs the block over the whole sequence; its last ``k`` positions read a wrapped token
and predict nothing, and under the causal mask they reach no position that predicts something, so
the loss is Eq. 24's exactly. Each module's block is like the model's last: an MoE block where
that is one (DeepSeek-V3's MTP modules use its MoE block), whose routed experts lie over the
expert-parallel group as the main blocks' do (``runtime.model.experts``; each depth's experts
seeded apart, ``runtime.model.models``), as the simulator counts them (``sim.models.mtp``). The head holds one final norm per module besides its own (DeepSeek-V3's
released checkpoint gives its MTP layer its own ``model.layers.61.shared_head.norm``, beside
``enorm``, ``hnorm`` and ``eh_proj``; the simulator counts the same bytes) and projects with its one
shared matrix. The concatenation follows Eq. 21's order, ``[h; Emb]``; implementations that load
the released weights concatenate ``[enorm(Emb); hnorm(h)]``, which only permutes ``M_k``'s columns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model.layers import LMHead, lm_loss, make_norm

__all__ = ["MTP_LOSS_WEIGHT", "MTPHead", "MTPModule", "MultiTokenPrediction"]

MTP_LOSS_WEIGHT = 0.3
"""λ of Eq. 25: DeepSeek-V3 §4.2 ("we set λ to 0.3 for the first 10T tokens and to 0.1 for the
remaining 4.8T tokens"); the first value."""

_EPS = 1e-6
"""The MTP norms' ε (DeepSeek-V3's RMSNorm, ``norm_eps`` 1e-6 in its released configuration)."""


class MTPModule(nn.Module):
    """One depth: ``TRM_k(M_k [RMSNorm(h^{k−1}); RMSNorm(Emb(t_{i+k}))])`` (Eqs. 21–22)."""

    def __init__(self, hidden: int, block: nn.Module) -> None:
        super().__init__()
        self.hidden_norm = nn.RMSNorm(hidden, eps=_EPS)
        self.embedding_norm = nn.RMSNorm(hidden, eps=_EPS)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        """``M_k ∈ R^{h×2h}``."""
        self.block = block
        """``TRM_k``: a block like the model's last."""

    def forward(self, h: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        return self.block(self.proj(torch.cat([self.hidden_norm(h), self.embedding_norm(embedded)], dim=-1)))


class MultiTokenPrediction(nn.Module):
    """The layer ``mtp``: hidden states ``(n, s, h)`` and labels ``(n, s)`` -> ``(n, s, (1 + D)·h)``,
    the main hidden state and each depth's, side by side.

    ``tie`` points it at the module whose ``weight`` is the shared token table (the embedding's
    ``nn.Embedding``, or a tied head's copy on the last stage), read at each call and not
    registered here, so its bytes stay the embedding's (as ``sim.models`` counts them) and its
    gradient adds to the table's. An untied model's layer on another stage than the embedding
    holds a registered copy instead (``hold_copy``), as Megatron-Core's MTP stage does
    (``sim.models.mtp``; its gradient is summed with the embedding's over the embedding group,
    ``runtime.execution.holdings.tied_groups``)."""

    wants_labels = True
    """``runtime.model.models.StageModule`` passes this layer the labels."""

    def __init__(self, modules: list[MTPModule]) -> None:
        super().__init__()
        self.depths = nn.ModuleList(modules)
        self._table: tuple[nn.Module, ...] = ()  # a tuple, so the module does not register it
        self.table: nn.Embedding | None = None
        """This layer's own copy of the token table (``hold_copy``); None: it reads another's."""

    def tie(self, table: nn.Module) -> None:
        """Embed the shifted tokens with ``table.weight``."""
        self._table = (table,)

    @property
    def borrowed(self) -> tuple[nn.Parameter, ...]:
        """Parameters this layer reads but another layer owns (the shared table; none with its own
        copy): FSDP2 keeps both layers in the stage's root unit (``runtime.model.sharding``)."""
        return tuple(table.weight for table in self._table if table is not self.table)

    def hold_copy(self, weight: torch.Tensor) -> None:
        """Hold a registered copy of the embedding's token table ``weight`` and embed with it."""
        self.table = nn.Embedding(*weight.shape, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            self.table.weight.copy_(weight)
        self.tie(self.table)

    def forward(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        weight, states = self._table[0].weight, [h]
        for k, module in enumerate(self.depths, start=1):
            ahead = torch.roll(labels, -(k - 1), dims=1)  # t_{i+k} = label i+k−1; the last k−1 wrap
            h = module(h, F.embedding(ahead, weight))
            states.append(h)
        return torch.cat(states, dim=-1)


class MTPHead(LMHead):
    """The head after ``mtp``: the main loss on the first hidden state plus ``λ/D · Σ_k L_k``
    (Eqs. 23–25), each depth through its own final norm and the one shared projection."""

    def __init__(self, hidden: int, vocab: int, depth: int, *, tied: bool, llama: bool = False) -> None:
        super().__init__(hidden, vocab, tied=tied, llama=llama)
        self.mtp_norms = nn.ModuleList(make_norm(hidden, llama) for _ in range(depth))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The main model's logits (the first of the ``1 + D`` hidden states)."""
        return super().logits(x.chunk(1 + len(self.mtp_norms), dim=-1)[0])

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        main, *depths = x.chunk(1 + len(self.mtp_norms), dim=-1)
        n, s = labels.shape
        extra = x.new_zeros((), dtype=torch.float32)
        for k, (h, norm) in enumerate(zip(depths, self.mtp_norms), start=1):
            logits = self.project(norm(h))[:, : s - k]  # position i predicts t_{i+k+1} = label i+k
            extra = extra + F.cross_entropy(logits.float().flatten(0, -2), labels[:, k:].flatten(),
                                            reduction="sum") / (n * s)  # Eq. 24's 1/T
        return lm_loss(super().logits(main), labels) + MTP_LOSS_WEIGHT / len(depths) * extra

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
the last dimension (the simulator's cut after it carries ``1 + D`` hidden states). ``mtp`` and
``head`` are on one stage, the one with the labels (the tokens ``i + k`` are the labels shifted by
``k − 1``): the scenario loader refuses any other plan, as Megatron-Core builds its MTP layers on the
last pipeline stage (``sim.models.mtp.check_mtp_stage``), so that cut never crosses a link here.
Each module runs the block over the whole sequence; its last ``k`` positions predict nothing (the
last ``k − 1`` have no token that far ahead: id 0 stands in), and under the causal mask they reach
no position that predicts something, so the loss is Eq. 24's exactly.

**The tokens ahead** are taken from the whole sequence's labels before any cut (``labels_ahead``:
column j of position i is label i + j, ``IGNORE`` past the end), as Megatron-Core's ``roll_tensor``
shifts the whole ids (``megatron/core/transformer/multi_token_prediction.py`` at NVIDIA/Megatron-LM
00611e6). A layer given the ``(n, s)`` labels builds the table itself; under context parallelism,
where a rank holds two of the sequence's 2c chunks and the tokens k ahead of a position may sit in
another rank's chunk, the executor builds it from the whole labels at the rank's global positions
(every rank draws the whole batch), so the ``T − k`` positions that have a target are counted at
their global indices. Megatron-Core exchanges the chunks' boundary tokens between context ranks
instead, because its ranks hold only their own chunks' ids.

**Tensor and sequence parallelism** (``runtime.model.tensor_parallel``) cut the modules as
Megatron-Core does: each block as the main blocks, ``M_k`` column-parallel and its output gathered
(``eh_proj``, a ``ColumnParallelLinear`` with ``gather_output=False`` followed by
``gather_from_tensor_model_parallel_region``), and under sequence parallelism the norms per
token on the device's part of the sequence and ``M_k``'s output scattered over it before the block
(``scatter_to_sequence_parallel_region``); the shifted tokens are looked up in the
vocabulary-parallel table like the main embedding (``embed``), reduce-scattered to the device's part
of the sequence under sequence parallelism.

Each module's block is like the model's last: an MoE block where that is one (DeepSeek-V3's MTP
modules use its MoE block), whose routed experts lie over the expert-parallel group as the main
blocks' do (``runtime.model.experts``; each depth's experts seeded apart, ``runtime.model.models``),
as the simulator counts them (``sim.models.mtp``).

The head holds one final norm per module besides its own (DeepSeek-V3's released checkpoint gives
its MTP layer its own ``model.layers.61.shared_head.norm``, beside ``enorm``, ``hnorm`` and
``eh_proj``; the simulator counts the same bytes) and projects with its one shared matrix. The
concatenation follows Eq. 21's order, ``[h; Emb]``; implementations that load the released weights
concatenate ``[enorm(Emb); hnorm(h)]``, which only permutes ``M_k``'s columns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model.layers import LMHead, lm_loss, make_norm

__all__ = ["IGNORE", "MTP_LOSS_WEIGHT", "MTPHead", "MTPModule", "MultiTokenPrediction", "labels_ahead"]

MTP_LOSS_WEIGHT = 0.3
"""λ of Eq. 25: DeepSeek-V3 §4.2 ("we set λ to 0.3 for the first 10T tokens and to 0.1 for the
remaining 4.8T tokens"); the first value."""

IGNORE = -100
"""The label of a position with no token that far ahead (``F.cross_entropy``'s ``ignore_index``)."""

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
        self.scatter = None
        """Set under sequence parallelism (``runtime.model.tensor_parallel``): cuts ``M_k``'s gathered
        output to this device's part of the sequence before the block."""

    def forward(self, h: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        x = self.proj(torch.cat([self.hidden_norm(h), self.embedding_norm(embedded)], dim=-1))
        return self.block(x if self.scatter is None else self.scatter(x))


def labels_ahead(labels: torch.Tensor, depth: int, positions: torch.Tensor | None = None) -> torch.Tensor:
    """The whole sequence's labels ``(n, s)`` -> ``(n, p, 1 + depth)``: at each of the ``p`` held
    positions i (``positions``, global indices; None: all ``s``), column j is label i + j, the target
    of depth j (the main model's for j = 0) and the token ``t_{i+j+1}`` depth j + 1 embeds;
    ``IGNORE`` where i + j ≥ s."""
    s = labels.shape[1]
    at = torch.arange(s, device=labels.device) if positions is None else positions.to(labels.device)
    index = at[:, None] + torch.arange(depth + 1, device=labels.device)[None, :]
    return labels[:, index.clamp(max=s - 1)].masked_fill(index >= s, IGNORE)


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
        self.embed = None
        """Set under tensor parallelism (``runtime.model.tensor_parallel``): ``(ids, weight) ->`` this
        device's embedded tokens, looked up in the vocabulary-parallel table."""
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
        """``labels``: the whole sequence's ``(n, s)``, or ``labels_ahead``'s table at the held positions."""
        weight, states = self._table[0].weight, [h]
        ahead = labels if labels.dim() == 3 else labels_ahead(labels, len(self.depths))
        for k, module in enumerate(self.depths, start=1):
            ids = ahead[..., k - 1].clamp(min=0)  # t_{i+k} = label i+k−1; past the end, id 0 predicts nothing
            h = module(h, F.embedding(ids, weight) if self.embed is None else self.embed(ids, weight))
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
        """``labels`` as ``MultiTokenPrediction.forward`` takes them; each depth's loss is divided by
        the ``n · s`` tokens held (Eq. 24's 1/T; under context parallelism the executor's 1/c makes it
        the whole sequence's)."""
        main, *depths = x.chunk(1 + len(self.mtp_norms), dim=-1)
        ahead = labels if labels.dim() == 3 else labels_ahead(labels, len(depths))
        n, s, _ = ahead.shape
        extra = 0.0  # a number, not a tensor: the losses are DTensors under tensor parallelism
        for k, (h, norm) in enumerate(zip(depths, self.mtp_norms), start=1):
            logits = self.project(norm(h))  # position i predicts t_{i+k+1} = label i+k (IGNORE past the end)
            extra = extra + F.cross_entropy(logits.float().flatten(0, -2), ahead[..., k].flatten(),
                                            ignore_index=IGNORE, reduction="sum") / (n * s)
        return lm_loss(super().logits(main), ahead[..., 0]) + MTP_LOSS_WEIGHT / len(depths) * extra

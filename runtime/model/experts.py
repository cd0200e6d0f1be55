"""A mixture-of-experts MLP in torch, and expert parallelism over gloo with ``all_to_all_single``.

The simulator's MoE block (``sim.models.moe``) replaces a transformer block's dense MLP with a
router, ``count`` routed experts of width ``ffn_hidden`` and ``shared`` always-on experts; this is
the same layer as an ``nn.Module`` (``MoE``):

* **Router** (Megatron-Core's ``TopKRouter``; Mixtral, Jiang et al. 2024, §2.1): a bias-free
  linear map hidden → count, computed in fp32; softmax over the experts; each token's ``top_k``
  best experts; with ``normalize`` (Mixtral's softmax over the top-k logits, Megatron-Core's
  default ``moe_router_pre_softmax: False``) their weights renormalised to sum to one. Routing
  is a pure function of the token and the router's weights: deterministic, and the same on one
  rank as split over many. With ``node_limit`` M (DeepSeek-V3 §2.1.2, node-limited routing) a
  token's experts come from its M best servers only, a server scored by the sum of its highest
  K_r/M probabilities (``node_limited``); a server is where the simulator lays the expert's
  expert-parallel rank (``runtime.model.config.expert_servers``). Each expert-parallel group
  routes with its own map (groups that straddle servers differently have different ones), and
  the unsplit reference gives each token the map of the group that dispatches it
  (``MoE.token_servers``), so routing stays a pure function of the token and its group.
* **Experts**: each a SwiGLU (llama) or GeLU MLP (gpt) of width ``ffn_hidden``
  (``runtime.model.layers.MLP``); the shared experts one dense MLP of width shared × ffn_hidden,
  as the simulator counts them. Dropless by default (Megatron-Core's default, capacity factor
  None); with a capacity factor each call drops the copies over an expert's capacity, as
  Megatron-Core's router does on each device's batch (``within_capacity``).
* **Expert parallelism** (``group`` of EP ranks; rank r holds experts [r·L, (r+1)·L), L = count/EP,
  Megatron-Core's ``local_expert_indices``): the token copies are sorted by expert, each rank
  first exchanges its per-expert counts (an ``all_to_all_single`` of count integers: torchtitan's
  ``ExpertParallel._token_dispatch`` in ``torchtitan/distributed/expert_parallel.py``;
  Megatron-Core's ``MoEAlltoAllTokenDispatcher.preprocess`` gathers the same counts), then
  dispatches the tokens with a second ``all_to_all_single`` whose split sizes those counts give,
  runs its local experts on what it received, and combines the results back with the reverse
  all-to-all. ``AllToAll`` is differentiable: its backward is the reverse all-to-all of the
  gradients (torch's own ``torch.distributed.nn.functional.all_to_all_single`` does the same on
  gloo but is deprecated in torch 2.13).
* **Expert tensor parallelism** (``etp_group``; ``cut_width``): each routed expert's w1 and w3
  keep this device's rows of the width, w2 the same columns (Megatron-Core's
  ``expert_tensor_parallel_size``, fc1 column- and fc2 row-parallel). Between the two
  all-to-alls the expert-tensor group's devices gather each other's arrived tokens and, after
  the experts, reduce-scatter the partial outputs back (``MoEAlltoAllTokenDispatcher`` in
  ``megatron/core/transformer/moe/token_dispatcher.py`` at d98e8a6: ``gather_from_sequence_
  parallel_region`` and ``reduce_scatter_to_sequence_parallel_region`` over ``expt_tp``), both
  as all-to-alls on gloo (the gather sends a copy to each; its backward, the reverse all-to-all
  with the copies' gradients summed, is the reduce-scatter).

**Capacity** (``within_capacity``): with ``model.experts.capacity_factor`` f, Megatron-Core
caps every expert at ``ceil(N·k / E · f)`` token copies of the N tokens its router saw in one call
(k = top_k, E = count; ``get_capacity`` and ``apply_router_token_dropping`` in
``megatron/core/transformer/moe/moe_utils.py`` at d98e8a6, called by ``TopKRouter.routing``): the
copies over capacity are dropped, the kept ones chosen by their routing probability
(``moe_token_drop_policy: probs``, its default: ``torch.topk`` of each expert's column of
probabilities) and without padding (``moe_pad_expert_input_to_capacity: False``); nothing is
dropped when the capacity exceeds N. A dropped copy is never dispatched and adds nothing to its
token's output. N is what one device routes in one micro-batch's forward (its replica's slice,
under sequence parallelism its tensor rank's 1/t of the sequence), so the unsplit reference
drops per the same groups of tokens (``token_groups``, from
``runtime.validation.grad_check.drop_groups``). Ties in probability go to the lower token (a
stable sort), where ``torch.topk`` leaves them unspecified.

Parameter names carry the *global* expert index (``mlp.experts.3.w1.weight``), so a rank that
holds experts 2 and 3 names their gradients as the unsplit model does, and each expert is
initialised from its own seed (``expert_seed``) whichever rank builds it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from runtime.model.layers import MLP

__all__ = ["ETP_DIM", "ETP_SUMMED", "EXPERT_PARAM", "ROUTER_PARAM", "AllToAll", "CopyToTensorRanks", "MoE",
           "SumOverTensorRanks", "capacity", "cut_width", "expert_seed", "node_limited", "route", "within_capacity"]

EXPERT_PARAM = "_dapple_expert"
"""Attribute set on routed-expert parameters: their gradients sum over the expert-data-parallel
group (``PlanSpec.expert_data_groups``), not the dense gradient group."""
ETP_DIM = "_dapple_etp_dim"
"""Attribute set on a routed expert's parameter cut over the expert-tensor-parallel group: the
dimension its slices concatenate along (0: w1, w3 and w1's bias, column-parallel; 1: w2,
row-parallel)."""
ETP_SUMMED = "_dapple_etp_summed"
"""Attribute set on a routed expert's ``w2`` bias under expert tensor parallelism: whole on every
expert-tensor rank, added on the first only, its gradient summed over the group."""
ROUTER_PARAM = "_dapple_router"
"""Attribute set on the router's weight: replicated over a stage's tensor ranks while each sees
its own tokens (sequence parallelism), so its gradient sums over every device of the stage
(Megatron-Core marks it ``sequence_parallel`` for the same all-reduce)."""


def expert_seed(seed: int, layer: int, expert: int) -> int:
    """The seed of expert ``expert``'s weights in layer ``layer`` (independent of which rank builds it)."""
    return (seed * 1_000_003 + layer) * 10_007 + 7 + expert


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` over ``group`` with the reverse all-to-all as its backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], receive: list[int], group) -> torch.Tensor:
        ctx.send, ctx.receive, ctx.group = send, receive, group
        out = x.new_empty((sum(receive), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=receive, input_split_sizes=send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), output_split_sizes=ctx.send, input_split_sizes=ctx.receive,
                               group=ctx.group)
        return back, None, None, None


class CopyToTensorRanks(torch.autograd.Function):
    """The identity, whose backward all-reduces over the tensor group: every tensor rank's part
    of a replicated input's gradient summed (Megatron-LM's ``copy_to_tensor_model_parallel_region``,
    ``megatron/core/tensor_parallel/mappings.py`` at d98e8a6)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class SumOverTensorRanks(torch.autograd.Function):
    """An all-reduce over the tensor group, whose backward is the identity (Megatron-LM's
    ``reduce_from_tensor_model_parallel_region``, the same file)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def route(logits: torch.Tensor, top_k: int, *, normalize: bool, servers: torch.Tensor | None = None,
          node_limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ``top_k`` experts (indices, ties to the lower index as ``torch.topk``) and
    their weights: softmax probabilities, renormalised over the top k with ``normalize``; with
    ``node_limit`` M and ``servers`` (each expert's server: one map, or one a token), only among
    the experts of the token's M best servers (``node_limited``)."""
    probs = torch.softmax(logits.float(), dim=-1)
    if servers is None or node_limit is None:
        weights, experts = torch.topk(probs, top_k, dim=-1)
    else:
        experts = torch.topk(node_limited(probs, servers, top_k, node_limit), top_k, dim=-1).indices
        weights = probs.gather(-1, experts)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def node_limited(probs: torch.Tensor, servers: torch.Tensor, top_k: int, node_limit: int) -> torch.Tensor:
    """The routing probabilities with every expert off the token's ``node_limit`` best servers
    set to −1 (below any probability, so never among its top k): DeepSeek-V3's node-limited
    routing (§2.1.2, "the sum of the highest K_r/M affinity scores of the experts distributed on
    each node"), as DeepSeek's ``Gate`` does it with ``n_groups``/``topk_groups`` (group scores
    from each group's top experts, the best ``topk_groups`` kept, the rest masked before the top-k;
    ``inference/model.py`` in deepseek-ai/DeepSeek-V3 at 9b4e978). A server is a group here,
    whatever its number of experts; a server's score sums its highest max(1, K_r // M).
    ``servers`` is one map (count,) for every token or a map per token (N, count): a server
    that holds none of a token's experts scores 0, below any server that holds one."""
    servers = servers.to(probs.device).expand_as(probs)
    count = int(servers.max()) + 1
    if node_limit >= count:
        return probs
    per_server = max(1, top_k // node_limit)
    # off-server probabilities as 0: a server of fewer than per_server experts sums what it has
    scores = torch.stack([probs.masked_fill(servers != n, 0.0).topk(per_server, dim=-1).values.sum(dim=-1)
                          for n in range(count)], dim=-1)
    best = torch.topk(scores, node_limit, dim=-1).indices
    allowed = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, best, True)
    return probs.masked_fill(~allowed.gather(1, servers), -1.0)


def capacity(tokens: int, top_k: int, count: int, capacity_factor: float) -> int:
    """Megatron-Core's ``get_capacity(num_tokens=tokens·top_k, count, f)``: ceil(tokens·k / E · f)."""
    return math.ceil((tokens * top_k / count) * capacity_factor)


def within_capacity(weights: torch.Tensor, chosen: torch.Tensor, count: int, capacity_factor: float,
                    groups: torch.Tensor | None = None) -> torch.Tensor:
    """Which of the N·k token copies (token-major, as ``chosen.reshape(-1)``) each expert keeps:
    per group of tokens (``groups``: a label per token; None: one group) and expert, the
    ``capacity`` copies of highest weight, all of them when the capacity exceeds the group's N."""
    n, k = chosen.shape
    label = torch.zeros(n, dtype=torch.long, device=chosen.device) if groups is None else groups.to(chosen.device)
    _, label = torch.unique(label, return_inverse=True)  # labels 0 .. G-1
    copy_label, expert = label.repeat_interleave(k), chosen.reshape(-1)
    # copies sorted by (group, expert, weight descending, token): each bucket's first ones are kept
    order = torch.argsort(-weights.detach().reshape(-1), stable=True)
    order = order[torch.argsort(expert[order], stable=True)]
    order = order[torch.argsort(copy_label[order], stable=True)]
    bucket = copy_label[order] * count + expert[order]
    _, sizes = torch.unique_consecutive(bucket, return_counts=True)
    starts = torch.repeat_interleave(torch.cumsum(sizes, 0) - sizes, sizes)
    place = torch.arange(order.numel(), device=chosen.device) - starts
    caps = []
    for tokens in torch.bincount(label).tolist():
        cap = capacity(tokens, k, count, capacity_factor)
        caps.append(cap if cap <= tokens else n * k)  # Megatron-Core drops nothing when cap > N
    caps = torch.tensor(caps, device=chosen.device)
    keep = torch.empty_like(place, dtype=torch.bool)
    keep[order] = place < caps[copy_label[order]]
    return keep


class MoE(nn.Module):
    """Router, routed experts (``local`` of them on this rank) and optional shared experts."""

    def __init__(self, hidden: int, *, count: int, top_k: int, ffn_hidden: int, shared: int, gated: bool,
                 local: tuple[int, ...] | None = None, normalize: bool = True,
                 capacity_factor: float | None = None, servers: tuple[int, ...] | None = None,
                 node_limit: int | None = None) -> None:
        super().__init__()
        self.count, self.top_k, self.normalize = count, top_k, normalize
        self.servers, self.node_limit = servers, node_limit
        """Each expert's server and the servers a token's experts may span (``node_limited``;
        None: routed anywhere)."""
        self.capacity_factor = capacity_factor
        """Each expert's capacity over the mean load (``within_capacity``; None: dropless)."""
        self.token_servers: torch.Tensor | None = None
        """Each input token's server of every routed expert (N, count): the map of the
        expert-parallel group that dispatches it (the unsplit reference's
        ``runtime.validation.grad_check.token_servers``); None: ``servers`` for every token."""
        self.token_groups: torch.Tensor | None = None
        """A label per input token: the capacity applies per label (the unsplit reference's
        ``runtime.validation.grad_check.drop_groups``); None: to the whole call, one device's batch."""
        self.local = tuple(range(count)) if local is None else tuple(local)
        self.router = nn.Linear(hidden, count, bias=False)
        self.experts = nn.ModuleDict({str(e): MLP(hidden, ffn_hidden, gated=gated) for e in self.local})
        self.etp, self.etp_rank, self.etp_group = 1, 0, None
        """Expert tensor parallelism: the group's size, this device's place in it and its process
        group (``cut_width``; None: each expert whole)."""
        self.tag_parameters()
        self.shared = MLP(hidden, shared * ffn_hidden, gated=gated) if shared else None
        self.group = None
        """The expert-parallel process group (None: every expert is here)."""
        self.tensor_split: tuple[int, int, object] | None = None
        """(tensor rank, tensor_parallel, tensor group) under tensor parallelism without sequence
        parallelism (set by ``runtime.model.tensor_parallel``): every tensor rank routes all the
        tokens it holds, dispatches its 1/t of each sample's sequence, and the outputs are summed
        over the group (``CopyToTensorRanks``, ``SumOverTensorRanks``); None: route and dispatch
        every token this device holds."""

    def tag_parameters(self) -> None:
        """Mark the router's weight and the routed experts' parameters (``ROUTER_PARAM``,
        ``EXPERT_PARAM``); again after ``fully_shard``, whose sharded parameters are new objects."""
        setattr(self.router.weight, ROUTER_PARAM, True)
        for p in self.experts.parameters():
            setattr(p, EXPERT_PARAM, True)
        if self.etp == 1:
            return
        for mlp in self.experts.values():
            for linear, dim in ((mlp.w1, 0), (mlp.w3, 0), (mlp.w2, 1)):
                if linear is not None:
                    setattr(linear.weight, ETP_DIM, dim)
            if mlp.w1.bias is not None:
                setattr(mlp.w1.bias, ETP_DIM, 0)
                setattr(mlp.w2.bias, ETP_SUMMED, True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, DTensor):  # sequence parallelism: route the tokens this device holds
            x = x.to_local()
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        if self.tensor_split is not None:  # each rank's router and experts see part of the gradient
            tokens = CopyToTensorRanks.apply(tokens, self.tensor_split[2])
        logits = F.linear(tokens.float(), self.router.weight.float())
        servers = self.token_servers if self.token_servers is not None else \
            None if self.servers is None else torch.tensor(self.servers, device=logits.device)
        weights, chosen = route(logits, self.top_k, normalize=self.normalize, servers=servers,
                                node_limit=self.node_limit)
        flat = chosen.reshape(-1)
        dispatched = torch.ones_like(flat, dtype=torch.bool)  # token-major: copy i is token i // top_k's
        groups = self.token_groups
        if self.tensor_split is not None:  # this tensor rank dispatches positions [r·s/t, (r+1)·s/t) of each sample
            s, (rank, size, _) = shape[-2], self.tensor_split
            mine = (torch.arange(tokens.shape[0], device=flat.device) % s) * size // s == rank
            dispatched, groups = mine.repeat_interleave(self.top_k), mine.long()  # capacity over its own tokens
        if self.capacity_factor is not None:  # the copies over an expert's capacity are never dispatched
            dispatched &= within_capacity(weights, chosen, self.count, self.capacity_factor, groups)
        copies = torch.nonzero(dispatched).flatten()
        kept = flat[copies]
        picked = copies[torch.argsort(kept, stable=True)]  # grouped by expert, in token order within
        per_expert = torch.bincount(kept, minlength=self.count)
        source = picked // self.top_k
        routed = self._experts(tokens[source], per_expert)
        combined = torch.zeros_like(tokens).index_add(
            0, source, routed * weights.reshape(-1)[picked].unsqueeze(-1).to(routed.dtype))
        if self.tensor_split is not None:  # each token's output on the rank that dispatched it: summed
            combined = SumOverTensorRanks.apply(combined, self.tensor_split[2])
        out = combined.reshape(shape)
        if self.shared is not None:
            out = out + self.shared(x)
        return out

    def _experts(self, copies: torch.Tensor, per_expert: torch.Tensor) -> torch.Tensor:
        """Every token copy (sorted by expert) through its expert, here or on its expert-parallel rank."""
        if self.group is None and self.etp_group is None:
            counts = per_expert.tolist()
            return torch.cat([self.experts[str(e)](chunk) for e, chunk in enumerate(copies.split(counts))])
        mine = len(self.local)
        if self.group is None:
            by_source, send, arrived = per_expert.reshape(1, mine), [copies.shape[0]], copies
        else:
            ep = dist.get_world_size(self.group)
            received = torch.empty_like(per_expert)
            dist.all_to_all_single(received, per_expert, group=self.group)  # counts first: the split sizes
            send = per_expert.reshape(ep, mine).sum(dim=1).tolist()
            by_source = received.reshape(ep, mine)
            arrived = AllToAll.apply(copies, send, by_source.sum(dim=1).tolist(), self.group)
        # arrived is grouped by source rank, then local expert; under expert tensor parallelism the
        # expert-tensor ranks' arrivals are gathered first (Megatron-Core's
        # MoEAlltoAllTokenDispatcher.dispatch_postprocess: gather_from_sequence_parallel_region over
        # the expert-tensor group), then regrouped by local expert (its sort_chunks_by_idxs)
        counts, sizes, gathered = self._gather_width(arrived, by_source)
        chunks = list(gathered.split(counts.reshape(-1).tolist()))
        outputs = [None] * len(chunks)
        sources = counts.shape[0] * counts.shape[1]
        for j, e in enumerate(self.local):
            picked = [r * mine + j for r in range(sources)]
            result = self.experts[str(e)](torch.cat([chunks[k] for k in picked]))
            for k, part in zip(picked, result.split([chunks[k].shape[0] for k in picked])):
                outputs[k] = part
        out = torch.cat(outputs)
        if self.etp_group is not None:  # the partial outputs summed back onto their ranks (reduce-scatter)
            out = AllToAll.apply(out, sizes, [arrived.shape[0]] * self.etp, self.etp_group)
            out = out.reshape(self.etp, arrived.shape[0], *out.shape[1:]).sum(dim=0)
        if self.group is None:
            return out
        return AllToAll.apply(out, by_source.sum(dim=1).tolist(), send, self.group)

    def _gather_width(self, arrived: torch.Tensor, by_source: torch.Tensor):
        """(counts by (expert-tensor rank, source, local expert), rows per expert-tensor rank, the
        rows of every expert-tensor rank's arrivals): the all-gather over the group as an
        all-to-all of copies, whose backward (reverse all-to-all, the copies' gradients summed)
        is the reduce-scatter; without expert tensor parallelism this device's own."""
        if self.etp_group is None:
            return by_source.unsqueeze(0), [arrived.shape[0]], arrived
        counts = [torch.empty_like(by_source) for _ in range(self.etp)]
        dist.all_gather(counts, by_source.contiguous(), group=self.etp_group)
        counts = torch.stack(counts)
        sizes = counts.sum(dim=(1, 2)).tolist()
        gathered = AllToAll.apply(arrived.repeat(self.etp, *([1] * (arrived.dim() - 1))),
                                  [arrived.shape[0]] * self.etp, sizes, self.etp_group)
        return counts, sizes, gathered


def cut_width(moe: MoE, etp_rank: int, etp: int) -> None:
    """Keep this device's 1/etp of each routed expert's width, in place (Megatron-Core's
    ``expert_tensor_parallel_size``: the experts' fc1 column-parallel, fc2 row-parallel over the
    expert-tensor group): rows [k·f/etp, (k+1)·f/etp) of w1 and w3 (and w1's bias), the same
    columns of w2; w2's bias whole, added on rank 0 only."""
    moe.etp, moe.etp_rank = etp, etp_rank
    for mlp in moe.experts.values():
        width = mlp.w1.weight.shape[0] // etp
        keep = slice(etp_rank * width, (etp_rank + 1) * width)
        for linear in (mlp.w1, mlp.w3):
            if linear is not None:
                linear.weight = nn.Parameter(linear.weight.detach()[keep].clone())
                if linear.bias is not None:
                    linear.bias = nn.Parameter(linear.bias.detach()[keep].clone())
        mlp.w2.weight = nn.Parameter(mlp.w2.weight.detach()[:, keep].clone())
        mlp.adds_bias = etp_rank == 0
    moe.tag_parameters()

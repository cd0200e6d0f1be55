"""Multi-token prediction: DeepSeek-V3's extra modules that predict the tokens after the next.

DeepSeek-AI 2024 ("DeepSeek-V3 Technical Report", arXiv 2412.19437, §2.2) adds ``D`` sequential
MTP modules after the main model; module ``k`` takes the main model's (or module ``k − 1``'s)
last hidden state of each token and the embedding of the token ``k`` places ahead, normalises
both (RMSNorm), concatenates them and projects the ``2h`` back to ``h`` (its matrix
``M_k ∈ R^{h×2h}``), runs one transformer block ``TRM_k`` and the output head, and adds a
cross-entropy loss (§2.2, Eq. 21–25). The embedding and the output head are *shared* with the
main model (§2.2: "shared embedding layer" and "shared output head"), and DualPipe keeps the
shallowest and deepest layers on one pipeline rank so that they share the parameters and their
gradients physically (§3.2.3, "Shared Embedding and Output Head for Multi-Token Prediction").
DeepSeek-V3 trains with ``D = 1`` (§4.2).

Here module ``k`` costs what it runs: the two norms and the projection (``2·2h·h`` FLOPs a token
forward; parameters ``2h·h + 2h``; its inputs stashed) and one block like the model's last (an
MoE block where the last is one: its experts, router and all-to-all) make one layer ``mtp``
between the last block and the ``head``, and the head runs once more for each module without
parameters of its own but its final norm's (:func:`with_mtp`). The head stays the model's last
layer and the MTP layer comes just before it, on the head's stage: a plan that cuts between them
is refused (:func:`check_mtp_stage`) and no cut the planner or a grid makes falls there
(``ModelSpec.no_cut_at``), as Megatron-Core builds its MTP layers on the last pipeline stage
unless a hand-written layout moves them (NVIDIA/Megatron-LM at d98e8a6,
``megatron/core/transformer/multi_token_prediction.py``, ``mtp_on_this_rank``: "without custom PP
layout, we only support put all of MTP layers on the last pipeline stage") and DeepSeek-V3 keeps
them with the output head on one rank (§3.2.3); DualPipe's V places that stage beside the embedding.
The shifted tokens' embedding look-up (a gather of ``h`` a token) is left out, but not its
collective under tensor parallelism.

The modules read the embedding's token table. An untied model's ``mtp`` layer on another stage
than the embedding holds a copy of it, equal at start and kept equal by summing both copies'
gradients over the embedding group, as Megatron-Core does for its MTP stage (NVIDIA/Megatron-LM
at d98e8a6, ``megatron/core/models/common/language_module/language_module.py``,
``setup_embeddings_and_output_layer``: "If use Multi-Token Prediction (MTP), we also need to
maintain duplicated embedding weights in mtp process stage", and
``megatron/core/distributed/finalize_model_grads.py``, ``_get_shared_word_embedding_weight``, whose
all-reduce runs when ``mtp_num_layers`` is set): the model's ``tied_layers`` are then the embedding
and ``mtp`` (``ModelSpec.tied_copy_bytes``, ``sim.cost.comm.tied_allreduce_s``), as a tied head's
are. A tied model's ``mtp`` layer reads the head's copy, which is there already (on its stage). Where the first
and the last stage share their devices (DualPipe's V) the layer reads the embedding's table itself,
one copy (DeepSeek-V3 §3.2.3: shared "physically"): :func:`table_on_one_device`.
"""

from __future__ import annotations

from dataclasses import replace

from sim.core.errors import SpecError
from sim.core.model_spec import LayerSpec, ModelSpec
from sim.core.plan import PlanSpec
from sim.cost.kernels import KernelSpec
from sim.cost.tensor_comm import TensorParallelCollective

__all__ = ["check_mtp_stage", "merge_layers", "mtp_projection", "mtp_projection_collectives", "table_on_one_device",
           "with_mtp"]


def mtp_projection(q: float, h: int, d: int, *, tensor: int = 1, sequence_parallel: bool = False) -> LayerSpec:
    """One MTP module's two RMSNorms and its ``2h → h`` projection on the ``q`` tokens a device
    holds: parameters ``2h·h + 2h``, forward ``2·q·2h·h`` FLOPs (backward twice), stash the norms'
    inputs and the projection's (``2·2q·h`` elements).

    Over a t-way tensor-parallel group the projection is column-parallel, as Megatron-Core's
    ``eh_proj`` (``megatron/core/transformer/multi_token_prediction.py`` at NVIDIA/Megatron-LM
    00611e6: a ``ColumnParallelLinear`` with ``gather_output=False``, its output then gathered by
    ``gather_from_tensor_model_parallel_region``); the norms stay whole on every device: a device
    holds ``2h·h/t + 2h`` and does 1/t of the product; with sequence parallelism the stash is 1/t of
    the sequence (Korthikanti et al. 2022, §4.2.2, as the blocks'). Its collectives:
    ``mtp_projection_collectives``."""
    t = tensor
    share = t if sequence_parallel else 1  # the norms and the projection's input on s/t tokens
    return LayerSpec(
        name="mtp_projection",
        param_bytes=float((2 * h * h / t + 2 * h) * d),
        param_tensors=3,
        output_bytes=float(q * h * d / t),  # a stage boundary carries 1/t of the sequence, as a block's
        stash_bytes=float(2 * 2 * q * h * d / share),
        fwd_flop=float(2 * q * 2 * h * h / t),
        bwd_flop=float(4 * q * 2 * h * h / t),
        wgrad_fraction=0.5,
        kernels=(KernelSpec(name="mtp_norms", bytes=2 * d * 2 * q * h / share),  # read and write 2q·h
                 KernelSpec(name="mtp_projection", flop=2 * q * h * 2 * h / t, rows=q, cols=h / t, inner=2 * h,
                            bytes=d * (q * 2 * h + q * h / t), fixed_bytes=d * 2 * h * h / t, weights=True)),
        tp_collectives=mtp_projection_collectives(q, h, d, tensor=t, sequence_parallel=sequence_parallel),
    )


def mtp_projection_collectives(q: float, h: int, d: int, *, tensor: int,
                               sequence_parallel: bool) -> tuple[TensorParallelCollective, ...]:
    """The collectives of one MTP module's look-up and projection for one sample over a t-way
    tensor-parallel group (none if t = 1), per Megatron-Core's ``_concat_embeddings`` (file above):
    the shifted tokens' look-up in the vocabulary-parallel table all-reduces its output (a
    reduce-scatter with sequence parallelism, whose backward all-gathers), as the main embedding's;
    the column-parallel ``eh_proj``'s input gradient is all-reduced in the backward (operator f,
    Shoeybi et al. 2019, §3), its output all-gathered in the forward (whose backward only splits);
    with sequence parallelism its input is all-gathered in the forward and its input gradient
    reduce-scattered, and the gathered output is scattered over the sequence before the block
    (``scatter_to_sequence_parallel_region``, whose backward all-gathers). Bytes: the gathered
    tensor, ``q·h`` (the look-up, the output) or ``q·2h`` (the projection's input) elements."""
    if tensor <= 1:
        return ()
    hidden, joined = float(d * q * h), float(d * q * 2 * h)
    if sequence_parallel:
        kinds = [("reduce-scatter", "forward", hidden), ("all-gather", "backward", hidden),
                 ("all-gather", "forward", joined), ("reduce-scatter", "backward", joined),
                 ("all-gather", "forward", hidden), ("all-gather", "backward", hidden)]
    else:
        kinds = [("all-reduce", "forward", hidden), ("all-reduce", "backward", joined),
                 ("all-gather", "forward", hidden)]
    return tuple(TensorParallelCollective(kind=kind, phase=phase, bytes=nbytes) for kind, phase, nbytes in kinds)


def merge_layers(name: str, first: LayerSpec, *rest: LayerSpec) -> LayerSpec:
    """One layer that runs ``first`` then each of ``rest``: parameters, FLOPs, stash, kernels,
    collectives and all-to-all bytes summed; its output ``first``'s (the head's 0); the weight-
    gradient share weighted by each backward's FLOPs; a backward workspace the largest (each
    freed before the next backward runs)."""
    layers = (first, *rest)
    bwd = sum(layer.bwd_flop for layer in layers)
    wgrad = sum(layer.wgrad_fraction * layer.bwd_flop for layer in layers) / bwd if bwd else first.wgrad_fraction
    return replace(
        first,
        name=name,
        param_bytes=sum(layer.param_bytes for layer in layers),
        param_tensors=sum(layer.optimizer_tensors for layer in layers),
        stash_bytes=sum(layer.stash_bytes for layer in layers),
        selective_stash_bytes=sum(layer.selective_stash for layer in layers),
        fwd_flop=sum(layer.fwd_flop for layer in layers),
        bwd_flop=bwd,
        wgrad_fraction=wgrad,
        kernels=sum((layer.kernels for layer in layers), ()),
        tp_collectives=sum((layer.tp_collectives for layer in layers), ()),
        cp_ring_bytes=sum(layer.cp_ring_bytes for layer in layers),
        expert_param_bytes=sum(layer.expert_param_bytes for layer in layers),
        a2a_bytes=sum(layer.a2a_bytes for layer in layers),
        backward_workspace_bytes=max(layer.backward_workspace_bytes for layer in layers),
        allocator_cached_bytes=max(layer.allocator_cached_bytes for layer in layers),
    )


def with_mtp(head: LayerSpec, module: LayerSpec, depth: int, *, head_params_bytes: float,
             head_tensors: int) -> tuple[LayerSpec, LayerSpec]:
    """``(mtp, head)``: the ``depth`` MTP modules as one layer (``module``: one module's projection
    and block, :func:`merge_layers`) before ``head``, and ``head`` run ``1 + depth`` times, its
    projection to the vocabulary (``head_params_bytes``, ``head_tensors``) held once (shared, §2.2).
    The ``mtp`` layer passes the main model's hidden state on beside each module's, so the cut
    after it carries ``1 + depth`` hidden states."""
    again = replace(head, param_bytes=head.param_bytes - head_params_bytes,
                    param_tensors=head.optimizer_tensors - head_tensors, tp_collectives=())
    mtp = merge_layers("mtp", *[module] * depth)
    hidden_bytes = module.output_bytes
    return replace(mtp, output_bytes=(1 + depth) * hidden_bytes), merge_layers(head.name, head, *[again] * depth)


def table_on_one_device(model: ModelSpec) -> ModelSpec:
    """``model`` for a plan whose first and last stage share their devices: an untied model's
    ``mtp`` layer reads the embedding's table on that device and holds no copy of it (DeepSeek-V3
    §3.2.3, DualPipe's shared embedding); any other model unchanged."""
    if model.mtp_depth and model.tied_layers == (0, len(model.layers) - 2):
        return replace(model, tied_layers=None, tied_bytes=0.0)
    return model


def check_mtp_stage(plan: PlanSpec, model: ModelSpec) -> None:
    """Raise ``SpecError`` (key ``stages``) when a stage starts at one of ``model.no_cut_at``: with
    multi-token prediction, the ``mtp`` layer apart from the head, whose stage alone has the labels
    and the output head it runs (the module docstring: Megatron-Core's last-stage placement)."""
    for index, stage in enumerate(plan.stages):
        if stage.layers[0] in model.no_cut_at:
            head = stage.layers[0]
            before = plan.stages[index - 1].layers
            raise SpecError(
                "stages",
                f"the mtp layer ({head - 1}) is on stage {index - 1} ({list(before)}) and the head ({head}) on stage "
                f"{index} ({list(stage.layers)}); multi-token prediction runs on the head's stage (Megatron-Core's "
                f"default placement, DeepSeek-V3 §3.2.3): put layers {head - 1} and {head} in one stage",
            )

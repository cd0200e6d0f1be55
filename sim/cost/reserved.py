"""Usable memory: what a training process cannot fill with tensors on a GPU.

A GPU's memory is not all the caching allocator's. Before the first tensor, three things take
their share, and the allocator itself cannot hand out every byte it holds:

* the CUDA context — the driver's state and the kernels it loaded: "~300MB" with CUDA's lazy
  module loading (CUDA 11.7 and later; more than 1000 MB before it), as PyTorch's maintainers
  measure it (pytorch/pytorch issue #107667, ptrblck, 2023-08-28): ``CUDA_CONTEXT_BYTES``;
* cuBLASLt's workspace, which PyTorch allocates per handle and stream: 32 MiB on Hopper and
  later, 4 MiB on Ampere with 24 GB or more, 1 MiB otherwise (``aten/src/ATen/cuda/CUDABlas.cpp``,
  pytorch/pytorch PR #120925, after the cuBLAS guide's ``cublasSetWorkspace`` advice);
* NCCL's buffers — each channel keeps a buffer per connection (NCCL_BUFFSIZE, 4 MiB, for the
  Simple protocol, plus LL and LL128's), a ring has two connections per channel, and "the memory
  usage is linearly tied to the number of channels" (NVIDIA/nccl issue #986, sjeaugey). On 8
  H100 NCCL opens 32 channels and allocates 10485760-byte (10 MiB) buffers per connection
  (NVIDIA/nccl issue #1685, ``NCCL_DEBUG_SUBSYS=ALLOC``): 32 × 2 × 10 MiB = 640 MiB for one
  communicator's ring, ``NCCL_RING_BYTES``. A plan with several groups (data, tensor, pipeline)
  has one communicator each, so this is a floor; older servers open fewer channels (no
  measurement is cited for them, so the same figure is used);
* the caching allocator's fragmentation — memory it reserved but cannot place the next tensor
  in: 1.83 GiB "reserved by PyTorch but unallocated" beside 75.31 GiB allocated when Llama 3.3 70B
  ran out of memory on an 80 GB GPU (vllm-project/compressed-tensors PR #587):
  ``FRAGMENTATION_FRACTION`` = 1.83 / 75.31 of the device's memory.

Beyond that share, a block the allocator keeps cached can be one that no request at the peak
fits: the allocator serves a request from the smallest cached block at least as large
(pytorch/pytorch ``c10/cuda/CUDACachingAllocator.cpp``, ``get_free_block``: ``pool.blocks.lower_bound``),
else it reserves a new segment (``alloc_block``), so a freed block smaller than every request
until the peak stays reserved beside it. Eager cross-entropy has one (``eager_logits_cached_bytes``).

``reserved_memory_bytes`` sums them; each GPU preset (``sim.input.presets``) writes its result
as ``cluster.device.memory_reserved``, and ``DeviceSpec.usable_memory_bytes`` is the rest.
"""

from __future__ import annotations

__all__ = ["CUDA_CONTEXT_BYTES", "FRAGMENTATION_FRACTION", "NCCL_RING_BYTES", "eager_logits_cached_bytes",
           "reserved_memory_bytes"]

MiB = 2**20

CUDA_CONTEXT_BYTES = 300 * MiB
"""The CUDA context with lazy module loading (pytorch/pytorch issue #107667: "~300MB")."""

NCCL_RING_BYTES = 32 * 2 * 10 * MiB
"""One NCCL communicator's ring buffers: 32 channels × 2 connections × 10 MiB (NVIDIA/nccl issue #1685)."""

FRAGMENTATION_FRACTION = 1.83 / 75.31
"""Reserved-but-unallocated over allocated bytes at an out-of-memory on an 80 GB GPU
(vllm-project/compressed-tensors PR #587: 1.83 GiB beside 75.31 GiB)."""


def reserved_memory_bytes(memory_bytes: float, *, cublas_workspace_bytes: float) -> float:
    """Bytes of a GPU of ``memory_bytes`` a training process cannot use for tensors: the CUDA
    context, cuBLASLt's workspace (``cublas_workspace_bytes``, by architecture), one NCCL
    communicator's ring buffers and the allocator's fragmentation (see the module docstring)."""
    return CUDA_CONTEXT_BYTES + cublas_workspace_bytes + NCCL_RING_BYTES + FRAGMENTATION_FRACTION * memory_bytes


def eager_logits_cached_bytes(tokens: float, vocab: float, dtype_bytes: float) -> float:
    """Bytes of 16-bit logits cached, not allocated, while eager cross-entropy's backward peaks:
    torchtitan (9dec370) returns the head's logits in the compute dtype (``model.py`` line 445,
    ``self.output(h)``), its ``loss_fn`` copies them to fp32 (``train.py`` lines 131-133) and the
    step frees them before the backward (``del pred``, lines 303-308). Their block
    (``tokens × vocab × dtype_bytes``) is then cached; the backward's first two requests are fp32
    logit tensors, twice its size (the gradients of ``eager_loss_workspace_bytes``), which it cannot
    hold, so at their peak it is reserved beside them, until the cast's 16-bit gradient reuses it."""
    return tokens * vocab * dtype_bytes

"""Counting the activations a forward keeps for its backward, on any device.

On a GPU ``torch.cuda.max_memory_allocated`` gives the peak of everything. On a CPU there
is no allocator to ask, so we count what the simulator counts (``sim.cost.compute``): parameters,
gradients and optimizer state (fixed across a step) plus the activations saved for the
backward, which rise with every forward and fall with every backward.

Autograd tells us about each saved activation through
``torch.autograd.graph.saved_tensors_hooks``: the pack hook sees every tensor a forward
saves; we wrap it in a small object whose death (when autograd frees the graph, after the
backward) subtracts it again. A storage shared by several saved tensors (a tensor and its
views) is counted once, while any of them is alive. Parameters that layers save (a
Linear's weight) are not activations and are left out. Inputs kept only for recomputation
are added by the executor with ``hold``/``release``. Outputs that selective activation
checkpointing caches (``runtime.model.recompute``) are handed over with ``hold_cached`` by the
checkpointed forward, which finds the meter watching it with ``watching_meter``; each counts
until SAC consumes it in the backward.

FSDP2 swaps a unit's sharded parameters for gathered (unsharded) ones from its forward on; with
``reshard_after_forward=False`` (the runtime's ``sharding: gradients``, ``runtime.model.sharding``)
it keeps them until the unit's backward, so at the activation peak, the end of a forward, a device
holds every unit's whole parameters beside its shards. ZeRO-2 holds those whole parameters as its
model state (Rajbhandari et al. 2020, §5.2: P_os+g), so a meter built with ``count_gathered``
records the most parameter bytes held gathered at any saved tensor (``peak_gathered_bytes``: the
whole stage's by the end of a forward, when the activations peak too), which the run adds to the
parameters it holds at rest. Under ``full`` a unit is gathered only while it runs: a buffer
(``sim.cost.memory.stage_held_bytes``), counted by neither side of a CPU comparison.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch.distributed.tensor import DTensor

__all__ = ["SavedTensorMeter", "static_bytes", "watching_meter"]

_WATCHING: ContextVar[SavedTensorMeter | None] = ContextVar("watching", default=None)


def watching_meter() -> SavedTensorMeter | None:
    """The meter whose ``watching`` block the caller runs in (None: none)."""
    return _WATCHING.get()


class _Saved:
    """A saved tensor on loan to autograd; returns its bytes to the meter when dropped."""

    __slots__ = ("key", "meter", "tensor")

    def __init__(self, tensor: torch.Tensor, meter: SavedTensorMeter, key: tuple) -> None:
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self) -> None:
        self.meter._release(self.key)


def _storage_key(tensor: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of the storage behind ``tensor`` (one device per rank: addresses are
    unique); a DTensor's is its local shard's, what this device stores."""
    if isinstance(tensor, DTensor):
        with torch.no_grad():
            tensor = tensor.to_local()
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:  # FSDP2's resharded parameters: freed storage, nothing held
        return 0, 0
    return storage.data_ptr(), storage.nbytes()


class SavedTensorMeter:
    """Current and peak bytes of saved activations, counted by storage."""

    def __init__(self, parameters: Iterable[torch.Tensor] = (), current=None, *, count_gathered: bool = False) -> None:
        """``current``: a callable returning the parameters as they are now, checked at each
        saved tensor (FSDP2 swaps a layer's sharded parameters for gathered ones during its
        forward; what a layer saves of those is the gathered parameter, not an activation);
        ``count_gathered``: also record the most bytes of those held gathered."""
        self.current_bytes = 0
        """Bytes of the activations saved now."""
        self.peak_bytes = 0
        """Highest ``current_bytes`` since the last ``reset_peak``."""
        self.peak_gathered_bytes = 0
        """Most bytes of gathered (unsharded) parameters held at a saved tensor since the last
        ``reset_peak`` (with ``count_gathered`` and ``current`` only; else 0)."""
        self._refs: dict[tuple, int] = {}
        self._excluded = {_storage_key(p)[0] for p in parameters}
        self._current = current
        self._count_gathered = count_gathered and current is not None

    def reset_peak(self) -> None:
        self.peak_bytes = self.current_bytes
        self.peak_gathered_bytes = self.gathered_bytes()

    def gathered_bytes(self) -> int:
        """Bytes of the parameters held gathered now: those ``current`` returns that are not the
        shards the meter was built with, each storage once (0 without ``count_gathered``)."""
        if not self._count_gathered:
            return 0
        held = {}
        for p in self._current():
            try:
                key = _storage_key(p)
            except RuntimeError:  # a storage torch has swapped out from under Python (FSDP2's all-gather)
                continue
            if key[1] and key[0] not in self._excluded:
                held[key[0]] = _local_bytes(p)  # the tensor's own bytes: FSDP2 pads its all-gather output
        return sum(held.values())

    def _acquire(self, key: tuple) -> None:
        count = self._refs.get(key, 0)
        self._refs[key] = count + 1
        if count == 0:
            self.current_bytes += key[1]
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        if self._count_gathered:
            self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes())

    def _release(self, key: tuple) -> None:
        count = self._refs[key] - 1
        if count:
            self._refs[key] = count
        else:
            del self._refs[key]
            self.current_bytes -= key[1]

    def _activation_key(self, tensor: torch.Tensor) -> tuple | None:
        """``tensor``'s storage key, or None when it is no activation (a parameter, freed)."""
        if isinstance(tensor, torch.nn.Parameter):  # FSDP2's gathered parameters are parameters too
            return None
        try:
            key = _storage_key(tensor)
        except RuntimeError:  # a storage torch has swapped out from under Python (FSDP2's all-gather)
            return None
        if key[0] in self._excluded or key[1] == 0:
            return None
        if self._current is not None and key[0] in {_storage_key(p)[0] for p in self._current()}:
            return None
        return key

    def _pack(self, tensor: torch.Tensor):
        key = self._activation_key(tensor)
        if key is None:
            return tensor
        self._acquire(key)
        return _Saved(tensor, self, key)

    def hold_cached(self, storage: dict) -> None:
        """Count what selective activation checkpointing cached (``_CachingTorchDispatchMode.storage``:
        op -> call index -> a ``_VersionWrapper`` tree) until each entry is consumed or freed."""
        for calls in storage.values():
            for entry in calls.values():
                for wrapper in entry if isinstance(entry, (tuple, list)) else (entry,):
                    tensor = getattr(wrapper, "val", None)
                    key = self._activation_key(tensor) if torch.is_tensor(tensor) else None
                    if key is not None:
                        self._acquire(key)
                        weakref.finalize(wrapper, self._release, key)

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Count every tensor that autograd saves inside this block."""
        token = _WATCHING.set(self)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield
        finally:
            _WATCHING.reset(token)

    def hold(self, tensor: torch.Tensor) -> object:
        """Count ``tensor`` as kept (e.g. a stage input stashed for recomputation) until
        the returned token is dropped."""
        key = _storage_key(tensor)
        self._acquire(key)
        return _Saved(tensor, self, key)


def _local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def static_bytes(module_params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer | None) -> int:
    """Parameters, their gradients (as many bytes once they exist) and optimizer state (a
    DTensor's: this device's shard)."""
    total = 0
    for p in module_params:
        total += _local_bytes(p) * (2 if p.grad is not None else 1)
    if optimizer is not None:
        for state in optimizer.state.values():
            total += sum(_local_bytes(v) for v in state.values() if torch.is_tensor(v) and v.dim() > 0)
    return total

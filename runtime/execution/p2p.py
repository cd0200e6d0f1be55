"""One rank's point-to-point traffic during one step: receives posted ahead, sends in flight.

Think of a mailbox at each pipeline station. Before the step starts the station puts out
empty envelopes (``irecv`` buffers) for the next few parcels it will need, in the order its
action list will need them; each ``RECV`` action then waits for its envelopes to fill and
puts out the next one, so data can arrive while the station computes (with gloo a send
cannot leave before its receive is posted). Sends go out without waiting; the step waits
for all of them at its end. Every wait has a timeout, so a peer that disappears turns into
an error instead of a hang.

Activations and gradients may travel on process groups of their own (``groups``: one for
the forward traffic, one for the backward): with gloo, two neighbours sending each other a
message at the same moment over one connection stall for milliseconds on a small host, and
a pipeline's steady state does exactly that (stage i sends a forward while stage i+1 sends
a backward); with a connection per direction they do not.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from sim.schedule.ir import Action, ActionKind

__all__ = ["Envelope", "Mailbox"]

Envelope = tuple[int, tuple[int, ...], torch.dtype, int]
"""A receive to post: (source rank, tensor shape, dtype, tag)."""


class Mailbox:
    """Receives of ``actions`` (their ``RECV_F``/``RECV_B``), described by ``envelopes``."""

    def __init__(self, actions: tuple[Action, ...], envelopes: Callable[[Action], list[Envelope]], *,
                 device: torch.device, timeout: timedelta, lookahead: int,
                 groups: tuple[Any, Any] = (None, None)) -> None:
        self.actions, self.envelopes = actions, envelopes
        self.groups = groups  # (forward traffic, backward traffic); None: the default group
        self.device, self.timeout, self.lookahead = device, timeout, max(1, lookahead)
        self.order = [i for i, a in enumerate(actions) if a.kind in (ActionKind.RECV_F, ActionKind.RECV_B)]
        self.position = {index: k for k, index in enumerate(self.order)}
        self.posted: dict[int, list] = {}
        self.sends: list = []
        self.next = 0

    def start(self) -> None:
        """Start a step: post its first receives (the previous step must have drained)."""
        assert not self.posted and not self.sends, "a step started before the last one finished"
        self.next = 0
        self._post(upto=self.lookahead - 1)

    def _post(self, upto: int) -> None:
        while self.next < len(self.order) and self.next <= upto:
            action = self.actions[self.order[self.next]]
            group = self.groups[0 if action.kind is ActionKind.RECV_F else 1]
            posted = []
            for src, shape, dtype, message_tag in self.envelopes(action):
                buffer = torch.empty(shape, dtype=dtype, device=self.device)
                posted.append((dist.irecv(buffer, src, group=group, tag=message_tag), buffer))
            self.posted[self.order[self.next]] = posted
            self.next += 1

    def receive(self, index: int) -> torch.Tensor:
        """Wait for the receive at ``index`` of the action list; its pieces, concatenated."""
        self._post(upto=self.position[index] + self.lookahead)
        posted = self.posted.pop(index)
        for work, _ in posted:
            work.wait(self.timeout)
        buffers = [buffer for _, buffer in posted]
        return buffers[0] if len(buffers) == 1 else torch.cat(buffers)

    def send(self, tensor: torch.Tensor, dst: int, message_tag: int, *, forward: bool) -> None:
        """Send ``tensor`` (activations when ``forward``, else gradients; kept alive until the
        step's end) without waiting."""
        tensor = tensor.contiguous()
        group = self.groups[0 if forward else 1]
        self.sends.append((dist.isend(tensor, dst, group=group, tag=message_tag), tensor))

    def drain(self) -> None:
        """Wait until every send of the step has left."""
        for work, _ in self.sends:
            work.wait(self.timeout)
        self.sends.clear()

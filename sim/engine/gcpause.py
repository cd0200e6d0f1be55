"""Pause Python's cyclic garbage collector around work that allocates millions of objects."""

from __future__ import annotations

import gc
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused():
    """Pause the cyclic garbage collector while compiling or replaying a plan (a decorator too).

    Both allocate millions of objects that live until the work ends (ops, flow kinds, events,
    memory timelines); with the collector on, its full passes over the growing heap cost a
    quarter of compiling 16,384 distinct devices, a quarter of building their memory
    timelines, and about half a replay. Nothing they keep needs cycle collection before they
    end; the collector resumes afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

"""Pause Python's cyclic garbage collector around allocation-heavy batch work.

Lowering a candidate schedule allocates hundreds of thousands of short-lived
objects (instructions, footprints, index tuples) that hold no reference cycles;
each young-generation collection still scans everything that survived, which
cost about a third of the time of lowering and timing a program. Reference
counting frees all of it as usual; only the cycle detector waits.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run the body with the cycle collector off (restored afterwards, even on error)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

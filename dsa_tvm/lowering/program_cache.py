"""Region programs kept by what they are made of, so a sweep recompiles only what changed.

A region's program is a function of its layers (weights included), each layer's
schedule (kind, TIR shape, knobs), the compiler options and the part of the hardware
description the code generator reads. The fields in :data:`TIMING_ONLY` only change how
long things take or what they cost (DRAM bandwidth and latency, the clock, the host,
energy and area, queue depths, ALU and NORM latencies): they steer the cost model that picks schedules,
but a schedule picked is in the key, so a design point that differs from one compiled
before only in them reuses its program (re-stamped for the new description) and is just
timed again. ``tests/compiler/test_program_cache.py`` compiles with the cache on and off
over changes of each field and checks the programs are the same.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

import numpy as np

from ..hw.config import HardwareConfig
from ..hw.schema import FIELDS
from ..isa.program import Program

#: sections of the description the code generator never reads except through a schedule
#: choice: the clock, the host, queue depths, energy, area and the analog crossbars (the
#: simulator maps a program's constant-weight GEMMs onto them)
TIMING_ONLY_SECTIONS = ("clock", "host", "queues", "energy", "area", "cim")
#: ... and single fields of other sections: labels, DRAM timing, unit latencies
TIMING_ONLY = frozenset({
    "name", "description", "bandwidth_bytes_per_cycle", "latency_cycles",
    "alu_latency_cycles", "norm_row_latency_cycles", "table_lookups_per_cycle",
} | {f.name for f in FIELDS if f.section in TIMING_ONLY_SECTIONS})

#: whole region programs kept (a ResNet-50 region with its packed weights is ~25 MB); an
#: entry is the program alone, not the layers it was compiled from
MAX_PROGRAMS = 24


def lowering_view(cfg: HardwareConfig) -> tuple:
    """The description as the code generator sees it: every field but the timing-only ones,
    and whether weights are packed int4 (which a CIM part's crossbars turn off)."""
    return tuple(sorted((k, repr(v)) for k, v in cfg.values.items() if k not in TIMING_ONLY)) \
        + (("packs_int4_weights", cfg.packs_int4_weights),)


def content_key(obj: Any) -> bytes:
    """A digest of a layer IR value: dataclass fields, tuples, numbers, strings and numpy
    arrays (dtype, shape and bytes), so two regions read from one model hash alike."""
    h = hashlib.blake2b(digest_size=20)
    _feed(h, obj)
    return h.digest()


def _feed(h, obj: Any) -> None:
    if isinstance(obj, np.ndarray):
        h.update(f"a{obj.dtype.str}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif is_dataclass(obj) and not isinstance(obj, type):
        h.update(f"d{type(obj).__qualname__}(".encode())
        for f in fields(obj):
            h.update(f.name.encode())
            _feed(h, getattr(obj, f.name))
        h.update(b")")
    elif isinstance(obj, (list, tuple)):
        h.update(f"l{len(obj)}[".encode())
        for v in obj:
            _feed(h, v)
        h.update(b"]")
    elif isinstance(obj, dict):
        h.update(f"m{len(obj)}{{".encode())
        for k in sorted(obj, key=repr):
            _feed(h, k)
            _feed(h, obj[k])
        h.update(b"}")
    else:
        h.update(f"{type(obj).__name__}:{obj!r};".encode())


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


class ProgramCache:
    """A bounded least-recently-used map from region keys to compiled regions."""

    def __init__(self, max_entries: int = MAX_PROGRAMS) -> None:
        self.max_entries = max_entries
        self.stats = CacheStats()
        self._entries: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> Any | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return hit

    def put(self, key: tuple, value: Any) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)


PROGRAMS = ProgramCache()
#: one layer's walked instructions and the scratchpad rows it used (lowering/region.py)
WALKS = ProgramCache(max_entries=4096)
_enabled: ContextVar[bool] = ContextVar("dsa_tvm_program_cache", default=True)


def cache_enabled() -> bool:
    return _enabled.get()


@contextmanager
def program_cache(enabled: bool) -> Iterator[ProgramCache]:
    """``with program_cache(False):`` compiles inside neither read nor fill the cache (the
    sweep benchmark's no-cache figure)."""
    token = _enabled.set(enabled)
    try:
        yield PROGRAMS
    finally:
        _enabled.reset(token)


def restamp(prog: Program, cfg: HardwareConfig) -> Program:
    """``prog`` as compiled for ``cfg``, which differs from its own description only in
    timing-only fields: the same instructions and DRAM image, ``cfg``'s fingerprint and
    description in the header (a fresh object, so timing is simulated anew)."""
    out = replace(prog, fingerprint=cfg.fingerprint, instructions=list(prog.instructions),
                  meta={**prog.meta, "hardware": cfg.as_dict()})
    if getattr(prog, "_fields_checked", None) is not None:
        # the instruction formats follow from fields in the key (widths, depths): the
        # words encoded for the cached program are this one's, and need no second check
        out.mark_fields_checked(cfg, getattr(prog, "_words", None))
    return out

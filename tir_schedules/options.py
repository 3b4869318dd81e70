"""Compiler choices that are not hardware: scoped with ``with dsa_tvm.options(...)``.

They live in a context variable, so a setting holds for the code inside the ``with``
block (in this thread or asyncio task) and is undone after it, even on an error;
nothing flips module-level globals. The defaults are what every compile uses.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace

DEPTHWISE_ENGINES = ("auto", "vector", "array")
OFFLOAD_POLICIES = ("faster", "all")
ROWS_CONCAT = ("dsa", "host")


@dataclass(frozen=True)
class CompileOptions:
    #: how depthwise convs run: "auto" (the engine with the lower estimate), "vector" (ALU
    #: MAC over taps on accumulator rows) or "array" (diagonal weight tiles on the MAC array)
    depthwise_engine: str = "auto"
    #: a host im2col fold of a few-channel conv must beat the unfolded estimate by this
    #: factor (it costs host work); ``math.inf`` never folds
    fold_min_gain: float = 1.25
    #: which compiled regions launch on the DSA: "faster" (those whose simulated time plus
    #: the launch overhead beats the host estimate) or "all" (every region that compiles:
    #: to measure the DSA on work a host would win, e.g. weight-bound LLM decode)
    offload: str = "faster"
    #: where a concat along the second-to-last axis (an LLM's KV cache and its new rows)
    #: runs: "dsa" (the movement room, in the region) or "host" (before the region: the
    #: host then hands the joined cache over in the tiles the attention reads, where the
    #: region would copy it and lay it out again; see docs/llm.md)
    rows_concat: str = "dsa"

    def __post_init__(self) -> None:
        if self.depthwise_engine not in DEPTHWISE_ENGINES:
            raise ValueError(f"depthwise_engine must be one of {', '.join(DEPTHWISE_ENGINES)}, "
                             f"got {self.depthwise_engine!r}")
        if self.offload not in OFFLOAD_POLICIES:
            raise ValueError(f"offload must be one of {', '.join(OFFLOAD_POLICIES)}, "
                             f"got {self.offload!r}")
        if self.rows_concat not in ROWS_CONCAT:
            raise ValueError(f"rows_concat must be one of {', '.join(ROWS_CONCAT)}, "
                             f"got {self.rows_concat!r}")
        gain = self.fold_min_gain
        if isinstance(gain, bool) or not isinstance(gain, (int, float)) or math.isnan(gain) \
                or gain <= 0:
            raise ValueError(f"fold_min_gain must be a number > 0 (math.inf: never fold), "
                             f"got {gain!r}")


_DEFAULTS = CompileOptions()
_current: ContextVar[CompileOptions | None] = ContextVar("dsa_tvm_compile_options",
                                                         default=None)


def current_options() -> CompileOptions:
    """The options in effect here (the defaults outside any ``options(...)`` block)."""
    return _current.get() or _DEFAULTS


@contextmanager
def options(**changes) -> Iterator[CompileOptions]:
    """``with dsa_tvm.options(depthwise_engine="vector"):`` compiles inside use these
    choices; the ones not named stay as they were."""
    known = {f.name for f in fields(CompileOptions)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise TypeError(f"unknown compile option(s) {', '.join(unknown)}; "
                        f"known: {', '.join(sorted(known))}")
    token = _current.set(replace(current_options(), **changes))
    try:
        yield current_options()
    finally:
        _current.reset(token)

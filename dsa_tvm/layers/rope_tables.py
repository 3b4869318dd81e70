"""Rotary tables that arrive at run time (an LLM step's ``cos``/``sin`` of its positions).

The ``rope`` room multiplies codes by integer tables in ``2**frac`` fixed point. When the
tables are constants the compiler picks ``frac`` from their largest entry; when they are
region inputs it cannot see them, so ``frac`` is fixed at compile time from a declared
bound (standard RoPE: ``|cos|, |sin| <= 1``) and the host, which turns the float tables
into the room's integer rows before each launch, checks that bound: a table beyond it
would wrap or lose bits, so it is an error, never a silently wrong result. The reference
(``tir_schedules.kinds.rope.run_rope``) converts with the same :func:`fixed_tables`, so the
DSA and the reference agree bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from .ir import QTensor, Rope

#: entries stay within 16 bits: |x - zp| * |table| * 2 < 2^31 whatever the codes
TABLE_BITS = 15
#: the bound runtime tables are compiled for: cos and sin of real angles
TABLE_BOUND = 1.0
#: the io note of a host-packed rotary table (``host_pack``)
IO_KEY = "rope_table"


class RopeTableError(ValueError):
    """A runtime rotary table the compiled program cannot hold exactly."""


def frac_for_bound(bound: float) -> int:
    """Fixed-point bits of tables whose entries stay within ``bound``."""
    return int(max(0, min(24, TABLE_BITS - 1 - math.floor(math.log2(max(bound, 2.0 ** -24))))))


def half_sign(d: int) -> np.ndarray:
    """-1 on the first half of a row, +1 on the second: ``rotate_half(x) * sin`` as a swap."""
    return np.concatenate([-np.ones(d // 2), np.ones(d // 2)])


def fixed_table(name: str, t: np.ndarray, shape: tuple[int, int], frac: int, bound: float,
                signed_half: bool) -> np.ndarray:
    """int32 [P, d]: the float table ``t`` (anything of P x d elements) in ``2**frac`` fixed
    point (``sin`` signed per half); raises :class:`RopeTableError` beyond ``bound``."""
    a = np.asarray(t, np.float64)
    if a.size != shape[0] * shape[1]:
        raise RopeTableError(f"rotary table '{name}': {a.shape} is not {shape} "
                             f"(positions x head width)")
    a = a.reshape(shape)
    if not np.isfinite(a).all():
        raise RopeTableError(f"rotary table '{name}' has non-finite entries")
    top = float(np.abs(a).max()) if a.size else 0.0
    if top > bound:
        raise RopeTableError(
            f"rotary table '{name}' has an entry of magnitude {top:g}, beyond the bound "
            f"{bound:g} it was compiled for (2^{frac} fixed point): the DSA would compute "
            f"wrong values. Pass cos/sin of real angles (|entry| <= {bound:g}), or compile "
            f"the table as a constant (then its fixed point follows its largest entry)")
    if signed_half:
        a = a * half_sign(shape[1])
    return np.round(a * 2.0 ** frac).astype(np.int32)


def layer_tables(ly: Rope, env: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) int32 [P, d] of a Rope layer: its constants, or its runtime inputs."""
    if not ly.tables:
        return ly.cos, ly.sin
    cos, sin = ly.tables
    shape = ly.table_shape
    return (fixed_table(cos.name, env[cos.name], shape, ly.frac, ly.bound, False),
            fixed_table(sin.name, env[sin.name], shape, ly.frac, ly.bound, True))


def io_entries(layers) -> dict[str, dict]:
    """Region input name -> its ``rope_table`` io note (what the host packer repeats)."""
    out: dict[str, dict] = {}
    for ly in layers:
        if isinstance(ly, Rope) and ly.tables:
            for t, signed in zip(ly.tables, (False, True)):
                note = {"positions": ly.table_shape[0], "width": ly.table_shape[1],
                        "frac": ly.frac, "bound": ly.bound, "signed_half": signed}
                if out.setdefault(t.name, note) != note:
                    raise ValueError(f"rotary table '{t.name}' is read as cos by one layer "
                                     f"and sin (or another shape) by another")
    return out


def pack_table(name: str, x: np.ndarray, note: dict, block: int) -> np.ndarray:
    """[P * d / block, block] int32 rows the room loads (host side of a launch)."""
    shape = (int(note["positions"]), int(note["width"]))
    t = fixed_table(name, x, shape, int(note["frac"]), float(note["bound"]),
                    bool(note["signed_half"]))
    return np.ascontiguousarray(t.reshape(shape[0] * (shape[1] // block), block))


def table_tensor(name: str, shape: tuple[int, ...], frac: int) -> QTensor:
    """The layer IR's view of a float table input (scale ``2**-frac``, no zero point)."""
    return QTensor(name, tuple(int(n) for n in shape), 2.0 ** -frac, 0)

"""int16 codes as two int8 byte planes, ``x = 256 hi + lo``, made by existing layers.

The MAC array multiplies int8 codes, so an int16 operand (a dense's input, a matmul's
probabilities, K or V with their cache) runs as two planes: ``hi = clamp(rshift_round(x,
8), int8)`` (a Rescale by ``2**-8``; an ``x`` from 32640 up gives 127, so it counts as
32639) and ``lo = clamp(x - 256 hi, int8)`` (an Add), zero point 0; ``lo`` on ``x``'s
grid, ``hi`` on one 256 times coarser (its codes stand for what they carry of ``x``).
:func:`split_layers` makes the pair, :func:`is_split` recognizes it (a lowering that moves
the split, to the host for a cache, must know it is this exact function) and
``layers.reference.stacked_byte_planes`` computes it on the host.
"""

from __future__ import annotations

import numpy as np

from ..isa import semantics as sem
from .ir import Add, Layer, QTensor, Requant, Rescale
from .reference import PLANE_SHIFT

#: the weight of the hi plane
PLANE = 1 << PLANE_SHIFT
_INT8 = (sem.INT8_MIN, sem.INT8_MAX)


def split_layers(name: str, x: QTensor) -> tuple[tuple[Layer, Layer], QTensor, QTensor]:
    """``x = 256 hi + lo`` for int16 codes ``x`` (zero point 0): the Rescale making ``hi``
    and the Add making ``lo``, and the two int8 planes (``hi``'s scale ``256 s_x``)."""
    hi = QTensor(f"{name}/hi", x.shape, PLANE * x.scale, 0)
    lo = QTensor(f"{name}/lo", x.shape, x.scale, 0)
    one = np.array([1], np.int32)
    return (Rescale(f"{name}/hi", x, hi, Requant(one, np.array([PLANE_SHIFT], np.int32), 0,
                                                 _INT8)),
            Add(f"{name}/lo", x, hi, lo, 1, -PLANE, Requant(one, np.array([0], np.int32), 0,
                                                            _INT8))), hi, lo


def is_split(hi: Layer, lo: Layer) -> bool:
    """True if ``hi`` and ``lo`` are :func:`split_layers`' pair over one int16 tensor."""
    if not (isinstance(hi, Rescale) and isinstance(lo, Add)):
        return False
    x = hi.input
    want_hi, want_lo = split_layers("", x)[0]
    return (x.dtype == "int16" and x.zero_point == 0 and lo.a.name == x.name
            and lo.b.name == hi.output.name and hi.output.dtype == lo.output.dtype == "int8"
            and (lo.a_mult, lo.b_mult) == (want_lo.a_mult, want_lo.b_mult)
            and _same_requant(hi.requant, want_hi.requant)
            and _same_requant(lo.requant, want_lo.requant)
            and hi.output.zero_point == lo.output.zero_point == 0
            and hi.output.scale == PLANE * x.scale and lo.output.scale == x.scale)


def _same_requant(a: Requant, b: Requant) -> bool:
    return (np.array_equal(a.multiplier, b.multiplier) and np.array_equal(a.shift, b.shift)
            and a.zero_point == b.zero_point and tuple(a.clip) == tuple(b.clip))

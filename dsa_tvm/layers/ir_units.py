"""Integer layers of the norm and vector units: row norms, softmax, tables, rotary.

Part of the layer contract of ``dsa_tvm.layers.ir`` (which re-exports them). The row
norms' integer semantics and parameter folding: ``dsa_tvm.layers.intnorm`` (the [norm]
unit's spec).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .qtensor import QTensor, Requant


@dataclass(frozen=True)
class Softmax:
    """y = int_softmax(x) over the last axis (I-BERT i-exp, table+Newton reciprocal)."""

    name: str
    input: QTensor
    output: QTensor          # same shape; typically scale 1/256, zero point -128
    params: object           # intnorm.SoftmaxParams
    #: int16 results written as two int8 byte planes, rows interleaved: input row r gives
    #: output rows 2r (``hi = clamp(rshift_round(y, 8))``) and 2r + 1 (``lo = clamp(y -
    #: 256 hi)``), the operand of a :class:`BatchMatmul` with ``planes``; ``output`` is
    #: int8 with twice the rows, on the int16 grid's scale
    planes: bool = False

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class LayerNorm:
    """y = int_norm(x) over the last axis, centred (mean and variance), gamma and beta folded."""

    name: str
    input: QTensor
    output: QTensor
    params: object           # intnorm.NormParams with center=True

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class RMSNorm:
    """y = int_norm(x) over the last axis, not centred (root mean square), weight folded."""

    name: str
    input: QTensor
    output: QTensor
    params: object           # intnorm.NormParams with center=False

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class Table:
    """y = table[x + 128]: an element-wise function of one int8 tensor, as 256 int8 codes
    (a dequantize -> sigmoid / SiLU / GELU / ... -> quantize chain evaluated on every input
    code by the compiler); the vector unit's activation table applies it (ALU LUT)."""

    name: str
    input: QTensor
    output: QTensor          # same shape as input
    table: np.ndarray        # int8 [256]: entry i is the output code of input code i - 128
    what: str = ""           # the chain it replaces, for reports ("sigmoid", "x*sigmoid(x)")

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class WideTable:
    """y = f(x) element-wise on int16 codes, as a line per 256-code segment read from two
    256-entry tables (``dsa_tvm.layers.wide_table``: ``acc = base[hi] + slope[hi] * lo``,
    ``y = rshift_round(acc, frac)``); ``error`` is the fit's largest distance from the
    exact chain, in output codes, over every input code."""

    name: str
    input: QTensor           # int16
    output: QTensor          # int16, same shape as input
    base: np.ndarray         # int32 [256]
    slope: np.ndarray        # int32 [256]
    frac: int
    error: int = 0
    what: str = ""

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class Rope:
    """Rotary position embedding over rows of ``d`` codes, the position of a row being its
    index mod ``P`` (the tables' rows; ``(B, H, P, d)`` heads): with ``xc = x - zero_point``
    and ``swap`` exchanging a row's two halves, ``acc = xc * cos[p] + swap(xc) * sin[p]``
    (int32, wrapping like the ALU's MUL and MAC), then requantized. The tables are the float
    ones in fixed point, ``sin`` signed per half (``-sin`` on the first: that is
    ``rotate_half(x) * sin``); :attr:`requant` takes out their scale.

    Runtime tables (an LLM step's positions): ``tables`` holds the float ``cos`` and
    ``sin`` region inputs (P x d elements) and ``cos``/``sin`` are None; the host converts
    them in ``2**frac`` fixed point, refusing entries beyond ``bound``
    (:mod:`dsa_tvm.layers.rope_tables`)."""

    name: str
    input: QTensor           # (..., P, d)
    output: QTensor          # same shape
    cos: np.ndarray | None   # int32 [P, d]
    sin: np.ndarray | None   # int32 [P, d], signed per half
    requant: Requant
    tables: tuple[QTensor, ...] = ()   # (cos, sin) float region inputs, or none
    frac: int = 0                      # fixed-point bits of runtime tables
    bound: float = 1.0                 # the largest |entry| runtime tables may hold

    @property
    def table_shape(self) -> tuple[int, int]:
        """(P, d): positions x row length."""
        if self.cos is not None:
            return tuple(int(n) for n in self.cos.shape)
        return tuple(int(n) for n in self.input.shape[-2:])

    @property
    def macs(self) -> int:
        return 2 * int(np.prod(self.input.shape))

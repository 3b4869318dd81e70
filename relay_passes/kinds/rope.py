"""rope: rotary position embedding, ``quantize(dq(x) * C + rotate_half(dq(x)) * S)`` with
``rotate_half(t) = concat(-t[..., h:], t[..., :h])`` and constant tables ``C``, ``S`` over
the last two axes (positions x head width), as Llama exports it and the quantizer plans
it (``dsa_tvm.quant.rope_plan``: int8 in and out, the interior FP32).

``x`` may arrive through the head split's int8 reshape/permute_dims (taken in, made a
Permute). The tables become integers in ``2**frac`` fixed point (``frac`` as large as the
tables allow within 16 bits), ``S`` signed per half; the layer is
:class:`dsa_tvm.layers.ir.Rope` on rows ``(B*H, P, d)``.

Tables that are not constants (an LLM step's ``cos``/``sin`` of its positions: float
region inputs of ``P x d`` elements) are read at run time: ``frac`` follows the bound
:data:`~dsa_tvm.layers.rope_tables.TABLE_BOUND` and the host packs and checks them
(:mod:`dsa_tvm.layers.rope_tables`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from tvm import relax
from tvm.ir.expr import GenericConst
from tvm.relax.dpl import DFPattern, is_const, is_op, is_tuple, wildcard

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.layers.ir import Layer, QTensor, Rope
from dsa_tvm.layers.rope_tables import TABLE_BOUND, frac_for_bound, table_tensor

from .common import Constraint, common_constraints
from .match import Match, NotAMatch, Reader, Root, const_value, dtype_of, shape_of
from .movement import slice_bounds
from .scales import requant
from .spec import Kind, dq, moved, q

#: table entries stay within 16 bits: |x - zp| * |table| * 2 < 2^31 whatever the tables
TABLE_BITS = 15


@dataclasses.dataclass
class RopeMatch(Match):
    """A match plus the float tables (broadcast to (P, d)), or the expressions of runtime
    tables (region inputs: ``float_inputs``, cos then sin, with their shapes)."""

    cos: np.ndarray | None = None
    sin: np.ndarray | None = None
    float_inputs: tuple[tuple[relax.Expr, tuple[int, ...]], ...] = ()


def _mul(a: DFPattern, b: DFPattern) -> DFPattern:
    return is_op("relax.multiply")(a, b) | is_op("relax.multiply")(b, a)


def _slice() -> DFPattern:
    op = "relax.strided_slice"
    x = dq(moved())
    return (is_op(op)(x, wildcard(), wildcard(), wildcard(), wildcard())
            | is_op(op)(x, wildcard(), wildcard(), wildcard()))


def _variants() -> list[tuple[str, DFPattern]]:
    rot = is_op("relax.concat")(is_tuple([is_op("relax.negative")(_slice()), _slice()]))
    add = is_op("relax.add")
    out = []
    for name, table in (("rotate_half", is_const), ("rotate_half_runtime", wildcard)):
        direct, rotated = _mul(dq(moved()), table()), _mul(rot, table())
        out.append((name, q(add(direct, rotated) | add(rotated, direct))))
    return out


# ----------------------------------------------------------------------------- reading
def _slice_of(r: Reader, expr) -> tuple[relax.Expr, tuple[int, int]]:
    """(the dequantize it slices, (begin, end)) of a unit-stride slice of the last axis."""
    sl = r.need(expr, "relax.strided_slice")
    shape = tuple(int(n) for n in sl.args[0].ty.shape)
    axes, ranges = slice_bounds(r, sl, shape)
    if axes != [len(shape) - 1] or ranges[0][2] != 1:
        raise NotAMatch(f"slice over axes {axes}, ranges {ranges}: not a unit-stride slice "
                        f"of the last axis")
    return sl.args[0], ranges[0][:2]


def _table(r: Reader, expr, shape: tuple[int, ...]) -> np.ndarray:
    """A float constant over the last two axes of ``shape`` (leading axes of extent 1)."""
    t = np.asarray(const_value(r.value(expr)), np.float64)
    if len(shape) < 2:
        raise NotAMatch(f"rows of {shape}: positions x head width expected")
    p, d = shape[-2:]
    if t.ndim > len(shape) or any(n != 1 for n in t.shape[:-2]) \
            or np.broadcast_shapes(t.shape[-2:], (p, d)) != (p, d):
        raise NotAMatch(f"table of shape {t.shape} is not over the last two axes of {shape}")
    return np.broadcast_to(t.reshape(t.shape[-2:] if t.ndim >= 2 else t.shape), (p, d))


def _split(r: Reader, mul: relax.Call, data: str) -> tuple[relax.Expr, relax.Expr]:
    """(the operand made by op ``data``, the table) of a multiply: the table is the
    constant, else the operand ``data`` does not make."""
    a, b = mul.args
    if isinstance(r.value(b), GenericConst):
        return a, b
    if isinstance(r.value(a), GenericConst):
        return b, a
    return (a, b) if r.call(a, data) is not None else (b, a)


def _runtime_table(r: Reader, expr, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of a float table read at run time: P x d elements, d its last axis."""
    if dtype_of(expr) != "float32":
        raise NotAMatch(f"a {dtype_of(expr)} table (float32 cos/sin expected)")
    t = shape_of(expr)
    p, d = shape[-2:]
    if int(np.prod(t, dtype=np.int64)) != p * d or t[-1] != d:
        raise NotAMatch(f"runtime table of shape {t} is not {p} positions x {d} codes "
                        f"(tables broadcast over positions stay on the CPU)")
    return t


def _read(r: Reader, root: Root) -> Match:
    add = r.need(root.body, "relax.add")
    muls = [r.need(a, "relax.multiply") for a in add.args]
    for direct, rotated in (muls, muls[::-1]):
        x_dq, c = _split(r, direct, "relax.dequantize")
        cat_expr, s = _split(r, rotated, "relax.concat")
        cat = r.call(cat_expr, "relax.concat")
        if r.call(x_dq, "relax.dequantize") is None or cat is None:
            continue
        x = r.operand(x_dq, moves=True)
        shape, d = tuple(x.shape), int(x.shape[-1])
        neg, low = r.value(cat.args[0]).fields
        high_dq, high = _slice_of(r, r.need(neg, "relax.negative").args[0])
        low_dq, low_range = _slice_of(r, low)
        h = d // 2
        if d % 2 or high != (h, d) or low_range != (0, h):
            raise NotAMatch(f"rotate_half slices {high} and {low_range} of {d} codes")
        for other in (high_dq, low_dq):
            r.same_tensor(x_dq, other, "the rotated and the direct term read different tensors")
        consts = [isinstance(r.value(t), GenericConst) for t in (c, s)]
        if all(consts):
            return RopeMatch("rope", add, [x], root.out, root.out_shape, root.q,
                             cos=_table(r, c, shape), sin=_table(r, s, shape))
        if any(consts):
            raise NotAMatch("one constant table and one runtime table")
        return RopeMatch("rope", add, [x], root.out, root.out_shape, root.q,
                         float_inputs=((c, _runtime_table(r, c, shape)),
                                       (s, _runtime_table(r, s, shape))))
    raise NotAMatch("not x * C + rotate_half(x) * S")


# ----------------------------------------------------------------------------- checks, layer
def frac_bits(m: RopeMatch) -> int:
    """Fixed-point bits of the tables: the largest entry within TABLE_BITS bits (runtime
    tables: the bound they are compiled for)."""
    if m.cos is None:
        return frac_for_bound(TABLE_BOUND)
    top = float(max(np.abs(m.cos).max(), np.abs(m.sin).max(), 2.0 ** -24))
    if not math.isfinite(top):
        return 0  # the rope_form constraint refuses such tables
    return int(max(0, min(24, TABLE_BITS - 1 - math.floor(math.log2(top)))))


def rescale_factors(m: Match) -> np.ndarray:
    return np.array([float(m.inputs[0].qp.scale[0]) / float(m.out.scale[0])
                     / 2.0 ** frac_bits(m)])


def _form(m: Match, cfg: HardwareConfig) -> str | None:
    d = int(m.inputs[0].shape[-1])
    if len(m.inputs[0].shape) < 2:
        return f"rows of {m.inputs[0].shape}: positions x head width expected"
    if d % (2 * cfg.block_out):
        return (f"half a row ({d // 2} codes) is not a whole number of {cfg.block_out}-lane "
                f"blocks (the half swap moves whole blocks)")
    x = m.inputs[0].qp
    if x.dtype == "int16" and int(x.zero_point[0]) != 0:
        return (f"an int16 input with zero point {int(x.zero_point[0])} (its products with "
                f"the tables stay within int32 at zero point 0 only)")
    if m.cos is None:
        return None   # runtime tables: the host packer checks their bound
    if not (np.isfinite(m.cos).all() and np.isfinite(m.sin).all()):
        return "non-finite cos/sin tables"
    top = max(float(np.abs(m.cos).max()), float(np.abs(m.sin).max()))
    if top >= 2 ** (TABLE_BITS - 1):
        return f"table entries up to {top:g} (the integer tables hold |entry| < 2^14)"
    return None


def _rows(t: QTensor) -> QTensor:
    """(..., P, d) as (B*H, P, d): rows of the last axis, never a 4-D image view."""
    s = tuple(t.shape)
    return dataclasses.replace(t, shape=(int(np.prod(s[:-2], dtype=np.int64)), *s[-2:]))


def _to_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    frac = frac_bits(m)
    rq = requant(rescale_factors(m), m)
    if m.cos is None:   # runtime tables: region inputs after x (placeholders for checks)
        tables = [table_tensor(t.name, t.shape, frac) for t in inputs[1:3]] or \
            [table_tensor(n, shape, frac) for n, (_, shape) in zip(("cos", "sin"),
                                                                  m.float_inputs)]
        return Rope(name, _rows(inputs[0]), _rows(output), None, None, rq,
                    tables=tuple(tables), frac=frac, bound=TABLE_BOUND)
    h = m.cos.shape[1] // 2
    sign = np.concatenate([-np.ones(h), np.ones(h)])
    cos = np.round(m.cos * 2.0 ** frac).astype(np.int32)
    sin = np.round(m.sin * sign * 2.0 ** frac).astype(np.int32)
    return Rope(name, _rows(inputs[0]), _rows(output), cos, sin, rq)


KINDS = (Kind(
    "rope", 210, _variants, _read,
    common_constraints(rescale_factors, wide_output=True, wide_inputs=True) + [
        Constraint("rope_form", "half the head width a multiple of `{cfg.block_out}`, finite "
                   "tables over positions x head width (or float32 region inputs of "
                   "positions x head width, |entry| <= 1, checked by the host); an int16 "
                   "input with zero point 0", _form)],
    _to_layer, "Mul, Slice, Neg, Concat, Add (rotary position embedding, x*cos + "
    "rotate_half(x)*sin)", "relax.add"),)

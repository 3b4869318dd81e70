"""add: ``quantize(act(dq(a) + dq(b)))``, two int8 activations of one shape (a residual) or
one broadcasting to the other with all its channels (``[N, C, 1, 1] + [N, C, H, W]``: the
binary room's), or one activation and a per-channel constant (a bias the exporter kept
apart).

Both operands are rescaled to the output in integers: ``a_mult = round(s_a / s_y * 2**n)``,
``b_mult`` likewise, with n chosen so both stay below ``2**ADD_MULT_BITS``; REQUANT is
then ``(1, n)``.
"""

from __future__ import annotations

import math

import numpy as np
from tvm.relax.dpl import DFPattern, is_const, is_op

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers.ir import Add, AddConst, BiasAdd, Layer, QTensor, Requant
from dsa_tvm.layers.layouts import broadcast_dims

from .common import Constraint, common_constraints
from .match import Match, Operand, QParams, Reader, Root, const_value
from .scales import channel_addend, clip_bounds
from .spec import ACTS, Kind, act, dq, q

#: Both rescale factors are multiplied by 2**n with n chosen so they stay below
#: 2**ADD_MULT_BITS; (x - zp) * mult then cannot overflow the int32 accumulator.
ADD_MULT_BITS = 21
#: the bound on an int16 operand's multiplier (a wide residual stream): its 17-bit
#: centred codes times it and the other term stay within int32
WIDE_ADD_MULT_BITS = 14


def _variants() -> list[tuple[str, DFPattern]]:
    return [(a or "plain", q(act(is_op("relax.add")(dq(), dq()), a))) for a in ACTS]


def _read(r: Reader, root: Root) -> Match:
    fused, body = r.activation(root.body)
    op = r.need(body, "relax.add")
    ops = [r.operand(op.args[0]), r.operand(op.args[1])]
    consts = [o for o in ops if o.value is not None]
    if len(consts) == 1:  # activation + constant (a bias the exporter kept apart)
        return root.match("add", op, [o for o in ops if o.value is None], addend=consts[0],
                          act=fused)
    return root.match("add", op, ops, act=fused)


def rescale_factors(m: Match) -> np.ndarray:
    s_in, s_out = float(m.inputs[0].qp.scale[0]), float(m.out.scale[0])
    other = m.addend if m.addend is not None else m.inputs[1]
    return np.array([s_in / s_out, float(other.qp.scale[0]) / s_out])


def _operands(m: Match, cfg: HardwareConfig) -> str | None:
    if m.addend is not None:
        x, c = m.inputs[0], m.addend
        if x.shape != tuple(m.out_shape):
            return f"operand {x.shape} -> {m.out_shape}: the activation must not broadcast"
        if not c.qp.per_tensor:
            return f"constant addend has {c.qp.scale.size} scales (one scale/zero point needed)"
        if channel_addend(c.value, tuple(m.out_shape)) is None:
            return (f"constant addend of shape {c.shape} varies along more than the channel "
                    f"axis of {m.out_shape}")
        return None
    a, b = m.inputs
    if a.value is not None and b.value is not None:
        return "both operands are constants"
    if a.shape == b.shape == tuple(m.out_shape):
        return None
    full, other = _ordered(m)
    if full.shape != tuple(m.out_shape):
        return (f"operands {a.shape} + {b.shape} -> {m.out_shape}: two activations need one "
                f"of the output's shape")
    d = broadcast_dims(full.shape, other.shape)
    return d if isinstance(d, str) else None


def wide(m: Match) -> bool:
    """An int16 operand (its multiplier keeps WIDE_ADD_MULT_BITS)."""
    return any(op.qp.dtype == "int16" for op in m.inputs)


def mult_bits(m: Match) -> tuple[int, int]:
    """Bits each operand's multiplier may take: ADD_MULT_BITS for an int8 one,
    WIDE_ADD_MULT_BITS for an int16 one (a constant addend is int8)."""
    ops = list(m.inputs) + ([m.addend] if m.addend is not None else [])
    return tuple(WIDE_ADD_MULT_BITS if op.qp.dtype == "int16" else ADD_MULT_BITS
                 for op in ops)


def _wide_operands(m: Match, cfg: HardwareConfig) -> str | None:
    """int16 operands: two activations of the output's shape (a residual add), and rescale
    factors below 2**WIDE_ADD_MULT_BITS."""
    if not wide(m):
        return None
    if m.addend is not None or any(op.value is not None for op in m.inputs) or \
            any(op.shape != tuple(m.out_shape) for op in m.inputs):
        return (f"an int16 operand is added only to another activation of the same shape "
                f"(a residual add), got {[op.shape for op in m.inputs]} -> {m.out_shape}")
    for f, bits in zip(rescale_factors(m), mult_bits(m)):
        if f >= 2.0 ** bits:
            return (f"rescale factor {f:g} of an add operand is >= 2^{bits} (an int16 "
                    f"operand leaves {WIDE_ADD_MULT_BITS} bits for its multiplier)")
    return None


def _ordered(m: Match) -> tuple[Operand, Operand]:
    """(full operand, the other) of two activations: a broadcasting one goes second."""
    a, b = m.inputs
    return (b, a) if b.shape == tuple(m.out_shape) and a.shape != b.shape else (a, b)


def _add_params(m: Match) -> tuple[int, int, int]:
    return add_multipliers(*(float(f) for f in rescale_factors(m)), bits=mult_bits(m))


def add_multipliers(ra: float, rb: float, bits: tuple[int, int] = (ADD_MULT_BITS, ADD_MULT_BITS)
                    ) -> tuple[int, int, int]:
    """(a_mult, b_mult, n): the two real rescale factors as integers at a shared shift n,
    each below ``2**bits`` of its operand."""
    n = min(b - 1 - math.floor(math.log2(r)) for r, b in zip((ra, rb), bits))
    n = min(max(n, 0), sem.REQUANT_SHIFT_RANGE[1])
    return int(round(ra * 2 ** n)), int(round(rb * 2 ** n)), n


def _to_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    am, bm, n = _add_params(m)
    rq = Requant(np.array([1], np.int32), np.array([n], np.int32), int(m.out.zero_point[0]),
                 clip_bounds(m))
    if m.addend is not None:
        c = channel_addend(m.addend.value, tuple(m.out_shape)).astype(np.int64)
        bias = (c - int(m.addend.qp.zero_point[0])) * bm
        return BiasAdd(name, inputs[0], output, am, bias.astype(np.int32), rq)
    if _ordered(m)[0] is not m.inputs[0]:  # the broadcasting operand second
        return Add(name, inputs[1], inputs[0], output, bm, am, rq)
    return Add(name, inputs[0], inputs[1], output, am, bm, rq)


# ----------------------------------------------------------------------------- add_const
def _const_variants() -> list[tuple[str, DFPattern]]:
    return [(a or "plain", q(act(is_op("relax.add")(dq(), is_const()), a))) for a in ACTS]


def _read_const(r: Reader, root: Root) -> Match:
    """An activation plus a float constant (a mask the exporter left unquantized): the
    constant, clamped to where it can still change the output, gets an int8 grid of its own
    (zero point 0; a mask of 0 and one large negative value is exact on it)."""
    fused, body = r.activation(root.body)
    op = r.need(body, "relax.add")
    x = r.operand(op.args[0])
    real = const_value(r.value(op.args[1])).astype(np.float64)
    out = root.out
    sx, zx = float(x.qp.scale[0]), int(x.qp.zero_point[0])
    sy, zy = float(out.scale[0]), int(out.zero_point[0])
    lo = (sem.INT8_MIN - zy - 1) * sy - sx * (sem.INT8_MAX - zx)
    hi = (sem.INT8_MAX - zy + 1) * sy - sx * (sem.INT8_MIN - zx)
    clamped = np.clip(np.nan_to_num(real, nan=0.0, posinf=hi, neginf=lo), lo, hi)
    peak = float(np.abs(clamped).max()) if clamped.size else 0.0
    scale = np.float32(peak / 127 if peak > 0 else 1.0)
    codes = np.clip(np.round(clamped / float(scale)), -127, 127).astype(np.int8)
    qp = QParams(np.array([scale], np.float32), np.array([0]), -1, "int8")
    addend = Operand(op.args[1], qp, tuple(codes.shape), codes)
    return root.match("add_const", op, [x], addend=addend, act=fused)


def _const_operand(m: Match, cfg: HardwareConfig) -> str | None:
    if m.inputs[0].shape != tuple(m.out_shape):
        return f"operand {m.inputs[0].shape} -> {m.out_shape}: the activation must not broadcast"
    try:
        np.broadcast_to(m.addend.value, tuple(m.out_shape))
    except ValueError:
        return f"constant of shape {m.addend.shape} does not broadcast to {m.out_shape}"
    return None


def _const_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    am, cm, n = _add_params(m)
    rq = Requant(np.array([1], np.int32), np.array([n], np.int32), int(m.out.zero_point[0]),
                 clip_bounds(m))
    full = np.ascontiguousarray(np.broadcast_to(m.addend.value, tuple(m.out_shape)))
    return AddConst(name, inputs[0], output, am, cm, full.reshape(-1), rq)


KINDS = (Kind(
    "add_const", 401, _const_variants, _read_const,
    common_constraints(rescale_factors, limit=2.0 ** ADD_MULT_BITS) + [
        Constraint("operands", "one int8 activation and a float constant that broadcasts to "
                   "it (an attention mask)", _const_operand),
    ],
    _const_layer, "Add of a float constant tensor (attention mask)", "relax.add"), Kind(
    "add", 400, _variants, _read,
    common_constraints(rescale_factors, limit=2.0 ** ADD_MULT_BITS, wide_output=True,
                       wide_inputs=True) + [
        Constraint("operands", "two int8 activations of the same shape or one broadcasting "
                   "per channel (`[N, C, 1, 1]`), or one activation and a per-channel (or "
                   "scalar) constant", _operands),
        Constraint("wide", "int16 operands: two activations of the output's shape (a "
                   f"residual add), rescale factors < 2^{WIDE_ADD_MULT_BITS}", _wide_operands),
    ],
    _to_layer, "Add (residual, + Relu/Clip)", "relax.add"),)

"""mul: ``quantize(act(dq(a) * dq(b)))``.

* Two int8 activations (an SE channel gate ``x * gate``, SiLU's ``x * sigmoid(x)`` when
  the quantizer keeps them apart): ``y = requant((a - za) * (b - zb))`` with the factor
  ``s_a * s_b / s_y`` (:class:`~dsa_tvm.layers.ir.Mul`); one operand may broadcast to
  the other with all its channels (``[N, C, 1, 1]`` against ``[N, C, H, W]``).
* One activation times (or divided by) a per-channel or scalar constant, int8 behind a
  dequantize or float (a layer scale, ``clip(x, 0, 6) / 6``): a
  :class:`~dsa_tvm.layers.ir.Rescale` whose per-channel REQUANT factor is
  ``s_a * c[ch] / s_y``, negative or zero factors included (the multiplier carries the
  sign).

The product of two activations may be quantized to int16 (an LLM's SiLU-gate product
``silu(gate) * up`` on a wide grid): REQUANT's wide mode and an ACC16 store; its operands
may be int16 too (ACC16 loads: the SiLU and up's output on int16 grids), and a fused
ReLU/Clip on it stays on the CPU (the wide mode clamps to int16 only). A product with a
constant reads and writes int8 only.
"""

from __future__ import annotations

import numpy as np
from tvm.relax.dpl import DFPattern, is_const, is_op

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers.ir import Layer, Mul, QTensor, Requant, Rescale
from dsa_tvm.layers.layouts import broadcast_dims

from .common import Constraint, common_constraints
from .match import Match, NotAMatch, Operand, QParams, Reader, Root, shape_of
from .scales import channel_addend, clip_bounds, requant
from .spec import ACTS, Kind, act, dq, q

_MUL = "relax.multiply"
_DIV = "relax.divide"   # by a constant: a product with its reciprocal (``clip(x, 0, 6) / 6``)


def _variants() -> list[tuple[str, DFPattern]]:
    out = []
    for a in ACTS:
        name = a or "plain"
        out.append((name, q(act(is_op(_MUL)(dq(), dq()), a))))
        out.append((f"const+{name}", q(act(is_op(_MUL)(dq(), is_const()), a))))
        out.append((f"const_first+{name}", q(act(is_op(_MUL)(is_const(), dq()), a))))
        out.append((f"div+{name}", q(act(is_op(_DIV)(dq(), is_const()), a))))
    return out


def _float_const(r: Reader, expr) -> Operand:
    """A float constant operand (real values; qparams of the identity)."""
    e = r.value(expr)
    value = getattr(e, "value", None)
    if value is None or not hasattr(value, "numpy"):
        raise NotAMatch("expected a dequantize or a constant")
    return Operand(e, QParams(np.ones(1, np.float32), np.zeros(1, np.int64), -1, "float32"),
                   shape_of(e), value.numpy().astype(np.float64))


def _read(r: Reader, root: Root) -> Match:
    fused, body = r.activation(root.body)
    op = r.need(body, _MUL, _DIV)
    if op.op.name == _DIV:
        c = _float_const(r, op.args[1]) if r.call(op.args[1], "relax.dequantize") is None \
            else r.operand(op.args[1])
        return root.match("mul", op, [r.operand(op.args[0])], weight=c, act=fused)
    ops = []
    for arg in op.args:
        ops.append(r.operand(arg) if r.call(arg, "relax.dequantize") is not None
                   else _float_const(r, arg))
    consts = [o for o in ops if o.value is not None]
    if len(consts) == 1:  # activation x constant (a layer scale)
        return root.match("mul", op, [o for o in ops if o.value is None], weight=consts[0],
                          act=fused)
    return root.match("mul", op, ops, act=fused)


def _real_const(c: Operand) -> np.ndarray:
    """The constant's real values (its integers dequantized, per axis if it has one)."""
    if c.qp.dtype == "float32":
        return c.value
    v = c.value.astype(np.float64)
    s, z = c.qp.scale.astype(np.float64), c.qp.zero_point.astype(np.float64)
    if s.size > 1 or z.size > 1:
        shape = [1] * v.ndim
        shape[c.qp.axis % v.ndim] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    return (v - z) * s


def channel_factors(m: Match) -> np.ndarray | None:
    """Per channel ``s_a * c / s_y`` of an activation x constant match (None if the
    constant varies along more than the channel axis)."""
    c = _real_const(m.weight)
    if m.op_name == _DIV:
        if np.any(c == 0):
            return None
        c = 1.0 / c
    c = channel_addend(c, tuple(m.out_shape))
    if c is None:
        return None
    return float(m.inputs[0].qp.scale[0]) * c / float(m.out.scale[0])


def rescale_factors(m: Match) -> np.ndarray:
    """The magnitudes REQUANT must represent (a zero factor needs none)."""
    s_out = float(m.out.scale[0])
    if m.weight is None:
        return np.array([float(m.inputs[0].qp.scale[0]) * float(m.inputs[1].qp.scale[0]) / s_out])
    f = channel_factors(m)
    f = np.abs(f[f != 0]) if f is not None else np.zeros(0)
    return f if f.size else np.ones(1)


def _operands(m: Match, cfg: HardwareConfig) -> str | None:
    if m.weight is not None:
        x = m.inputs[0]
        if x.shape != tuple(m.out_shape):
            return f"operand {x.shape} -> {m.out_shape}: the activation must not broadcast"
        if channel_factors(m) is None:
            return (f"constant factor of shape {m.weight.shape} varies along more than the "
                    f"channel axis of {m.out_shape} (or divides by zero)")
        return None
    if len(m.inputs) != 2:
        return "both operands are constants"
    a, b = _ordered(m)
    if a.shape != tuple(m.out_shape):
        return f"operands {a.shape} * {b.shape} -> {m.out_shape}: neither has the output's shape"
    d = broadcast_dims(a.shape, b.shape)
    return d if isinstance(d, str) else None


def _wide_output(m: Match, cfg: HardwareConfig) -> str | None:
    """An int16 output or operand is the product of two activations' (the binary room's
    ACC16 loads and store); a product with a constant (a Rescale) reads and writes int8."""
    if m.weight is not None and "int16" in {m.out.dtype, *(o.qp.dtype for o in m.inputs)}:
        return ("int16 codes are read and written by the product of two activations only, "
                "not by a product with a constant")
    return None


def _ordered(m: Match) -> tuple[Operand, Operand]:
    """(full operand, the other): the first operand that has the output's shape first."""
    a, b = m.inputs
    return (b, a) if b.shape == tuple(m.out_shape) and a.shape != b.shape else (a, b)


def _signed_requant(f: np.ndarray, m: Match) -> Requant:
    """Per-channel REQUANT of real factors of any sign (the multiplier carries it)."""
    mult, shift = np.zeros(f.size, np.int32), np.zeros(f.size, np.int32)
    for i, v in enumerate(f):
        if v != 0:
            mm, ss = sem.quantize_multiplier(abs(float(v)))
            mult[i], shift[i] = (mm if v > 0 else -mm), ss
    return Requant(mult, shift, int(m.out.zero_point[0]), clip_bounds(m))


def _to_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    if m.weight is not None:
        return Rescale(name, inputs[0], output, _signed_requant(channel_factors(m), m))
    a, b = inputs
    if _ordered(m)[0] is not m.inputs[0]:
        a, b = b, a
    return Mul(name, a, b, output, requant(rescale_factors(m), m))


KINDS = (Kind(
    "mul", 450, _variants, _read,
    common_constraints(rescale_factors, wide_output=True, wide_inputs=True) + [
        Constraint("operands", "two int8 (or int16) activations, one of the output's shape and "
                   "the other "
                   "the same or broadcasting per channel (`[N, C, 1, 1]`), or one activation and "
                   "a per-channel (or scalar) constant", _operands),
        Constraint("wide", "int16 operands and output only for the product of two "
                   "activations (ACC16 loads; REQUANT's wide mode, an ACC16 store)",
                   _wide_output),
    ],
    _to_layer, "Mul (SE gate, x * sigmoid(x), layer scale), Div by a constant; + Relu/Clip", _MUL),)

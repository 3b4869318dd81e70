"""softmax, layer_norm, rms_norm: row operations over the last axis (the [norm] units), int8
codes out (int16 when the output is an int16 tensor: NORM's ``out_wide``).

* softmax ``quantize(softmax(dq(x), axis=-1))``;
* layer_norm ``quantize(layer_norm(dq(x), gamma, beta))`` (TVM's ONNX importer for
  LayerNormalization) or decomposed as GPT-2 / BERT exports give it:
  ``d = x - mean(x)``, ``d / sqrt(mean(d**2) + eps)`` (or ``d * rsqrt(...)``), ``* gamma + beta``;
* rms_norm (Llama): ``x / sqrt(mean(x**2) + eps)`` (or ``x * rsqrt(...)``, or
  ``x * (1 / sqrt(...))`` as ``torch.rsqrt`` exports), ``* weight``.

Gamma, beta and the weight are float constants (or dequantized ones); their folding
into integers is :func:`dsa_tvm.layers.intnorm.norm_params` (and ``softmax_params``),
whose ValueError becomes the ``fold`` constraint's reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.layers import intnorm as inn
from dsa_tvm.layers.ir import Layer, LayerNorm, QTensor, RMSNorm, Softmax

from .common import Constraint, common_constraints
from .dense import as_rows
from .match import Match, NotAMatch, Reader, Root, const_value
from .spec import Kind, dq, q


@dataclass
class NormMatch(Match):
    """A match plus the float constants the norm folds (``None``: absent)."""

    gamma: np.ndarray | None = None
    beta: np.ndarray | None = None
    eps: float = 0.0


#: why a norm's normalized tensor and its statistics must be one (dequantized) tensor
_STATS = "the normalized tensor and its statistics are different tensors"


def _op(name: str, *args: DFPattern) -> DFPattern:
    return is_op(name)(*args)


def _square(x: Callable[[], DFPattern]) -> DFPattern:
    return _op("relax.power", x(), is_const()) | _op("relax.multiply", x(), x())


def _normalized(x: Callable[[], DFPattern]) -> DFPattern:
    """``x / sqrt(mean(x**2) + eps)`` or ``x * rsqrt(mean(x**2) + eps)``. ``x`` makes the
    pattern of each use: the partitioner gives every reader of an int8 tensor its own
    dequantize, so the uses are separate dequantizes of one tensor (the read checks it)."""
    den = _op("relax.add", _op("relax.mean", _square(x)), is_const())
    x = x()
    return (_op("relax.divide", x, _op("relax.sqrt", den))
            | _op("relax.multiply", x, _op("relax.rsqrt", den))
            | _op("relax.multiply", x, _op("relax.divide", is_const(), _op("relax.sqrt", den))))


def _param() -> DFPattern:
    """gamma, beta, the weight: a float constant or a dequantized one, inside the composite
    (so the region function carries it, not a parameter the host would pass)."""
    return is_const() | dq(is_const())


def _scaled(body: DFPattern) -> DFPattern:
    w = _param()
    return _op("relax.multiply", body, w) | _op("relax.multiply", w, body)


# ----------------------------------------------------------------------------- reading
def _floats(r: Reader, expr: relax.Expr) -> np.ndarray:
    """A float constant, or a dequantized integer one, as float64."""
    dqc = r.call(expr, "relax.dequantize")
    if dqc is not None:
        qp = r.qparams(dqc)
        v = const_value(r.value(dqc.args[0])).astype(np.float64)
        return (v - qp.zero_point.astype(np.float64)) * qp.scale.astype(np.float64)
    return const_value(r.value(expr)).astype(np.float64)


def _scalar(r: Reader, expr: relax.Expr) -> float:
    v = _floats(r, expr)
    if v.size != 1:
        raise NotAMatch(f"expected a scalar constant, got shape {v.shape}")
    return float(v.reshape(-1)[0])


def _norm_match(root: Root, kind: str, op: relax.Call, x, **kw) -> NormMatch:
    return NormMatch(kind, op, [x], root.out, root.out_shape, root.q, **kw)


def _read_normalized(r: Reader, body: relax.Expr) -> tuple[relax.Call, relax.Expr, float]:
    """(the divide/multiply, its numerator, eps) of ``x / sqrt(mean(x**2) + eps)``."""
    top = r.need(body, "relax.divide", "relax.multiply")
    recip = r.call(top.args[1], "relax.divide") if top.op.name == "relax.multiply" else None
    if recip is not None:  # x * (1 / sqrt(...)): torch.rsqrt as exported
        if _scalar(r, recip.args[0]) != 1.0:
            raise NotAMatch("x * (c / sqrt(...)) with c other than 1")
        root = r.need(recip.args[1], "relax.sqrt")
    else:
        root = r.need(top.args[1], "relax.sqrt", "relax.rsqrt")
        if (top.op.name == "relax.divide") != (root.op.name == "relax.sqrt"):
            raise NotAMatch("x / sqrt or x * rsqrt expected")
    add = r.need(root.args[0], "relax.add")
    mean = r.need(add.args[0], "relax.mean")
    sq = r.need(mean.args[0], "relax.power", "relax.multiply")
    if sq.op.name == "relax.power" and _scalar(r, sq.args[1]) != 2.0:
        raise NotAMatch("power with an exponent other than 2")
    r.same_tensor(top.args[0], sq.args[0], _STATS)
    if sq.op.name == "relax.multiply":
        r.same_tensor(sq.args[0], sq.args[1], _STATS)
    _last_axis(mean)
    return top, top.args[0], _scalar(r, add.args[1])


def _split_scale(r: Reader, body: relax.Expr) -> tuple[np.ndarray | None, relax.Expr]:
    """(the constant factor, the other operand) of ``body * w`` / ``w * body``; (None, body)."""
    mul = r.call(body, "relax.multiply")
    if mul is not None:
        for i in (1, 0):
            try:
                w = _floats(r, mul.args[i])
            except NotAMatch:
                continue
            return w, mul.args[1 - i]
    return None, body


def _last_axis(op: relax.Call) -> None:
    raw = op.attrs.axis if hasattr(op.attrs, "axis") else op.attrs.axes
    try:
        axes = [] if raw is None else [int(a) for a in raw]
    except TypeError:
        axes = [int(raw)]
    rank = len(op.args[0].ty.shape)
    if len(axes) != 1 or axes[0] % rank != rank - 1:
        raise NotAMatch(f"{op.op.name} over axes {axes}, not the last axis")


def _read_softmax(r: Reader, root: Root) -> Match:
    op = r.need(root.body, "relax.nn.softmax")
    _last_axis(op)
    return _norm_match(root, "softmax", op, r.operand(op.args[0]))


def _read_layer_norm(r: Reader, root: Root) -> Match:
    op = r.call(root.body, "relax.nn.layer_norm")
    if op is not None:
        if not (op.attrs.center and op.attrs.scale):
            raise NotAMatch("layer_norm without center or scale")
        _last_axis(op)
        return _norm_match(root, "layer_norm", op, r.operand(op.args[0]),
                           gamma=_floats(r, op.args[1]), beta=_floats(r, op.args[2]),
                           eps=float(op.attrs.epsilon))
    add = r.need(root.body, "relax.add")
    beta = _floats(r, add.args[1])
    gamma, body = _split_scale(r, add.args[0])
    top, d, eps = _read_normalized(r, body)
    sub = r.need(d, "relax.subtract")
    mean = r.need(sub.args[1], "relax.mean")
    _last_axis(mean)
    r.same_tensor(mean.args[0], sub.args[0], _STATS)
    x = r.operand(sub.args[0])
    return _norm_match(root, "layer_norm", top, x, gamma=gamma if gamma is not None else 1.0,
                       beta=beta, eps=eps)


def _read_rms_norm(r: Reader, root: Root) -> Match:
    w, body = _split_scale(r, root.body)
    try:
        top, x, eps = _read_normalized(r, body)
    except NotAMatch:
        if w is None:
            raise
        top, x, eps = _read_normalized(r, root.body)  # the multiply was x * rsqrt
        w = None
    return _norm_match(root, "rms_norm", top, r.operand(x), gamma=1.0 if w is None else w,
                       eps=eps)


# ----------------------------------------------------------------------------- patterns
def _softmax_variants() -> list[tuple[str, DFPattern]]:
    return [("plain", q(_op("relax.nn.softmax", dq())))]


def _layer_norm_variants() -> list[tuple[str, DFPattern]]:
    d = _op("relax.subtract", dq(), _op("relax.mean", dq()))
    return [("fused", q(_op("relax.nn.layer_norm", dq(), _param(), _param()))),
            ("decomposed", q(_op("relax.add", _scaled(_normalized(lambda: d)), _param())))]


def _rms_norm_variants() -> list[tuple[str, DFPattern]]:
    return [("weighted", q(_scaled(_normalized(dq)))), ("plain", q(_normalized(dq)))]


# ----------------------------------------------------------------------------- layers
def _params(m: NormMatch):
    s_in, s_out = float(m.inputs[0].qp.scale[0]), float(m.out.scale[0])
    zp_out = int(m.out.zero_point[0])
    if m.kind == "softmax":
        return inn.softmax_params(s_in, s_out, zp_out)
    n = int(m.inputs[0].shape[-1])
    return inn.norm_params(n, s_in, m.eps, m.gamma, m.beta, s_out, zp_out,
                           m.kind == "layer_norm", m.out.dtype == "int16")


def _fold(m: Match, cfg: HardwareConfig) -> str | None:
    try:
        _params(m)
    except ValueError as e:
        return str(e)
    return None


def _same_shape(m: Match, cfg: HardwareConfig) -> str | None:
    if tuple(m.inputs[0].shape) != tuple(m.out_shape):
        return f"output shape {m.out_shape} differs from input {m.inputs[0].shape}"
    return None


_TYPES = {"softmax": Softmax, "layer_norm": LayerNorm, "rms_norm": RMSNorm}


def _to_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    """The layer over rows of the last axis (a 4-D tensor, an NCHW image on the DSA, as
    the (rows, n) matrix: the same elements in the channels-last layout)."""
    return _TYPES[m.kind](name, as_rows(inputs[0]), as_rows(output), _params(m))


def _constraints(wide_inputs: bool = False) -> list[Constraint]:
    """``wide_inputs``: the norms read int16 rows too (a wide residual stream, NORM's
    ``in_wide``). Every kind may write int16 codes (NORM's ``out_wide``: attention
    probabilities on a grid finer than 1/256)."""
    base = [c for c in common_constraints(lambda m: np.array([1.0]), wide_output=True,
                                          wide_inputs=wide_inputs)
            if c.name in ("dtypes", "per_tensor_activations", "positive_scales")]
    return base + [
        Constraint("same_shape", "output shape = input shape", _same_shape),
        Constraint("fold", f"rows of 1..{inn.MAX_ROW} elements; scales, eps, gamma and beta "
                   "fold into the norm unit's integers (`dsa_tvm.layers.intnorm`)", _fold),
    ]


KINDS = (
    Kind("softmax", 660, _softmax_variants, _read_softmax, _constraints(), _to_layer,
         "Softmax over the last axis", "relax.nn.softmax"),
    Kind("layer_norm", 655, _layer_norm_variants, _read_layer_norm, _constraints(True), _to_layer,
         "LayerNormalization over the last axis (fused or decomposed)", "relax.nn.layer_norm"),
    Kind("rms_norm", 650, _rms_norm_variants, _read_rms_norm, _constraints(True), _to_layer,
         "RMSNorm as exported: Pow, ReduceMean, Add(eps), Sqrt, Div, Mul(weight)", "relax.sqrt"),
)

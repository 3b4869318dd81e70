"""dense: ``quantize(act(matmul(dq(x), dq(W) | permute_dims(dq(W))) [+ dq(bias)]))``.

The weight is a constant ``[K, N]`` (or ``[N, K]`` under ``permute_dims``); the input
has rank >= 2 and is read as rows of its last axis. REQUANT factors as conv2d's:
``M[n] = s_in * s_w[n] / s_out``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from tvm import relax
from tvm.ir.expr import GenericConst
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa.formats import DRAM_SIZE_BITS
from dsa_tvm.layers.ir import Dense, Layer, QTensor

from .common import MAX_DMA, Constraint, common_constraints
from .dense_planes import byte_plane_layers, plane_lo_shift
from .match import LoweringError, Match, NotAMatch, Operand, Reader, Root, shape_of
from .scales import int32_bias, requant
from .spec import ACTS, Kind, act, dq, q, variant_name
from .weights import weight_constraints


def merged_heads() -> DFPattern:
    """permute_dims then reshape (attention's head merge), a permute_dims alone, or a
    reshape alone of an attention matmul's output (the head merge of one token, where the
    transpose moves an axis of extent 1)."""
    x = is_op("relax.permute_dims")(wildcard())
    return is_op("relax.reshape")(x, wildcard()) | x | is_op("relax.reshape")(wildcard(),
                                                                           wildcard())


def _attention_output(r: Reader, expr) -> bool:
    """``quantize(matmul(dq(a), dq(b)))`` of two activations: rows, never an NCHW image
    (inside a composite its input is a parameter: the partitioner checked it already)."""
    if isinstance(r.value(expr), relax.Var):
        return True
    qz = r.call(expr, "relax.quantize")
    mm = r.call(qz.args[0], "relax.matmul") if qz is not None else None
    return mm is not None and all(r.call(a, "relax.dequantize") is not None
                                  and not isinstance(r.value(r.call(a, "relax.dequantize")
                                                             .args[0]), GenericConst)
                                  for a in mm.args)


def _pattern(bias: bool, act_name: str | None, flat: bool = False,
             merged: bool = False) -> DFPattern:
    w = dq(is_const())
    x = (dq(is_op("relax.reshape")(wildcard(), wildcard())) if flat
         else dq(merged_heads()) if merged else dq())
    mm = is_op("relax.matmul")(x, w | is_op("relax.permute_dims")(w))
    if bias:
        mm = is_op("relax.add")(mm, dq(is_const()))
    return q(act(mm, act_name))


def _variants(flat: bool = False) -> list[tuple[str, DFPattern]]:
    return [(variant_name(bias, a), _pattern(bias, a, flat)) for bias in (True, False)
            for a in ACTS]


def _merged_variants() -> list[tuple[str, DFPattern]]:
    return [(variant_name(bias, None), _pattern(bias, None, merged=True))
            for bias in (True, False)]


def _flat_input(r: Reader, dq_expr) -> Operand:
    """A flatten ``reshape(x)`` of an (N, C, 1, 1) image to (N, C), read as ``x`` itself: its
    channel-blocked bytes are the rows of (N, C) (a view, no copy)."""
    dq_call = r.need(dq_expr, "relax.dequantize")
    rs = r.need(dq_call.args[0], "relax.reshape")
    src, flat = shape_of(rs.args[0]), shape_of(rs)
    if len(src) != 4 or src[2:] != (1, 1) or flat != src[:2]:
        raise NotAMatch(f"reshape {src} -> {flat} before a dense is not a flatten of 1x1 "
                        f"pixels (only those are a view of the same bytes)")
    return Operand(rs.args[0], r.qparams(dq_call), flat)


def check_head_merge(r: Reader, x: Operand) -> None:
    """NotAMatch unless ``x`` arrives through attention's head merge."""
    if not x.moves:
        raise NotAMatch("no head merge before the dense")
    if len(x.moves) == 1 and x.moves[0][1] == tuple(range(len(x.moves[0][1]))) \
            and not _attention_output(r, x.expr):
        raise NotAMatch("a reshape alone before a dense is a head merge only after an "
                        "attention matmul")


def _read(r: Reader, root: Root, flat: bool = False, merged: bool = False) -> Match:
    fused, body = r.activation(root.body)
    bias, body = r.bias_add(body)
    op = r.need(body, "relax.matmul")
    perm = r.call(op.args[1], "relax.permute_dims")
    w = r.operand(perm.args[0] if perm is not None else op.args[1])
    x = _flat_input(r, op.args[0]) if flat else r.operand(op.args[0], moves=merged)
    if merged:
        check_head_merge(r, x)
    kind = "dense_flat" if flat else "dense_merged" if merged else "dense"
    return root.match(kind, op, [x], weight=w,
                      weight_transposed=perm is not None, bias=bias, act=fused)


def rescale_factors(m: Match) -> np.ndarray:
    s_in, s_out = float(m.inputs[0].qp.scale[0]), float(m.out.scale[0])
    return s_in * m.weight.qp.scale.astype(np.float64) / s_out


def _shapes(m: Match, cfg: HardwareConfig) -> str | None:
    w = m.weight.shape
    if len(w) != 2 or len(m.inputs[0].shape) < 2:
        return f"dense needs a 2-D weight and an input of rank >= 2, got {m.inputs[0].shape} x {w}"
    n, k = (w[0], w[1]) if m.weight_transposed else (w[1], w[0])
    if ceil_div(k, cfg.block_in) > MAX_DMA or ceil_div(n, cfg.block_out) > MAX_DMA:
        return f"K={k} or N={n} blocks exceed the {DRAM_SIZE_BITS}-bit DMA size fields"
    return None


def _matmul_dtype(m: Match, cfg: HardwareConfig) -> str | None:
    od = str(m.op.attrs.out_dtype)
    if od not in ("", "void", "None", "float32"):
        return f"matmul out_dtype {od} (expected float32 QDQ arithmetic)"
    return None


#: a matmul's arithmetic is the QDQ float32 one (shared with batch_matmul)
MATMUL_DTYPE = Constraint("dtype", "float32 QDQ arithmetic", _matmul_dtype)


def as_rows(t: QTensor) -> QTensor:
    """A 4-D tensor (..., C) as the matrix (rows, C) a dense layer reads. The DSA takes
    every 4-D tensor for an NCHW image; a dense layer over the last axis of one
    (channels-last Linear) must see it as rows of C, as ranks 2, 3 and 5 already are."""
    if len(t.shape) != 4:
        return t
    rows = int(np.prod(t.shape[:-1], dtype=np.int64))
    return replace(t, shape=(rows, int(t.shape[-1])))


def _weight_nk(m: Match) -> np.ndarray:
    """The int8 weight as [N, K]."""
    w = m.weight.value.astype(np.int8)
    return w if m.weight_transposed else np.ascontiguousarray(w.T)


def _wide_input(m: Match, cfg: HardwareConfig) -> str | None:
    """An int16 input runs as two byte planes joined in the accumulator (``dense_planes``):
    symmetric, the joined sums within int32, the requantize's factors (``2**lo_shift``
    times the plain dense's) within REQUANT's range."""
    x = m.inputs[0].qp
    if x.dtype != "int16":
        return None
    if int(x.zero_point[0]) != 0:
        return f"an int16 input with zero point {int(x.zero_point[0])} (the planes need 0)"
    shift = plane_lo_shift(_weight_nk(m), int32_bias(m, m.out_shape[-1]))
    if shift is None:
        return "a byte-plane dense's sums pass int32 (the weights' rows sum too large)"
    big = (1 << shift) * float(np.max(rescale_factors(m)))
    if not big < 2.0 ** 31:
        return (f"the byte planes' requantize factor {big:g} (2^{shift} s_x s_w / s_y) is not "
                f"below 2^31 (output scale {float(m.out.scale[0]):g})")
    return None


def _to_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor
              ) -> Layer | tuple[Layer, ...]:
    w = _weight_nk(m)
    if inputs[0].dtype == "int16":
        bias = int32_bias(m, w.shape[0])
        shift = plane_lo_shift(w, bias)
        if shift is None:       # the wide_input constraint refuses these
            raise LoweringError(f"{name}: a byte-plane dense's sums pass int32 (unchecked)")
        return byte_plane_layers(name, as_rows(inputs[0]), as_rows(output), w, bias,
                                 requant((1 << shift) * rescale_factors(m), m), shift)
    return Dense(name, as_rows(inputs[0]), as_rows(output), w, int32_bias(m, w.shape[0]),
                 requant(rescale_factors(m), m))


_CONSTRAINTS = common_constraints(rescale_factors, wide_output=True,
                                  wide_inputs=True) + weight_constraints(
    channel_axis=lambda m: 0 if m.weight_transposed else 1,
    channels=lambda m: m.out_shape[-1],
    rows=lambda m, w: w if m.weight_transposed else w.T) + [
    Constraint("shapes", "2-D weight; ceil(K/block_in), ceil(N/block_out) within the DMA "
               "fields", _shapes),
    MATMUL_DTYPE,
    Constraint("wide_input", "an int16 input: zero point 0, run as two int8 byte planes "
               "joined in the accumulator", _wide_input),
]

KINDS = (
    Kind("dense_merged", 805, _merged_variants, lambda r, root: _read(r, root, merged=True),
         _CONSTRAINTS, _to_layer, "Transpose + Reshape (attention's head merge) + MatMul "
         "with constant B", "relax.matmul"),
    Kind("dense_flat", 801, lambda: _variants(flat=True), lambda r, root: _read(r, root, True),
         _CONSTRAINTS, _to_layer, "Flatten (of 1x1 pixels) + Gemm, MatMul with constant B",
         "relax.matmul"),
    Kind("dense", 800, _variants, _read, _CONSTRAINTS, _to_layer,
         "Gemm, MatMul with constant B (+ Relu/Clip)", "relax.matmul"),
)

"""grouped dense: ``quantize(act(matmul(dq(x), W) [+ b]))`` with ``W`` a float constant on a
per-group grid (a scale and an offset per group of input rows, GGUF Q4_1's form).

A QDQ graph cannot say "a scale and a minimum per 32 rows" with int8 codes and
DequantizeLinear, so the quantizer (``quantize_onnx(..., weight_group=32)``) leaves such a
weight in float32, rounded onto its grid, and this kind finds the grid again
(``layers.group_grid.find_grid``): exactly, so onnxruntime on the same graph is the
reference. A float weight on no grid stays on the CPU, named.
"""

from __future__ import annotations

import numpy as np
from tvm.relax.dpl import DFPattern, is_const, is_op

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.layers.group_grid import GRID_BITS, GRID_GROUPS, find_grid, grouped_dense
from dsa_tvm.layers.ir import GroupedDense, Layer, QTensor

from .common import Constraint, common_constraints
from .dense import MATMUL_DTYPE, as_rows, check_head_merge, merged_heads
from .match import (
    Match,
    NotAMatch,
    Operand,
    QParams,
    Reader,
    Root,
    const_value,
    qtensor,
    shape_of,
)
from .scales import clip_bounds
from .spec import ACTS, Kind, act, dq, q, variant_name


def _pattern(bias: bool, act_name: str | None, merged: bool = False) -> DFPattern:
    w = is_const()
    mm = is_op("relax.matmul")(dq(merged_heads()) if merged else dq(),
                               w | is_op("relax.permute_dims")(w))
    if bias:
        mm = is_op("relax.add")(mm, is_const())
    return q(act(mm, act_name))


def _variants(merged: bool = False) -> list[tuple[str, DFPattern]]:
    return [(variant_name(bias, a), _pattern(bias, a, merged)) for bias in (True, False)
            for a in (ACTS if not merged else (None,))]


def float_const(r: Reader, expr, what: str) -> Operand:
    value = const_value(r.value(expr))
    if value.dtype != np.float32:
        raise NotAMatch(f"{what} is {value.dtype}, not a float32 constant")
    return Operand(r.value(expr), QParams(np.ones(1, np.float32), np.zeros(1, np.int64), -1,
                                          "float32"), shape_of(expr), value)


def _read(r: Reader, root: Root, merged: bool = False) -> Match:
    fused, body = r.activation(root.body)
    add = r.call(body, "relax.add")
    bias = float_const(r, add.args[1], "the bias") if add is not None else None
    op = r.need(add.args[0] if add is not None else body, "relax.matmul")
    perm = r.call(op.args[1], "relax.permute_dims")
    w = float_const(r, perm.args[0] if perm is not None else op.args[1], "the weight")
    x = r.operand(op.args[0], moves=merged)
    if merged:
        check_head_merge(r, x)
    return root.match("grouped_dense_merged" if merged else "grouped_dense", op, [x],
                      weight=w, weight_transposed=perm is not None, bias=bias, act=fused)


def _weight_nk(m: Match) -> np.ndarray:
    w = m.weight.value
    return w if m.weight_transposed else np.ascontiguousarray(w.T)


def _on_grid(m: Match, cfg: HardwareConfig) -> str | None:
    w = m.weight.value
    if w.ndim != 2:
        return f"a {w.ndim}-D float weight (a grouped dense takes a 2-D one)"
    if find_grid(_weight_nk(m)) is None:
        return (f"the float32 weight {w.shape} is on no per-group grid ({' or '.join(map(str, GRID_BITS))} "
                f"bits, groups of {'/'.join(map(str, GRID_GROUPS))} input rows): quantize it "
                f"(quantize_onnx(..., weight_group=32)) or it stays on the CPU")
    n = _weight_nk(m).shape[0]
    if m.bias is not None and m.bias.value.size != n:
        return f"bias of {m.bias.value.size} values for {n} output channels"
    return None


def _layer(m: Match, name: str, inputs: list[QTensor], output: QTensor
           ) -> GroupedDense | tuple[Layer, GroupedDense]:
    grid = find_grid(_weight_nk(m))
    if grid is None:                   # the on_grid constraint refuses these
        raise NotAMatch(f"{name}: the weight is on no per-group grid")
    bias = None if m.bias is None else m.bias.value.reshape(-1).astype(np.float64)
    return grouped_dense(name, as_rows(inputs[0]), as_rows(output), grid, bias, clip_bounds(m))


def _wide_input(m: Match, cfg: HardwareConfig) -> str | None:
    x = m.inputs[0].qp
    if x.dtype == "int16" and int(x.zero_point[0]) != 0:
        return f"an int16 input with zero point {int(x.zero_point[0])} (the planes need 0)"
    return None


def _factors(m: Match) -> np.ndarray:
    """The requantize factor of the layer the match becomes (one accumulator unit over
    the output scale)."""
    made = _layer(m, "check", [qtensor("x", m.inputs[0].shape, m.inputs[0].qp)],
                  qtensor("y", m.out_shape, m.out))
    ly = made[-1] if isinstance(made, tuple) else made
    mult, shift = ly.requant.per_channel(ly.weight.shape[0])
    return mult.astype(np.float64) * 2.0 ** -shift.astype(np.float64)


_CONSTRAINTS = [
    Constraint("grid", "a float32 2-D weight on a per-group grid (4 or 8 bits, a scale and "
               "an offset per group of input rows; `layers.group_grid.find_grid`)", _on_grid),
    *common_constraints(_factors, wide_output=True, wide_inputs=True),
    Constraint("wide_input", "an int16 input: zero point 0, run as two int8 byte planes "
               "(`layers.ir.BytePlanes`) summed per group", _wide_input),
    MATMUL_DTYPE,
]

KINDS = (
    Kind("grouped_dense_merged", 795, lambda: _variants(merged=True),
         lambda r, root: _read(r, root, merged=True), _CONSTRAINTS, _layer,
         "Transpose + Reshape (attention's head merge) + MatMul with a float32 constant B "
         "on a per-group grid", "relax.matmul"),
    Kind("grouped_dense", 790, _variants, _read, _CONSTRAINTS, _layer,
         "MatMul with a float32 constant B on a per-group grid (int4 weights per group of "
         "input rows: GGUF Q4_1)", "relax.matmul"),
)

"""The activation table kind: an element-wise chain on one int8 tensor as one ALU LUT.

``relay_passes.table_chains`` (run by ``canonicalize.prepare``) has rewritten every
maximal chain ``quantize(f(dequantize(x)))`` (sigmoid, SiLU, hardswish, GELU, tanh, exp,
leaky ReLU, ...) into its exact canonical form, evaluated on the 256 codes by TVM's
llvm build::

    quantize(take(T, astype(round(dequantize(x) / s), "int32") + (z + 128)), s_out, z_out)

This kind matches that form and becomes a :class:`~dsa_tvm.layers.ir.Table` layer with
the 256 output codes ``round(T / s_out) + z_out`` (exact: ``T`` holds the codes' real
values). An int16 chain (65,536 entries, offset ``z + 32768``) becomes a
:class:`~dsa_tvm.layers.ir.WideTable`: a line per 256-code segment fitted to the exact
codes (``layers.wide_table``), kept on the CPU when the fit is further than
``MAX_ERROR_CODES`` from them anywhere (the constraint says how far). Priority 350:
below the array and pooling kinds and the residual add, above relu, clip and rescale;
the canonical form contains none of their patterns.
"""

from __future__ import annotations

import numpy as np
from tvm.relax.dpl import is_const, is_op

from dsa_tvm.layers import wide_table
from dsa_tvm.layers.ir import Layer, QTensor, Table, WideTable

from .common import Constraint, common_constraints
from .match import Match, NotAMatch, Reader, Root, const_value
from .spec import Kind, dq, q


def _pattern():
    idx = is_op("relax.divide")(dq(), is_const())
    idx = is_op("relax.add")(is_op("relax.astype")(is_op("relax.round")(idx)), is_const())
    return q(is_op("relax.take")(is_const(), idx))


def _read(r: Reader, root: Root) -> Match:
    take = r.need(root.body, "relax.take")
    add = r.need(take.args[1], "relax.add")
    cast = r.need(add.args[0], "relax.astype")
    rnd = r.need(cast.args[0], "relax.round")
    div = r.need(rnd.args[0], "relax.divide")
    x = r.operand(div.args[0])
    real = const_value(r.value(take.args[0])).reshape(-1)
    scale = const_value(r.value(div.args[1])).reshape(-1)
    off = const_value(r.value(add.args[1])).reshape(-1)
    wide = real.size == wide_table.CODES
    if (real.size != 256 and not wide) or scale.size != 1 or off.size != 1 \
            or x.qp.scale.size != 1 or (x.qp.dtype == "int16") != wide \
            or (root.out.dtype == "int16") != wide:
        raise NotAMatch("not the canonical table form")
    if np.float32(scale[0]) != np.float32(x.qp.scale[0]) or \
            int(off[0]) != int(x.qp.zero_point[0]) + real.size // 2:
        raise NotAMatch("the table index does not undo the dequantize")
    m = root.match("table", take, [x])
    s_out, z_out = np.float64(root.out.scale[0]), int(root.out.zero_point[0])
    bound = real.size // 2
    codes = np.clip(np.round(real.astype(np.float64) / s_out) + z_out, -bound, bound - 1)
    m.table = codes.astype(np.int16 if wide else np.int8)  # type: ignore[attr-defined]
    m.fit = wide_table.fit(codes) if wide else None  # type: ignore[attr-defined]
    return m


def _to_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    if m.fit is not None:
        f = m.fit
        return WideTable(name, inputs[0], output, f.base, f.slope, f.frac, f.error, "table")
    return Table(name, inputs[0], output, m.table, "table")


def _close_fit(m: Match, cfg) -> str | None:
    f = m.fit
    if f is not None and f.error > wide_table.MAX_ERROR_CODES:
        return (f"the int16 function's segment lines are {f.error} codes from it somewhere "
                f"(at most {wide_table.MAX_ERROR_CODES}): too curved for 256 segments")
    return None


def _same_shape(m: Match, cfg) -> str | None:
    if tuple(m.inputs[0].shape) != tuple(m.out_shape):
        return f"input {m.inputs[0].shape} and output {m.out_shape} differ"
    return None


KINDS = (
    Kind("table", 350, lambda: [("plain", _pattern())], _read,
         common_constraints(lambda m: np.ones(1), wide_output=True, wide_inputs=True)
         + [Constraint("same_shape", "one output code per input code", _same_shape),
            Constraint("wide_fit", "an int16 function within "
                       f"{wide_table.MAX_ERROR_CODES} codes of its segment lines", _close_fit)],
         _to_layer,
         "any element-wise chain on one int8 tensor (Sigmoid, SiLU, HardSwish, HardSigmoid, "
         "Gelu, Tanh, Exp, LeakyRelu, ...) between DequantizeLinear and QuantizeLinear "
         "(int16 to int16 too, interpolated)",
         "relax.take"),
)

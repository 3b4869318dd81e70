"""batch_matmul: ``quantize(matmul(dq(a), dq(b)))`` of two int8 activations.

Two kinds. ``batch_matmul_fused`` (second operand's zero point 0, as the quantizer plans
attention's K and V) joins the "dsa" regions: its operands may be made in
the region, through the head split's reshape/permute_dims (taken into the pattern and
made a Permute), and ``b`` is laid out as the array's weight tiles on the device
(``tir_schedules.kinds.permute``), so an attention block is one launch. Otherwise
``batch_matmul`` has its own codegen name (``HOST_PACKED``): MergeCompositeFunctions
never merges it with "dsa" layers, so both operands reach it from the host, which packs
them (``dsa_tvm.layers.host_pack``) with the zero-point terms. REQUANT factor
``M = s_a * s_b / s_out``; the DSA sees (B, M, K) x (B, K, N), the leading dimensions
flattened. One int16 operand (attention's probabilities, or K or V with their cache, on an
int16 grid) runs as two byte planes (``matmul_planes``), in the region only.
"""

from __future__ import annotations

import numpy as np
from tvm.relax.dpl import DFPattern, is_op

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa.formats import DRAM_SIZE_BITS
from dsa_tvm.layers.ir import BatchMatmul, Layer, QTensor

from .common import MAX_DMA, Constraint, common_constraints
from .dense import MATMUL_DTYPE
from .match import Match, Reader, Root, qtensor
from .matmul_planes import double_plane_layers, matmul_plane_layers, planes_fit
from .scales import clip_bounds, requant
from .spec import HOST_PACKED, Kind, dq, moved, q


def _variants() -> list[tuple[str, DFPattern]]:
    return [("plain", q(is_op("relax.matmul")(dq(), dq())))]


def _read(r: Reader, root: Root) -> Match:
    op = r.need(root.body, "relax.matmul")
    return root.match("batch_matmul", op, [r.operand(op.args[0]), r.operand(op.args[1])])


def _fused_variants() -> list[tuple[str, DFPattern]]:
    return [("moved", q(is_op("relax.matmul")(dq(moved()), dq(moved()))))]


def _read_fused(r: Reader, root: Root) -> Match:
    op = r.need(root.body, "relax.matmul")
    return root.match("batch_matmul_fused", op, [r.operand(op.args[0], moves=True),
                                                 r.operand(op.args[1], moves=True)])


def _zero_points(m: Match, cfg: HardwareConfig) -> str | None:
    zb = int(m.inputs[1].qp.zero_point[0])
    if zb:
        return (f"second operand zero point {zb} (the device corrects the first operand's "
                f"zero point with column sums of the second, which needs zero point 0 itself, "
                f"as the quantizer plans attention's K and V)")
    return None


def rescale_factors(m: Match) -> np.ndarray:
    s_in, s_out = float(m.inputs[0].qp.scale[0]), float(m.out.scale[0])
    return np.array([s_in * float(m.inputs[1].qp.scale[0]) / s_out])


def _shapes(m: Match, cfg: HardwareConfig) -> str | None:
    a, b = m.inputs
    if a.value is not None or b.value is not None:
        return "one operand is a constant (a dense layer whose weights failed the dense checks)"
    if (len(a.shape) < 3 or len(b.shape) != len(a.shape) or a.shape[:-2] != b.shape[:-2]
            or a.shape[-1] != b.shape[-2]):
        return (f"batch matmul needs (..., M, K) x (..., K, N) operands with the same leading "
                f"dimensions, got {a.shape} x {b.shape}")
    if ceil_div(a.shape[2], cfg.block_in) > MAX_DMA or ceil_div(b.shape[2], cfg.block_out) > MAX_DMA:
        return f"K or N blocks exceed the {DRAM_SIZE_BITS}-bit DMA size fields"
    return None


def _batched(t: QTensor) -> QTensor:
    """(..., R, C) as (B, R, C); the runtime reshapes the graph's tensors to match."""
    lead = int(np.prod(t.shape[:-2], dtype=np.int64))
    return QTensor(t.name, (lead,) + tuple(t.shape[-2:]), t.scale, t.zero_point, t.dtype)


def _to_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor
              ) -> Layer | tuple[Layer, ...]:
    a, b, y = (_batched(t) for t in (inputs[0], inputs[1], output))
    on_device = m.kind == "batch_matmul_fused"
    if a.dtype == b.dtype == "int16":
        return double_plane_layers(name, a, b, y, clip_bounds(m), on_device)
    if "int16" in (a.dtype, b.dtype):
        side = "a" if a.dtype == "int16" else "b"
        return matmul_plane_layers(name, a, b, y, clip_bounds(m), on_device, side)
    return BatchMatmul(name, a, b, y, requant(rescale_factors(m), m), on_device=on_device)


def _wide_input(m: Match, cfg: HardwareConfig) -> str | None:
    """An int16 operand runs as two byte planes (both int16: four plane products): zero
    point 0, the planes' add factors within an int16 operand's bits."""
    a, b = m.inputs
    wide = [op for op in (a, b) if op.qp.dtype == "int16"]
    if not wide:
        return None
    zps = [int(op.qp.zero_point[0]) for op in wide if int(op.qp.zero_point[0])]
    if zps:
        return f"an int16 operand with zero point {zps[0]} (the planes need 0)"
    ts = [qtensor(n, op.shape, op.qp) for n, op in (("a", a), ("b", b))]
    return planes_fit(*ts, qtensor("y", m.out_shape, m.out), clip_bounds(m))


_SHAPES = Constraint("shapes", "two int8 activations (..., M, K) x (..., K, N), same leading "
                     "dimensions (no broadcast)", _shapes)


KINDS = (
    Kind("batch_matmul_fused", 701, _fused_variants, _read_fused,
         common_constraints(rescale_factors, wide_output=True, wide_inputs=True) + [
             _SHAPES, MATMUL_DTYPE,
             Constraint("zero_points", "second operand has zero point 0", _zero_points),
             Constraint("wide_input", "int16 operands: zero point 0, run as int8 byte "
                        "planes", _wide_input),
         ],
         _to_layer, "MatMul of two activations made in the region (zero points 0; "
         "head split/merge reshape and transpose taken in)", "relax.matmul"),
    Kind("batch_matmul", 700, _variants, _read,
         common_constraints(rescale_factors) + [_SHAPES, MATMUL_DTYPE],
         _to_layer, "MatMul of two activations (host-packed operands)", "relax.matmul",
         codegen=HOST_PACKED),
)

"""What the DSA can run: one predicate per constraint, derived from a HardwareConfig.

Each layer kind has a list of :class:`Constraint`. A constraint's ``test``
returns None when the match satisfies it, else the reason (with the offending
numbers). :func:`check` runs them in order, so the partition report, the
FuseOpsByPattern check functions and the operator table (``optable.py``) all
come from these lists and cannot drift apart. Limits are never restated by
hand: they come from the config (scratchpad depths) and the ISA field widths.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa.formats import DRAM_SIZE_BITS, PAD_BITS, addr_bits
from dsa_tvm.layers.ir import QTensor
from dsa_tvm.lowering.region import lowering_supports

from .patterns import Match, Operand
from .scales import ADD_MULT_BITS, accumulator_bias, channel_addend, rescale_factors
from .to_layers import layer_from_match

MAX_PAD = (1 << PAD_BITS) - 1
MAX_DMA = (1 << DRAM_SIZE_BITS) - 1

Test = Callable[[Match, HardwareConfig], "str | None"]


@dataclass(frozen=True)
class Constraint:
    """One named DSA constraint; ``doc`` says it for the operator table (``{cfg}`` fields allowed)."""

    name: str
    doc: str
    test: Test


# ----------------------------------------------------------------------------- common


def _int8_tensors(m: Match, cfg: HardwareConfig) -> str | None:
    for i, op in enumerate(m.inputs):
        if op.qp.dtype != "int8":
            return f"input {i} is {op.qp.dtype}, the DSA's activations are {cfg.input_dtype}"
    if m.out.dtype != "int8":
        return f"output is quantized to {m.out.dtype}, the DSA stores {cfg.input_dtype}"
    return None


def _per_tensor(m: Match, cfg: HardwareConfig) -> str | None:
    for i, op in enumerate(m.inputs):
        if not op.qp.per_tensor:
            return f"input {i} has {op.qp.scale.size} scales (activations need one scale/zero point)"
    if not m.out.per_tensor:
        return f"output has {m.out.scale.size} scales (activations need one scale/zero point)"
    return None


def _positive_scales(m: Match, cfg: HardwareConfig) -> str | None:
    for qp, what in [(o.qp, f"input {i}") for i, o in enumerate(m.inputs)] + [(m.out, "output")]:
        if not np.all(qp.scale > 0):
            return f"{what} scale {qp.scale.tolist()} is not positive"
    return None


def _requant_range(m: Match, cfg: HardwareConfig) -> str | None:
    f = rescale_factors(m)
    if not np.all(f > 0):
        return f"rescale factor {f.min():g} is not positive"
    limit = 2.0 ** ADD_MULT_BITS if m.kind == "add" else 2.0 ** 31
    if f.max() >= limit:
        return f"rescale factor {f.max():g} (input/output scales) is >= {limit:g}"
    return None


def _activation(m: Match, cfg: HardwareConfig) -> str | None:
    if m.act is None:
        return None
    _, lo, hi = m.act
    if not lo <= hi or math.isnan(lo) or math.isnan(hi):
        return f"clip bounds [{lo}, {hi}] are empty"
    return None


COMMON = [
    Constraint("int8", "activations int8 (`{cfg.input_dtype}`), in and out", _int8_tensors),
    Constraint("per_tensor_activations", "one scale and zero point per activation tensor",
               _per_tensor),
    Constraint("positive_scales", "positive scales", _positive_scales),
    Constraint("requant_range", "input/output rescale factor representable by REQUANT "
               "(< 2^31; residual add < 2^21)", _requant_range),
    Constraint("activation", "fused ReLU/Clip with a non-empty range (folded into the REQUANT clip)",
               _activation),
]

# ----------------------------------------------------------------------------- weights


def _weights(channel_axis: Callable[[Match], int]) -> Test:
    def test(m: Match, cfg: HardwareConfig) -> str | None:
        w: Operand = m.weight
        if w.value is None:
            return "weights are not a constant"
        if w.qp.dtype != "int8":
            return f"weights are {w.qp.dtype}, the array takes {cfg.weight_dtype}"
        if np.any(w.qp.zero_point != 0):
            zps = sorted(set(w.qp.zero_point.tolist()))[:4]
            return f"weight zero point must be 0 (symmetric weights), got {zps}"
        if not np.all(w.qp.scale > 0):
            return "weight scales must be positive"
        if not w.qp.per_tensor:
            ax = channel_axis(m)
            if w.qp.axis % len(w.shape) != ax or w.qp.scale.size != w.shape[ax]:
                return (f"weight scales must be per tensor or per output channel (axis {ax}), "
                        f"got {w.qp.scale.size} scales on axis {w.qp.axis}")
        return None

    return test


def _bias(m: Match, cfg: HardwareConfig) -> str | None:
    b = m.bias
    if b is None:
        return None
    if b.value is None or b.qp.dtype != "int32":
        return f"bias must be an int32 constant, got {b.qp.dtype}"
    if np.any(b.qp.zero_point != 0):
        return "bias zero point must be 0"
    n = m.out_shape[1] if m.kind == "conv2d" else m.out_shape[-1]
    if b.value.size != n or not np.all(b.qp.scale > 0):
        return f"bias must have one int32 value per output channel ({n}), got shape {b.value.shape}"
    return _bias_range(m, n)


def _bias_range(m: Match, channels: int) -> str | None:
    """bias + the largest int8 x int8 sum must fit the int32 accumulator, which wraps."""
    if m.weight is None or m.weight.value is None:
        return None
    b = accumulator_bias(m, channels)
    w = np.abs(m.weight.value.astype(np.int64))
    w = w.reshape(w.shape[0], -1) if m.kind == "conv2d" else (w if m.weight_transposed else w.T)
    x_max = max(abs(-128 - int(m.inputs[0].qp.zero_point[0])), 127 - int(m.inputs[0].qp.zero_point[0]))
    peak = np.abs(b) + x_max * w.sum(1)
    c = int(np.argmax(peak))
    if peak[c] <= 2 ** 31 - 1:
        return None
    ratio = float(m.bias.qp.scale.reshape(-1)[c % m.bias.qp.scale.size]) / (
        float(m.inputs[0].qp.scale[0]) * float(m.weight.qp.scale.reshape(-1)[c % m.weight.qp.scale.size]))
    return (f"bias of channel {c} is {b[c]:.4g} in accumulator units (bias scale = {ratio:.4g} x "
            f"input scale x weight scale); with the largest int8 sum it reaches {peak[c]:.4g}, "
            "past the int32 accumulator (it would wrap)")


# ----------------------------------------------------------------------------- conv2d


def _conv_layout(m: Match, cfg: HardwareConfig) -> str | None:
    a = m.op.attrs
    lay = (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout))
    if lay != ("NCHW", "OIHW", "NCHW"):
        return f"layouts must be NCHW/OIHW/NCHW, got {'/'.join(lay)}"
    return None


def _conv_groups(m: Match, cfg: HardwareConfig) -> str | None:
    g = int(m.op.attrs.groups)
    cin, cout = m.inputs[0].shape[1], m.out_shape[1]
    if g == 1 or (g == cin == cout):
        return None
    return f"groups={g} with {cin}->{cout} channels: only groups=1 or depthwise (groups=C_in=C_out)"


def _pads(m: Match, cfg: HardwareConfig) -> str | None:
    pads = [int(p) for p in m.op.attrs.padding]
    if max(pads) > MAX_PAD:
        return f"padding {pads} exceeds the {PAD_BITS}-bit LOAD pad fields (max {MAX_PAD})"
    return None


def _kernel_hw(m: Match) -> tuple[int, int]:
    if m.kind == "conv2d":
        return m.weight.shape[2], m.weight.shape[3]
    kh, kw = (int(v) for v in m.op.attrs.pool_size)
    return kh, kw


def _strides(m: Match, cfg: HardwareConfig) -> str | None:
    limit = (1 << addr_bits(cfg.inp_depth)) - 1
    st = [int(s) for s in m.op.attrs.strides]
    if min(st) < 1 or max(st) > limit:
        return f"strides {st} outside 1..{limit} (GEMM input-stride field, {addr_bits(cfg.inp_depth)} bits)"
    return None


def _dilation_one(m: Match, cfg: HardwareConfig) -> str | None:
    d = [int(v) for v in m.op.attrs.dilation]
    if d != [1, 1]:
        return f"dilation {d}: pooling windows must be dense"
    return None


def _image_dma(m: Match, cfg: HardwareConfig) -> str | None:
    _, c, h, w = m.inputs[0].shape
    _, oc, oh, ow = m.out_shape
    pitch_in = w * ceil_div(c, cfg.block_in)
    pitch_out = ow * ceil_div(oc, cfg.block_out)
    if max(pitch_in, pitch_out, h, oh) > MAX_DMA:
        return (f"image row pitch {max(pitch_in, pitch_out)} elements or height {max(h, oh)} "
                f"exceeds the {DRAM_SIZE_BITS}-bit DMA size/stride fields (max {MAX_DMA})")
    return None


def _conv_tile(m: Match, cfg: HardwareConfig) -> str | None:
    kh, kw = _kernel_hw(m)
    if kh * kw > cfg.inp_depth or kh * kw > cfg.wgt_depth:
        return (f"a one-pixel tile of the {kh}x{kw} kernel needs {kh * kw} input rows and weight "
                f"tiles; the scratchpads hold {cfg.inp_depth} rows / {cfg.wgt_depth} tiles")
    return None


def _pool_tile(m: Match, cfg: HardwareConfig) -> str | None:
    kh, kw = _kernel_hw(m)
    if kh * kw + 2 > cfg.acc_depth:
        return (f"a {kh}x{kw} window needs {kh * kw + 2} accumulator rows; "
                f"the accumulator holds {cfg.acc_depth}")
    return None


CONV2D = COMMON + [
    Constraint("weights", "int8 constant weights, zero point 0, per-tensor or per-output-channel "
               "scales", _weights(lambda m: 0)),
    Constraint("bias", "optional int32 constant bias, zero point 0, one per output channel; "
               "in accumulator units plus the largest int8 sum within int32", _bias),
    Constraint("layout", "NCHW data, OIHW kernel", _conv_layout),
    Constraint("groups", "groups = 1 or depthwise (groups = C_in = C_out)", _conv_groups),
    Constraint("padding", f"padding <= {MAX_PAD} per side (LOAD pad fields, {PAD_BITS} bits)", _pads),
    Constraint("strides", "strides < 2^(input address bits)", _strides),
    Constraint("dma", f"W*ceil(C/block_in) and H <= {MAX_DMA} (16-bit DMA fields)", _image_dma),
    Constraint("tile", "KH*KW <= {cfg.inp_depth} input rows and <= {cfg.wgt_depth} weight tiles "
               "(one-pixel tile)", _conv_tile),
]

# ----------------------------------------------------------------------------- matmuls


def _dense_shapes(m: Match, cfg: HardwareConfig) -> str | None:
    w = m.weight.shape
    if len(w) != 2 or len(m.inputs[0].shape) < 2:
        return f"dense needs a 2-D weight and an input of rank >= 2, got {m.inputs[0].shape} x {w}"
    n, k = (w[0], w[1]) if m.weight_transposed else (w[1], w[0])
    if ceil_div(k, cfg.block_in) > MAX_DMA or ceil_div(n, cfg.block_out) > MAX_DMA:
        return f"K={k} or N={n} blocks exceed the {DRAM_SIZE_BITS}-bit DMA size fields"
    return None


def _bmm_shapes(m: Match, cfg: HardwareConfig) -> str | None:
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


def _matmul_dtype(m: Match, cfg: HardwareConfig) -> str | None:
    od = str(m.op.attrs.out_dtype)
    if od not in ("", "void", "None", "float32"):
        return f"matmul out_dtype {od} (expected float32 QDQ arithmetic)"
    return None


def _dense_weight_axis(m: Match) -> int:
    return 0 if m.weight_transposed else 1


DENSE = COMMON + [
    Constraint("weights", "int8 constant weights, zero point 0, per-tensor or per-output-channel "
               "scales", _weights(_dense_weight_axis)),
    Constraint("bias", "optional int32 constant bias, zero point 0, one per output channel; "
               "in accumulator units plus the largest int8 sum within int32", _bias),
    Constraint("shapes", "2-D weight; ceil(K/block_in), ceil(N/block_out) within the DMA fields",
               _dense_shapes),
    Constraint("dtype", "float32 QDQ arithmetic", _matmul_dtype),
]

BATCH_MATMUL = COMMON + [
    Constraint("shapes", "two int8 activations (..., M, K) x (..., K, N), same leading "
               "dimensions (no broadcast)", _bmm_shapes),
    Constraint("dtype", "float32 QDQ arithmetic", _matmul_dtype),
]

# ----------------------------------------------------------------------------- pools


def _pool_attrs(m: Match, cfg: HardwareConfig) -> str | None:
    a = m.op.attrs
    if str(a.layout) != "NCHW" or str(a.out_layout or a.layout) != "NCHW":
        return f"layout must be NCHW, got {a.layout}"
    if bool(a.ceil_mode):
        return "ceil_mode=True (windows would hang over the padded input)"
    return None


def _avg_count(m: Match, cfg: HardwareConfig) -> str | None:
    a = m.op.attrs
    pads = [int(p) for p in a.padding]
    if any(pads) and not bool(a.count_include_pad):
        return (f"padding {pads} with count_include_pad=False: the window count varies at the "
                "borders (1/count must be a constant folded into REQUANT)")
    return None


def _gap_axes(m: Match, cfg: HardwareConfig) -> str | None:
    axes = [int(v) for v in (m.op.attrs.axis or [])]
    shape = m.inputs[0].shape
    if len(shape) != 4 or sorted(a % 4 for a in axes) != [2, 3]:
        return f"mean over axes {axes} of a rank-{len(shape)} tensor (only H, W of NCHW)"
    if shape[2] * shape[3] * 255 >= 2 ** 31:
        return f"H*W = {shape[2] * shape[3]} values would overflow the int32 sum"
    return None


_POOL_COMMON = [
    Constraint("attrs", "NCHW, ceil_mode=False, dilation 1", lambda m, c: _pool_attrs(m, c)
               or _dilation_one(m, c)),
    Constraint("padding", f"padding <= {MAX_PAD} per side", _pads),
    Constraint("strides", "strides < 2^(input address bits)", _strides),
    Constraint("dma", f"W*ceil(C/block_in) and H <= {MAX_DMA}", _image_dma),
    Constraint("tile", "KH*KW + 2 <= {cfg.acc_depth} accumulator rows (one window)", _pool_tile),
]
MAX_POOL2D = COMMON + _POOL_COMMON
AVG_POOL2D = COMMON + _POOL_COMMON + [
    Constraint("count", "no padding or count_include_pad=True (constant window count)", _avg_count),
]
GLOBAL_AVG_POOL = COMMON + [
    Constraint("axes", "mean over H and W of an NCHW tensor, H*W*255 < 2^31", _gap_axes),
]

# ----------------------------------------------------------------------------- elementwise


def _add_operands(m: Match, cfg: HardwareConfig) -> str | None:
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
    if a.shape != b.shape or tuple(m.out_shape) != a.shape:
        return (f"operands {a.shape} + {b.shape} -> {m.out_shape}: two activations must have "
                f"the same shape (no broadcast)")
    return None


ADD = COMMON + [Constraint("operands", "two int8 activations of the same shape, or one and "
                           "a per-channel (or scalar) constant", _add_operands)]
ELEMENTWISE = list(COMMON)

# ----------------------------------------------------------------------------- codegen


def _codegen(m: Match, cfg: HardwareConfig) -> str | None:
    """Ask the codegen itself (``dsa_tvm.lowering.region.lowering_supports``) about the
    layer this match becomes, so a layer it cannot lower stays on the CPU alone instead
    of failing the compilation of its whole region."""
    def qt(name: str, shape, qp) -> QTensor:
        return QTensor(name, tuple(int(d) for d in shape), float(qp.scale[0]),
                       int(qp.zero_point[0]))

    ins = [qt(f"in{i}", op.shape, op.qp) for i, op in enumerate(m.inputs)]
    layer = layer_from_match(m, "layer", ins, qt("out", m.out_shape, m.out))
    return lowering_supports(layer, cfg)


CODEGEN = Constraint("codegen", "the DSA codegen lowers the layer and a schedule fits the "
                     "scratchpads (`dsa_tvm.lowering.region.lowering_supports`)", _codegen)

#: kind -> its constraints, in check order.
CONSTRAINTS: dict[str, list[Constraint]] = {
    kind: rules + [CODEGEN] for kind, rules in {
        "conv2d": CONV2D, "dense": DENSE, "batch_matmul": BATCH_MATMUL,
        "max_pool2d": MAX_POOL2D, "avg_pool2d": AVG_POOL2D, "global_avg_pool": GLOBAL_AVG_POOL,
        "add": ADD, "relu": ELEMENTWISE, "clip": ELEMENTWISE, "rescale": ELEMENTWISE,
    }.items()
}


def check(m: Match, cfg: HardwareConfig) -> tuple[bool, str]:
    """(True, "") if the DSA can run the match, else (False, "<constraint>: <reason>")."""
    for c in CONSTRAINTS[m.kind]:
        try:
            why = c.test(m, cfg)
        except Exception as e:  # a graph we do not understand is a graph we do not offload
            why = f"cannot check ({type(e).__name__}: {e})"
        if why:
            return False, f"{c.name}: {why}"
    return True, ""


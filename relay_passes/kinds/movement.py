"""Data movement inside a region: ``quantize(concat(dq(a), dq(b), ...))`` along channels
or along the second-to-last axis (rows: an LLM's KV cache and its new rows, any rank from
2, as a ``(groups, length, row)`` view),
``quantize(strided_slice(dq(x)))`` a block-aligned channel range (C2f's split) or a run of
rows (the second-to-last axis, step 1: an LLM's last token before its logits) and
``quantize(resize2d(dq(x)))`` nearest-neighbour by an integer factor, and
``quantize(permute_dims(dq(x)))`` between an NCHW image and its channels-last rows (ConvNeXt
blocks, norms over the channels). All are copies when every tensor shares one scale and
zero point (the quantizer plans them so); the layers go to the movement room
(``tir_schedules.kinds.movement``) or, the permute, to the Permute room, DMA only.

Nearest resize is ``y[i] = x[i // s]`` for an integer factor ``s`` under the
``half_pixel``/``pytorch_half_pixel`` coordinates with any rounding (the source
coordinate ``k + (r + 0.5) / s - 0.5`` of ``i = s * k + r`` lies strictly inside
``(k - 0.5, k + 0.5)``) and under ``asymmetric`` with ``floor`` (PyTorch's nearest).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from tvm.relax.dpl import DFPattern, is_op, is_tuple, wildcard

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.layers.ir import Concat, Layer, Permute, QTensor, Resize, Slice
from dsa_tvm.layers.layouts import TO_CHANNELS_LAST, layout_permute, rows_view
from tir_schedules.kinds.movement import rows_concat_axis, slice_reason
from tir_schedules.options import current_options

from .common import Constraint, common_constraints
from .match import Match, NotAMatch, Reader, Root
from .spec import Kind, dq, moved, q

#: concat inputs the table has patterns for (larger first)
CONCAT_INPUTS = (4, 3, 2)
#: (coordinate mode, rounding) pairs under which nearest resize is ``x[i // s]``
_HALF = ("half_pixel", "pytorch_half_pixel")


def _one(m: Match) -> np.ndarray:
    return np.array([1.0])


def _same_grid(m: Match, cfg: HardwareConfig) -> str | None:
    out = (float(m.out.scale[0]), int(m.out.zero_point[0]))
    for i, o in enumerate(m.inputs):
        if (float(o.qp.scale[0]), int(o.qp.zero_point[0])) != out:
            return (f"input {i} has scale/zero point ({float(o.qp.scale[0]):g}, "
                    f"{int(o.qp.zero_point[0])}), the output {out}: a copy needs one grid "
                    f"(the quantizer shares one scale over Concat/Resize)")
    return None


# ----------------------------------------------------------------------------- concat
def _concat_variants() -> list[tuple[str, DFPattern]]:
    # rows (a KV cache) may take their inputs' int8 moves in (the new rows' head split)
    rows = ("2_inputs_moved", q(is_op("relax.concat")(is_tuple([dq(moved()), dq(moved())]))))
    return [rows] + [(f"{k}_inputs", q(is_op("relax.concat")(is_tuple([dq() for _ in
                                                                       range(k)]))))
                     for k in CONCAT_INPUTS]


def _read_concat(r: Reader, root: Root) -> Match:
    op = r.need(root.body, "relax.concat")
    tup = r.value(op.args[0])
    ins = [r.operand(f, moves=True) for f in tup.fields]
    m = root.match("concat", op, ins)
    if any(o.moves for o in ins) and not _rows_axis(m):
        m = root.match("concat", op, [r.operand(f) for f in tup.fields])
        if any(r.call(r.need(f, "relax.dequantize").args[0], "relax.reshape",
                      "relax.permute_dims") is not None for f in tup.fields):
            raise NotAMatch("moves before a channel concat stay outside it")
    return m


def _axis(m: Match) -> int:
    axis = int(m.op.attrs.axis)
    return axis + len(m.out_shape) if axis < 0 else axis


def _rows_axis(m: Match) -> bool:
    """Along the second-to-last axis of tensors of rank 2 or more (4-D included)."""
    rank = len(m.out_shape)
    return rank >= 2 and _axis(m) == rank - 2 and not (rank == 4 and _axis(m) == 1)


def _concat_axis(m: Match, cfg: HardwareConfig) -> str | None:
    if (len(m.out_shape) != 4 or _axis(m) != 1) and not _rows_axis(m):
        return (f"concat of {len(m.out_shape)}-D tensors on axis {_axis(m)}: the DSA "
                f"concatenates the channels (axis 1) of NCHW images, or rows along the "
                f"second-to-last axis")
    if _rows_axis(m) and current_options().rows_concat == "host":
        return ("a concat of rows (second-to-last axis) kept on the host by "
                "options(rows_concat='host')")
    return None


def _groups_view(t: QTensor, axis: int) -> QTensor:
    """``(groups, length, row)``: the same bytes as rows of the last axis."""
    s = tuple(t.shape)
    return replace(t, shape=(int(np.prod(s[:axis], dtype=np.int64)), s[axis], s[-1]))


def _concat_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    if _rows_axis(m):
        axis = _axis(m)
        layer = Concat(name, tuple(_groups_view(t, axis) for t in inputs),
                       _groups_view(output, axis), 1)
        assert rows_concat_axis(tuple(layer.output.shape), layer.axis)
        return layer
    return Concat(name, tuple(inputs), output, _axis(m))


# ----------------------------------------------------------------------------- slice
def _slice_variants() -> list[tuple[str, DFPattern]]:
    op = "relax.strided_slice"
    return [("strided", q(is_op(op)(dq(), wildcard(), wildcard(), wildcard(), wildcard()))),
            ("plain", q(is_op(op)(dq(), wildcard(), wildcard(), wildcard())))]


def _read_slice(r: Reader, root: Root) -> Match:
    op = r.need(root.body, "relax.strided_slice")
    return root.match("slice", op, [r.operand(op.args[0])])


def slice_bounds(r: Reader, op, shape: tuple[int, ...]
                 ) -> tuple[list[int], list[tuple[int, int, int]]]:
    """(axes, [(begin, end, stride)] normalised like Python's slice over each axis) of a
    ``strided_slice`` ``op`` of a tensor of ``shape``."""
    args = op.args
    axes = [a % len(shape) for a in r.ints(args[1])]
    begin, end = r.ints(args[2]), r.ints(args[3])
    steps = r.ints(args[4]) if len(args) > 4 else [1] * len(axes)
    return axes, [slice(b, e, s).indices(shape[a])
                  for a, b, e, s in zip(axes, begin, end, steps)]


def slice_range(r: Reader, m: Match) -> tuple[list[int], list[tuple[int, int, int]]]:
    """:func:`slice_bounds` of a slice match."""
    return slice_bounds(r, m.op, m.inputs[0].shape)


def _kept(m: Match) -> list[tuple[int, tuple[int, int, int]]]:
    """The slice's axes that keep less than the whole axis, with their ranges."""
    axes, ranges = slice_range(Reader(lambda v: None), m)
    return [(a, rg) for a, rg in zip(axes, ranges) if rg != (0, m.inputs[0].shape[a], 1)]


def _rows_slice(m: Match) -> bool:
    """A slice of rows: only the second-to-last axis of a 2-, 3- or 5-D tensor, step 1
    (an LLM's last token before the logits, a window of a sequence). 4-D tensors are
    NCHW images to the DSA: their rows are not one layout's."""
    rank, kept = len(m.out_shape), _kept(m)
    return (rank in (2, 3, 5) and len(kept) == 1 and kept[0][0] == rank - 2
            and kept[0][1][2] == 1)


def _slice_form(m: Match, cfg: HardwareConfig) -> str | None:
    if _rows_slice(m):
        return None
    if len(m.out_shape) != 4:
        return (f"slice of a {len(m.out_shape)}-D tensor along other axes than its rows "
                f"(the second-to-last axis, step 1); NCHW images slice their channels")
    kept = _kept(m)
    if any(a != 1 for a, _ in kept):
        return (f"slice along axes {sorted({a for a, _ in kept})}: the DSA slices the "
                f"channels (axis 1) only")
    if not kept:
        return None
    b, e, st = kept[0][1]
    if st != 1:
        return f"channel stride {st} (only contiguous channel ranges are a block copy)"
    return slice_reason(b, e, m.inputs[0].shape[1], cfg.block_out)


def _slice_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    if _rows_slice(m):
        (axis, (begin, _, _)), = _kept(m)
        return Slice(name, _groups_view(inputs[0], axis), _groups_view(output, axis), begin,
                     axis=1)
    axes, ranges = slice_range(Reader(lambda v: None), m)
    begin = dict(zip(axes, ranges)).get(1, (0, 0, 1))[0]
    return Slice(name, inputs[0], output, begin)


# ----------------------------------------------------------------------------- resize
def _resize_variants() -> list[tuple[str, DFPattern]]:
    return [("nearest", q(is_op("relax.image.resize2d")(dq(), wildcard())))]


def _read_resize(r: Reader, root: Root) -> Match:
    op = r.need(root.body, "relax.image.resize2d")
    return root.match("resize", op, [r.operand(op.args[0])])


def _factors(m: Match) -> tuple[int, int] | None:
    (_, _, h, w), (_, _, oh, ow) = m.inputs[0].shape, m.out_shape
    if oh % h or ow % w:
        return None
    return oh // h, ow // w


def _resize_form(m: Match, cfg: HardwareConfig) -> str | None:
    a = m.op.attrs
    method, coord, rnd = str(a.method), str(a.coordinate_transformation_mode), \
        str(a.rounding_method)
    if method != "nearest_neighbor":
        return f"{method} resize (only nearest-neighbour is a copy)"
    if str(a.layout) != "NCHW":
        return f"layout {a.layout} (NCHW only)"
    if len(m.inputs[0].shape) != 4 or _factors(m) is None:
        return f"{m.inputs[0].shape} -> {m.out_shape} is not an integer upsampling"
    if not (coord in _HALF or (coord == "asymmetric" and rnd == "floor")):
        return (f"coordinate mode {coord} with rounding {rnd or 'round'}: nearest is "
                f"x[i // s] only under half_pixel or asymmetric+floor")
    return None


def _resize_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    f = _factors(m)
    if f is None:
        raise ValueError(f"{m.inputs[0].shape} -> {m.out_shape}: not an integer upsampling")
    return Resize(name, inputs[0], output, f)


# ----------------------------------------------------------------------------- layout permute
def _permute_variants() -> list[tuple[str, DFPattern]]:
    return [("layout", q(is_op("relax.permute_dims")(dq())))]


def _read_permute(r: Reader, root: Root) -> Match:
    op = r.need(root.body, "relax.permute_dims")
    return root.match("layout_permute", op, [r.operand(op.args[0])])


def _perm(m: Match) -> tuple[int, ...] | None:
    axes = m.op.attrs.axes
    return None if axes is None else tuple(int(a) for a in axes)


def _permute_form(m: Match, cfg: HardwareConfig) -> str | None:
    if len(m.out_shape) != 4 or not layout_permute(_perm(m)):
        return (f"permute_dims{_perm(m) or ''} of a {len(m.out_shape)}-D tensor: only NCHW "
                f"<-> NHWC of 4-D tensors is a block copy here (attention's moves are taken "
                f"into the matmuls that read them)")
    return None


def _permute_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    """NCHW image -> NHWC rows ``(N*H*W, C)``, or NHWC rows -> NCHW image: the blocked layout
    keeps one row of channel blocks per pixel either way (the room checks the block map)."""
    (x,), perm = inputs, _perm(m)
    if perm == TO_CHANNELS_LAST:
        return Permute(name, x, rows_view(output), tuple(x.shape), perm)
    return Permute(name, rows_view(x), output, tuple(x.shape), perm)


def _constraints(extra: Constraint, wide: bool = False) -> list[Constraint]:
    """``wide``: int16 codes too (a copy of rows moves them as ACC16 lanes; the codegen
    constraint refuses the forms that cannot)."""
    grid = Constraint("one_grid", "every input and the output share one scale and zero "
                      "point (a copy)", _same_grid)
    return common_constraints(_one, wide_output=wide, wide_inputs=wide) + [extra, grid]


KINDS = (
    Kind("concat", 200, _concat_variants, _read_concat,
         _constraints(Constraint("concat_axis", "channel axis of 4-D NCHW tensors (every "
                                 "input but the last a multiple of `{cfg.block_out}` "
                                 "channels), or the second-to-last axis (rows: a KV cache)",
                                 _concat_axis), wide=True),
         _concat_layer, "Concat (channels or rows, 2-4 inputs, one scale)", "relax.concat"),
    Kind("slice", 205, _slice_variants, _read_slice,
         _constraints(Constraint("channel_slice", "a contiguous channel range of a 4-D NCHW "
                                 "tensor, begin a multiple of `{cfg.block_out}`, the end too "
                                 "unless it is the last channel; or a run of rows (the "
                                 "second-to-last axis, step 1)", _slice_form), wide=True),
         _slice_layer, "Slice (channels, block-aligned, or rows; one scale)",
         "relax.strided_slice"),
    Kind("resize", 201, _resize_variants, _read_resize,
         _constraints(Constraint("nearest", "nearest-neighbour, integer factors, NCHW, "
                                 "half_pixel or asymmetric+floor coordinates", _resize_form)),
         _resize_layer, "Resize (nearest, integer scale)", "relax.image.resize2d"),
    Kind("layout_permute", 150, _permute_variants, _read_permute,
         _constraints(Constraint("layout", "NCHW <-> NHWC (axes (0, 2, 3, 1) or (0, 3, 1, 2)) "
                                 "of a 4-D tensor", _permute_form)),
         _permute_layer, "Transpose (NCHW <-> NHWC, one scale)", "relax.permute_dims"),
)

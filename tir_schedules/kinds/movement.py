"""Room: data movement inside a region (concat and slice along channels, nearest resize):
DMA only.

Both layers are copies in the blocked layout ``[N][H][W][CB][block]`` (one scale for
input and output, no requant), so the room emits LOAD/STORE pairs through the
accumulator scratchpad itself instead of building TIR:

* concat: each input's pixels are loaded in chunks and stored into its channel-block
  slice of the output (STORE ``x_stride`` = the output's blocks per pixel). Only whole
  channel blocks move, so every input but the last must have a multiple of ``block``
  channels (the last one's padded lanes land in the output's padding);
* concat of rows along the second-to-last axis (an LLM's KV cache: cache rows, then the
  new tokens' rows, per head): in the rows layout ``[rows][CB][block]`` a group of
  ``L`` rows is ``L * CB`` contiguous accumulator rows, so it is the channel concat with
  the groups as pixels and ``L * CB`` blocks per input: strided copies of whole rows,
  any row length;
* slice: each chunk of pixels loads the output's channel blocks of every pixel (LOAD
  ``x_stride`` = the input's blocks per pixel, base at the first block) and stores them
  contiguously. ``begin`` must be a multiple of ``block``; the end too unless it is the
  input's last channel (then the input's padded lanes land in the output's padding);
* resize ``(sh, sw)``: one input row (or a piece of it) is loaded once and stored
  ``sh * sw`` times, each STORE writing every ``sw``-th output pixel
  (``x_stride = sw * CB``): the repeat is in the addressing, no lane moves.

Cost: DMA bytes at the DRAM bandwidth plus one latency per transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa.formats import DRAM_SIZE_BITS
from dsa_tvm.isa.instructions import Buffer
from dsa_tvm.layers.checks import inputs_read, tensor_bytes, with_weights
from dsa_tvm.layers.ir import Concat, Resize, Slice

from ..vector_unit import MAX_DMA, staged_rows_knobs
from .base import Kind, Recipe, UnsupportedLayer


@dataclass(frozen=True)
class MoveShape:
    """``concat``: inputs of ``cbs`` channel blocks each over ``n*h*w`` pixels;
    ``resize``: one input of ``cbs[0]`` blocks, ``n x h x w`` pixels, upsampled by ``scale``;
    ``slice``: ``cbs = (input blocks, output blocks)``, the output from block ``offset`` on."""

    kind: str                 # "concat" | "resize" | "slice"
    n: int
    h: int
    w: int
    cbs: tuple[int, ...]
    block: int
    scale: tuple[int, int] = (1, 1)
    offset: int = 0
    wide: bool = False        # int16 codes: ACC16 transfers, two bytes a lane
    rows: bool = False        # a slice of rows (runs longer than the staging move in pieces)


@dataclass(frozen=True)
class MoveKnobs:
    rows: int                 # accumulator rows one transfer stages


def _cb_out(s: MoveShape) -> int:
    return {"concat": sum(s.cbs), "slice": s.cbs[-1]}.get(s.kind, s.cbs[0])


def _transfers(s: MoveShape, k: MoveKnobs) -> list[tuple[int, int]]:
    """(rows loaded, stores of them) per staged chunk, in program order."""
    out = []
    if s.kind == "slice":
        p, cb = s.n * s.h * s.w, s.cbs[1]
        if s.rows and cb > k.rows:   # a long run of rows: pieces of one group
            return [(min(k.rows, cb - c0), 1) for _ in range(p) for c0 in range(0, cb, k.rows)]
        pc = max(1, k.rows // cb)
        return [(min(pc, p - p0) * cb, 1) for p0 in range(0, p, pc)]
    if s.kind == "concat":
        p = s.n * s.h * s.w
        for cb in s.cbs:
            if cb > k.rows:   # a long run of rows (a KV cache): pieces of one pixel
                out += [(min(k.rows, cb - c0), 1) for _ in range(p)
                        for c0 in range(0, cb, k.rows)]
                continue
            pc = max(1, k.rows // cb)
            out += [(min(pc, p - p0) * cb, 1) for p0 in range(0, p, pc)]
    else:
        cb, (sh, sw) = s.cbs[0], s.scale
        wc = max(1, k.rows // cb)
        for _ in range(s.n * s.h):
            out += [(min(wc, s.w - w0) * cb, sh * sw) for w0 in range(0, s.w, wc)]
    return out


def move_fits(cfg: HardwareConfig, s: MoveShape, k: MoveKnobs) -> str | None:
    if k.rows > cfg.acc_depth:
        return f"{k.rows} staged rows exceed the {cfg.acc_depth}-row accumulator"
    if s.kind == "concat" or s.rows:
        # pixels longer than the staging move in pieces (a concat, a rows slice); strides
        # between pixels only matter when there are several (one group: a prefill chunk)
        if s.n * s.h * s.w > 1 and (_cb_out(s) > MAX_DMA or max(s.cbs) > MAX_DMA):
            return f"a {_cb_out(s)}-block output stride exceeds the {DRAM_SIZE_BITS}-bit DMA fields"
        return None
    if _cb_out(s) > k.rows or (s.kind != "slice" and max(s.cbs) > k.rows):
        return f"one pixel's {max(s.cbs)} channel blocks exceed {k.rows} staged rows"
    if max(s.cbs) * max(s.scale[1], 1) > MAX_DMA or _cb_out(s) > MAX_DMA:
        return f"DMA stride exceeds the {DRAM_SIZE_BITS}-bit DMA fields"
    return None


candidate_move_knobs, default_move_knobs = staged_rows_knobs(MoveKnobs, move_fits)


def estimate_move_cycles(cfg: HardwareConfig, s: MoveShape, k: MoveKnobs) -> float:
    """Every byte in and out at the DRAM bandwidth, one latency per transfer."""
    cycles = 0.0
    for rows, stores in _transfers(s, k):
        moved = rows * s.block * (1 + stores) * (2 if s.wide else 1)
        cycles += moved / cfg.bandwidth_bytes_per_cycle + (1 + stores) * cfg.latency_cycles
    return cycles


def move_instructions(cfg: HardwareConfig, s: MoveShape, k: MoveKnobs) -> int:
    return sum(1 + stores for _, stores in _transfers(s, k))


def emit_move(b, cfg: HardwareConfig, s: MoveShape, k: MoveKnobs, regions: dict) -> None:
    """The LOAD/STORE pairs of the layer; staging alternates between two halves of the
    rows so the derived tokens let the next load overlap the previous stores."""
    buf = Buffer.ACC16 if s.wide else Buffer.ACC8
    long_runs = (s.kind == "concat" or s.rows) and max(s.cbs) > k.rows // 2
    half = k.rows // 2 if k.rows >= 2 * max(s.cbs) or long_runs else 0
    y = regions["y"]
    cbo = _cb_out(s)
    slot = 0

    def stage() -> int:
        nonlocal slot
        base = slot * half
        slot ^= 1 if half else 0
        return base

    def run(src: int, dst: int, blocks: int) -> None:
        """A long run of blocks, contiguous both sides, in pieces of the staging."""
        step = half or k.rows
        for c0 in range(0, blocks, step):
            m = min(step, blocks - c0)
            base = stage()
            b.load(buf, base, src + c0, 1, m, m)
            b.store(buf, base, dst + c0, 1, m, m)

    if s.kind == "slice":
        x, cbi = regions["x"], s.cbs[0]
        p = s.n * s.h * s.w
        if s.rows and cbo > (half or k.rows):   # a long run of rows: pieces of each group
            for p0 in range(p):
                run(b.addr(x, buf) + p0 * cbi + s.offset, b.addr(y, buf) + p0 * cbo, cbo)
            return
        pc = max(1, (half or k.rows) // cbo)
        for p0 in range(0, p, pc):
            m = min(pc, p - p0)
            base = stage()
            b.load(buf, base, b.addr(x, buf) + p0 * cbi + s.offset, m, cbo,
                   cbi if cbi <= MAX_DMA else cbo)        # one pixel (move_fits): unused
            b.store(buf, base, b.addr(y, buf) + p0 * cbo, 1, m * cbo, m * cbo)
        return
    if s.kind == "concat":
        p = s.n * s.h * s.w
        cb0 = 0
        for i, cb in enumerate(s.cbs):
            x = regions[f"x{i}"]
            step = half or k.rows
            if cb > step:   # a long run of rows: pieces of one pixel
                for p0 in range(p):
                    run(b.addr(x, buf) + p0 * cb, b.addr(y, buf) + p0 * cbo + cb0, cb)
                cb0 += cb
                continue
            pc = max(1, step // cb)
            for p0 in range(0, p, pc):
                m = min(pc, p - p0)
                base = stage()
                b.load(buf, base, b.addr(x, buf) + p0 * cb, 1, m * cb, m * cb)
                b.store(buf, base, b.addr(y, buf) + p0 * cbo + cb0, m, cb,
                        cbo if cbo <= MAX_DMA else cb)    # one pixel (move_fits): unused
            cb0 += cb
        return
    cb, (sh, sw) = s.cbs[0], s.scale
    ow = s.w * sw
    wc = max(1, (half or k.rows) // cb)
    x = regions["x"]
    for n in range(s.n):
        for i in range(s.h):
            for w0 in range(0, s.w, wc):
                m = min(wc, s.w - w0)
                base = stage()
                b.load(buf, base, b.addr(x, buf) + ((n * s.h + i) * s.w + w0) * cb, 1, m * cb,
                       m * cb)
                for dy in range(sh):
                    row = (n * s.h * sh + i * sh + dy) * ow
                    for dx in range(sw):
                        b.store(buf, base, b.addr(y, buf) + (row + w0 * sw + dx) * cb, m, cb,
                                sw * cb)


# ----------------------------------------------------------------------------- layers
def _same_grid(layer, ins) -> None:
    for t in ins:
        if (t.scale, t.zero_point) != (layer.output.scale, layer.output.zero_point):
            raise UnsupportedLayer(f"{layer.name}: input '{t.name}' has scale/zero point "
                                   f"({t.scale:g}, {t.zero_point}), the output "
                                   f"({layer.output.scale:g}, {layer.output.zero_point}): a "
                                   f"copy needs one grid")


def rows_concat_axis(shape: tuple[int, ...], axis: int) -> bool:
    """A concat of rows views along their second-to-last axis (not 4-D: that is NCHW)."""
    axis = axis + len(shape) if axis < 0 else axis
    return len(shape) in (2, 3, 5) and axis == len(shape) - 2


def _rows_concat(layer: Concat, cfg: HardwareConfig) -> MoveShape:
    """Groups (the axes before the concat axis) as pixels, each input's ``L * CB``
    accumulator rows per group as its blocks."""
    out = tuple(layer.output.shape)
    axis = len(out) - 2
    for t in layer.inputs:
        if len(t.shape) != len(out) or tuple(t.shape[:axis]) != out[:axis] \
                or t.shape[-1] != out[-1]:
            raise UnsupportedLayer(f"{layer.name}: input {t.shape} and output {out} differ "
                                   f"off the concat axis {axis}")
    if sum(t.shape[axis] for t in layer.inputs) != out[axis]:
        raise UnsupportedLayer(f"{layer.name}: lengths do not add up to {out[axis]}")
    cb = ceil_div(out[-1], cfg.block_out)
    groups = int(np.prod(out[:axis], dtype=np.int64))
    return MoveShape("concat", groups, 1, 1, tuple(t.shape[axis] * cb for t in layer.inputs),
                     cfg.block_out, wide=layer.output.dtype == "int16")


def concat_recipe(layer: Concat, cfg: HardwareConfig, consts: bool) -> Recipe:
    block = cfg.block_out
    out = layer.output.shape
    dtypes = {t.dtype for t in layer.inputs} | {layer.output.dtype}
    if dtypes != {"int8"} and (len(dtypes) > 1 or not rows_concat_axis(tuple(out), layer.axis)):
        raise UnsupportedLayer(f"{layer.name}: {sorted(dtypes)} codes; a concat copies one "
                               f"dtype (int16 only along rows)")
    if 2 <= len(layer.inputs) <= 8 and rows_concat_axis(tuple(out), layer.axis):
        _same_grid(layer, layer.inputs)
        return Recipe(KIND, _rows_concat(layer, cfg),
                      {f"x{i}": t for i, t in enumerate(layer.inputs)})
    if len(out) != 4 or layer.axis not in (1, -3):
        raise UnsupportedLayer(f"{layer.name}: concat of {len(out)}-D tensors on axis "
                               f"{layer.axis}; the DSA concatenates NCHW channels (axis 1) or "
                               f"rows along the second-to-last axis of 2-, 3- or 5-D "
                               f"tensors")
    if not 2 <= len(layer.inputs) <= 8:
        raise UnsupportedLayer(f"{layer.name}: {len(layer.inputs)} inputs (2..8 supported)")
    _same_grid(layer, layer.inputs)
    for t in layer.inputs[:-1]:
        if t.shape[1] % block:
            raise UnsupportedLayer(f"{layer.name}: input '{t.name}' has {t.shape[1]} channels, "
                                   f"not a multiple of the {block}-lane block (DMA moves whole "
                                   f"blocks; only the last input may be partial)")
    for t in layer.inputs:
        if (t.shape[0],) + tuple(t.shape[2:]) != (out[0],) + tuple(out[2:]):
            raise UnsupportedLayer(f"{layer.name}: input {t.shape} and output {out} differ "
                                   f"off the channel axis")
    if sum(t.shape[1] for t in layer.inputs) != out[1]:
        raise UnsupportedLayer(f"{layer.name}: channels do not add up to {out[1]}")
    n, _, h, w = out
    shape = MoveShape("concat", n, h, w, tuple(ceil_div(t.shape[1], block)
                                              for t in layer.inputs), block)
    return Recipe(KIND, shape, {f"x{i}": t for i, t in enumerate(layer.inputs)})


def resize_recipe(layer: Resize, cfg: HardwareConfig, consts: bool) -> Recipe:
    x, y = layer.input.shape, layer.output.shape
    sh, sw = layer.scale
    if len(x) != 4 or len(y) != 4:
        raise UnsupportedLayer(f"{layer.name}: resize of {len(x)}-D tensors (NCHW only)")
    if min(sh, sw) < 1 or tuple(y) != (x[0], x[1], x[2] * sh, x[3] * sw):
        raise UnsupportedLayer(f"{layer.name}: {x} -> {y} is not an integer nearest upsample")
    _same_grid(layer, [layer.input])
    shape = MoveShape("resize", x[0], x[2], x[3], (ceil_div(x[1], cfg.block_out),),
                      cfg.block_out, (sh, sw))
    return Recipe(KIND, shape, {"x": layer.input})


def _rows_slice(layer: Slice, cfg: HardwareConfig) -> MoveShape:
    """Rows ``[begin, begin + L_out)`` of each group (the axes before the rows axis): in
    the rows layout the channel slice with ``L * CB`` blocks per group."""
    x, y = tuple(layer.input.shape), tuple(layer.output.shape)
    axis = len(x) - 2
    if len(y) != len(x) or x[:axis] != y[:axis] or x[-1] != y[-1]:
        raise UnsupportedLayer(f"{layer.name}: {x} -> {y} differ off the rows axis {axis}")
    if not 0 <= layer.begin < layer.begin + y[axis] <= x[axis]:
        raise UnsupportedLayer(f"{layer.name}: rows [{layer.begin}, {layer.begin + y[axis]}) "
                               f"are not a non-empty range of 0..{x[axis]}")
    cb = ceil_div(x[-1], cfg.block_out)
    groups = int(np.prod(x[:axis], dtype=np.int64))
    return MoveShape("slice", groups, 1, 1, (x[axis] * cb, y[axis] * cb), cfg.block_out,
                     offset=layer.begin * cb, wide=layer.input.dtype == "int16", rows=True)


def slice_recipe(layer: Slice, cfg: HardwareConfig, consts: bool) -> Recipe:
    block = cfg.block_out
    x, y = layer.input.shape, layer.output.shape
    if layer.input.dtype != layer.output.dtype:
        raise UnsupportedLayer(f"{layer.name}: {layer.input.dtype} in, {layer.output.dtype} "
                               f"out: a copy keeps its dtype")
    if rows_concat_axis(tuple(x), layer.axis):
        _same_grid(layer, [layer.input])
        return Recipe(KIND, _rows_slice(layer, cfg), {"x": layer.input})
    if layer.input.dtype != "int8":
        raise UnsupportedLayer(f"{layer.name}: channel slices copy int8 codes only")
    if len(x) != 4 or len(y) != 4:
        raise UnsupportedLayer(f"{layer.name}: slice of {len(x)}-D tensors (NCHW only)")
    if (x[0],) + tuple(x[2:]) != (y[0],) + tuple(y[2:]):
        raise UnsupportedLayer(f"{layer.name}: {x} -> {y} differ off the channel axis")
    end = layer.begin + y[1]
    why = slice_reason(layer.begin, end, x[1], block)
    if why:
        raise UnsupportedLayer(f"{layer.name}: {why}")
    _same_grid(layer, [layer.input])
    shape = MoveShape("slice", x[0], x[2], x[3], (ceil_div(x[1], block), ceil_div(y[1], block)),
                      block, offset=layer.begin // block)
    return Recipe(KIND, shape, {"x": layer.input})


def slice_reason(begin: int, end: int, channels: int, block: int) -> str | None:
    """None if channels ``[begin, end)`` of ``channels`` are whole blocks for the DMA."""
    if not 0 <= begin < end <= channels:
        return f"channels [{begin}, {end}) are not a non-empty range of 0..{channels}"
    if begin % block or (end % block and end != channels):
        return (f"channels [{begin}, {end}) of {channels}: the DMA moves whole {block}-lane "
                f"blocks (begin a multiple of {block}; the end too unless it is the last "
                f"channel)")
    return None


def run_slice(ly: Slice, env: dict[str, np.ndarray]) -> np.ndarray:
    x = env[ly.input.name].reshape(ly.input.shape)
    axis = ly.axis % x.ndim
    return np.ascontiguousarray(np.take(x, range(ly.begin, ly.begin + ly.output.shape[axis]),
                                        axis=axis))


def run_concat(ly: Concat, env: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([env[t.name].reshape(t.shape) for t in ly.inputs], axis=ly.axis)


def run_resize(ly: Resize, env: dict[str, np.ndarray]) -> np.ndarray:
    sh, sw = ly.scale
    return np.repeat(np.repeat(env[ly.input.name].reshape(ly.input.shape), sh, axis=2), sw,
                     axis=3)


def _describe(ly) -> str:
    ins = ly.inputs if isinstance(ly, Concat) else (ly.input,)
    extra = (f" x{ly.scale}" if isinstance(ly, Resize) else f" from {ly.begin}"
             if isinstance(ly, Slice) and ly.axis == 1
             else f" from {ly.begin} axis={ly.axis}" if isinstance(ly, Slice)
             else f" axis={ly.axis}")
    return (f"{type(ly).__name__} {ly.name}: {' + '.join(str(tuple(t.shape)) for t in ins)}"
            f"{extra} -> {tuple(ly.output.shape)}")


def _bounds(ly) -> tuple[int, int]:
    """Resize reads every input element once (each is a source of some output pixel);
    a slice reads only the channels it keeps."""
    if isinstance(ly, Slice):
        return with_weights(ly, tensor_bytes(ly.output))
    return with_weights(ly, inputs_read(ly))


LAYERS = {Concat: (concat_recipe, run_concat), Resize: (resize_recipe, run_resize),
          Slice: (slice_recipe, run_slice)}

KIND = Kind(
    name="movement", layers=tuple(LAYERS),
    recipe=lambda ly, cfg, consts: LAYERS[type(ly)][0](ly, cfg, consts),
    reference=lambda ly, env: LAYERS[type(ly)][1](ly, env),
    bounds=_bounds, describe=_describe,
    shape=MoveShape, knobs=MoveKnobs,
    fits=move_fits, candidates=candidate_move_knobs, default=default_move_knobs,
    estimate=estimate_move_cycles, instructions=move_instructions,
    tiles=lambda s: {}, extents=lambda s: {},
    fill=lambda cfg, s, k: [0.0, 0.0, k.rows / cfg.acc_depth],
    emit=emit_move)

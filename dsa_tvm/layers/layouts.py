"""Tensor layouts between the Relax graph (NCHW, row-major matrices) and the DSA.

The DSA keeps activations channel-blocked: ``[N][H][W][CB][block]`` int8, with
channels padded up to whole blocks, so one scratchpad row is one pixel's block
of channels. A matrix ``(..., K)`` is an image of ``prod(...)`` rows, one pixel
wide. The runtime packs inputs and unpacks outputs with these functions; the
compiler packs constants with them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..intmath import ceil_div, window_out_hw


def image_dims(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(N, C, H, W) of a logical activation: NCHW, or a matrix (..., K) as N=1, H=rows, W=1.

    Every 4-D shape is an image here: a layer that reads a 4-D tensor as rows of its
    last axis (dense) gets a 2-D view from ``relay_passes.to_layers`` instead."""
    if len(shape) == 4:
        n, c, h, w = shape
        return n, c, h, w
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    return 1, shape[-1], rows, 1


def same_bytes(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Two views of one tensor with one DSA layout: equal, two matrix views with the same
    rows of the same last axis ((1, T, D), (T, D), (B*H, T, D) with B*H*T rows), or an
    (N, C, 1, 1) image and the (N, C) rows a dense reads it as (a flatten: each image is
    one row of blocks)."""
    if a == b:
        return True
    if len(a) != 4 and len(b) != 4 and a and b:
        return a[-1] == b[-1] and int(np.prod(a)) == int(np.prod(b))
    img, rows = (a, b) if len(a) == 4 else (b, a)
    return len(img) == 4 and img[2:] == (1, 1) and rows == img[:2]


#: permute_dims axes between an NCHW image and its channels-last rows: in the blocked layout
#: both are one row of channel blocks per pixel, so either way is a block copy
TO_CHANNELS_LAST = (0, 2, 3, 1)
TO_CHANNELS_FIRST = (0, 3, 1, 2)


def layout_permute(perm: tuple[int, ...] | None) -> bool:
    """``perm`` turns an NCHW image into NHWC rows or back (ConvNeXt's channels-last blocks)."""
    return perm is not None and tuple(perm) in (TO_CHANNELS_LAST, TO_CHANNELS_FIRST)


def rows_view(t):
    """A tensor as the rows of its last axis, (rows, C): the view a data movement reads
    any non-image tensor in (every matrix view of it is the same bytes)."""
    shape = tuple(t.shape)
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return replace(t, shape=(rows, int(shape[-1])))


def pixel_rows(x: np.ndarray) -> np.ndarray:
    """An NCHW image as the rows of its pixels, (N*H*W, C): the bytes the DSA keeps it in,
    so a 1x1 convolution is a dense over them."""
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1).reshape(-1, x.shape[1]))


def from_pixel_rows(y: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Rows of pixels (N*H*W, C) back into the NCHW image ``shape``."""
    n, c, h, w = shape
    return np.ascontiguousarray(y.reshape(n, h, w, c).transpose(0, 3, 1, 2))


def broadcast_dims(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int] | str:
    """(n, hw, nb, hwb) of ``b`` broadcasting to ``a`` in the blocked layout (the pixels
    of NCHW, the rows of ``(..., C)``), or why it cannot.

    ``b`` must keep every channel (one lane each: the ALU cannot spread a lane). Over the
    pixel axes (those of extent 1 in ``a`` aside) ``b`` is full on one run and 1 on the
    other: ``[N, C, 1, 1]`` is (N images full, H*W pixels broadcast), ``[1, C, H, W]``
    (N broadcast, H*W full); axes that alternate more often are refused."""
    if len(b) > len(a):
        return f"operand {tuple(b)} has more dimensions than {tuple(a)}"
    if len(b) != len(a) and 4 in (len(a), len(b)):
        return (f"operand {tuple(b)} against {tuple(a)}: a 4-D tensor is an NCHW image, the "
                f"other rank channels-last rows (give both the same rank)")
    b = (1,) * (len(a) - len(b)) + tuple(b)
    if any(db not in (1, da) for da, db in zip(a, b)):
        return f"operand {b} does not broadcast to {tuple(a)}"
    ch = 1 if len(a) == 4 else len(a) - 1
    if b[ch] != a[ch]:
        return (f"operand {b} broadcasts over the channels of {tuple(a)} (only per-channel "
                f"operands broadcast: one lane per channel)")
    axes = [(da, db == da) for i, (da, db) in enumerate(zip(a, b)) if i != ch and da > 1]
    runs: list[list] = []
    for da, full in axes:
        if runs and runs[-1][1] == full:
            runs[-1][0] *= da
        else:
            runs.append([da, full])
    total = int(np.prod([d for d, _ in axes], dtype=np.int64))
    if not runs or (len(runs) == 1 and runs[0][1]):
        return 1, total, 1, total
    if len(runs) == 1:
        return 1, total, 1, 1
    if len(runs) == 2:
        (n, outer_full), (hw, _) = runs
        return (n, hw, n, 1) if outer_full else (n, hw, 1, hw)
    return f"operand {b} broadcasts to {tuple(a)} over alternating axes"


def blocked_shape(shape: tuple[int, ...], block: int) -> tuple[int, int, int, int, int]:
    n, c, h, w = image_dims(shape)
    return n, h, w, ceil_div(c, block), block


def pack_activation(x: np.ndarray, block: int) -> np.ndarray:
    """Logical NCHW or (..., K) int8 -> [N][H][W][CB][block], zero-padded channels."""
    n, c, h, w = image_dims(x.shape)
    img = x.reshape(n, c, h, w) if x.ndim == 4 else x.reshape(1, h, c).transpose(0, 2, 1)[
        ..., None]
    cb = ceil_div(c, block)
    out = np.zeros((n, h, w, cb * block), dtype=x.dtype)
    out[..., :c] = img.transpose(0, 2, 3, 1)
    return out.reshape(n, h, w, cb, block)


def unpack_activation(y: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """[N][H][W][CB][block] -> the logical shape (drops padded channels)."""
    n, c, h, w = image_dims(shape)
    flat = y.reshape(n, h, w, -1)[..., :c]
    if len(shape) == 4:
        return np.ascontiguousarray(flat.transpose(0, 3, 1, 2))
    return np.ascontiguousarray(flat.reshape(h, c)).reshape(shape)


def pack_conv_weights(w: np.ndarray, block_in: int, block_out: int) -> np.ndarray:
    """int8 [O, I, KH, KW] -> [OB][KH][KW][IB][block_out][block_in] tiles, zero padded
    (another integer dtype is kept: an index array gives the tile order)."""
    o, i, kh, kw = w.shape
    ob, ib = ceil_div(o, block_out), ceil_div(i, block_in)
    dtype = w.dtype if np.issubdtype(w.dtype, np.integer) else np.int8
    p = np.zeros((ob * block_out, ib * block_in, kh, kw), dtype=dtype)
    p[:o, :i] = w
    return np.ascontiguousarray(
        p.reshape(ob, block_out, ib, block_in, kh, kw).transpose(0, 4, 5, 2, 1, 3))


def pack_output_stage(bias: np.ndarray, mult: np.ndarray, shift: np.ndarray,
                      block_out: int) -> np.ndarray:
    """Per-channel (bias, multiplier, shift) -> the [OB][3][block_out] REQUANT table.

    Padded channels get multiplier 0 (their outputs are the zero point, never read)."""
    o = len(bias)
    ob = ceil_div(o, block_out)
    t = np.zeros((ob * block_out, 3), dtype=np.int32)
    t[:o, 0], t[:o, 1], t[:o, 2] = bias, mult, shift
    return np.ascontiguousarray(t.reshape(ob, block_out, 3).transpose(0, 2, 1))


def im2col(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int],
           padding: tuple[int, int, int, int], dilation: tuple[int, int],
           pad_value: int) -> np.ndarray:
    """NCHW -> (N, KH*KW*C, OH, OW): channel ``(ki * KW + kj) * C + c`` holds the input
    pixel tap (ki, kj) of output pixel (oh, ow) reads; pads hold ``pad_value``."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw) = kernel, strides, padding, dilation
    xp = np.full((n, c, h + pt + pb, w + pl + pr), pad_value, x.dtype)
    xp[:, :, pt:pt + h, pl:pl + w] = x
    oh, ow = window_out_hw(h, w, kernel, strides, padding, dilation)
    cols = np.empty((n, kh, kw, c, oh, ow), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, i, j] = xp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                               j * dw:j * dw + sw * (ow - 1) + 1:sw]
    return cols.reshape(n, kh * kw * c, oh, ow)


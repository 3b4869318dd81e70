"""Integer CPU reference of a :class:`~dsa_tvm.layers.ir.Region`.

Executes every layer kind with exactly the semantics documented in
:mod:`dsa_tvm.layers.ir`, using the simulator's own rounding and wrapping
code (:mod:`dsa_tvm.isa.semantics`), so a DSA program and this reference must
agree bit for bit. Plain numpy, no TVM: it is also the fake backend of the
offload tests and the oracle of the codegen tests.
"""

from __future__ import annotations

import numpy as np

from ..isa import semantics as sem
from .ir import (
    Add,
    BatchMatmul,
    BiasAdd,
    Conv2d,
    Dense,
    GlobalAvgPool,
    Layer,
    Pool2d,
    QTensor,
    Region,
    Requant,
    Rescale,
)

__all__ = ["run_region", "run_layer", "apply_requant"]


def apply_requant(acc: np.ndarray, rq: Requant, axis: int) -> np.ndarray:
    """int8 ``clamp(requantize(acc), lo, hi)``; per-channel parameters run along ``axis``."""
    acc = sem.wrap_int32(acc)
    m = np.asarray(rq.multiplier, np.int64).reshape(-1)
    s = np.asarray(rq.shift, np.int64).reshape(-1)
    if m.size > 1 or s.size > 1:
        c = acc.shape[axis]
        shape = [1] * acc.ndim
        shape[axis] = c
        m = np.broadcast_to(m, (c,)).reshape(shape)
        s = np.broadcast_to(s, (c,)).reshape(shape)
    else:
        m, s = m[0], s[0]
    y = sem.requantize(acc, m, s, rq.zero_point)
    lo, hi = rq.clip
    return sem.saturate(y, lo, hi).astype(np.int8)


def _centered(x: np.ndarray, t: QTensor) -> np.ndarray:
    """``x - zero_point`` as int64 (the value every layer starts from)."""
    if tuple(x.shape) != tuple(t.shape):
        raise ValueError(f"tensor '{t.name}': expected shape {t.shape}, got {x.shape}")
    return x.astype(np.int64) - np.int64(t.zero_point)


def _windows(xc: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int],
             dilation: tuple[int, int], out_hw: tuple[int, int]) -> np.ndarray:
    """[N, C, OH, OW, KH, KW] view of the (already padded) NCHW input."""
    kh, kw = kernel
    sh, sw = strides
    dh, dw = dilation
    oh, ow = out_hw
    n, c = xc.shape[:2]
    out = np.empty((n, c, oh, ow, kh, kw), xc.dtype)
    for i in range(kh):
        for j in range(kw):
            out[..., i, j] = xc[:, :, i * dh: i * dh + (oh - 1) * sh + 1: sh,
                                j * dw: j * dw + (ow - 1) * sw + 1: sw]
    return out


def _pad(xc: np.ndarray, padding: tuple[int, int, int, int], value: int) -> np.ndarray:
    top, left, bottom, right = padding
    return np.pad(xc, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)


def _conv2d(ly: Conv2d, x: np.ndarray) -> np.ndarray:
    xc = _pad(_centered(x, ly.input), ly.padding, 0)  # pads are the zero point: 0 once centred
    n, cin = xc.shape[:2]
    cout, ipg, kh, kw = ly.weight.shape
    g = ly.groups
    if cin != ipg * g or cout % g:
        raise ValueError(f"{ly.name}: {cin} input channels, weight {ly.weight.shape}, groups {g}")
    oh, ow = ly.output.shape[2:]
    win = _windows(xc, (kh, kw), ly.strides, ly.dilation, (oh, ow))  # N C OH OW KH KW
    win = win.reshape(n, g, ipg, oh, ow, kh, kw)
    w = ly.weight.astype(np.int64).reshape(g, cout // g, ipg, kh, kw)
    acc = np.einsum("ngihwyx,goiyx->ngohw", win, w, optimize=True).reshape(n, cout, oh, ow)
    acc = acc + ly.bias.astype(np.int64).reshape(1, cout, 1, 1)
    return apply_requant(acc, ly.requant, axis=1)


def _dense(ly: Dense, x: np.ndarray) -> np.ndarray:
    acc = _centered(x, ly.input) @ ly.weight.astype(np.int64).T + ly.bias.astype(np.int64)
    return apply_requant(acc, ly.requant, axis=-1)


def _batch_matmul(ly: BatchMatmul, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    acc = np.matmul(_centered(a, ly.a), _centered(b, ly.b))
    return apply_requant(acc, ly.requant, axis=-1)


def _pool2d(ly: Pool2d, x: np.ndarray) -> np.ndarray:
    xc = _centered(x, ly.input)
    oh, ow = ly.output.shape[2:]
    if ly.kind == "max":
        lowest = np.iinfo(np.int64).min  # pads never win
        win = _windows(_pad(xc, ly.padding, lowest), ly.kernel, ly.strides, (1, 1), (oh, ow))
        acc = win.max(axis=(4, 5))
    elif ly.kind == "avg":
        win = _windows(_pad(xc, ly.padding, 0), ly.kernel, ly.strides, (1, 1), (oh, ow))
        acc = win.sum(axis=(4, 5))
    else:
        raise ValueError(f"{ly.name}: unknown pool kind '{ly.kind}'")
    return apply_requant(acc, ly.requant, axis=1)


def _global_avg_pool(ly: GlobalAvgPool, x: np.ndarray) -> np.ndarray:
    acc = _centered(x, ly.input).sum(axis=(2, 3))
    return apply_requant(acc, ly.requant, axis=1).reshape(ly.output.shape)


def _add(ly: Add, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    acc = sem.wrap_int32(_centered(a, ly.a) * ly.a_mult + _centered(b, ly.b) * ly.b_mult)
    return apply_requant(acc, ly.requant, axis=1 if acc.ndim == 4 else -1)


def _bias_add(ly: BiasAdd, x: np.ndarray) -> np.ndarray:
    axis = 1 if x.ndim == 4 else -1
    shape = [1] * x.ndim
    shape[axis] = -1
    bias = np.asarray(ly.bias, np.int64).reshape(shape)
    acc = sem.wrap_int32(_centered(x, ly.input) * ly.x_mult + bias)
    return apply_requant(acc, ly.requant, axis=axis)


def _rescale(ly: Rescale, x: np.ndarray) -> np.ndarray:
    acc = _centered(x, ly.input)
    return apply_requant(acc, ly.requant, axis=1 if acc.ndim == 4 else -1).reshape(ly.output.shape)


def run_layer(ly: Layer, env: dict[str, np.ndarray]) -> np.ndarray:
    """One layer's int8 output, reading its inputs from ``env`` by tensor name."""
    if isinstance(ly, Conv2d):
        out = _conv2d(ly, env[ly.input.name])
    elif isinstance(ly, Dense):
        out = _dense(ly, env[ly.input.name])
    elif isinstance(ly, BatchMatmul):
        out = _batch_matmul(ly, env[ly.a.name], env[ly.b.name])
    elif isinstance(ly, Pool2d):
        out = _pool2d(ly, env[ly.input.name])
    elif isinstance(ly, GlobalAvgPool):
        out = _global_avg_pool(ly, env[ly.input.name])
    elif isinstance(ly, Add):
        out = _add(ly, env[ly.a.name], env[ly.b.name])
    elif isinstance(ly, BiasAdd):
        out = _bias_add(ly, env[ly.input.name])
    elif isinstance(ly, Rescale):
        out = _rescale(ly, env[ly.input.name])
    else:
        raise TypeError(f"unknown layer type {type(ly).__name__}")
    if tuple(out.shape) != tuple(ly.output.shape):
        raise ValueError(f"{ly.name}: computed shape {out.shape}, declared {ly.output.shape}")
    return out


def run_region(region: Region, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run every layer of ``region`` in order; returns its outputs (int8) by name."""
    env: dict[str, np.ndarray] = {}
    for t in region.inputs:
        if t.name not in inputs:
            raise KeyError(f"region '{region.name}': missing input '{t.name}'")
        arr = np.asarray(inputs[t.name])
        if arr.dtype != np.int8:
            raise TypeError(f"region '{region.name}': input '{t.name}' must be int8, got {arr.dtype}")
        env[t.name] = arr.reshape(t.shape)
    for ly in region.layers:
        env[ly.output.name] = run_layer(ly, env)
    return {t.name: env[t.name] for t in region.outputs}

"""The integer CPU reference (each room's, ``tir_schedules.kinds.run_region``) against oracles.

Oracles are written from the documented layer semantics alone: Python-integer
loops for the accumulators (one multiply-add at a time, int32 wrap at the end is
the same as wrapping every step), float64 for sums that are exact in float, and
Python integers for the rounding (floor(x / 2**s + 1/2)).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsa_tvm.layers import ir as L
from tir_schedules.kinds import run_layer, run_region

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _wrap32(v: int) -> int:
    return ((int(v) + (1 << 31)) % (1 << 32)) - (1 << 31)


def _requant_py(acc: int, m: int, s: int, zp: int, lo: int = -128, hi: int = 127) -> int:
    prod = _wrap32(acc) * int(m)
    y = (prod + (1 << (s - 1))) >> s if s > 0 else prod
    return max(lo, min(hi, y + zp, 127), -128)


def _rq(rng, channels: int, lo=-128, hi=127) -> L.Requant:
    m = rng.integers(1 << 30, 1 << 31, channels).astype(np.int32)
    s = rng.integers(30, 45, channels).astype(np.int32)
    return L.Requant(m, s, int(rng.integers(-20, 20)), (lo, hi))


def _i8(rng, shape) -> np.ndarray:
    return rng.integers(-128, 128, shape).astype(np.int8)


def _qt(name, shape, zp) -> L.QTensor:
    return L.QTensor(name, tuple(shape), 0.1, int(zp))


def _oracle_requant(acc: np.ndarray, rq: L.Requant, axis: int) -> np.ndarray:
    m, s = rq.per_channel(acc.shape[axis])
    out = np.empty(acc.shape, np.int8)
    for idx in np.ndindex(*acc.shape):
        c = idx[axis]
        out[idx] = _requant_py(int(acc[idx]), int(m[c]), int(s[c]), rq.zero_point, *rq.clip)
    return out


# ----------------------------------------------------------------------------- conv2d


def _conv_loops(x, w, bias, zp, stride, pad, dil, groups):
    n, cin, h, wd = x.shape
    cout, ipg, kh, kw = w.shape
    top, left, bottom, right = pad
    oh = (h + top + bottom - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + left + right - dil[1] * (kw - 1) - 1) // stride[1] + 1
    acc = np.zeros((n, cout, oh, ow), np.int64)
    opg = cout // groups
    for b, o, i, j in itertools.product(range(n), range(cout), range(oh), range(ow)):
        g = o // opg
        total = int(bias[o])
        for ci, ky, kx in itertools.product(range(ipg), range(kh), range(kw)):
            y = i * stride[0] + ky * dil[0] - top
            xx = j * stride[1] + kx * dil[1] - left
            v = int(x[b, g * ipg + ci, y, xx]) if 0 <= y < h and 0 <= xx < wd else zp  # pad = zp
            total += (v - zp) * int(w[o, ci, ky, kx])
        acc[b, o, i, j] = _wrap32(total)
    return acc


@SETTINGS
@given(seed=st.integers(0, 2**31), cin=st.integers(1, 5), depthwise=st.booleans(),
       groups2=st.booleans(), k=st.integers(1, 3), stride=st.integers(1, 3),
       pad=st.tuples(*[st.integers(0, 2)] * 4), dil=st.integers(1, 2), hw=st.integers(3, 7),
       per_channel=st.booleans())
def test_conv2d_matches_loops(seed, cin, depthwise, groups2, k, stride, pad, dil, hw, per_channel):
    rng = np.random.default_rng(seed)
    if depthwise:
        groups, cout = cin, cin
    elif groups2:
        cin, groups, cout = 2 * cin, 2, 4
    else:
        groups, cout = 1, int(rng.integers(1, 6))
    if hw + pad[0] + pad[2] < dil * (k - 1) + 1 or hw + pad[1] + pad[3] < dil * (k - 1) + 1:
        return
    zp = int(rng.integers(-128, 128))
    x = _i8(rng, (1, cin, hw, hw))
    w = _i8(rng, (cout, cin // groups, k, k))
    bias = rng.integers(-5000, 5000, cout).astype(np.int32)
    acc = _conv_loops(x, w, bias, zp, (stride, stride), pad, (dil, dil), groups)
    rq = _rq(rng, cout if per_channel else 1, lo=int(rng.integers(-128, 0)))
    ly = L.Conv2d("c", _qt("x", x.shape, zp), _qt("y", acc.shape, rq.zero_point), w, bias,
                  (stride, stride), pad, (dil, dil), groups, rq)
    got = run_layer(ly, {"x": x})
    np.testing.assert_array_equal(got, _oracle_requant(acc, rq, axis=1))
    assert got.dtype == np.int8


def test_conv2d_accumulator_wraps_at_int32():
    x = np.full((1, 1, 1, 1), 1, np.int8)
    w = np.ones((1, 1, 1, 1), np.int8)
    bias = np.array([2**31 - 1], np.int32)  # + 1 wraps to INT32_MIN
    rq = L.Requant(np.array([1 << 30], np.int32), np.array([54], np.int32), 0)
    ly = L.Conv2d("c", _qt("x", (1, 1, 1, 1), 0), _qt("y", (1, 1, 1, 1), 0), w, bias,
                  (1, 1), (0, 0, 0, 0), (1, 1), 1, rq)
    got = run_layer(ly, {"x": x})
    assert got.item() == _requant_py(-(2**31), 1 << 30, 54, 0) == -128


# ----------------------------------------------------------------------------- matmuls


@SETTINGS
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 6), k=st.integers(1, 40), n=st.integers(1, 9),
       lead=st.booleans())
def test_dense_matches_float(seed, rows, k, n, lead):
    rng = np.random.default_rng(seed)
    shape = (2, rows, k) if lead else (rows, k)
    x, w = _i8(rng, shape), _i8(rng, (n, k))
    zp = int(rng.integers(-128, 128))
    bias = rng.integers(-10000, 10000, n).astype(np.int32)
    acc = (x.astype(np.float64) - zp) @ w.astype(np.float64).T + bias  # exact: < 2**53
    rq = _rq(rng, n)
    ly = L.Dense("d", _qt("x", shape, zp), _qt("y", acc.shape, rq.zero_point), w, bias, rq)
    np.testing.assert_array_equal(run_layer(ly, {"x": x}),
                                  _oracle_requant(acc.astype(np.int64), rq, axis=-1))


@SETTINGS
@given(seed=st.integers(0, 2**31), b=st.integers(1, 3), m=st.integers(1, 5), k=st.integers(1, 12),
       n=st.integers(1, 5))
def test_batch_matmul_matches_float(seed, b, m, k, n):
    rng = np.random.default_rng(seed)
    a, bb = _i8(rng, (b, m, k)), _i8(rng, (b, k, n))
    za, zb = (int(v) for v in rng.integers(-128, 128, 2))
    acc = np.matmul(a.astype(np.float64) - za, bb.astype(np.float64) - zb)
    rq = _rq(rng, 1)
    ly = L.BatchMatmul("bm", _qt("a", a.shape, za), _qt("b", bb.shape, zb),
                       _qt("y", acc.shape, rq.zero_point), rq)
    np.testing.assert_array_equal(run_layer(ly, {"a": a, "b": bb}),
                                  _oracle_requant(acc.astype(np.int64), rq, axis=-1))


# ----------------------------------------------------------------------------- pools


def _pool_loops(x, zp, kind, kernel, stride, pad):
    n, c, h, w = x.shape
    top, left, bottom, right = pad
    oh = (h + top + bottom - kernel[0]) // stride[0] + 1
    ow = (w + left + right - kernel[1]) // stride[1] + 1
    acc = np.zeros((n, c, oh, ow), np.int64)
    for b, ch, i, j in itertools.product(range(n), range(c), range(oh), range(ow)):
        vals = []
        for ky, kx in itertools.product(range(kernel[0]), range(kernel[1])):
            y, xx = i * stride[0] + ky - top, j * stride[1] + kx - left
            if 0 <= y < h and 0 <= xx < w:
                vals.append(int(x[b, ch, y, xx]) - zp)
            elif kind == "avg":
                vals.append(0)  # count_include_pad: the pad is the zero point
        acc[b, ch, i, j] = max(vals) if kind == "max" else sum(vals)
    return acc


@SETTINGS
@given(seed=st.integers(0, 2**31), kind=st.sampled_from(["max", "avg"]), k=st.integers(1, 3),
       stride=st.integers(1, 3), pad=st.integers(0, 1), hw=st.integers(3, 7))
def test_pool2d_matches_loops(seed, kind, k, stride, pad, hw):
    rng = np.random.default_rng(seed)
    pad = min(pad, k - 1)  # a window always holds one real pixel
    x = _i8(rng, (1, 3, hw, hw))
    zp = int(rng.integers(-128, 128))
    pads = (pad,) * 4
    acc = _pool_loops(x, zp, kind, (k, k), (stride, stride), pads)
    rq = _rq(rng, 1)
    ly = L.Pool2d("p", kind, _qt("x", x.shape, zp), _qt("y", acc.shape, rq.zero_point), (k, k),
                  (stride, stride), pads, rq)
    np.testing.assert_array_equal(run_layer(ly, {"x": x}), _oracle_requant(acc, rq, axis=1))


@pytest.mark.parametrize("keepdims", [True, False])
def test_global_avg_pool(keepdims):
    rng = np.random.default_rng(0)
    x = _i8(rng, (2, 5, 4, 3))
    acc = (x.astype(np.int64) + 7).sum(axis=(2, 3))
    rq = _rq(rng, 1)
    out_shape = (2, 5, 1, 1) if keepdims else (2, 5)
    ly = L.GlobalAvgPool("g", _qt("x", x.shape, -7), _qt("y", out_shape, rq.zero_point), rq)
    want = _oracle_requant(acc, rq, axis=1).reshape(out_shape)
    np.testing.assert_array_equal(run_layer(ly, {"x": x}), want)


# ----------------------------------------------------------------------------- elementwise


@SETTINGS
@given(seed=st.integers(0, 2**31), am=st.integers(-(1 << 21), 1 << 21),
       bm=st.integers(-(1 << 21), 1 << 21), shift=st.integers(0, 30))
def test_add_matches_integers(seed, am, bm, shift):
    rng = np.random.default_rng(seed)
    a, b = _i8(rng, (1, 2, 3, 3)), _i8(rng, (1, 2, 3, 3))
    za, zb, zy = (int(v) for v in rng.integers(-128, 128, 3))
    rq = L.Requant(np.array([1], np.int32), np.array([shift], np.int32), zy, (zy, 127))
    ly = L.Add("add", _qt("a", a.shape, za), _qt("b", b.shape, zb), _qt("y", a.shape, zy), am, bm, rq)
    want = np.empty(a.shape, np.int8)
    for idx in np.ndindex(*a.shape):
        acc = (int(a[idx]) - za) * am + (int(b[idx]) - zb) * bm
        want[idx] = _requant_py(acc, 1, shift, zy, zy, 127)
    np.testing.assert_array_equal(run_layer(ly, {"a": a, "b": b}), want)


@SETTINGS
@given(seed=st.integers(0, 2**31), am=st.integers(-(1 << 21), 1 << 21), shift=st.integers(0, 30),
       rank4=st.booleans())
def test_bias_add_adds_per_channel(seed, am, shift, rank4):
    """Channels are axis 1 of NCHW and the last axis of matrices."""
    rng = np.random.default_rng(seed)
    x = _i8(rng, (1, 3, 2, 2) if rank4 else (2, 4, 3))
    c = x.shape[1] if rank4 else x.shape[-1]
    bias = rng.integers(-(1 << 28), 1 << 28, c).astype(np.int32)
    zx, zy = (int(v) for v in rng.integers(-128, 128, 2))
    rq = L.Requant(np.array([1], np.int32), np.array([shift], np.int32), zy)
    ly = L.BiasAdd("ba", _qt("x", x.shape, zx), _qt("y", x.shape, zy), am, bias, rq)
    want = np.empty(x.shape, np.int8)
    for idx in np.ndindex(*x.shape):
        acc = _wrap32((int(x[idx]) - zx) * am + int(bias[idx[1] if rank4 else idx[-1]]))
        want[idx] = _requant_py(acc, 1, shift, zy)
    np.testing.assert_array_equal(run_layer(ly, {"x": x}), want)


def test_rescale_is_relu_in_integer_domain():
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 16, 16)
    rq = L.Requant(np.array([1 << 30], np.int32), np.array([30], np.int32), 5, (5, 127))  # x1.0
    ly = L.Rescale("r", _qt("x", x.shape, 5), _qt("y", x.shape, 5), rq)
    np.testing.assert_array_equal(run_layer(ly, {"x": x}), np.maximum(x, 5))


def test_rounding_is_half_up():
    # acc * m / 2**s = k + 1/2 exactly: rounds towards +inf for both signs
    rq = L.Requant(np.array([1 << 30], np.int32), np.array([31], np.int32), 0)  # x0.5
    x = np.array([[3, -3, 1, -1]], np.int8)
    ly = L.Rescale("r", _qt("x", x.shape, 0), _qt("y", x.shape, 0), rq)
    np.testing.assert_array_equal(run_layer(ly, {"x": x}), [[2, -1, 1, 0]])


# ----------------------------------------------------------------------------- regions


def test_region_runs_layers_in_order_and_checks_inputs():
    rng = np.random.default_rng(1)
    x = _i8(rng, (1, 2, 4, 4))
    t_x, t_c, t_y = _qt("x", x.shape, 0), _qt("c", x.shape, 0), _qt("y", x.shape, 0)
    w = np.eye(2, dtype=np.int8).reshape(2, 2, 1, 1)
    one = L.Requant(np.array([1 << 30], np.int32), np.array([30], np.int32), 0)
    conv = L.Conv2d("c", t_x, t_c, w, np.zeros(2, np.int32), (1, 1), (0,) * 4, (1, 1), 1, one)
    add = L.Add("y", t_c, t_x, t_y, 1, 1, L.Requant(np.array([1]), np.array([0]), 0))
    region = L.Region("r", [t_x], [t_y], [conv, add])
    out = run_region(region, {"x": x})["y"]
    np.testing.assert_array_equal(out, np.clip(2 * x.astype(np.int32), -128, 127))
    with pytest.raises(KeyError, match="missing input 'x'"):
        run_region(region, {})
    with pytest.raises(TypeError, match="must be int8"):
        run_region(region, {"x": x.astype(np.int32)})


def test_every_layer_type_has_one_room():
    """The registry finds a room for every layer type of the IR; where a type splits
    (depthwise Conv2d), exactly one room claims each layer."""
    from typing import get_args

    from tir_schedules.kinds import kind_of, kinds, room_of

    taken = {t for k in kinds() for t in k.layers}
    assert set(get_args(L.Layer)) <= taken
    for k in kinds():
        if k.shape is not None:
            assert k.knobs is not None and (k.build is not None or k.emit is not None)
            assert kind_of(object.__new__(k.shape)) is k
    x = L.QTensor("x", (1, 4, 6, 6), 0.1, 0)
    y = L.QTensor("y", (1, 4, 4, 4), 0.1, 0)
    rq = L.Requant(np.array([1 << 20], np.int32), np.array([20], np.int32), 0)
    dw = L.Conv2d("dw", x, y, np.ones((4, 1, 3, 3), np.int8), np.zeros(4, np.int32), (1, 1),
                  (0, 0, 0, 0), (1, 1), 4, rq)
    full = L.Conv2d("c", x, y, np.ones((4, 4, 3, 3), np.int8), np.zeros(4, np.int32), (1, 1),
                    (0, 0, 0, 0), (1, 1), 1, rq)
    assert room_of(dw).name == "depthwise" and room_of(full).name == "conv2d"

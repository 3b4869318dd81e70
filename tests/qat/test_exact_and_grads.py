"""The integer products and the straight-through gradients QAT trains with."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.qat import exact
from dsa_tvm.qat.fake_quant import fake_quant, straight_through


def _extreme_codes(rng, shape, lo, hi):
    """Codes mostly at the range's ends (the partial sums' worst case), some inside."""
    v = rng.choice([lo, hi], size=shape)
    inside = rng.random(shape) < 0.3
    return np.where(inside, rng.integers(lo, hi + 1, size=shape), v)


@settings(max_examples=25, deadline=None)
@given(k=st.sampled_from([1, 7, 300, 600, 3000, 5000]), w_max=st.sampled_from([7, 127]),
       seed=st.integers(0, 2**16))
def test_int_product_is_exact_for_every_reduction_length(k, w_max, seed):
    """Short reductions in float32, longer ones split in nibbles, the longest in float64:
    all equal numpy's int64 product, with codes at the worst-case ends."""
    rng = np.random.default_rng(seed)
    x = _extreme_codes(rng, (3, k), -255, 255)
    w = _extreme_codes(rng, (5, k), -w_max, w_max)
    got = exact.int_product(F.linear, torch.tensor(x, dtype=torch.float32),
                            torch.tensor(w, dtype=torch.float32), k, w_max)
    np.testing.assert_array_equal(got, x.astype(np.int64) @ w.astype(np.int64).T)


@settings(max_examples=10, deadline=None)
@given(cin=st.sampled_from([1, 16, 130]), groups=st.booleans(), stride=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
def test_int_conv_is_exact(cin, groups, stride, seed):
    rng = np.random.default_rng(seed)
    g = cin if groups else 1
    cout = cin if groups else 8
    x = _extreme_codes(rng, (2, cin, 9, 9), -255, 255)
    w = _extreme_codes(rng, (cout, cin // g, 3, 3), -127, 127)
    got = exact.int_product(lambda a, b: F.conv2d(a, b, stride=stride, padding=1, groups=g),
                            torch.tensor(x, dtype=torch.float32),
                            torch.tensor(w, dtype=torch.float32), w[0].size, 127)
    want = F.conv2d(torch.tensor(x, dtype=torch.float64), torch.tensor(w, dtype=torch.float64),
                    stride=stride, padding=1, groups=g).numpy()
    np.testing.assert_array_equal(got, want.astype(np.int64))


def test_fake_quant_forward_is_quantize_dequantize():
    x = torch.tensor([-3.0, -0.25, 0.05, 0.15, 0.25, 1.0, 100.0])
    s = torch.tensor(0.1)
    y = fake_quant(x, s, 3, -128, 127)
    q = np.clip(np.round(x.numpy() / np.float32(0.1)) + 3, -128, 127)
    np.testing.assert_array_equal(y.numpy(), ((q - 3) * np.float32(0.1)).astype(np.float32))


def test_gradients_pass_inside_the_range_and_stop_outside():
    x = torch.tensor([-20.0, -1.0, 0.0, 1.0, 20.0], requires_grad=True)
    s = torch.tensor(0.1, requires_grad=True)
    fake_quant(x, s, 0, -128, 127).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 1, 1, 1, 0])
    # LSQ: outside the range the step is the clamp code, inside round(v) - v (here 0)
    want = (-128 + 127) / np.sqrt(5 * 127)
    assert s.grad.item() == pytest.approx(want, rel=1e-5)


_finite = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=60, deadline=None)
@given(approx=st.lists(_finite, min_size=1, max_size=8), exact_=st.lists(_finite, min_size=1,
       max_size=8), weights=st.lists(st.floats(-4, 4, width=32), min_size=8, max_size=8))
def test_straight_through_forwards_exact_bit_for_bit_and_approxs_gradient(approx, exact_,
                                                                          weights):
    """The forward value is the exact tensor's, every bit (the DSA's outputs are those
    bits; ``a + (e - a)`` rounds where a and e are far apart), broadcast as a sum would be;
    the gradient reaches ``approx`` alone, whole."""
    n = min(len(approx), len(exact_))
    a = torch.tensor(approx[:n], requires_grad=True)
    e = torch.tensor(exact_[:n], requires_grad=True)
    y = straight_through(a, e)
    assert y.dtype == torch.float32 and torch.equal(y, e.detach())
    w = torch.tensor(weights[:n])
    (y * w).sum().backward()
    assert torch.equal(a.grad, w) and e.grad is None
    col = torch.zeros(n, 1, requires_grad=True)   # approx broadcast against a wider exact
    row = straight_through(col, e.detach().reshape(1, n).double())
    assert row.shape == (n, n) and row.dtype == torch.float64
    assert torch.equal(row, e.detach().double().expand(n, n))
    row.sum().backward()
    assert torch.equal(col.grad, torch.full((n, 1), float(n)))


@settings(max_examples=20, deadline=None)
@given(scale=st.sampled_from([1e-6, 1e-3, 0.05, 7.0]), zp=st.integers(-128, 127),
       seed=st.integers(0, 2**16))
def test_output_stage_is_the_simulators(scale, zp, seed):
    """exact.output_stage against semantics.output_stage per channel (tiny scales,
    saturating accumulators included)."""
    from dsa_tvm.isa import semantics as sem

    rng = np.random.default_rng(seed)
    acc = rng.integers(-2**31, 2**31, size=(2, 4, 3), dtype=np.int64)
    bias = rng.integers(-2**20, 2**20, size=4).astype(np.int32)
    factors = scale * rng.uniform(0.5, 2.0, 4)
    got = exact.output_stage(acc, bias, factors, zp, (-128, 127), 1)
    mult, shift = sem.quantize_multipliers(factors)
    want = sem.output_stage(acc.astype(np.int32), bias.reshape(1, 4, 1),
                            mult.reshape(1, 4, 1), shift.reshape(1, 4, 1), zp)
    np.testing.assert_array_equal(got, want)

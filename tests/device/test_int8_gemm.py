"""The exact int8 product backend of the functional model's GEMMs (``sim.int8_gemm``):
equal to int64 numpy wherever it is used, refused where it would saturate."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.sim import int8_gemm

needs_backend = pytest.mark.skipif(not int8_gemm.available(),
                                   reason="no exact int8 products on this CPU: float32 path")


@needs_backend
@settings(max_examples=60, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=2), m=st.integers(1, 40),
       k=st.integers(1, 300), n=st.integers(1, 40), shared=st.booleans(),
       fill=st.sampled_from([None, -128, 127]), seed=st.integers(0, 2**32 - 1))
def test_matmul_equals_int64(lead, m, k, n, shared, fill, seed):
    """Broadcast leading axes (weights shared or per batch), every code including the
    extremes that saturate 16-bit pair sums."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (*lead, m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (k, n) if shared else (*lead, k, n), dtype=np.int8)
    if fill is not None:
        x[...] = fill
        w[..., ::2, :] = -128
        w[..., 1::2, :] = 127
    got = int8_gemm.matmul(x, w, int8_gemm.column_sums(w))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.matmul(x.astype(np.int64), w.astype(np.int64)))


@needs_backend
def test_longest_reduction_fits_int32():
    """At MAX_K every shifted product at its largest still sums inside int32."""
    k = int8_gemm.MAX_K
    x = np.full((1, k), 127, np.int8)
    w = np.full((k, 2), 127, np.int8)
    w[:, 1] = -128
    got = int8_gemm.matmul(x, w, int8_gemm.column_sums(w))
    assert got.tolist() == [[127 * 127 * k, -127 * 128 * k]]


@needs_backend
def test_longer_reductions_run_in_parts_and_wrap_like_the_accumulator():
    """Past MAX_K the reduction runs in parts; the int32 sum wraps as the accumulator
    does (here past 2**31 on purpose), and a biased input gives the same."""
    k = 3 * int8_gemm.MAX_K + 5
    x = np.full((2, k), 127, np.int8)
    x[1, ::3] = -128
    w = np.full((k, 3), 127, np.int8)
    w[:, 1] = -128
    w[::7, 2] = -5
    want = np.matmul(x.astype(np.int64), w.astype(np.int64))
    want = ((want + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)
    got = int8_gemm.matmul(x, w, int8_gemm.column_sums(w))
    np.testing.assert_array_equal(got, want)
    biased = (x.view(np.uint8) ^ np.uint8(0x80)).view(np.int8)
    np.testing.assert_array_equal(int8_gemm.matmul(biased, w, int8_gemm.column_sums(w), True),
                                  want)


class _Saturating:
    """A backend whose pair sums saturate at 16 bits, as u8s8 kernels without VNNI do."""

    def run(self, _outputs, feeds):
        a, b = feeds["A"].astype(np.int64), feeds["B"].astype(np.int64)
        prod = a[:, :, None] * b[None, :, :]                       # (m, k, n)
        k = prod.shape[1] - prod.shape[1] % 2
        pairs = np.clip(prod[:, 0:k:2] + prod[:, 1:k:2], -(1 << 15), (1 << 15) - 1)
        return [(pairs.sum(axis=1) + prod[:, k:].sum(axis=1)).astype(np.int32)]


def test_a_saturating_backend_is_refused(monkeypatch):
    """The backend proves itself on the extreme codes before use: one that saturates is
    not available and the float32 path is taken; a missing onnxruntime likewise."""
    assert not int8_gemm._proves_exact(_Saturating())
    for make in (lambda: _Saturating(), lambda: (_ for _ in ()).throw(ImportError("no ort"))):
        monkeypatch.setattr(int8_gemm, "_STATE", {})
        monkeypatch.setattr(int8_gemm, "_session", make)
        assert int8_gemm.available() is False

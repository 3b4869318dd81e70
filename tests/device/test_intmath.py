"""The integer helpers every layer shares (dsa_tvm.intmath), against exact references."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from dsa_tvm.flow import FlowResult
from dsa_tvm.intmath import ceil_div, window_out, window_out_hw
from dsa_tvm.quant.metrics import cosine


@given(st.integers(-10**30, 10**30), st.integers(1, 10**20))
def test_ceil_div_is_exact(a, b):
    assert ceil_div(a, b) == math.ceil(Fraction(a, b))   # exact, also beyond float range


@given(size=st.integers(1, 40), kernel=st.integers(1, 7), stride=st.integers(1, 4),
       pads=st.tuples(st.integers(0, 3), st.integers(0, 3)), dilation=st.integers(1, 3))
def test_window_out_counts_the_windows(size, kernel, stride, pads, dilation):
    """Every start position whose last tap still lies in the padded input is a window."""
    span = dilation * (kernel - 1) + 1
    padded = size + pads[0] + pads[1]
    want = len(range(0, padded - span + 1, stride)) if padded >= span else 0
    got = window_out(size, kernel, stride, pads[0], pads[1], dilation)
    assert max(got, 0) == want
    assert window_out_hw(size, size + 1, (kernel, 1), (stride, 1), (pads[0], 0, pads[1], 0),
                         (dilation, 1)) == (got, size + 1)


def test_cosine_defines_all_zero_inputs():
    z, v = np.zeros(4), np.array([1.0, -2.0, 0.0, 3.0])
    assert cosine(z, z) == 1.0            # identical
    assert cosine(z, v) == cosine(v, z) == 0.0
    assert cosine(v, 2 * v) == 1.0 and cosine(v, -v) == -1.0


def test_flow_agreement_of_all_zero_outputs_is_not_perfect():
    """A DSA output of zeros against a non-zero reference: cosine 0, not 1 (the flow's own
    inline cosine said 1.0 whenever either side was all zeros)."""
    ref = np.array([[0.5, -1.0, 2.0]], np.float32)
    res = FlowResult("m", None, [np.zeros_like(ref)], [ref], None, None)
    assert res.agreement(None)["cosine"] == 0.0
    same = FlowResult("m", None, [ref.copy()], [ref], None, None)
    assert same.agreement(0.5)["cosine"] == 1.0

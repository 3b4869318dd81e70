"""Host im2col of a few-channel conv's input (dsa_tvm.lowering.fold_input)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.layers.layouts import im2col
from dsa_tvm.lowering.fold_input import fold_conv, fold_region_inputs
from dsa_tvm.lowering.region import compile_region
from tir_schedules.kinds import run_region
from tir_schedules.options import options

from .test_lowering import CFGS, check, conv, qt, region


def _direct_taps(x, kh, kw, stride, pad, dil, zp):
    """Independent im2col: one output pixel at a time, taps read with bounds checks."""
    n, c, h, w = x.shape
    oh = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    ow = (w + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    out = np.empty((n, kh * kw * c, oh, ow), x.dtype)
    for b in range(n):
        for y in range(oh):
            for xo in range(ow):
                for i in range(kh):
                    for j in range(kw):
                        r, s = y * stride - pad + i * dil, xo * stride - pad + j * dil
                        inside = 0 <= r < h and 0 <= s < w
                        out[b, (i * kw + j) * c:(i * kw + j + 1) * c, y, xo] = (
                            x[b, :, r, s] if inside else zp)
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 2), st.integers(0, 2),
       st.integers(1, 2), st.integers(-128, 127), st.integers(0, 2**31))
def test_im2col_matches_direct_taps(c, k, stride, pad, dil, zp, seed):
    x = np.random.default_rng(seed).integers(-128, 128, (2, c, 7, 6), dtype=np.int8)
    got = im2col(x, (k, k), (stride, stride), (pad,) * 4, (dil, dil), zp)
    np.testing.assert_array_equal(got, _direct_taps(x, k, k, stride, pad, dil, zp))


def test_folded_conv_is_the_same_integer_layer():
    """reference(conv, x) == reference(1x1 conv, im2col(x)): the fold changes no sum."""
    rng = np.random.default_rng(3)
    x = qt(rng, "x", (1, 3, 12, 10))
    ly = conv(rng, x, 20, 5, 2, 2, "stem")
    xs = rng.integers(-128, 128, x.shape, dtype=np.int8)
    want = run_region(region([x], [ly]), {"x": xs})["stem_y"]
    f = fold_conv(ly)
    cols = im2col(xs, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1), x.zero_point)
    got = run_region(region([f.input], [f]), {"x": cols})["stem_y"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("preset", sorted(CFGS))
def test_stem_conv_folds_bit_exact_and_faster(preset):
    cfg, rng = CFGS[preset], np.random.default_rng(7)
    x = qt(rng, "x", (1, 3, 32, 32))
    stem = conv(rng, x, cfg.block_out + 5, 7, 2, 3, "stem")
    reg = region([x], [stem])
    assert fold_region_inputs(reg, cfg)[1] == {"x": {"kernel": [7, 7], "strides": [2, 2],
                                                     "padding": [3, 3, 3, 3],
                                                     "dilation": [1, 1]}}
    folded = check(reg, cfg, rng)
    with options(fold_min_gain=math.inf):  # never fold
        plain = check(reg, cfg, rng)
        assert "im2col" not in compile_region(reg, cfg).program.meta["io"]["x"]
    assert folded.cycles * 2 < plain.cycles


def test_no_fold_when_the_input_has_other_readers_or_full_blocks():
    cfg, rng = CFGS["default"], np.random.default_rng(1)
    x = qt(rng, "x", (1, 3, 16, 16))
    a, b = conv(rng, x, 8, 3, 1, 1, "a"), conv(rng, x, 8, 3, 1, 1, "b")
    assert fold_region_inputs(region([x], [a, b], [a.output, b.output]), cfg)[1] == {}
    wide = qt(rng, "w", (1, cfg.block_in, 16, 16))
    assert fold_region_inputs(region([wide], [conv(rng, wide, 8, 3, 1, 1)]), cfg)[1] == {}
    one = conv(rng, x, 8, 1, 1, 0)
    assert fold_region_inputs(region([x], [one]), cfg)[1] == {}


def _stem_report(reg, cfg, rng):
    from dsa_tvm.layers.host_pack import pack_region_input
    from dsa_tvm.report import build_report
    from dsa_tvm.runtime import Launch
    from dsa_tvm.sim.simulator import Simulator

    prog = compile_region(reg, cfg).program
    xs = {t.name: rng.integers(-128, 128, t.shape, dtype=np.int8) for t in reg.inputs}
    feeds = {}
    for k, v in xs.items():
        feeds.update(pack_region_input(k, v, prog.meta["io"][k], cfg.block_in, cfg.block_out))
    return prog, build_report([Launch(prog, Simulator(cfg).run(prog, feeds), xs, {})])


def test_folded_stem_bound_counts_the_im2col_matrix():
    """Issue 19.4: a folded stem's compulsory bytes are the host-packed im2col matrix the
    DSA reads (C*KH*KW bytes per output pixel), not the unexpanded image; the run
    report's roofline bound and the benchmark use the program's layer table."""
    cfg, rng = CFGS["default"], np.random.default_rng(5)
    c, hw, k, stride, pad, cout = 3, 32, 7, 2, 3, 24
    x = qt(rng, "x", (1, c, hw, hw))
    reg = region([x], [conv(rng, x, cout, k, stride, pad, "stem")])
    oh = (hw + 2 * pad - k) // stride + 1
    weights, out = cout * c * k * k, cout * oh * oh
    image, cols = c * hw * hw, c * k * k * oh * oh  # every pixel is read: a 7x7 window, stride 2
    prog, rep = _stem_report(reg, cfg, rng)
    assert "im2col" in prog.meta["io"]["x"]
    (meta,) = prog.meta["layers"]
    assert (meta["min_read_bytes"], meta["min_write_bytes"]) == (cols + weights, out)
    (row,) = rep.rows
    assert (row.min_read, row.min_written) == (cols + weights, out)
    assert row.dram_read >= row.min_read and not row.check
    macs = out * c * k * k
    want = max(math.ceil(macs / cfg.peak_macs_per_cycle),
               math.ceil((cols + weights + out) / cfg.bandwidth_bytes_per_cycle))
    assert row.bound == want == rep.bound_cycles
    with options(fold_min_gain=math.inf):  # never fold: the image itself is the input
        prog, rep = _stem_report(reg, cfg, rng)
    assert "im2col" not in prog.meta["io"]["x"]
    assert rep.rows[0].min_read == image + weights

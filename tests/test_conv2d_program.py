"""The hand-written conv2d program against its numpy reference, on every preset.

Every program runs on the simulator with its hazard checker on (a missing
dependency token fails the run), goes through the binary encoding and back, and
must match ``reference_conv2d`` bit for bit. The reference itself is checked
against a direct loop over output pixels.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.instructions import Alu, AluOp
from dsa_tvm.isa.program import Program
from dsa_tvm.isa.semantics import quantize_multiplier, requantize, split_requant_imm
from dsa_tvm.programs.conv2d import (
    Conv2dTiling,
    conv2d_program,
    conv_output_size,
    default_tiling,
    pack_bias,
    pack_conv_weights,
    pack_input,
    pack_qparams,
    reference_conv2d,
    unpack_output,
)
from dsa_tvm.sim.simulator import Simulator

PRESETS = ("edge", "default", "large")


def _cdiv(a, b):
    return -(-a // b)


def _case(cfg, h, w, cin, cout, k, stride, pad, *, seed=0, input_zp=0, output_zp=0,
          use_bias=False, relu=False, requant=True, double_buffer=True, tiling=None,
          kw=None, clip=None):
    """Build, encode, decode, simulate and compare one conv; returns the SimResult."""
    kh, kw = k, (k if kw is None else kw)
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (h, w, cin), dtype=np.int8)
    wt = rng.integers(-128, 128, (cout, kh, kw, cin), dtype=np.int8)
    ms = [quantize_multiplier(float(s)) for s in rng.uniform(1e-4, 1e-2, cout)]
    bias = rng.integers(-30000, 30000, cout).astype(np.int32)
    qp = pack_qparams([m for m, _ in ms], [s for _, s in ms], cfg,
                      bias=bias if use_bias else None)
    prog = conv2d_program(cfg, h, w, cin, cout, kh, kw, stride, pad,
                          double_buffer=double_buffer, tiling=tiling, requant=requant,
                          use_bias=use_bias, relu=relu, input_zp=input_zp, output_zp=output_zp,
                          clip=clip)
    prog = Program.from_bytes(prog.to_bytes(cfg), cfg)  # every field encodes
    inputs = {"x": pack_input(x, cfg), "w": pack_conv_weights(wt, cfg)}
    if requant:
        inputs["qp"] = qp
    elif use_bias:
        inputs["bias"] = pack_bias(bias, cfg)
    res = Simulator(cfg).run(prog, inputs)
    want = reference_conv2d(x, wt, qp if requant else None, stride, pad,
                            bias if use_bias and not requant else None, input_zp, output_zp,
                            relu, clip)
    got = unpack_output(res.outputs["out"], cout)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    alus = [ins for ins in prog.instructions if isinstance(ins, Alu)]
    m = prog.meta
    ocb = -(-cout // cfg.block_out)
    tiles = _cdiv(m["oh"], m["tile_oh"]) * _cdiv(m["ow"], m["tile_ow"]) * _cdiv(ocb,
                                                                                m["tile_ocb"])
    if requant:   # one fused output stage per tile, nothing else on the vector unit
        assert len(alus) == tiles and all(ins.op == AluOp.REQUANT for ins in alus)
        zp, lo, hi = split_requant_imm(alus[0].imm)
        assert zp == output_zp and hi == (127 if clip is None else clip[1])
        assert lo == max(output_zp if relu else -128, -128 if clip is None else clip[0])
    else:
        assert {ins.op for ins in alus} <= {AluOp.ADD, AluOp.MAX}
    return res


@pytest.fixture(scope="module", params=PRESETS)
def cfg(request):
    return load_config(request.param)


# ----------------------------------------------------------------------------- reference

def _naive_conv(x, wt, stride, pad, zp):
    co, kh, kw, ci = wt.shape
    h, w, _ = x.shape
    oh, ow = conv_output_size(h, w, kh, kw, stride, pad)
    xp = np.full((h + 2 * pad, w + 2 * pad, ci), zp, dtype=np.int64)
    xp[pad:pad + h, pad:pad + w] = x
    out = np.zeros((oh, ow, co), dtype=np.int64)
    for i in range(oh):
        for j in range(ow):
            patch = xp[i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[i, j] = np.tensordot(wt.astype(np.int64), patch, axes=([1, 2, 3], [0, 1, 2]))
    return out


@pytest.mark.parametrize("stride,pad,k,zp", [(1, 1, 3, 0), (2, 3, 7, -5), (2, 0, 1, 4)])
def test_reference_matches_direct_loop(stride, pad, k, zp):
    cfg = load_config("edge")
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (11, 9, 5), dtype=np.int8)
    wt = rng.integers(-128, 128, (6, k, k, 5), dtype=np.int8)
    bias = rng.integers(-1000, 1000, 6).astype(np.int32)
    mult, shift = np.full(6, 1 << 30), np.arange(6) + 10
    qp = pack_qparams(mult, shift, cfg, bias=bias)
    acc = _naive_conv(x, wt, stride, pad, zp) + bias
    want = requantize(acc, mult, shift, 7)
    got = reference_conv2d(x, wt, qp, stride, pad, None, zp, 7)
    np.testing.assert_array_equal(got, want)
    # ReLU: lo = the output zero point; ReLU6-style clip: a tighter hi as well
    np.testing.assert_array_equal(reference_conv2d(x, wt, qp, stride, pad, None, zp, 7, True),
                                  np.maximum(want, 7))
    np.testing.assert_array_equal(
        reference_conv2d(x, wt, qp, stride, pad, None, zp, 7, True, (-128, 30)),
        np.clip(want, 7, 30))
    np.testing.assert_array_equal(reference_conv2d(x, wt, None, stride, pad, None, zp),
                                  _naive_conv(x, wt, stride, pad, zp))
    np.testing.assert_array_equal(reference_conv2d(x, wt, None, stride, pad, bias, zp, relu=True),
                                  np.maximum(_naive_conv(x, wt, stride, pad, zp) + bias, 0))
    with pytest.raises(ValueError, match="row 0 of the table"):
        reference_conv2d(x, wt, qp, stride, pad, bias, zp, 7)


def test_pack_qparams_layout_by_hand():
    cfg = load_config("edge")                        # block_out 8
    qp = pack_qparams([10, 11, 12], [1, 2, 3], cfg, bias=[-1, -2, -3])
    assert qp.shape == (1, 3, 8) and qp.dtype == np.int32
    assert qp[0, 0].tolist() == [-1, -2, -3, 0, 0, 0, 0, 0]     # bias row
    assert qp[0, 1].tolist() == [10, 11, 12, 0, 0, 0, 0, 0]     # mult row
    assert qp[0, 2].tolist() == [1, 2, 3, 0, 0, 0, 0, 0]        # shift row
    assert pack_qparams(np.arange(9), np.arange(9), cfg).shape == (2, 3, 8)
    assert not pack_qparams([1], [1], cfg)[:, 0].any()          # no bias: zero row
    with pytest.raises(ValueError):
        pack_qparams([1, 2], [1], cfg)
    with pytest.raises(ValueError):
        pack_qparams([1, 2], [1, 2], cfg, bias=[1])


# ----------------------------------------------------------------------------- programs

@pytest.mark.parametrize("name,shape,opts", [
    ("cin3_3x3", (9, 10, 3, 20, 3, 1, 1), dict(input_zp=5, use_bias=True)),
    ("stem_7x7_s2", (15, 13, 3, 10, 7, 2, 3), dict(input_zp=-7, output_zp=3, relu=True)),
    ("1x1", (8, 7, 40, 24, 1, 1, 0), dict(use_bias=True, relu=True)),
    ("1x1_s2", (9, 9, 20, 33, 1, 2, 0), dict(output_zp=-4)),
    ("3x3_s2", (10, 9, 24, 17, 3, 2, 1), dict(input_zp=3, use_bias=True)),
    ("int32_out", (6, 6, 10, 12, 3, 1, 1), dict(requant=False, use_bias=True, relu=True)),
    ("single_buffer", (8, 8, 20, 20, 3, 1, 1), dict(double_buffer=False, input_zp=-1)),
    ("relu6", (7, 6, 12, 18, 3, 1, 1), dict(input_zp=2, output_zp=-6, use_bias=True, relu=True,
                                            clip=(-128, 6))),
    ("int32_bias_only", (5, 5, 9, 10, 1, 1, 0), dict(requant=False, use_bias=True)),
    # edge: 50 output blocks of REQUANT groups do not stay resident; reloaded per tile
    ("many_out_channels", (3, 4, 8, 400, 1, 1, 0), dict(use_bias=True, relu=True, output_zp=2)),
    ("1x1_pad_only_border", (5, 6, 8, 8, 1, 1, 2), dict(input_zp=9, use_bias=True)),
])
def test_conv_matches_reference(cfg, name, shape, opts):
    h, w, cin, cout, k, stride, pad = shape
    _case(cfg, h, w, cin, cout, k, stride, pad, seed=sum(map(ord, name)), **opts)


def test_reduction_split_and_narrow_tiles(cfg):
    """Input-block chunks (row-wise loads, zero-point fills), narrow and short tiles."""
    cin = 3 * cfg.block_in + 1
    t = Conv2dTiling(tile_oh=2, tile_ow=3, tile_ocb=1, tile_icb=2, ocb_outer=False)
    _case(cfg, 7, 8, cin, cfg.block_out + 3, 3, 1, 1, input_zp=-9, use_bias=True, tiling=t)
    t = Conv2dTiling(tile_oh=3, tile_ow=2, tile_ocb=2, tile_icb=1, ocb_outer=True)
    _case(cfg, 9, 7, cin, 3 * cfg.block_out, 3, 2, (2, 0, 1, 2), input_zp=4, relu=True,
          tiling=t)


def test_asymmetric_kernel_stride_and_padding(cfg):
    _case(cfg, 9, 11, 5, 6, 3, (2, 1), (1, 0, 2, 1), kw=1, input_zp=2)
    _case(cfg, 8, 8, 5, 6, 1, (1, 2), (0, 1, 0, 0), kw=3, input_zp=-2)


def test_default_tiling_fits_resnet_layers(cfg):
    """ResNet-50's largest channel counts still tile on the smallest scratchpads."""
    for shape in [(224, 224, 3, 64, 7, 2, 3), (7, 7, 2048, 512, 1, 1, 0),
                  (14, 14, 1024, 2048, 1, 2, 0), (7, 7, 512, 512, 3, 1, 1)]:
        h, w, cin, cout, k, s, p = shape
        t = default_tiling(cfg, h, w, cin, cout, k, k, s, p, use_bias=True, relu=True)
        prog = conv2d_program(cfg, h, w, cin, cout, k, k, s, p, tiling=t, use_bias=True,
                              relu=True)
        res = Simulator(cfg).run(prog, timing_only=True)  # no hazard, no deadlock
        oh, ow = conv_output_size(h, w, k, k, s, p)
        blocks = oh * ow * -(-cout // cfg.block_out) * k * k * -(-cin // cfg.block_in)
        assert res.counters["macs"] == blocks * cfg.peak_macs_per_cycle  # each output once


def test_constant_weights_parameters_and_bias():
    cfg = load_config("default")
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (6, 7, 19), dtype=np.int8)
    wt = rng.integers(-128, 128, (21, 3, 3, 19), dtype=np.int8)
    bias = rng.integers(-5000, 5000, 21).astype(np.int32)
    qp = pack_qparams(np.full(21, 1 << 30), np.arange(21) % 5 + 12, cfg, bias=bias)
    prog = conv2d_program(cfg, 6, 7, 19, 21, 3, 3, 1, 1, input_zp=-2, output_zp=1,
                          weights=wt, qparams=qp)
    prog = Program.from_bytes(prog.to_bytes(cfg), cfg)
    assert [r.name for r in prog.regions_of("input")] == ["x"]
    assert prog.region("qp").shape == (2, 3, 16)
    res = Simulator(cfg).run(prog, {"x": pack_input(x, cfg)})
    np.testing.assert_array_equal(unpack_output(res.outputs["out"], 21),
                                  reference_conv2d(x, wt, qp, 1, 1, None, -2, 1))
    # int32 output: the bias is its own constant region, added by ALU ADD
    prog = conv2d_program(cfg, 6, 7, 19, 21, 3, 3, 1, 1, input_zp=-2, requant=False,
                          weights=wt, bias=bias)
    res = Simulator(cfg).run(prog, {"x": pack_input(x, cfg)})
    np.testing.assert_array_equal(unpack_output(res.outputs["out"], 21),
                                  reference_conv2d(x, wt, None, 1, 1, bias, -2))
    with pytest.raises(ValueError, match="row 0 of the qparams table"):
        conv2d_program(cfg, 6, 7, 19, 21, 3, 3, 1, 1, weights=wt, qparams=qp, bias=bias)
    with pytest.raises(ValueError, match=r"qparams must be \[2, 3, 16\]"):
        conv2d_program(cfg, 6, 7, 19, 21, 3, 3, 1, 1, qparams=qp[:, :2])


def test_tiling_that_does_not_fit_is_refused():
    cfg = load_config("edge")
    with pytest.raises(ValueError, match="does not fit"):
        conv2d_program(cfg, 32, 32, 64, 64, 3, 3, 1, 1,
                       tiling=Conv2dTiling(32, 32, 8, 8))


def test_double_buffering_overlaps_dma_with_compute():
    """Same tiles, with and without a second slot per scratchpad: the tokens let the
    DMA of the next tile run under the GEMM of this one."""
    cfg = load_config("edge")
    shape = (7, 7, 512, 128, 1, 1, 0)
    t = default_tiling(cfg, *shape[:5], 1, *shape[5:], use_bias=True)
    db = _case(cfg, *shape, double_buffer=True, use_bias=True, tiling=t)
    sb = _case(cfg, *shape, double_buffer=False, use_bias=True, tiling=t)
    assert db.cycles < 0.8 * sb.cycles, (db.cycles, sb.cycles)
    assert db.counters["load.busy_cycles"] > 0.3 * db.cycles  # DMA is a real share


# ----------------------------------------------------------------------------- property

@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(preset=st.sampled_from(PRESETS), h=st.integers(1, 10), w=st.integers(1, 10),
       cin=st.integers(1, 40), cout=st.integers(1, 40), k=st.sampled_from([1, 2, 3, 5]),
       stride=st.integers(1, 3), pad=st.integers(0, 3), zp=st.integers(-128, 127),
       ozp=st.integers(-20, 20), bias=st.booleans(), relu=st.booleans(),
       db=st.booleans(), seed=st.integers(0, 2**16),
       tiles=st.none() | st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3),
                                   st.integers(1, 3), st.booleans()))
def test_random_convs(preset, h, w, cin, cout, k, stride, pad, zp, ozp, bias, relu, db, seed,
                      tiles):
    """Random shapes with the chosen tiling, or with random (possibly ragged) tiles."""
    assume(h + 2 * pad >= k and w + 2 * pad >= k)
    cfg = load_config(preset)
    tiling = None if tiles is None else Conv2dTiling(*tiles)
    try:
        _case(cfg, h, w, cin, cout, k, stride, pad, seed=seed, input_zp=zp, output_zp=ozp,
              use_bias=bias, relu=relu, double_buffer=db, tiling=tiling)
    except ValueError as e:  # a random tiling may not fit
        assert tiling is not None and "does not fit" in str(e)

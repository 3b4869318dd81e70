"""Conv2d layers through the compiler's lowering, bit-exact against the CPU reference.

What the retired hand-written conv2d program was tested for, asked of the programs
``compile_region`` generates: the conv shapes of real networks (the few-channel 7x7/2
stem, strided 1x1 and 3x3, padding wider than the kernel, asymmetric kernels, strides
and padding, more output channels than the output-stage table keeps resident),
nonzero zero points, bias, ReLU and ReLU6 clips, and ResNet-50's largest layers on
the smallest scratchpads. Every program goes through the binary encoding and back,
runs on the simulator with its hazard checker on, and must match
``tir_schedules.kinds.run_region`` bit for bit (the reference itself is checked
against direct loops in ``test_reference.py``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("tvm")

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dsa_tvm.hw.config import HardwareConfig  # noqa: E402
from dsa_tvm.isa.program import Program  # noqa: E402
from dsa_tvm.isa.semantics import quantize_multiplier  # noqa: E402
from dsa_tvm.layers import ir as L  # noqa: E402
from dsa_tvm.layers.host_pack import pack_region_input  # noqa: E402
from dsa_tvm.layers.layouts import unpack_activation  # noqa: E402
from dsa_tvm.lowering.region import compile_region, lowering_supports  # noqa: E402
from dsa_tvm.sim.simulator import Simulator  # noqa: E402
from tir_schedules.kinds import run_region  # noqa: E402

from .test_lowering import CFGS, PRESETS  # noqa: E402

Pair = tuple[int, int]


def _conv_region(rng: np.random.Generator, h: int, w: int, cin: int, cout: int,
                 k: int | Pair, stride: int | Pair, pad: int | tuple[int, int, int, int], *,
                 input_zp: int = 0, output_zp: int = 0, bias: bool = True,
                 clip: Pair = (-128, 127)) -> L.Region:
    """A one-conv region on a 1-image NCHW input with random int8 weights."""
    kh, kw = (k, k) if isinstance(k, int) else k
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    top, left, bottom, right = (pad,) * 4 if isinstance(pad, int) else pad
    oh, ow = (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1
    wgt = rng.integers(-128, 128, (cout, cin, kh, kw), dtype=np.int8)
    scale = 40 / (74 * 74 * math.sqrt(wgt[0].size))  # ~1/spread of the accumulator
    pairs = [quantize_multiplier(float(f)) for f in scale * rng.uniform(0.25, 4, cout)]
    rq = L.Requant(np.array([p[0] for p in pairs], np.int32),
                   np.array([p[1] for p in pairs], np.int32), output_zp, clip)
    b = rng.integers(-30000, 30000, cout) if bias else np.zeros(cout)
    x = L.QTensor("x", (1, cin, h, w), 0.05, input_zp)
    y = L.QTensor("y", (1, cout, oh, ow), 0.05, output_zp)
    ly = L.Conv2d("conv", x, y, wgt, b.astype(np.int32), (sh, sw), (top, left, bottom, right),
                  (1, 1), 1, rq)
    return L.Region("r", [x], [y], [ly])


def _check(reg: L.Region, cfg: HardwareConfig, rng: np.random.Generator):
    """Compile, encode and decode, simulate, compare with run_region; the SimResult."""
    (xt,), (yt,) = reg.inputs, reg.outputs
    x = rng.integers(-128, 128, xt.shape, dtype=np.int8)
    prog = compile_region(reg, cfg).program
    prog = Program.from_bytes(prog.to_bytes(cfg), cfg)  # every field encodes
    feeds = pack_region_input(xt.name, x, prog.meta["io"][xt.name], cfg.block_in,
                              cfg.block_out)
    res = Simulator(cfg).run(prog, feeds)
    got = unpack_activation(res.outputs[yt.name], yt.shape)
    np.testing.assert_array_equal(got, run_region(reg, {xt.name: x})[yt.name])
    return res


# ----------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name,shape,opts", [
    ("cin3_3x3", (9, 10, 3, 20, 3, 1, 1), dict(input_zp=5)),
    ("stem_7x7_s2", (15, 13, 3, 10, 7, 2, 3), dict(input_zp=-7, output_zp=3, clip=(3, 127))),
    ("1x1", (8, 7, 40, 24, 1, 1, 0), dict(clip=(0, 127))),
    ("1x1_s2", (9, 9, 20, 33, 1, 2, 0), dict(output_zp=-4, bias=False)),
    ("3x3_s2", (10, 9, 24, 17, 3, 2, 1), dict(input_zp=3)),
    ("relu6", (7, 6, 12, 18, 3, 1, 1), dict(input_zp=2, output_zp=-6, clip=(-6, 6))),
    # edge: 50 output blocks of output-stage parameters do not stay resident
    ("many_out_channels", (3, 4, 8, 400, 1, 1, 0), dict(output_zp=2, clip=(2, 127))),
    ("1x1_pad_only_border", (5, 6, 8, 8, 1, 1, 2), dict(input_zp=9)),
    ("5x5_s3_pad_wider", (9, 8, 6, 7, 5, 3, 3), dict(input_zp=-128, output_zp=20)),
])
def test_conv_shapes_match_reference(preset, name, shape, opts):
    h, w, cin, cout, k, stride, pad = shape
    rng = np.random.default_rng(sum(map(ord, name)))
    _check(_conv_region(rng, h, w, cin, cout, k, stride, pad, **opts), CFGS[preset], rng)


@pytest.mark.parametrize("preset", PRESETS)
def test_asymmetric_kernel_stride_and_padding(preset):
    rng = np.random.default_rng(11)
    _check(_conv_region(rng, 9, 11, 5, 6, (3, 1), (2, 1), (1, 0, 2, 1), input_zp=2),
           CFGS[preset], rng)
    _check(_conv_region(rng, 8, 8, 5, 6, (1, 3), (1, 2), (0, 1, 0, 0), input_zp=-2),
           CFGS[preset], rng)


@pytest.mark.parametrize("preset", PRESETS)
def test_resnet50_largest_layers_lower_on_every_preset(preset):
    """ResNet-50's widest 1x1 layers still tile on the smallest scratchpads, and the
    program issues each output block's reduction exactly once (no tile is computed
    twice)."""
    cfg = CFGS[preset]
    rng = np.random.default_rng(2)
    for h, w, cin, cout, k, s, p in [(7, 7, 2048, 512, 1, 1, 0), (14, 14, 1024, 2048, 1, 2, 0),
                                     (7, 7, 512, 2048, 1, 1, 0)]:
        reg = _conv_region(rng, h, w, cin, cout, k, s, p, clip=(0, 127))
        (ly,) = reg.layers
        assert lowering_supports(ly, cfg) is None
        res = Simulator(cfg).run(compile_region(reg, cfg).program, timing_only=True)
        oh, ow = ly.output.shape[2:]
        blocks = oh * ow * -(-cout // cfg.block_out) * k * k * -(-cin // cfg.block_in)
        assert res.counters["macs"] == blocks * cfg.peak_macs_per_cycle
    for h, w, cin, cout, k, s, p in [(224, 224, 3, 64, 7, 2, 3), (7, 7, 512, 512, 3, 1, 1)]:
        ly = _conv_region(rng, h, w, cin, cout, k, s, p, clip=(0, 127)).layers[0]
        why = lowering_supports(ly, cfg)
        if preset == "edge" and cin == 512:
            # the conv schedule keeps a block's whole 3x3x512 reduction in WGT (576 rows
            # of 512): the partitioner keeps this layer on the CPU, and says why
            assert why is not None and "scratchpad" in why, why
        else:
            assert why is None, why


# ----------------------------------------------------------------------------- property
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(preset=st.sampled_from(PRESETS), h=st.integers(1, 10), w=st.integers(1, 10),
       cin=st.integers(1, 40), cout=st.integers(1, 40), k=st.sampled_from([1, 2, 3, 5]),
       stride=st.integers(1, 3), pad=st.integers(0, 3), zp=st.integers(-128, 127),
       ozp=st.integers(-20, 20), bias=st.booleans(), relu=st.booleans(),
       seed=st.integers(0, 2**16))
def test_random_convs(preset, h, w, cin, cout, k, stride, pad, zp, ozp, bias, relu, seed):
    """Random shapes, strides, paddings and zero points against the CPU reference.

    Padding stays below the kernel (every window reads an image pixel): with wider
    padding, an output tile made only of border rows makes ``compile_region`` raise
    CodegenError "a tile of the copy is all padding" (edge, 1x1 image, 1x1 kernel, pad 2,
    33 channels), a known limitation kept out of this property; the offload path keeps
    such a layer on the CPU with that reason, and the wide-border shapes that do compile
    are pinned in ``test_conv_shapes_match_reference``."""
    assume(pad < k and h + 2 * pad >= k and w + 2 * pad >= k)
    rng = np.random.default_rng(seed)
    reg = _conv_region(rng, h, w, cin, cout, k, stride, pad, input_zp=zp, output_zp=ozp,
                       bias=bias, clip=(ozp, 127) if relu else (-128, 127))
    cfg = CFGS[preset]
    assert lowering_supports(reg.layers[0], cfg) is None
    _check(reg, cfg, rng)

"""The same layers compiled under every array dataflow and output stage: bit-identical
outputs (matching the CPU reference), loop orders that suit the dataflow, and the
weight-stationary order's simulated cycles following its closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("tvm")

from dsa_tvm.hw.config import load_config  # noqa: E402
from dsa_tvm.isa.instructions import Gemm  # noqa: E402
from dsa_tvm.isa.program import Program  # noqa: E402
from dsa_tvm.layers.host_pack import pack_region_input  # noqa: E402
from dsa_tvm.layers.layouts import unpack_activation  # noqa: E402
from dsa_tvm.lowering.region import compile_region  # noqa: E402
from dsa_tvm.sim.simulator import Simulator  # noqa: E402
from dsa_tvm.sim.timing import compute_cycles  # noqa: E402
from tir_schedules.kinds import recipe, run_region  # noqa: E402
from tir_schedules.kinds.conv2d import candidate_knobs, fewest_folds  # noqa: E402

from .test_conv2d_region import _check, _conv_region  # noqa: E402

DATAFLOWS = ("matrix-vector", "weight-stationary", "output-stationary")
SHAPES = {
    "3x3": ((10, 9, 24, 40, 3, 1, 1), dict(input_zp=3)),
    "1x1_s2": ((9, 9, 20, 33, 1, 2, 0), dict(output_zp=-4, bias=False)),
    "stem_7x7_s2": ((15, 13, 3, 10, 7, 2, 3), dict(input_zp=-7, output_zp=3, clip=(3, 127))),
}


@pytest.mark.parametrize("preset", ["edge", "default"])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_dataflow_and_output_stage_gives_identical_outputs(preset, name):
    shape, opts = SHAPES[name]
    outs = {}
    for flow in DATAFLOWS:
        for stage in ("shared", "pipelined"):
            cfg = load_config(preset).replace(dataflow=flow, stage=stage,
                                              weight_double_buffer=flow != "matrix-vector")
            rng = np.random.default_rng(sum(map(ord, name)))
            reg = _conv_region(rng, *shape, **opts)
            res = _check(reg, cfg, rng)   # bit-exact against the CPU reference
            outs[flow, stage] = (next(iter(res.outputs.values())), res.cycles)
    first = next(iter(outs.values()))[0]
    for got, _ in outs.values():
        np.testing.assert_array_equal(got, first)
    # timing does differ: the description is not ignored
    assert len({c for _, c in outs.values()}) > 1


def test_weight_stationary_streams_pixels_past_one_weight_tile():
    shape, opts = SHAPES["3x3"]
    reg = _conv_region(np.random.default_rng(0), *shape, **opts)
    for flow in DATAFLOWS:
        cfg = load_config("default").replace(dataflow=flow)
        gemms = [i for i in compile_region(reg, cfg).program.instructions
                 if isinstance(i, Gemm)]
        inner = [i.loops[-1] for i in gemms]
        if flow == "weight-stationary":
            assert all(lp.wgt == 0 and lp.extent > 1 for lp in inner)
        else:
            assert all(lp.wgt != 0 or lp.extent == 1 for lp in inner)


def _closed_form(flow: str, m: int, k: int, n: int, r: int, c: int) -> int:
    """SCALE-Sim's compute cycles of an (m x k) @ (k x n) layer alone (per fold)."""
    if flow == "weight-stationary":
        return math.ceil(k / r) * math.ceil(n / c) * (m + 2 * r + c - 2)
    return math.ceil(m / r) * math.ceil(n / c) * (k + r + c - 2)


def _compiled(reg, cfg, pick):
    prog = compile_region(reg, cfg, pick).program
    return Program.from_bytes(prog.to_bytes(cfg), cfg)


@pytest.mark.parametrize("flow", DATAFLOWS)
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_input_channel_chunks_are_exact_on_every_dataflow(flow, data):
    """Input tiles holding only some channel blocks (the reduction split into chunks whose
    partial sums stay in the accumulator, weights chunk-major in the scratchpad) give the
    reference's numbers bit for bit, borders, strides and zero points included."""
    draw = data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cfg = load_config("default").replace(dataflow=flow)
    k, stride = draw(st.sampled_from([(1, 1), (1, 2), (3, 1), (3, 2)]))
    h = draw(st.integers(k + 1, 9))
    reg = _conv_region(rng, h, draw(st.integers(k + 1, 9)), draw(st.integers(33, 72)),
                       draw(st.integers(1, 40)), k, stride, draw(st.integers(0, k // 2)),
                       input_zp=draw(st.integers(-128, 127)), output_zp=3)
    shape = recipe(reg.layers[0], cfg, consts=False).shape
    chunked = [kn for kn in candidate_knobs(cfg, shape) if kn.tile_icb < shape.icb]
    knobs = draw(st.sampled_from(chunked))
    prog = _compiled(reg, cfg, lambda c, s: knobs)
    (xt,), (yt,) = reg.inputs, reg.outputs
    x = rng.integers(-128, 128, xt.shape, dtype=np.int8)
    feeds = pack_region_input(xt.name, x, prog.meta["io"][xt.name], cfg.block_in,
                              cfg.block_out)
    got = unpack_activation(Simulator(cfg).run(prog, feeds).outputs[yt.name], yt.shape)
    np.testing.assert_array_equal(got, run_region(reg, {xt.name: x})[yt.name])
    assert len(prog.instructions) > 0 and knobs.tile_icb < shape.icb


@pytest.mark.parametrize("flow, layer, inp_kib", [
    # ResNet-18 layer3's 3x3/2 conv: its 29x29 input over all 8 channel blocks is 6,728
    # rows, the 64 KiB input scratchpad 4,096: without chunks, pixels split in two and
    # every weight tile folds twice (1.19x the closed form)
    ("weight-stationary", (28, 28, 128, 256, 3, 2, 1), 64),
    # MobileNetV2's 14x14, 384 -> 64 projection: 196 pixels x 24 blocks fit 128 KiB
    ("output-stationary", (14, 14, 384, 64, 1, 1, 0), 128),
])
def test_fewest_folds_mapping_meets_the_closed_form(flow, layer, inp_kib):
    """With the mapping SCALE-Sim assumes (every output pixel streamed past each weight
    tile, or each fold's whole reduction streamed), the simulator's GEMM cycles are the
    closed form's exactly."""
    cfg = load_config("default").replace(dataflow=flow, inp_kib=inp_kib)
    h, w, cin, cout, k, stride, pad = layer
    reg = _conv_region(np.random.default_rng(0), h, w, cin, cout, k, stride, pad)
    prog = compile_region(reg, cfg, fewest_folds).program
    gemm = sum(compute_cycles(i, cfg) for i in prog.instructions if isinstance(i, Gemm))
    oh, ow = reg.outputs[0].shape[2:]
    assert gemm == _closed_form(flow, oh * ow, k * k * cin, cout, cfg.block_in, cfg.block_out)


@pytest.mark.parametrize("stride", [2, 3])
def test_strided_pointwise_conv_loads_only_the_pixels_it_reads(stride):
    """A 1x1 conv with stride s reads one pixel in s x s: its input tiles are strided LOADs
    of those pixels (not the rows and columns between them), bit-exact on every dataflow."""
    from dsa_tvm.isa.instructions import Buffer, Load
    from dsa_tvm.sim.timing import dma_bytes

    rng = np.random.default_rng(stride)
    reg = _conv_region(rng, 13, 11, 40, 24, 1, stride, 0, input_zp=5)
    oh, ow = reg.outputs[0].shape[2:]
    for flow in DATAFLOWS:
        cfg = load_config("default").replace(dataflow=flow)
        prog = compile_region(reg, cfg).program
        read = sum(dma_bytes(i, cfg) for i in prog.instructions
                   if isinstance(i, Load) and i.buffer == Buffer.INP)
        assert read == oh * ow * math.ceil(40 / cfg.block_in) * cfg.block_in
        _check(reg, cfg, rng)

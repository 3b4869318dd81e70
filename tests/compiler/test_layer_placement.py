"""Consecutive layers of a region take disjoint scratchpad rows where both fit
(``dsa_tvm.lowering.region._walk_placed``): the next layer's weights load while this one
computes (tokens follow footprints, so shared rows would serialize them). Values stay
exact; a layer too big to sit above the previous one starts from row 0 as before."""

from __future__ import annotations

import numpy as np

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.instructions import Buffer, Engine, Gemm, Load
from dsa_tvm.lowering.region import compile_region

from .test_lowering import check, conv, qt, region

DEFAULT = load_config("default")


def _two_convs(rng, cin: int, mid: int, cout: int, hw: int):
    x = qt(rng, "x", (1, cin, hw, hw))
    a = conv(rng, x, mid, 3, 1, 1, name="a")
    b = conv(rng, a.output, cout, 3, 1, 1, name="b")
    return region([x], [a, b])


def _layer_ranges(prog) -> list[tuple[int, int]]:
    return [(m["first"], m["last"]) for m in prog.meta["layers"]]


def test_next_layer_weights_load_under_this_layers_compute():
    rng = np.random.default_rng(0)
    reg = _two_convs(rng, 16, 32, 32, 8)
    res = check(reg, DEFAULT, rng)                        # exact against the reference
    prog = compile_region(reg, DEFAULT).program
    (a0, a1), (b0, b1) = _layer_ranges(prog)
    ins, s = prog.instructions, res.schedule
    a_gemm_end = max(int(s.end[i]) for i in range(a0, a1 + 1) if isinstance(ins[i], Gemm))
    b_wgt = [i for i in range(b0, b1 + 1)
             if isinstance(ins[i], Load) and ins[i].buffer == Buffer.WGT]
    assert b_wgt and int(s.start[b_wgt[0]]) < a_gemm_end
    assert int(s.engine[b_wgt[0]]) == Engine.LOAD
    a_wgt = {ins[i].sram_base for i in range(a0, a1 + 1)
             if isinstance(ins[i], Load) and ins[i].buffer == Buffer.WGT}
    assert min(ins[i].sram_base for i in b_wgt) > max(a_wgt)   # above the first layer's rows


def test_a_layer_that_does_not_fit_above_starts_at_row_zero():
    """A weight scratchpad of 64 tiles: each 32-channel 3x3 conv's double-buffered weights
    take 36, so the second cannot sit above the first and starts at row 0; still exact."""
    rng = np.random.default_rng(1)
    cfg = DEFAULT.replace(wgt_kib=16)
    reg = _two_convs(rng, 32, 32, 32, 8)
    check(reg, cfg, rng)
    prog = compile_region(reg, cfg).program
    ins = prog.instructions
    firsts = [min(ins[i].sram_base for i in range(lo, hi + 1)
                  if isinstance(ins[i], Load) and ins[i].buffer == Buffer.WGT)
              for lo, hi in _layer_ranges(prog)]
    assert firsts == [0, 0]

"""Depthwise throughput (issue 13, deliverable 6): how close a depthwise conv gets to its
roofline bound, and that the faster schedules stay exact.

On this ISA both engines spend one compute-engine cycle per accumulator row and tap
(the vector unit: ``block_out / lanes`` cycles per row; the array: a GEMM step whose
diagonal weight tile does ``block_out`` useful MACs), plus the requant pass: a 3x3
stride-1 layer cannot beat ``(9 + 1) / 2`` = 5x its DRAM bound on a part whose vector unit
is one row wide. A vector unit wider than a row (``lanes > block_out``) runs several rows
per cycle; at 64 lanes (``default``) the same layer is DRAM-bound within 2x. Cycles are
simulated (deterministic), compared with the bound the program's layer table records;
values against the integer reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsa_tvm.hw.config import load_config
from dsa_tvm.layers.checks import compute_bound
from dsa_tvm.lowering.region import compile_region
from tir_schedules.kinds import conv2d, window
from tir_schedules.kinds.window import WindowKnobs

from .test_lowering import check, conv, depthwise_engine, qt, region

DEFAULT = load_config("default")
#: default with a vector unit one accumulator row wide (what it had before issue 13)
NARROW = DEFAULT.replace(lanes=DEFAULT.block_out)


def _bound(meta: dict, cfg) -> float:
    dram = (meta["min_read_bytes"] + meta["min_write_bytes"]) / cfg.bandwidth_bytes_per_cycle
    return max(compute_bound(int(meta["macs"]), cfg.peak_macs_per_cycle), dram)


def _ratio(cfg, c: int, hw: int, stride: int, engine: str = "auto", seed: int = 0) -> float:
    """Simulated cycles / bound of one exact-checked depthwise 3x3 layer."""
    rng = np.random.default_rng(seed)
    x = qt(rng, "x", (1, c, hw, hw))
    reg = region([x], [conv(rng, x, 0, 3, stride, 1, depthwise=True)])
    with depthwise_engine(engine):
        res = check(reg, cfg, rng)
        meta = compile_region(reg, cfg).program.meta["layers"][0]
    return res.cycles / _bound(meta, cfg)


@pytest.mark.parametrize("c, hw, stride", [(192, 28, 1), (960, 7, 1), (144, 28, 2)])
def test_default_is_within_2x_of_the_bound(c, hw, stride):
    """MobileNetV2-shaped layers on default (a 4-row vector unit)."""
    assert DEFAULT.lanes == 4 * DEFAULT.block_out
    assert _ratio(DEFAULT, c, hw, stride) <= 2.0


@pytest.mark.parametrize("engine", ["vector", "array"])
def test_row_wide_vector_unit_is_near_the_isa_floor(engine):
    """With one row per cycle the stride-1 floor is (taps + requant) / 2 = 5x: both engines
    within 10% of it (never below: that would beat one row per cycle)."""
    r = _ratio(NARROW, 192, 14, 1, engine)
    assert 5.0 <= r <= 5.5, r


def test_alu_rows_per_cycle_shortens_only_the_alu():
    """Widening the vector unit changes ALU time, never values or DRAM traffic."""
    rng = np.random.default_rng(1)
    x = qt(rng, "x", (1, 48, 10, 10))
    reg = region([x], [conv(rng, x, 0, 3, 1, 1, depthwise=True)])
    knobs = WindowKnobs(10, 10, 1, True)
    with depthwise_engine("vector"):
        slow = check(reg, NARROW, np.random.default_rng(2), lambda c, s: knobs)
        fast = check(reg, DEFAULT, np.random.default_rng(2), lambda c, s: knobs)
    assert fast.cycles < slow.cycles
    assert fast.counters["dram_read_bytes"] == slow.counters["dram_read_bytes"]


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_double_buffered_channel_tiles_exact(data):
    """Several channel tiles, double-buffered weights and tables (the next channel tile's
    operands load while this one computes), on a row-wide and a 4-row vector unit."""
    draw = data.draw
    cfg = draw(st.sampled_from([NARROW, DEFAULT]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b = cfg.block_out
    k = draw(st.sampled_from([3, 5]))
    x = qt(rng, "x", (draw(st.integers(1, 2)), draw(st.integers(2 * b + 1, 4 * b)),
                      draw(st.integers(k, 8)), draw(st.integers(k, 8))))
    ly = conv(rng, x, 0, k, draw(st.sampled_from([1, 2])), draw(st.integers(0, k // 2)),
              depthwise=True)
    r = window.depthwise_recipe(ly, cfg, consts=False)
    cands = [kn for kn in window.candidate_window_knobs(cfg, r.shape)
             if kn.double_buffer and kn.tile_cb < r.shape.cb]
    knobs = draw(st.sampled_from(cands))
    with depthwise_engine("vector"):
        check(region([x], [ly]), cfg, rng, lambda c, s: knobs)


def test_array_estimate_counts_peeled_gemms():
    """A depthwise nest has six GEMM levels: the estimate pays a fill per peeled copy, so
    it is no lower than the simulator (once it was 6% lower and auto chose the slower
    engine)."""
    rng = np.random.default_rng(4)
    x = qt(rng, "x", (1, 160, 7, 7))
    reg = region([x], [conv(rng, x, 0, 3, 1, 1, depthwise=True)])
    r = conv2d.depthwise_recipe(reg.layers[0], DEFAULT, consts=False)
    kn = conv2d.default_conv_knobs(DEFAULT, r.shape)
    with depthwise_engine("array"):
        res = check(reg, DEFAULT, rng, lambda c, s: kn)
    est = conv2d.estimate_cycles(DEFAULT, r.shape, kn)
    assert 0.95 * res.cycles <= est <= 1.1 * res.cycles, (est, res.cycles)

"""Concat of rows along the second-to-last axis in the movement room (an LLM's KV cache:
the cache's rows, then the new tokens' rows, per head): strided copies of whole rows in
the rows layout, compiled, simulated and compared bit for bit with the integer reference
over ranks, lengths (up to runs longer than the staging rows), heads and row widths; the
cases it does not take are refused with the reason (they stay on the CPU)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsa_tvm.layers import ir as L
from dsa_tvm.lowering.region import lowering_supports

from .test_lowering import CFGS, FEW, PRESETS, check, region


def _concat(lead: tuple[int, ...], lengths: list[int], d: int, zp: int) -> L.Concat:
    ins = tuple(L.QTensor(f"x{i}", (*lead, n, d), 0.05, zp) for i, n in enumerate(lengths))
    out = L.QTensor("y", (*lead, sum(lengths), d), 0.05, zp)
    return L.Concat("cat", ins, out, len(out.shape) - 2)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_rows_concat_bit_exact(preset, data):
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rank = draw(st.sampled_from([2, 3, 5]))
    heads = draw(st.integers(1, 4))
    lead = {2: (), 3: (heads,), 5: (1, heads, draw(st.integers(1, 2)))}[rank]
    lengths = draw(st.lists(st.integers(1, 40), min_size=2, max_size=3))
    d = draw(st.sampled_from([cfg.block_out, 2 * cfg.block_out, 3, cfg.block_out + 5]))
    ly = _concat(lead, lengths, d, int(rng.integers(-128, 128)))
    assert lowering_supports(ly, cfg) is None
    check(region(list(ly.inputs), [ly]), cfg, rng)


@pytest.mark.parametrize("preset", PRESETS)
def test_a_cache_longer_than_the_staging_rows_moves_in_pieces(preset):
    """A decode step's cache (rows x blocks above the accumulator's depth) and one new row."""
    cfg = CFGS[preset]
    rows = cfg.acc_depth // 2 + 3   # with two blocks a row: more than the whole accumulator
    ly = _concat((2,), [rows, 1], 2 * cfg.block_out, -3)
    check(region(list(ly.inputs), [ly]), cfg, np.random.default_rng(0))


def test_unsupported_concats_say_why():
    cfg = CFGS["default"]
    last = _concat((2,), [3, 4], 16, 0)
    last = L.Concat("cat", last.inputs, last.output, 1)   # fine: rows axis of 3-D
    assert lowering_supports(last, cfg) is None
    lanes = L.Concat("cat", (L.QTensor("a", (2, 3, 16), 0.05, 0),
                             L.QTensor("b", (2, 3, 8), 0.05, 0)),
                     L.QTensor("y", (2, 3, 24), 0.05, 0), 2)
    assert "axis 2" in lowering_supports(lanes, cfg)
    grids = L.Concat("cat", (L.QTensor("a", (2, 3, 16), 0.05, 0),
                             L.QTensor("b", (2, 1, 16), 0.04, 0)),
                     L.QTensor("y", (2, 4, 16), 0.05, 0), 1)
    assert "one grid" in lowering_supports(grids, cfg)

"""Batch matmul with operands made in the region (``BatchMatmul.on_device``): the second
operand is laid out as weight tiles by a ``weight_tiles`` Permute (a block copy when the
tile rows are blocks of the source, ``K^T`` from ``K`` rows; a block copy plus a
transpose of each tile on the MAC array when they are its columns, ``V`` from ``V``
rows). Compiled, simulated and compared bit for bit with the integer reference (numpy),
head split included."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("tvm")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dsa_tvm.isa import semantics as sem  # noqa: E402
from dsa_tvm.layers import ir as L  # noqa: E402
from dsa_tvm.lowering.region import lowering_supports  # noqa: E402

from .test_lowering import CFGS, FEW, check, region  # noqa: E402


def _sym(name: str, shape) -> L.QTensor:
    return L.QTensor(name, tuple(shape), 0.05, 0)


def _requant(scale: float) -> L.Requant:
    m, s = sem.quantize_multiplier(scale)
    return L.Requant(np.array([m], np.int32), np.array([s], np.int32), 3, (-128, 127))


def _attention_matmul(heads: int, seq: int, width: int, transposed: bool,
                      rows_of_m: int, a_zero_point: int = 0) -> L.Region:
    """a: Q (heads, M, width) from a (M, heads*width) tensor by the head split, or P
    (heads, M, seq) as it is; b: K^T
    (``transposed``: b[h] = K[h]^T, (width, seq)) or V ((seq, width)) from rows."""
    d = heads * width
    src = _sym("kv", (seq, d))
    if transposed:  # Q from its rows by the head split
        x = _sym("q", (rows_of_m, d))
        a = _sym("a", (heads, rows_of_m, width))
        first = [L.Permute("split_a", x, a, (rows_of_m, heads, width), (1, 0, 2))]
    else:  # the probabilities, per head already
        x = a = _sym("p", (heads, rows_of_m, seq))
        first = []
    if a_zero_point:  # corrected with column sums the tiles' movement writes
        a = dataclasses.replace(a, zero_point=a_zero_point)
        x = dataclasses.replace(x, zero_point=a_zero_point)
        if first:
            first = [dataclasses.replace(first[0], input=x, output=a)]
        else:
            x = a
    if transposed:
        b = _sym("b", (heads, width, seq))
        tiles = L.Permute("tiles", src, b, (seq, heads, width), (1, 2, 0), weight_tiles=True)
    else:
        b = _sym("b", (heads, seq, width))
        tiles = L.Permute("tiles", src, b, (seq, heads, width), (1, 0, 2), weight_tiles=True)
    n = b.shape[-1]
    y = L.QTensor("y", (heads, rows_of_m, n), 0.1, 3)
    mm = L.BatchMatmul("mm", a, b, y, _requant(1 / (8 * b.shape[1])), on_device=True)
    tiles = dataclasses.replace(tiles, column_sums=-a.zero_point)
    return region([x, src], [*first, tiles, mm])


@pytest.mark.parametrize("transposed", [True, False], ids=["K^T", "V"])
@pytest.mark.parametrize("preset", ["default", "large"])
@FEW
@given(heads=st.integers(1, 3), width_blocks=st.integers(1, 3), seq=st.integers(1, 70),
       m=st.integers(1, 40), za=st.sampled_from([0, -128, 127, 5]),
       seed=st.integers(0, 2**31 - 1))
def test_on_device_matmul_bit_exact(preset, transposed, heads, width_blocks, seq, m, za, seed):
    """Head widths of whole blocks, any sequence length (a partial last tile: 65), the
    first operand's zero point anything (softmax's -128: column sums on the device)."""
    cfg = CFGS[preset]
    width = width_blocks * cfg.block_in
    reg = _attention_matmul(heads, seq, width, transposed, m, za)
    for ly in reg.layers:
        assert lowering_supports(ly, cfg) is None, ly.name
    check(reg, cfg, np.random.default_rng(seed))


def test_lane_splitting_moves_are_refused_with_the_reason():
    """A head width that is no whole number of blocks: a tile row would need lanes of
    two input blocks."""
    cfg = CFGS["default"]
    reg = _attention_matmul(2, 32, cfg.block_in + 8, True, 8)
    why = lowering_supports(reg.layers[-2], cfg)
    assert why is not None and "weight tile" in why


@pytest.mark.parametrize("preset", ["default", "large"])
@pytest.mark.parametrize("transposed", [False, True])
@FEW
@given(heads=st.integers(1, 3), width_blocks=st.integers(1, 2), seq=st.integers(1, 70),
       m=st.integers(1, 9), za=st.sampled_from([0, -128, 5]), seed=st.integers(0, 2**31 - 1))
def test_operand_the_host_tiles_is_read_once_and_bit_exact(preset, transposed, heads,
                                                           width_blocks, seq, m, za, seed):
    """Decode's cache arriving per head as a region input: V (rows of head width, P @ V)
    or K, which the host also transposes to K^T (q @ K^T). The host lays it out as weight
    tiles (with the column sums for the first operand's zero point), the movement leaves
    the program, and the outputs stay bit-exact; the cache's bytes are read once, never
    written."""
    from dsa_tvm.lowering.region import compile_region

    cfg = CFGS[preset]
    width = width_blocks * cfg.block_in
    cache = _sym("c", (heads, seq, width))
    if transposed:      # scores: q (m, width) @ K^T (width, seq)
        a, reduced, n, perm = L.QTensor("a", (heads, m, width), 0.05, za), width, seq, (0, 2, 1)
    else:               # context: P (m, seq) @ V (seq, width)
        a, reduced, n, perm = L.QTensor("a", (heads, m, seq), 0.05, za), seq, width, (0, 1, 2)
    b = _sym("b", (heads, reduced, n))
    tiles = L.Permute("tiles", cache, b, (heads, seq, width), perm, weight_tiles=True,
                      column_sums=-za)
    y = L.QTensor("y", (heads, m, n), 0.1, 3)
    mm = L.BatchMatmul("mm", a, b, y, _requant(1 / (8 * reduced)), on_device=True)
    reg = region([a, cache], [tiles, mm])
    check(reg, cfg, np.random.default_rng(seed))
    prog = compile_region(reg, cfg).program
    io = prog.meta["io"]["c"]["weight_tiles"]
    assert io["column_sums"] == -za
    assert io["steps"] == [[[heads, seq, width], list(perm)]]
    assert [ly["name"] for ly in prog.meta["layers"]] == ["mm"]
    assert not prog.regions_of("scratch")   # no tiles written to DRAM and read back
    assert {r.name for r in prog.regions_of("input")} == {"a", "c"} | ({"c#colsum"} if za else set())


def cache_matmul(cfg, transposed: bool, heads: int, seq: int, m: int, za: int,
                 requant: str) -> tuple[L.Region, L.BatchMatmul]:
    """A decode attention matmul over a host-tiled cache (q @ K^T or P @ V) with a
    per-tensor requantize, one per column, or one per column that all agree."""
    width = cfg.block_in
    cache = _sym("c", (heads, seq, width))
    if transposed:
        a, reduced, n, perm = L.QTensor("a", (heads, m, width), 0.05, za), width, seq, (0, 2, 1)
    else:
        a, reduced, n, perm = L.QTensor("a", (heads, m, seq), 0.05, za), seq, width, (0, 1, 2)
    b = _sym("b", (heads, reduced, n))
    tiles = L.Permute("tiles", cache, b, (heads, seq, width), perm, weight_tiles=True,
                      column_sums=-za)
    y = L.QTensor("y", (heads, m, n), 0.1, 3)
    rq = _requant(1 / (8 * reduced))
    if requant != "tensor":
        scales = np.linspace(0.5, 2.0 if requant == "columns" else 0.5, n) / (8 * reduced)
        ms = [sem.quantize_multiplier(float(s)) for s in scales]
        rq = L.Requant(np.array([v[0] for v in ms], np.int32),
                       np.array([v[1] for v in ms], np.int32), 3, (-128, 127))
    mm = L.BatchMatmul("mm", a, b, y, rq, on_device=True)
    return region([a, cache], [tiles, mm]), mm


def test_columns_that_agree_read_one_table_block():
    """37 keys, one multiplier per key, all equal: one table block (the column count is
    neither 1 nor a block)."""
    from tir_schedules.kinds import recipe

    cfg = CFGS["default"]
    reg, mm = cache_matmul(cfg, True, 2, 37, 3, 0, "equal columns")
    r = recipe(mm, cfg, consts=True)
    assert r.shape.uniform and r.consts["params"].shape == (1, 1, 3, cfg.block_out)
    check(reg, cfg, np.random.default_rng(0))


@pytest.mark.parametrize("preset", ["default", "edge"])
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(transposed=st.booleans(), heads=st.integers(1, 3), seq=st.integers(1, 70),
       m=st.integers(1, 9), za=st.sampled_from([0, -128]),
       requant=st.sampled_from(["tensor", "columns", "equal columns"]),
       data=st.data())
def test_any_tiling_of_a_cache_matmul_is_bit_exact(preset, transposed, heads, seq, m, za,
                                                   requant, data):
    """Every tiling the knobs allow, row tiles outside the output-block tiles or inside
    (``rows_outer``), with a per-tensor requantize (one table block serves every column
    block: ``MatmulShape.uniform``), one multiplier per column (the whole table), or one
    per column that all agree (uniform too)."""
    from tir_schedules.kinds import recipe
    from tir_schedules.kinds.matmul import MatmulShape

    cfg = CFGS[preset]
    reg, mm = cache_matmul(cfg, transposed, heads, seq, m, za, requant)
    shape = recipe(mm, cfg, consts=False).shape
    assert shape.uniform == (requant != "columns" or mm.output.shape[-1] == 1)
    knobs = data.draw(st.sampled_from(recipe(mm, cfg, consts=False).kind.candidates(cfg, shape)))
    check(reg, cfg, np.random.default_rng(seq * 7 + m),
          lambda c, s: knobs if isinstance(s, MatmulShape) else None)

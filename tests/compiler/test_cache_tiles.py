"""A KV-cache concat written into the attention's tiles in place (``lowering.cache_tiles``).

A decode region joins a cache (region input) with new rows made on the device and lays
the joined rows out as an on-device matmul's weight tiles. When the cache's length is
whole tiles, the host lays the cache out in the joined tiles and the region writes the new
rows' tiles only (``TilesAppend``): bit-exact against the integer reference of the
Concat and the Permute, the cache read as often as when the host hands the joined cache
over, and nothing of it written. Otherwise the concat and the movement stay as they were.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dsa_tvm.layers import ir as L  # noqa: E402
from dsa_tvm.llm.traffic import program_reads  # noqa: E402
from dsa_tvm.lowering.cache_tiles import cache_appends  # noqa: E402
from dsa_tvm.lowering.region import compile_region  # noqa: E402

from .test_device_matmul import _requant, _sym  # noqa: E402
from .test_lowering import CFGS, FEW, check, region  # noqa: E402


def _decode_attention(heads: int, seq: int, new: int, width: int, transposed: bool, m: int,
                      za: int) -> tuple[L.Region, L.Region]:
    """(the region with the concat: cache ``c`` + the head split of ``x`` -> K^T or V
    tiles -> the matmul; the same matmul with the joined cache ``j`` handed over)."""
    total = seq + new
    x = _sym("x", (new, heads * width))
    rows = _sym("rows", (heads, new, width))
    split = L.Permute("split", x, rows, (new, heads, width), (1, 0, 2))
    cache, joined = _sym("c", (heads, seq, width)), _sym("j", (heads, total, width))
    cat = L.Concat("cat", (cache, rows), joined, 1)
    if transposed:      # scores: q (m, width) @ K^T (width, total)
        a, reduced, n, perm = L.QTensor("a", (heads, m, width), 0.05, za), width, total, (0, 2, 1)
    else:               # context: P (m, total) @ V (total, width)
        a, reduced, n, perm = L.QTensor("a", (heads, m, total), 0.05, za), total, width, (0, 1, 2)
    b = _sym("b", (heads, reduced, n))
    y = L.QTensor("y", (heads, m, n), 0.1, 3)
    mm = L.BatchMatmul("mm", a, b, y, _requant(1 / (8 * reduced)), on_device=True)

    def tiles(src: L.QTensor) -> L.Permute:
        return L.Permute("tiles", src, b, (heads, total, width), perm, weight_tiles=True,
                         column_sums=-za)
    return (region([a, cache, x], [split, cat, tiles(joined), mm]),
            region([a, joined], [tiles(joined), mm]))


@pytest.mark.parametrize("preset", ["default", "large"])
@pytest.mark.parametrize("transposed", [True, False], ids=["K^T", "V"])
@FEW
@given(heads=st.integers(1, 3), width_blocks=st.integers(1, 2), tiles=st.integers(1, 5),
       new=st.integers(1, 40), m=st.integers(1, 9), za=st.sampled_from([0, -128, 5]),
       seed=st.integers(0, 2**31 - 1))
def test_cache_of_whole_tiles_is_appended_in_place(preset, transposed, heads, width_blocks,
                                                   tiles, new, m, za, seed):
    cfg = CFGS[preset]
    width, seq = width_blocks * cfg.block_in, tiles * cfg.block_in
    reg, handed = _decode_attention(heads, seq, new, width, transposed, m, za)
    check(reg, cfg, np.random.default_rng(seed))
    prog = compile_region(reg, cfg).program
    ops = [ly["op"] for ly in prog.meta["layers"]]
    # V's column sums (P with a zero point) would need the cache's tiles: no in-place write
    in_place = transposed or za == 0
    assert ("TilesAppend" in ops) == in_place and ("Concat" in ops) != in_place, ops
    if not in_place:
        return
    assert "Permute" in ops   # the head split only
    ref = compile_region(handed, cfg).program
    n_new = -(-new // cfg.block_in)   # the new rows' tiles along the joined axis
    appended = heads * n_new * width_blocks   # tiles the region writes into the cache
    # the cache read as often; with column sums the new tiles are read back for their sums
    assert program_reads(prog, cfg, {"c"})["kv"] == program_reads(ref, cfg, {"j"})["kv"] \
        + (appended * cfg.wgt_tile_bytes if za else 0)
    io = prog.meta["io"]["c"]["weight_tiles"]
    assert io["append"] == {"cache": [heads, seq, width], "joined": [heads, seq + new, width],
                            "axis": 1}
    # nothing but the new rows' tiles (and their column sums) is written into the cache:
    # blocks of a tile's rows, one row of sums a column block
    assert _stored(prog, cfg, "c") == appended * cfg.block_out
    assert _stored(prog, cfg, "c#colsum") == (heads * n_new if za else 0)


@pytest.mark.parametrize("preset", ["default", "edge"])
def test_v_tiles_are_transposed_in_chunks_bit_exact(preset):
    """V's new tiles are transposed on the array in chunks of half a ring of slots (one
    LOAD and one GEMM a chunk, the two halves alternating): a tile count that is no whole
    number of chunks stays bit-exact, and the transpose does not pay two DRAM latencies a
    tile (each tile's load, GEMM and store in turn, as before the ring)."""
    from dsa_tvm.isa.instructions import Gemm
    from tir_schedules.kinds.permute import TRANSPOSE_RING, permute_recipe, transpose_ring

    cfg = CFGS[preset]
    reg, _ = _decode_attention(3, 2 * cfg.block_in, 40, 2 * cfg.block_in, False, 4, 0)
    res = check(reg, cfg, np.random.default_rng(0))
    prog = compile_region(reg, cfg).program
    (meta,) = [ly for ly in prog.meta["layers"] if ly["op"] == "TilesAppend"]
    (append,) = [ly for ly in cache_appends(reg, cfg).layers if isinstance(ly, L.TilesAppend)]
    shape = permute_recipe(append, cfg, False).shape
    tiles = shape.transpose_tiles
    assert tiles == 3 * 2 * -(-40 // cfg.block_in)     # heads x width blocks x new row tiles
    ring = transpose_ring(cfg, shape)
    assert ring == min(TRANSPOSE_RING, tiles) and tiles % (ring // 2)
    chunked = [ins for ins in prog.instructions[meta["first"]:meta["last"] + 1]
               if isinstance(ins, Gemm)]
    assert len(chunked) == -(-tiles // (ring // 2))
    assert sum(g.steps for g in chunked) == tiles * cfg.block_out
    span = int(res.schedule.end[meta["last"]] - res.schedule.start[meta["first"]])
    assert span < tiles * 2 * cfg.latency_cycles


@pytest.mark.parametrize("preset", ["default", "edge", "large"])
def test_a_decode_steps_padding_rows_copy_as_runs(preset):
    """A decode step's new V row fills one row of each new tile; the other rows are
    padding (any source block will do). They are copied as runs of consecutive source
    blocks, wrapping past the last one, not one transfer a row of the last block (81
    staging loads on `default` before, 21 now), and the result stays bit-exact."""
    from dsa_tvm.isa.instructions import Buffer, Load

    cfg = CFGS[preset]
    heads, width_blocks = 3, 2
    reg, _ = _decode_attention(heads, 2 * cfg.block_in, 1, width_blocks * cfg.block_in, False,
                               4, 0)
    check(reg, cfg, np.random.default_rng(0))
    prog = compile_region(reg, cfg).program
    (meta,) = [ly for ly in prog.meta["layers"] if ly["op"] == "TilesAppend"]
    staged = [ins for ins in prog.instructions[meta["first"]:meta["last"] + 1]
              if isinstance(ins, Load) and ins.buffer == Buffer.ACC8]
    sources = heads * width_blocks              # the new row's blocks
    tiles = heads * width_blocks                # one new tile per head and width block
    assert len(staged) <= tiles * (-(-cfg.block_out // sources) + 1)


def _stored(prog, cfg, name: str) -> int:
    """Elements (blocks, or int32 rows) the program stores into DRAM region ``name``."""
    r = {r.name: r for r in prog.regions}.get(name)
    return 0 if r is None else sum(
        s.y_size * s.x_size for s in prog.instructions if type(s).__name__ == "Store"
        and r.offset <= s.dram_base * cfg.element_bytes(s.buffer) < r.offset + r.nbytes)


@pytest.mark.parametrize("transposed", [True, False], ids=["K^T", "V"])
def test_cache_of_partial_tiles_keeps_the_concat(transposed):
    """A tile holding cache and new rows: the host cannot lay the cache out alone."""
    cfg = CFGS["default"]
    reg, _ = _decode_attention(2, cfg.block_in + 3, 1, cfg.block_in, transposed, 3, 0)
    check(reg, cfg, np.random.default_rng(0))
    ops = [ly["op"] for ly in compile_region(reg, cfg).program.meta["layers"]]
    assert "Concat" in ops and "TilesAppend" not in ops


def test_malformed_appends_are_refused_with_the_reason():
    """What the rewrite would never make, refused by the room (the concat then stays)."""
    import dataclasses

    from tir_schedules.kinds import UnsupportedLayer, recipe

    cfg = CFGS["default"]
    c, n = _sym("c", (2, 16, 16)), _sym("n", (2, 1, 16))
    b = _sym("b", (2, 16, 17))
    ta = L.TilesAppend("ta", c, n, b, (2, 17, 16), 1, (((2, 17, 16), (0, 2, 1)),))
    assert recipe(ta, cfg, consts=False).shape.dest   # well formed: the new tiles placed
    for bad, why in [
        (dataclasses.replace(ta, joined=(2, 18, 16)), "do not join along axis 1"),
        (dataclasses.replace(ta, input=dataclasses.replace(n, shape=(2, 1, 8))), "do not join"),
        (dataclasses.replace(ta, cache=dataclasses.replace(c, dtype="int16")), "int8 codes"),
        (dataclasses.replace(ta, cache=dataclasses.replace(c, scale=0.1)), "one grid"),
    ]:
        with pytest.raises(UnsupportedLayer, match=why):
            recipe(bad, cfg, consts=False)

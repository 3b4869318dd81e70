"""An int16 KV cache kept by the host as byte planes (``lowering.cache_planes``).

K or V on an int16 grid runs its attention matmul as two int8 byte planes. A decode
region would split the joined cache every step; instead the host splits its cache (the
same arithmetic as the region's split, checked on every int16 code) and the region splits
the new rows only, each plane an int8 cache concat written into its tiles in place:
bit-exact against the integer reference of the region as the front end made it, the
cache read once a step (twice an int8 cache's bytes).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("tvm")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dsa_tvm.layers import ir as L  # noqa: E402
from dsa_tvm.layers.ir import WIDE_CLIP  # noqa: E402
from dsa_tvm.layers.plane_split import is_split, split_layers  # noqa: E402
from dsa_tvm.layers.reference import split_planes  # noqa: E402
from dsa_tvm.llm.traffic import program_reads  # noqa: E402
from dsa_tvm.lowering.cache_planes import cache_planes  # noqa: E402
from dsa_tvm.lowering.region import compile_region  # noqa: E402
from relay_passes.kinds.matmul_planes import (  # noqa: E402
    double_plane_layers,
    fuse_plane_matmuls,
    matmul_plane_layers,
    split_before_moves,
)
from tir_schedules.kinds import run_region  # noqa: E402

from .test_cache_tiles import _decode_attention  # noqa: E402
from .test_lowering import CFGS, FEW, check, region  # noqa: E402

S16 = 0.05 / 256     # the int16 cache's step: int8's range on 256 times finer codes


def _wide_attention(heads: int, seq: int, new: int, width: int, transposed: bool, m: int,
                    za: int) -> L.Region:
    """An int16 cache ``c`` + new int16 rows ``x`` -> K^T or V on byte planes -> the
    matmul, as the front end makes it (``relay_passes.kinds.layer_from_match``): the split
    before the movement, each plane moved into weight tiles."""
    total = seq + new
    cache = L.QTensor("c", (heads, seq, width), S16, 0, "int16")
    x = L.QTensor("x", (heads, new, width), S16, 0, "int16")
    joined = L.QTensor("j", (heads, total, width), S16, 0, "int16")
    cat = L.Concat("cat", (cache, x), joined, 1)
    if transposed:
        a, reduced, n, perm = L.QTensor("a", (heads, m, width), 0.05, za), width, total, (0, 2, 1)
    else:
        a, reduced, n, perm = L.QTensor("a", (heads, m, total), 0.05, za), total, width, (0, 1, 2)
    b = L.QTensor("b", (heads, reduced, n), S16, 0, "int16")
    y = L.QTensor("y", (heads, m, n), 0.1 * 4 / reduced, 3)
    rows = dataclasses.replace(joined, shape=(heads * total, width))
    move = L.Permute("move", rows, b, (heads, total, width), perm)
    layers = matmul_plane_layers("mm", a, b, y, (-128, 127), True, side="b")
    split, moves, rest = split_before_moves([move], list(layers))
    moves = [dataclasses.replace(p, weight_tiles=True, column_sums=-za) for p in moves]
    return region([a, cache, x], [cat, *split, *moves, *rest])


def _codes(shape, rng: np.random.Generator) -> np.ndarray:
    """int16 codes over the whole range, the split's edges among them."""
    x = rng.integers(-32768, 32768, shape, dtype=np.int16)
    edges = np.array([32767, 32640, 32639, -32768, -32640, -129, 128, 127, -128, 0], np.int16)
    flat = x.reshape(-1)
    flat[:min(flat.size, edges.size)] = edges[:flat.size]
    return x


def test_the_host_split_is_the_regions_split_on_every_code():
    x = L.QTensor("x", (256, 256), S16, 0, "int16")
    (hi, lo), _, _ = split_layers("s", x)
    codes = np.arange(-32768, 32768, dtype=np.int64).astype(np.int16).reshape(256, 256)
    got = run_region(L.Region("r", [x], [hi.output, lo.output], [hi, lo]), {"x": codes})
    want = split_planes(codes)
    assert is_split(hi, lo)
    np.testing.assert_array_equal(got[hi.output.name], want[0])
    np.testing.assert_array_equal(got[lo.output.name], want[1])
    assert not is_split(lo, hi) and not is_split(
        hi, dataclasses.replace(lo, b_mult=-255))


@pytest.mark.parametrize("preset", ["default", "large"])
@pytest.mark.parametrize("transposed", [True, False], ids=["K^T", "V"])
@FEW
@given(heads=st.integers(1, 3), width_blocks=st.integers(1, 2), tiles=st.integers(1, 4),
       new=st.integers(1, 20), m=st.integers(1, 9), za=st.sampled_from([0, 5]),
       seed=st.integers(0, 2**31 - 1))
def test_an_int16_cache_is_split_by_the_host_and_appended_per_plane(
        preset, transposed, heads, width_blocks, tiles, new, m, za, seed):
    cfg = CFGS[preset]
    width, seq = width_blocks * cfg.block_in, tiles * cfg.block_in
    za = za if transposed else 0      # V's column sums would need the cache's tiles
    reg = _wide_attention(heads, seq, new, width, transposed, m, za)
    rng = np.random.default_rng(seed)
    xs = {"a": rng.integers(-128, 128, (heads, m, width if transposed else seq + new),
                            dtype=np.int8),
          "c": _codes((heads, seq, width), rng), "x": _codes((heads, new, width), rng)}
    check(reg, cfg, rng, xs=xs)
    prog = compile_region(reg, cfg).program
    ops = [ly["op"] for ly in prog.meta["layers"]]
    assert ops.count("TilesAppend") == 2 and "Concat" not in ops, ops
    # the region splits the new rows only
    splits = [ly for ly in cache_planes(reg)[0].layers if isinstance(ly, L.Rescale)]
    assert [tuple(ly.input.shape) for ly in splits] == [(heads, new, width)]
    io = prog.meta["io"]
    assert prog.meta["inputs"] == ["a", "c", "x"] and list(io["c"]["planes"]) == ["c#hi", "c#lo"]
    assert "c#hi" not in io    # noted under the cache, which the runtime hands over
    # twice the bytes of the same cache on int8, read once
    narrow, _ = _decode_attention(heads, seq, new, width, transposed, m, za)
    ref = compile_region(narrow, cfg).program
    assert program_reads(prog, cfg, {"c"})["kv"] == 2 * program_reads(ref, cfg, {"c"})["kv"]


def test_a_cache_of_partial_tiles_concats_its_planes_on_the_device():
    """A tile holding cache and new rows: the host still splits, the region concats each
    plane (the cache through DRAM, as an int8 cache of that length), bit-exact."""
    cfg = CFGS["default"]
    reg = _wide_attention(2, cfg.block_in + 3, 1, cfg.block_in, True, 3, 0)
    rng = np.random.default_rng(1)
    xs = {"a": rng.integers(-128, 128, (2, 3, cfg.block_in), dtype=np.int8),
          "c": _codes((2, cfg.block_in + 3, cfg.block_in), rng),
          "x": _codes((2, 1, cfg.block_in), rng)}
    check(reg, cfg, rng, xs=xs)
    ops = [ly["op"] for ly in compile_region(reg, cfg).program.meta["layers"]]
    assert ops.count("Concat") == 2 and "TilesAppend" not in ops, ops


def test_what_is_not_a_cache_split_is_left_alone():
    """An int8 cache, a cache the region also outputs, a concat read by more than the
    split: no planes."""
    cfg = CFGS["default"]
    reg = _wide_attention(1, cfg.block_in, 1, cfg.block_in, True, 2, 0)
    assert cache_planes(reg)[1]
    kept = dataclasses.replace(reg, outputs=[*reg.outputs, reg.layers[0].output])
    assert cache_planes(kept) == (kept, {})
    narrow, _ = _decode_attention(1, cfg.block_in, 1, cfg.block_in, True, 2, 0)
    assert cache_planes(narrow) == (narrow, {})


@pytest.mark.parametrize("preset", ["default", "large"])
@FEW
@given(heads=st.integers(1, 3), m=st.integers(1, 6), tiles=st.integers(1, 3),
       seed=st.integers(0, 2**31 - 1))
def test_int16_q_against_int16_k_joins_its_planes_in_one_matmul_per_k_plane(
        preset, heads, m, tiles, seed):
    """Q on int16 too (not a softmax's): its planes stacked (BytePlanes), interleaved by a
    move, and joined exactly in each K plane's matmul (``fuse_plane_matmuls``): K's tiles
    read once a plane, bit-exact against the unfused layers' reference."""
    cfg = CFGS[preset]
    width, n = cfg.block_in * 2, tiles * cfg.block_in
    a = L.QTensor("q", (heads, m, width), 2.0 / 32767, 0, "int16")
    b = L.QTensor("kt", (heads, width, n), S16, 0, "int16")
    y = L.QTensor("y", (heads, m, n), 0.05, 0, "int16")
    layers = list(double_plane_layers("qk", a, b, y, WIDE_CLIP, True))
    tiles_of = {}
    for ly in layers:     # each plane of K as weight tiles, once
        if isinstance(ly, L.BatchMatmul) and ly.b.name not in tiles_of:
            t = dataclasses.replace(ly.b, name=ly.b.name + ">tiles")
            tiles_of[ly.b.name] = (L.Permute(f"tiles{len(tiles_of)}", ly.b, t,
                                             tuple(ly.b.shape), (0, 1, 2), weight_tiles=True), t)
    made = {ly.output.name for ly in layers}
    body = []
    for ly in layers:
        if isinstance(ly, L.BatchMatmul):
            perm, t = tiles_of[ly.b.name]
            if perm not in body and ly.b.name in made:
                body.append(perm)
            ly = dataclasses.replace(ly, b=t)
        body.append(ly)
    fused = fuse_plane_matmuls(body, {y.name}, cfg)
    kinds = [type(ly).__name__ for ly in fused]
    assert kinds.count("BytePlanes") == 1 and kinds.count("BatchMatmul") == 2, kinds
    assert all(ly.planes for ly in fused if isinstance(ly, L.BatchMatmul))
    rng = np.random.default_rng(seed)
    xs = {"q": _codes(a.shape, rng), "kt": _codes(b.shape, rng)}
    reg = region([a, b], fused, [y])
    res_fused = check(reg, cfg, rng, xs=xs)
    unfused = run_region(region([a, b], body, [y]), xs)[y.name]
    # the planes carry codes from 32640 up as 32639 (plane_split): the exact product of those
    held = {k: np.minimum(v.astype(np.float64), 32639) for k, v in xs.items()}
    exact = (held["q"] @ held["kt"]) * a.scale * b.scale
    want = np.clip(np.round(exact / y.scale), -32768, 32767)
    got = run_region(reg, xs)[y.name]
    # each K plane's product rounds once onto its grid (two int16 output steps: a grid
    # spanning twice the range), then the join: within 3 steps, as the unfused planes
    err, err_unfused = np.abs(got - want), np.abs(unfused - want)
    assert err.max() <= 3 and err_unfused.max() <= 3, (err, err_unfused)
    assert res_fused.cycles > 0


@pytest.mark.parametrize("transposed", [True, False], ids=["K^T", "V"])
def test_an_int16_operand_handed_over_whole_is_split_and_tiled_by_the_host(transposed):
    """A prefill chunk's K or V, joined before the region: only the split reads the int16
    input, so the host splits it and lays each plane out as weight tiles; the region
    holds no split and no movement, bit-exact."""
    cfg = CFGS["default"]
    reg = _wide_attention(2, cfg.block_in, 5, cfg.block_in, transposed, 3, 0)
    cat = reg.layers[0]
    joined = dataclasses.replace(cat.output, name="j")
    whole = region([reg.inputs[0], joined], reg.layers[1:])
    rng = np.random.default_rng(2)
    xs = {"a": rng.integers(-128, 128, tuple(reg.inputs[0].shape), dtype=np.int8),
          "j": _codes(tuple(joined.shape), rng)}
    check(whole, cfg, rng, xs=xs)
    prog = compile_region(whole, cfg).program
    ops = [ly["op"] for ly in prog.meta["layers"]]
    assert ops == ["BatchMatmul", "BatchMatmul", "Add"], ops
    assert all("weight_tiles" in note for note in prog.meta["io"]["j"]["planes"].values())

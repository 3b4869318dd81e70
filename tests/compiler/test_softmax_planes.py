"""Attention's int16 probabilities as byte planes the softmax writes itself, joined in the
batch matmul's accumulator (``Softmax.planes``, ``BatchMatmul.planes``, fused by
``matmul_planes.fuse_plane_matmuls``): bit-exact on every preset, exactly the int16
probabilities' product with V, V's tiles read once, the int16 codes never in DRAM."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dsa_tvm.isa import intnorm as inn
from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers import ir as L
from dsa_tvm.layers.reference import apply_requant, byte_planes, join_planes
from dsa_tvm.lowering.region import lowering_supports
from dsa_tvm.quant.api import SOFTMAX_OUT_WIDE
from relay_passes.kinds.matmul_planes import (
    _sums_fit,
    fuse_plane_matmuls,
    matmul_plane_layers,
)

from .test_lowering import check, region
from .test_norm_lowering import NORM_CFGS

S_STEP, V_STEP, Y_STEP = 0.05, 0.02, 0.01


def _fused(b: int, m: int, k: int, n: int) -> L.Region:
    """scores (b, m, k) -> softmax planes (b, 2m, k) -> @ V (the cache rows, host-tiled)."""
    s = L.QTensor("s", (b, m, k), S_STEP, 0)
    ps = SOFTMAX_OUT_WIDE.scale
    planes = L.QTensor("planes", (b, 2 * m, k), ps, 0)
    soft = L.Softmax("sm", s, planes, inn.softmax_params(S_STEP, ps, 0), planes=True)
    cache, v = L.QTensor("c", (b, k, n), V_STEP, 0), L.QTensor("v", (b, k, n), V_STEP, 0)
    tiles = L.Permute("tiles", cache, v, (b, k, n), (0, 1, 2), weight_tiles=True)
    mult, shift = sem.quantize_multipliers(np.array([ps * V_STEP / Y_STEP]))
    y = L.QTensor("y", (b, m, n), Y_STEP, 0)
    mm = L.BatchMatmul("pv", planes, v, y, L.Requant(mult, shift, 0, (-128, 127)),
                       on_device=True, planes=True)
    return region([s, cache], [soft, tiles, mm])


@pytest.mark.parametrize("preset", list(NORM_CFGS))
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(b=st.integers(1, 3), m=st.integers(1, 20), k=st.one_of(st.integers(1, 40),
                                                              st.integers(41, 1100)),
       n_blocks=st.integers(1, 3), seed=st.integers(0, 2 ** 31 - 1))
@example(b=3, m=3, k=2048, n_blocks=4, seed=0)     # SmolLM2's decode at context 2048
def test_softmax_planes_and_their_matmul_are_bit_exact(preset, b, m, k, n_blocks, seed):
    """Rows across several softmax tiles and matmul row tiles; the join is exact: the
    result is the int16 probabilities' own product, requantized once."""
    cfg = NORM_CFGS[preset]
    reg = _fused(b, m, k, n_blocks * cfg.block_out)
    why = lowering_supports(tuple(reg.layers), cfg)
    if why:             # only a long row on edge's small accumulator (the fusion skips it)
        assert cfg.name == "edge" and k > 1000, why
        return
    res = check(reg, cfg, np.random.default_rng(seed))
    assert res.cycles > 0
    soft, _, mm = reg.layers
    rng = np.random.default_rng(seed)
    s = rng.integers(-128, 128, (b, m, k), dtype=np.int8)
    v = rng.integers(-128, 128, (b, k, mm.output.shape[-1]), dtype=np.int8)
    p16 = inn.int_softmax(s, 0, soft.params, out_wide=True).astype(np.int64)
    planes = byte_planes(p16)
    assert np.array_equal(planes[:, 0::2].astype(np.int64) * 256 + planes[:, 1::2], p16)
    joined = join_planes(np.matmul(planes.astype(np.int64), v.astype(np.int64)))
    np.testing.assert_array_equal(apply_requant(joined, mm.requant, -1),
                                  apply_requant(p16 @ v, mm.requant, -1))


def test_the_fused_planes_read_v_once_and_write_no_int16():
    """Against the separate planes (a split, two matmuls, an add), the fused pair reads
    V's tiles once and moves fewer DRAM bytes, in fewer cycles."""
    from dsa_tvm.lowering.region import compile_region
    from dsa_tvm.sim.simulator import Simulator

    cfg = NORM_CFGS["default"]
    b, m, k, n = 3, 3, 512, 64
    fused = _fused(b, m, k, n)
    soft, tiles, mm = fused.layers
    p = L.QTensor("p", (b, m, k), soft.output.scale, 0, "int16")
    split = region(fused.inputs, [L.Softmax("sm", soft.input, p, soft.params), tiles,
                                  *matmul_plane_layers("pv", p, mm.b, mm.output,
                                                       mm.requant.clip, True)])
    cost = {}
    for name, reg in (("fused", fused), ("split", split)):
        prog = compile_region(reg, cfg).program
        res = Simulator(cfg).run(prog, timing_only=True)
        cost[name] = res.cycles, res.counters["dram_read_bytes"]
    assert cost["fused"][0] < cost["split"][0], cost
    assert cost["fused"][1] < cost["split"][1], cost
    # the split path's layers, fused, are the pair above
    again = fuse_plane_matmuls(list(split.layers), {mm.output.name}, cfg)
    assert [type(ly).__name__ for ly in again] == ["Softmax", "Permute", "BatchMatmul"]
    assert again[0].planes and again[2].planes


def test_what_the_fusion_cannot_take_keeps_the_separate_planes():
    """A probability tensor that leaves the region, a grid so fine that the joined sums
    could pass int32, or a part whose accumulator cannot stage the planes keeps the
    split, two matmuls and the add."""
    cfg = NORM_CFGS["default"]
    fused = _fused(1, 2, 24, 16)
    soft, tiles, mm = fused.layers
    p = L.QTensor("p", (1, 2, 24), soft.output.scale, 0, "int16")
    layers = [L.Softmax("sm", soft.input, p, soft.params), tiles,
              *matmul_plane_layers("pv", p, mm.b, mm.output, mm.requant.clip, True)]
    assert len(fuse_plane_matmuls(layers, {mm.output.name}, cfg)) == 3
    assert len(fuse_plane_matmuls(layers, {mm.output.name, "p"}, cfg)) == len(layers)
    assert _sums_fit(p, mm.b, True)
    tiny = L.QTensor("p", (1, 2, 70000), 1e-9, 0, "int16")
    assert not _sums_fit(tiny, mm.b, True) and not _sums_fit(tiny, mm.b, False)
    long = _fused(3, 3, 2048, 64)          # edge: a 2048-code row's second tile does not fit
    soft, tiles, mm = long.layers
    p = L.QTensor("p", (3, 3, 2048), soft.output.scale, 0, "int16")
    layers = [L.Softmax("sm", soft.input, p, soft.params), tiles,
              *matmul_plane_layers("pv", p, mm.b, mm.output, mm.requant.clip, True)]
    assert len(fuse_plane_matmuls(layers, {mm.output.name}, NORM_CFGS["edge"])) == len(layers)
    assert len(fuse_plane_matmuls(layers, {mm.output.name}, cfg)) == 3

"""Functional semantics of GEMM, bit-exact against numpy.

Each hand-built program is made sequential with tokens (``reference_machine.sequential``)
and its outputs are compared with an explicit numpy expression; the property test
compares random GEMM tiles against the step-by-step reference in
``reference_machine.RefMachine``. LOAD / STORE are in ``test_functional_dma.py``, the
ALU in ``test_functional_alu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import Buffer, Gemm, Load

from .harness import (  # noqa: F401 (both_gemm_paths: a fixture, used by name)
    PROPERTY_CFGS,
    both_gemm_paths,
    draw_nest,
    nest_span,
    rand_int8,
    rand_int32,
    run,
    run_and_check,
    wrap32_np,
)
from .reference_machine import build_sequential, reference_outputs, wrap32

I64 = np.int64
#: every test here on both GEMM paths (harness.both_gemm_paths)
pytestmark = pytest.mark.usefixtures("both_gemm_paths")


# ----------------------------------------------------------------------------- GEMM

def _gemm_program(cfg, x, wt, acc0, gemms, out_rows, name="gemm"):
    """LOAD x (INP rows), wt (WGT tiles), acc0 (ACC rows); run ``gemms`` (builder args);
    STORE ``out_rows`` accumulator rows."""
    b = ProgramBuilder(cfg, name)
    rx = b.region("x", "input", x.shape)
    rw = b.region("w", "input", wt.shape)
    ra = b.region("a", "input", acc0.shape, "int32")
    out = b.region("out", "output", (out_rows, cfg.block_out), "int32")
    b.load(Buffer.INP, 0, b.addr(rx, Buffer.INP), 1, x.shape[0])
    b.load(Buffer.WGT, 0, b.addr(rw, Buffer.WGT), 1, wt.shape[0])
    b.load(Buffer.ACC, 0, b.addr(ra, Buffer.ACC), 1, acc0.shape[0])
    for g in gemms:
        b.gemm(*g)
    b.store(Buffer.ACC, 0, b.addr(out, Buffer.ACC), 1, out_rows)
    prog = build_sequential(b)
    return prog, {"x": x, "w": wt, "a": acc0}


def test_gemm_reset_and_accumulate(any_cfg):
    cfg = any_cfg
    bi, bo = cfg.block_in, cfg.block_out
    rng = np.random.default_rng(5)
    m = 7
    x = rand_int8(rng, (m, bi))
    wt = rand_int8(rng, (2, bo, bi))
    acc0 = rand_int32(rng, (3 * m, bo), -(1 << 20), 1 << 20)
    prog, inputs = _gemm_program(cfg, x, wt, acc0, [
        (0, 0, 0, [(m, 1, 1, 0)], True),            # rows 0..m-1 = x @ w0.T
        (0, 0, 1, [(m, 1, 1, 0)], False),           # rows 0..m-1 += x @ w1.T
        (m, 0, 1, [(m, 1, 1, 0)], False),           # rows m..2m-1 = acc0 + x @ w1.T
    ], 3 * m)
    res = run(cfg, prog, inputs)
    x64, w64 = x.astype(I64), wt.astype(I64)
    want = acc0.astype(I64).copy()
    want[:m] = x64 @ w64[0].T + x64 @ w64[1].T
    want[m:2 * m] += x64 @ w64[1].T
    np.testing.assert_array_equal(res.outputs["out"], want.astype(np.int32))


@pytest.mark.parametrize("mb,nb,kb", [(5, 3, 2), (1, 1, 4), (6, 1, 1), (2, 4, 3)])
def test_gemm_tiled_matmul_nest(default_cfg, mb, nb, kb):
    """(n block: weight-varying output level) x (m row) x (k block: reduction level)."""
    cfg = default_cfg
    bi, bo = cfg.block_in, cfg.block_out
    rng = np.random.default_rng(6)
    x = rand_int8(rng, (mb, kb * bi))
    w = rand_int8(rng, (nb * bo, kb * bi))
    packed = np.ascontiguousarray(w.reshape(nb, bo, kb, bi).transpose(0, 2, 1, 3)).reshape(
        nb * kb, bo, bi)
    acc0 = np.zeros((mb * nb, bo), np.int32)
    gemm = (0, 0, 0, [(nb, 1, 0, kb), (mb, nb, kb, 0), (kb, 0, 1, 1)], True)
    prog, inputs = _gemm_program(cfg, x.reshape(mb * kb, bi), packed, acc0, [gemm], mb * nb)
    res = run(cfg, prog, inputs)
    want = (x.astype(I64) @ w.astype(I64).T).reshape(mb * nb, bo)
    np.testing.assert_array_equal(res.outputs["out"], want.astype(np.int32))


def test_gemm_conv1d_nest(any_cfg):
    """out[co, p] = sum_t W[co, t] @ in[p + t]: output-channel level (weight varies),
    position level, tap level (reduction, accumulator fixed)."""
    cfg = any_cfg
    bi, bo = cfg.block_in, cfg.block_out
    rng = np.random.default_rng(7)
    cob, p, taps = 2, 6, 3
    x = rand_int8(rng, (p + taps - 1, bi))
    wt = rand_int8(rng, (cob * taps, bo, bi))
    acc0 = np.zeros((cob * p, bo), np.int32)
    gemm = (0, 0, 0, [(cob, p, 0, taps), (p, 1, 1, 0), (taps, 0, 1, 1)], True)
    prog, inputs = _gemm_program(cfg, x, wt, acc0, [gemm], cob * p)
    res = run(cfg, prog, inputs)
    want = np.zeros((cob, p, bo), I64)
    for c in range(cob):
        for q in range(p):
            for t in range(taps):
                want[c, q] += wt[c * taps + t].astype(I64) @ x[q + t].astype(I64)
    np.testing.assert_array_equal(res.outputs["out"], want.reshape(-1, bo).astype(np.int32))


def test_gemm_conv2d_with_padded_load(default_cfg):
    """3x3 'same' convolution of an HxW image: LOAD INP pads the border with the zero
    point, GEMM walks (oh, ow, r, s) with two reduction levels."""
    cfg = default_cfg
    bi, bo = cfg.block_in, cfg.block_out
    rng = np.random.default_rng(8)
    hh, ww, zp = 5, 6, -3
    img = rand_int8(rng, (hh, ww, bi))
    wt = rand_int8(rng, (9, bo, bi))
    b = ProgramBuilder(cfg, "conv2d")
    ri = b.region("img", "input", img.shape)
    rw = b.region("w", "input", wt.shape)
    out = b.region("out", "output", (hh * ww, bo), "int32")
    wp = ww + 2
    b.load(Buffer.INP, 0, b.addr(ri, Buffer.INP), hh, ww, ww, pad=(1, 1, 1, 1), pad_value=zp)
    b.load(Buffer.WGT, 0, b.addr(rw, Buffer.WGT), 1, 9)
    b.gemm(0, 0, 0, [(hh, ww, wp, 0), (ww, 1, 1, 0), (3, 0, wp, 3), (3, 0, 1, 1)], reset=True)
    b.store(Buffer.ACC, 0, b.addr(out, Buffer.ACC), 1, hh * ww)
    res = run(cfg, build_sequential(b), {"img": img, "w": wt})
    padded = np.pad(img.astype(I64), ((1, 1), (1, 1), (0, 0)), constant_values=zp)
    want = np.zeros((hh, ww, bo), I64)
    for r in range(3):
        for s in range(3):
            want += padded[r:r + hh, s:s + ww] @ wt[3 * r + s].astype(I64).T
    np.testing.assert_array_equal(res.outputs["out"], want.reshape(-1, bo).astype(np.int32))


def test_gemm_non_injective_accumulator_map(any_cfg):
    """acc row i + j receives x[i + 4j] @ W[j].T for every (i, j): rows overlap."""
    cfg = any_cfg
    bi, bo = cfg.block_in, cfg.block_out
    rng = np.random.default_rng(9)
    x = rand_int8(rng, (16, bi))
    wt = rand_int8(rng, (3, bo, bi))
    acc0 = rand_int32(rng, (8, bo), -1000, 1000)
    for reset in (False, True):
        gemm = (1, 0, 0, [(4, 1, 1, 0), (3, 1, 4, 1)], reset)
        prog, inputs = _gemm_program(cfg, x, wt, acc0, [gemm], 8)
        res = run(cfg, prog, inputs)
        want = acc0.astype(I64).copy()
        if reset:
            want[1:7] = 0
        for i in range(4):
            for j in range(3):
                want[1 + i + j] += wt[j].astype(I64) @ x[i + 4 * j].astype(I64)
        np.testing.assert_array_equal(res.outputs["out"], want.astype(np.int32))


def test_gemm_int32_wraparound(default_cfg):
    cfg = default_cfg
    bi, bo = cfg.block_in, cfg.block_out
    x = np.full((1, bi), 127, np.int8)
    wt = np.full((1, bo, bi), 127, np.int8)
    wt[0, 1] = -128                                              # lane 1 goes negative
    acc0 = np.zeros((2, bo), np.int32)
    acc0[0] = (1 << 31) - 100
    acc0[1] = -(1 << 31) + 5
    gemm = (0, 0, 0, [(2, 1, 0, 0)], False)
    prog, inputs = _gemm_program(cfg, x, wt, acc0, [gemm], 2)
    res = run(cfg, prog, inputs)
    step = np.full(bo, 127 * 127 * bi, I64)
    step[1] = -128 * 127 * bi
    want = wrap32_np(acc0.astype(I64) + step)
    assert want[0, 0] < 0                                        # it did wrap
    np.testing.assert_array_equal(res.outputs["out"], want)


def test_gemm_long_reduction_exact_and_wrapping(default_cfg):
    """9000 reduction steps of (-128)*(-128)*block_in: beyond float32's exact range and
    past 2**31, so the sum must wrap exactly."""
    cfg = default_cfg
    bi, bo = cfg.block_in, cfg.block_out
    x = np.full((1, bi), -128, np.int8)
    wt = np.full((1, bo, bi), -128, np.int8)
    wt[0, 0, 0] = 127
    acc0 = np.zeros((1, bo), np.int32)
    gemm = (0, 0, 0, [(9000, 0, 0, 0)], True)
    prog, inputs = _gemm_program(cfg, x, wt, acc0, [gemm], 1)
    res = run(cfg, prog, inputs)
    per_step = np.full(bo, 128 * 128 * bi, I64)
    per_step[0] = 128 * 128 * (bi - 1) - 128 * 127
    want = np.array([[wrap32(9000 * int(v)) for v in per_step]], np.int32)
    np.testing.assert_array_equal(res.outputs["out"], want)


def test_gemm_long_random_reduction_exact(default_cfg):
    """Random operands over 300 reduction steps (float32 chunks of at most 1024 products,
    the last one padded, summed in int32) stay bit-exact."""
    cfg = default_cfg
    bi, bo = cfg.block_in, cfg.block_out
    rng = np.random.default_rng(10)
    x = rand_int8(rng, (300, bi))
    wt = rand_int8(rng, (300, bo, bi))
    acc0 = rand_int32(rng, (1, bo))
    gemm = (0, 0, 0, [(300, 0, 1, 1)], False)
    prog, inputs = _gemm_program(cfg, x, wt, acc0, [gemm], 1)
    res = run(cfg, prog, inputs)
    tot = acc0.astype(I64)[0] + np.einsum("kob,kb->o", wt.astype(I64), x.astype(I64))
    np.testing.assert_array_equal(res.outputs["out"], wrap32_np(tot[None]))


@pytest.mark.parametrize("steps", [63, 64, 65, 129, 200])
def test_gemm_reduction_chunk_boundaries_extreme_values(default_cfg, steps):
    """Reductions just below, at and above a 1024-product chunk (64 blocks of 16), all
    products at +-2**14: every chunk sum sits at the edge of float32's exact range."""
    cfg = default_cfg
    bi, bo = cfg.block_in, cfg.block_out
    x = np.full((steps, bi), -128, np.int8)
    x[1::2] = 127                                             # alternate the sign per step
    wt = np.full((steps, bo, bi), -128, np.int8)
    wt[:, 1] = 127
    acc0 = np.zeros((2, bo), np.int32)
    acc0[1] = (1 << 31) - 7
    # row 0: reset and reduce; row 1: accumulate onto a value near 2**31 (wraps)
    gemms = [(0, 0, 0, [(steps, 0, 1, 1)], True), (1, 0, 0, [(steps, 0, 1, 1)], False)]
    prog, inputs = _gemm_program(cfg, x, wt, acc0, gemms, 2)
    res = run(cfg, prog, inputs)
    per = np.einsum("kob,kb->o", wt.astype(object), x.astype(object))
    want = np.stack([per, per + ((1 << 31) - 7)])
    np.testing.assert_array_equal(res.outputs["out"], wrap32_np(want))


def test_gemm_batched_nest_with_padded_reduction_chunks(default_cfg):
    """A batch level (every operand moves), an M level and a 67-step reduction: two
    float32 chunks of 34 blocks, the last padded by one, per batch; against the
    step-by-step reference."""
    cfg = default_cfg
    rng = np.random.default_rng(18)
    k = 67
    x = rand_int8(rng, (4 * k, cfg.block_in))
    wt = rand_int8(rng, (2 * k, cfg.block_out, cfg.block_in))
    acc0 = rand_int32(rng, (4, cfg.block_out))
    gemm = (0, 0, 0, [(2, 2, 2 * k, k), (2, 1, k, 0), (k, 0, 1, 1)], False)
    prog, inputs = _gemm_program(cfg, x, wt, acc0, [gemm], 4)
    run_and_check(cfg, prog, inputs)


def test_weight_cache_dropped_only_for_overwritten_tiles(default_cfg):
    """Prepared weight matrices are reused until a WGT load overwrites one of their tiles;
    loads elsewhere keep them, a partial overwrite drops them (and the next GEMM sees the
    new weights)."""
    from dsa_tvm.sim.functional import Machine

    cfg = default_cfg
    bi, bo = cfg.block_in, cfg.block_out
    rng = np.random.default_rng(17)
    x = rand_int8(rng, (4, bi))
    w_all = rand_int8(rng, (12, bo, bi))
    b = ProgramBuilder(cfg, "wcache")
    rx = b.region("x", "input", x.shape)
    rw = b.region("w", "input", w_all.shape)
    out = b.region("out", "output", (12, bo), "int32")
    wa, xa = b.addr(rw, Buffer.WGT), b.addr(rx, Buffer.INP)
    b.load(Buffer.INP, 0, xa, 1, 4)
    b.load(Buffer.WGT, 0, wa, 1, 4)                          # tiles 0..3 = w0..w3
    b.load(Buffer.WGT, 10, wa + 4, 1, 2)                     # tiles 10..11 = w4, w5
    nest_a = [(4, 0, 1, 1)]                                  # sum_k w[k] @ x[k]
    nest_b = [(2, 1, 0, 1), (4, 0, 1, 0)]                    # 2 rows: (w4, w5) @ sum_k x[k]
    b.gemm(0, 0, 0, nest_a, reset=True)
    b.gemm(4, 0, 10, nest_b, reset=True)
    b.load(Buffer.WGT, 20, wa + 6, 1, 2)                     # elsewhere: both survive
    b.gemm(1, 0, 0, nest_a, reset=True)
    b.load(Buffer.WGT, 3, wa + 8, 1, 1)                      # overwrites tile 3 only
    b.gemm(2, 0, 0, nest_a, reset=True)                      # must see w8 in place of w3
    b.gemm(6, 0, 10, nest_b, reset=True)
    b.store(Buffer.ACC, 0, b.addr(out, Buffer.ACC), 1, 12)
    prog = build_sequential(b)
    res, _ = run_and_check(cfg, prog, {"x": x, "w": w_all})
    x64, w64 = x.astype(I64), w_all.astype(I64)
    first = sum(w64[k] @ x64[k] for k in range(4))
    second = sum(w64[k] @ x64[k] for k in range(3)) + w64[8] @ x64[3]
    got = res.outputs["out"]
    np.testing.assert_array_equal(got[0], first)
    np.testing.assert_array_equal(got[1], first)
    np.testing.assert_array_equal(got[2], second)
    np.testing.assert_array_equal(got[6], w64[4] @ x64.sum(0))

    # the cache itself: which prepared matrices each load keeps
    m = Machine(cfg, prog)
    m.dram[:, rw.offset:rw.offset + rw.nbytes] = w_all.view(np.uint8).reshape(-1)
    loads = [i for i in prog.instructions if isinstance(i, Load) and i.buffer == Buffer.WGT]
    gemms = [i for i in prog.instructions if isinstance(i, Gemm)]
    for ld in loads[:2]:
        m.execute(0, ld)
    m.execute(0, gemms[0])
    m.execute(0, gemms[1])
    assert len(m._wcache) == 2
    m.execute(0, loads[2])                                   # tiles 20..21
    assert len(m._wcache) == 2
    m.execute(0, loads[3])                                   # tile 3: gemm_a's range
    assert [k[0] for k in m._wcache] == [10]


# ----------------------------------------------------------------------------- properties

ROWS = 32


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cfg_name=st.sampled_from(sorted(PROPERTY_CFGS)), reset=st.booleans(),
       seed=st.integers(0, 2**32 - 1), extreme=st.booleans())
def test_property_gemm_tile_matches_loop_reference(data, cfg_name, reset, seed, extreme):
    cfg = PROPERTY_CFGS[cfg_name]
    bi, bo = cfg.block_in, cfg.block_out
    loops = draw_nest(data.draw, 4, "aiw", 3, 3)
    spans = [nest_span(loops, k) for k in (1, 2, 3)]
    assume(max(spans) < ROWS)
    bases = [data.draw(st.integers(0, ROWS - 1 - s)) for s in spans]
    rng = np.random.default_rng(seed)
    if extreme:   # largest magnitudes: exercises the exact-sum and wrap-around paths
        x = np.full((ROWS, bi), -128, np.int8)
        wt = np.full((ROWS, bo, bi), -128, np.int8)
        acc0 = np.full((ROWS, bo), (1 << 31) - 1, np.int32)
    else:
        x, wt, acc0 = rand_int8(rng, (ROWS, bi)), rand_int8(rng, (ROWS, bo, bi)), rand_int32(
            rng, (ROWS, bo))
    prog, inputs = _gemm_program(cfg, x, wt, acc0, [(*bases, loops, reset)], ROWS)
    run_and_check(cfg, prog, inputs)


def test_reference_helper_agrees_on_a_known_program(default_cfg):
    """Guard the guard: the step-by-step reference itself reproduces a numpy matmul."""
    cfg = default_cfg
    bi, bo = cfg.block_in, cfg.block_out
    rng = np.random.default_rng(15)
    x = rand_int8(rng, (3, bi))
    wt = rand_int8(rng, (1, bo, bi))
    acc0 = np.zeros((3, bo), np.int32)
    prog, inputs = _gemm_program(cfg, x, wt, acc0, [(0, 0, 0, [(3, 1, 1, 0)], True)], 3)
    ref = reference_outputs(cfg, prog, inputs)["out"]
    np.testing.assert_array_equal(ref, (x.astype(I64) @ wt[0].astype(I64).T).astype(np.int32))



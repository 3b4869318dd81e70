"""Functional semantics of the vector ALU: every op in tensor and immediate form,
reductions, aliasing, the fused REQUANT output stage; bit-exact against numpy and
the step-by-step reference in ``reference_machine.RefMachine`` (split from test_functional).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import AluOp, Buffer
from dsa_tvm.isa.semantics import pack_clip_imm, pack_requant_imm
from dsa_tvm.sim.plans import alu_plan

from .harness import (
    PROPERTY_CFGS,
    draw_nest,
    nest_span,
    rand_int32,
    run,
    run_and_check,
    wrap32_np,
)
from .reference_machine import (
    PARAM_ROWS,
    build_sequential,
    output_stage_py,
    requant_imm_fields,
    rshift_round_py,
    wrap32,
)

I64 = np.int64


# ----------------------------------------------------------------------------- ALU

R = 6  # rows per operand in the ALU tests


def _alu_program(cfg, data, alu_calls, out_rows, name="alu"):
    b = ProgramBuilder(cfg, name)
    rd = b.region("d", "input", data.shape, "int32")
    out = b.region("out", "output", (out_rows, cfg.block_out), "int32")
    b.load(Buffer.ACC, 0, b.addr(rd, Buffer.ACC), 1, data.shape[0])
    for kw in alu_calls:
        b.alu(**kw)
    b.store(Buffer.ACC, 0, b.addr(out, Buffer.ACC), 1, out_rows)
    return build_sequential(b), {"d": data}


def _expected_alu(op, a, bb, b2, b3, d, imm):
    """Vectorized numpy form of every ALU op, on Python integers (object arrays)."""

    def obj(v):
        return None if v is None else np.asarray(v, dtype=np.int64).astype(object)

    a, bb, b2, b3, d = obj(a), obj(bb), obj(b2), obj(b3), obj(d)
    if op == AluOp.MOV:
        return wrap32_np(np.broadcast_to(bb, a.shape))
    if op == AluOp.ADD:
        return wrap32_np(a + bb)
    if op == AluOp.SUB:
        return wrap32_np(a - bb)
    if op == AluOp.MUL:
        return wrap32_np(a * bb)
    if op == AluOp.MAC:
        return wrap32_np(d + a * bb)
    if op == AluOp.MAC8:
        return wrap32_np(d + ((a + 128) % 256 - 128) * ((bb + 128) % 256 - 128))
    if op == AluOp.MIN:
        return np.minimum(a, bb).astype(np.int32)
    if op == AluOp.MAX:
        return np.maximum(a, bb).astype(np.int32)
    if op == AluOp.SHR:
        f = np.vectorize(lambda x, s: wrap32(rshift_round_py(x, s)), otypes=[np.int64])
        return f(a, bb).astype(np.int32)
    if op == AluOp.CLIP:
        return np.minimum(np.maximum(a, bb), b2).astype(np.int32)
    if op == AluOp.REQUANT:
        zp, lo, hi = requant_imm_fields(imm)
        f = np.vectorize(lambda x, c, m, s: output_stage_py(x, c, m, s, zp, lo, hi),
                         otypes=[np.int64])
        return f(a, bb, b2, b3).astype(np.int32)
    raise AssertionError(op)


def _alu_data(cfg, op, rng):
    """Rows: [0, R) source A, [R, 2R) destination (initial), [2R, 5R) source B: R groups
    of up to three parameter rows (CLIP: lo, hi; REQUANT: bias, mult, shift)."""
    bo = cfg.block_out
    a = rand_int32(rng, (R, bo))
    a[0, :4] = [(1 << 31) - 1, -(1 << 31), 0, -1]
    d0 = rand_int32(rng, (R, bo))
    b = rand_int32(rng, (3 * R, bo))
    if op == AluOp.SHR:
        b = rng.integers(-40, 70, (3 * R, bo)).astype(np.int32)
        b[0, :4] = [0, 1, -1, 33]
    if op == AluOp.CLIP:
        lo = rng.integers(-(1 << 20), 0, (R, bo))
        b[0:2 * R:2] = lo
        b[1:2 * R:2] = lo + rng.integers(0, 1 << 21, (R, bo))
    if op == AluOp.REQUANT:
        b[0::3] = rng.integers(-(1 << 20), 1 << 20, (R, bo))      # bias
        b[0, 0] = (1 << 31) - 1                                   # a + bias wraps
        b[1::3] = rng.integers(1 << 30, 1 << 31, (R, bo))         # mult
        b[2::3] = rng.integers(0, 63, (R, bo))                    # shift
        b[2, :3] = [0, 31, 62]
        a = rand_int32(rng, (R, bo), -(1 << 16), 1 << 16)
        a[0, :2] = [(1 << 31) - 1, -(1 << 31)]
    if op in (AluOp.MUL, AluOp.MAC, AluOp.MAC8):
        b[0, 0] = (1 << 31) - 1                                   # a * b wraps
    return a, d0, b


TENSOR_OPS = [op for op in AluOp if op != AluOp.LUT]   # LUT (a table, not rows): test_lut.py
IMM_OPS = [op for op in AluOp if op not in (AluOp.REQUANT, AluOp.LUT)]


@pytest.mark.parametrize("op", TENSOR_OPS, ids=lambda o: o.name)
def test_alu_tensor_form(any_cfg, op):
    cfg = any_cfg
    rng = np.random.default_rng(100 + int(op))
    a, d0, b = _alu_data(cfg, op, rng)
    data = np.concatenate([a, d0, b])
    rows = PARAM_ROWS.get(op, 1)
    # CLIP reads rows b, b + 1 and REQUANT b, b + 1, b + 2 per step: step B by the group
    imm = pack_requant_imm(-5, -100, 90) if op == AluOp.REQUANT else 0
    call = dict(op=op, dst_base=R, a_base=0, b_base=2 * R, loops=[(R, 1, 1, rows)], imm=imm)
    prog, inputs = _alu_program(cfg, data, [call], 5 * R)
    res = run(cfg, prog, inputs)
    groups = b[:rows * R].reshape(R, rows, -1).astype(I64)
    bb = groups[:, 0]
    b2 = groups[:, 1] if rows > 1 else None
    b3 = groups[:, 2] if rows > 2 else None
    want = data.copy()
    want[R:2 * R] = _expected_alu(op, a.astype(I64), bb, b2, b3, d0.astype(I64), imm)
    np.testing.assert_array_equal(res.outputs["out"], want)
    if op == AluOp.REQUANT:                       # the clamp of the immediate took effect
        got = res.outputs["out"][R:2 * R]
        assert got.min() >= -100 and got.max() <= 90
        assert (got == -100).any() and (got == 90).any()


@pytest.mark.parametrize("op", IMM_OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("imm_kind", ["small", "extreme"])
def test_alu_immediate_form(any_cfg, op, imm_kind):
    cfg = any_cfg
    rng = np.random.default_rng(200 + int(op))
    a, d0, _ = _alu_data(cfg, op, rng)
    data = np.concatenate([a, d0])
    if op == AluOp.CLIP:
        lo, hi = (-1000, 2500) if imm_kind == "small" else (-32768, 32767)
        imm = pack_clip_imm(lo, hi)
        bb, b2 = lo, hi
    elif op == AluOp.SHR:
        imm = 5 if imm_kind == "small" else -3
        bb, b2 = imm, None
    else:
        imm = 1234567 if imm_kind == "small" else -(1 << 31)
        bb, b2 = imm, None
    call = dict(op=op, dst_base=R, a_base=0, loops=[(2, 3, 3, 0), (3, 1, 1, 0)], imm=imm,
                use_imm=True)
    prog, inputs = _alu_program(cfg, data, [call], 2 * R)
    res = run(cfg, prog, inputs)
    want = data.copy()
    want[R:] = _expected_alu(op, a.astype(I64), np.int64(bb), b2, None, d0.astype(I64), imm)
    np.testing.assert_array_equal(res.outputs["out"], want)


def test_alu_clip_immediate_packing():
    assert pack_clip_imm(0, 6) == 6 << 16
    assert pack_clip_imm(-128, 127) == (127 << 16) | 0xFF80
    assert pack_clip_imm(-1, -1) == -1
    with pytest.raises(ValueError):
        pack_clip_imm(0, 40000)


def test_alu_max_pool_reduction(any_cfg):
    """dst[p] = max over k of src[p*k + j]: MOV -inf, then MAX with dst stride 0 on the
    inner level (a reduction level stepped in loop order)."""
    cfg = any_cfg
    bo = cfg.block_out
    rng = np.random.default_rng(11)
    p, k = 4, 3
    src = rand_int32(rng, (p * k, bo))
    data = np.concatenate([src, np.zeros((p, bo), np.int32)])
    dst = p * k
    calls = [dict(op=AluOp.MOV, dst_base=dst, loops=[(p, 1, 0, 0)], imm=-(1 << 31), use_imm=True),
             dict(op=AluOp.MAX, dst_base=dst, a_base=dst, b_base=0,
                  loops=[(p, 1, 1, k), (k, 0, 0, 1)])]
    prog, inputs = _alu_program(cfg, data, calls, p * k + p)
    res = run(cfg, prog, inputs)
    want = src.reshape(p, k, bo).max(axis=1)
    np.testing.assert_array_equal(res.outputs["out"][dst:], want)
    np.testing.assert_array_equal(res.outputs["out"][:dst], src)


def test_alu_sum_and_mac_reductions(any_cfg):
    cfg = any_cfg
    bo = cfg.block_out
    rng = np.random.default_rng(12)
    p, k = 3, 5
    src = rand_int32(rng, (p * k, bo))
    vec = rand_int32(rng, (k, bo), -1000, 1000)
    data = np.concatenate([src, vec, np.zeros((2 * p, bo), np.int32)])
    s0, m0 = p * k + k, p * k + k + p
    calls = [
        # sums (wrapping): dst = dst + src over the inner level
        dict(op=AluOp.MOV, dst_base=s0, loops=[(p, 1, 0, 0)], imm=0, use_imm=True),
        dict(op=AluOp.ADD, dst_base=s0, a_base=s0, b_base=0, loops=[(p, 1, 1, k), (k, 0, 0, 1)]),
        # dot products: dst += src[p, j] * vec[j]
        dict(op=AluOp.MOV, dst_base=m0, loops=[(p, 1, 0, 0)], imm=7, use_imm=True),
        dict(op=AluOp.MAC, dst_base=m0, a_base=0, b_base=p * k,
             loops=[(p, 1, k, 0), (k, 0, 1, 1)]),
    ]
    prog, inputs = _alu_program(cfg, data, calls, data.shape[0])
    res = run(cfg, prog, inputs)
    s64 = src.astype(object).reshape(p, k, bo)
    np.testing.assert_array_equal(res.outputs["out"][s0:s0 + p], wrap32_np(s64.sum(axis=1)))
    mac = 7 + (s64 * vec.astype(object)[None]).sum(axis=1)
    np.testing.assert_array_equal(res.outputs["out"][m0:m0 + p], wrap32_np(mac))


def test_alu_aliasing_runs_in_loop_order(any_cfg):
    """Reads of rows written by earlier points of the same instruction see the new values."""
    cfg = any_cfg
    bo = cfg.block_out
    rng = np.random.default_rng(13)
    n = 8
    src = rand_int32(rng, (n, bo), -1000, 1000)
    data = np.concatenate([src, src, src])
    calls = [
        # prefix sum in place: row i = row i-1 + row i (a reads the previous destination)
        dict(op=AluOp.ADD, dst_base=1, a_base=0, b_base=1, loops=[(n - 1, 1, 1, 1)]),
        # smear forward: row i+1 = row i, in loop order -> every row becomes the first one
        dict(op=AluOp.MOV, dst_base=n + 1, b_base=n, loops=[(n - 1, 1, 0, 1)]),
        # shift backward: row i = row i+1 (reads rows not yet written)
        dict(op=AluOp.MOV, dst_base=2 * n, b_base=2 * n + 1, loops=[(n - 1, 1, 0, 1)]),
    ]
    prog, inputs = _alu_program(cfg, data, calls, 3 * n)
    res = run(cfg, prog, inputs)
    out = res.outputs["out"]
    np.testing.assert_array_equal(out[:n], np.cumsum(src.astype(I64), axis=0))
    np.testing.assert_array_equal(out[n:2 * n], np.repeat(src[:1], n, axis=0))
    np.testing.assert_array_equal(out[2 * n:3 * n], np.concatenate([src[1:], src[-1:]]))


def test_alu_aliasing_with_reduction_level(default_cfg):
    """Point order matters with a reduction level inside a parallel one and a source that
    reads another point's destination."""
    cfg = default_cfg
    rng = np.random.default_rng(14)
    data = rand_int32(rng, (12, cfg.block_out), -50, 50)
    calls = [dict(op=AluOp.ADD, dst_base=2, a_base=1, b_base=0, loops=[(3, 1, 1, 0), (2, 0, 0, 3)])]
    prog, inputs = _alu_program(cfg, data, calls, 12)
    run_and_check(cfg, prog, inputs)


def test_requant_pipeline_matches_hand_computed(default_cfg):
    """A concrete REQUANT: bias add, rounding half up, zero point, saturation to int8."""
    cfg = default_cfg
    bo = cfg.block_out
    data = np.zeros((4, bo), np.int32)
    data[0, :7] = [3, -3, 5, -5, 1000, -1000, (1 << 31) - 1]
    data[1, :] = 0                                     # bias
    data[1, 6] = 1                                     # lane 6: (2**31 - 1) + 1 wraps
    data[2, :] = 1                                     # mult
    data[3, :] = 1                                     # shift: x / 2
    call = dict(op=AluOp.REQUANT, dst_base=0, a_base=0, b_base=1, loops=[(1, 0, 0, 0)],
                imm=pack_requant_imm(10))
    prog, inputs = _alu_program(cfg, data, [call], 1)
    res = run(cfg, prog, inputs)
    # 3/2=1.5->2, -1.5->-1, 2.5->3, -2.5->-2, 500, -500, -2**30; then +10 and saturate
    assert list(res.outputs["out"][0, :7]) == [12, 9, 13, 8, 127, -128, -128]


def test_requant_fused_bias_relu_hand_computed(default_cfg):
    """Bias, per-lane multiplier and shift, zero point and a ReLU6-style clamp in one pass."""
    cfg = default_cfg
    bo = cfg.block_out
    data = np.zeros((5, bo), np.int32)
    data[0, :6] = [100, 100, -100, 7, 7, 1000]         # accumulators
    data[1, :6] = [20, -300, 50, 0, 1, 0]              # bias
    data[2, :6] = [1, 1, 3, 1 << 30, 1 << 30, 1]       # mult
    data[3, :6] = [2, 2, 1, 31, 31, 0]                 # shift
    data[3, 6:] = 62                                   # padding lanes: anything in range
    # zp -3, ReLU (lo = zp), hi = zp + 12
    call = dict(op=AluOp.REQUANT, dst_base=4, a_base=0, b_base=1, loops=[(1, 0, 0, 0)],
                imm=pack_requant_imm(-3, -3, 9))
    prog, inputs = _alu_program(cfg, data, [call], 5)
    res = run(cfg, prog, inputs)
    # 120/4 = 30 -> 27 -> 9 (hi); -200/4 = -50 -> -53 -> -3 (ReLU); -50*3/2 = -75 -> -3;
    # 7 * 2**30 / 2**31 = 3.5 -> 4 -> 1; 8/2 = 4 -> 1; 1000 -> 997 -> 9
    assert list(res.outputs["out"][4, :6]) == [9, -3, -3, 1, 1, 9]
    assert list(res.outputs["out"][4, 6:]) == [-3] * (bo - 6)     # 0 -> zp, within [lo, hi]
    np.testing.assert_array_equal(res.outputs["out"][:4], data[:4])



ALU_ROWS = 48
PARAM0 = 30   # REQUANT parameter groups (bias, mult, shift) live in rows [30, 48)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cfg_name=st.sampled_from(sorted(PROPERTY_CFGS)), op=st.sampled_from(TENSOR_OPS),
       seed=st.integers(0, 2**32 - 1))
def test_property_alu_tile_matches_loop_reference(data, cfg_name, op, seed):
    cfg = PROPERTY_CFGS[cfg_name]
    bo = cfg.block_out
    use_imm = False if op == AluOp.REQUANT else data.draw(st.booleans(), label="use_imm")
    loops = draw_nest(data.draw, 3, "dab", 3, 2)
    rng = np.random.default_rng(seed)
    acc = rand_int32(rng, (ALU_ROWS, bo))
    if data.draw(st.booleans(), label="small values"):
        acc = rand_int32(rng, (ALU_ROWS, bo), -300, 300)
    if op == AluOp.REQUANT:
        # B steps over (bias, mult, shift) groups; destination and A stay below them
        loops = [(e, d, a, 3 * (b % 2)) for e, d, a, b in loops]
        ngroups = (ALU_ROWS - PARAM0) // 3
        acc[PARAM0 + 1::3] = rng.integers(-(1 << 31), 1 << 31, (ngroups, bo))
        acc[PARAM0 + 2::3] = rng.integers(0, 63, (ngroups, bo))
        limit_da = PARAM0
    else:
        limit_da = ALU_ROWS
        if op == AluOp.SHR:
            acc[::3] = rng.integers(-70, 70, acc[::3].shape)       # plausible shift amounts
    sd, sa, sb = (nest_span(loops, k) for k in (1, 2, 3))
    extra = PARAM_ROWS.get(op, 1) - 1
    if op == AluOp.REQUANT:
        assume(sd < PARAM0 and sa < PARAM0 and sb <= ALU_ROWS - PARAM0 - 3)
    else:
        assume(sd < ALU_ROWS and sa < ALU_ROWS and sb + extra < ALU_ROWS)
    dst = data.draw(st.integers(0, limit_da - 1 - sd), label="dst")
    a = data.draw(st.integers(0, limit_da - 1 - sa), label="a")
    if op == AluOp.REQUANT:
        b = PARAM0 + 3 * data.draw(st.integers(0, (ALU_ROWS - PARAM0 - 3 - sb) // 3), label="b")
    else:
        b = data.draw(st.integers(0, ALU_ROWS - 1 - sb - extra), label="b")
    imm = data.draw(st.one_of(st.integers(-(1 << 31), (1 << 31) - 1), st.integers(-70, 70)),
                    label="imm")
    if op == AluOp.REQUANT:
        zp, b1, b2 = (data.draw(st.integers(-128, 127), label=k) for k in ("zp", "b1", "b2"))
        imm = pack_requant_imm(zp, min(b1, b2), max(b1, b2))
    call = dict(op=op, dst_base=dst, a_base=a, b_base=b, loops=loops, imm=imm, use_imm=use_imm)
    prog, inputs = _alu_program(cfg, acc, [call], ALU_ROWS)
    run_and_check(cfg, prog, inputs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cfg_name=st.sampled_from(sorted(PROPERTY_CFGS)), seed=st.integers(0, 2**32 - 1))
def test_property_in_place_add_reduction_matches_loop_reference(data, cfg_name, seed):
    """An in-place ADD with reduction levels (the grouped dense's sum over groups) runs as
    one gathered sum (``AluPlan.sum_steps``); it must equal the point-by-point loop, int32
    wrap-around included."""
    cfg = PROPERTY_CFGS[cfg_name]
    bo = cfg.block_out
    nest = draw_nest(data.draw, 3, "db", 4, 3)
    loops = [(e, d, d, b) for e, d, b in nest]          # a is the destination
    loops[data.draw(st.integers(0, 2), label="reduced level")] = (
        data.draw(st.integers(2, 6), label="steps"), 0, 0, data.draw(st.integers(1, 3)))
    sd, sb = nest_span(loops, 1), nest_span(loops, 3)
    rows = sd + sb + 2
    rng = np.random.default_rng(seed)
    acc = rand_int32(rng, (rows, bo))                    # full range: sums wrap
    calls = [dict(op=AluOp.ADD, dst_base=0, a_base=0, b_base=sd + 1, loops=loops)]
    prog, inputs = _alu_program(cfg, acc, calls, rows)
    alu = next(ins for ins in prog.instructions if getattr(ins, "op", None) == AluOp.ADD)
    assume(alu_plan(alu.loops, 0, sd + 1, AluOp.ADD, bo).sum_steps)   # the gathered path
    run_and_check(cfg, prog, inputs)

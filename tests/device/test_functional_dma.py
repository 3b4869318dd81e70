"""Functional semantics of LOAD and STORE (2-D windows, strides, padding, broadcast,
every buffer's widths), bit-exact against numpy and, by property test, against the
step-by-step reference in ``reference_machine.RefMachine``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dsa_tvm.hw.config import with_overrides
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import Buffer
from dsa_tvm.isa.program import INT4

from .harness import (  # noqa: F401 (both_gemm_paths: a fixture, used by name)
    PROPERTY_CFGS,
    both_gemm_paths,
    identity_tile,
    prune_n_m,
    rand_int8,
    rand_int16,
    rand_int32,
    run,
    run_and_check,
)
from .reference_machine import build_sequential

I64 = np.int64
#: every test here on both GEMM paths (harness.both_gemm_paths)
pytestmark = pytest.mark.usefixtures("both_gemm_paths")


# ----------------------------------------------------------------------------- LOAD / STORE

PAD = (1, 2, 1, 1)  # top, bottom, left, right


def _window(elems: np.ndarray, base: int, ys: int, xs: int, stride: int) -> np.ndarray:
    idx = base + np.arange(ys)[:, None] * stride + np.arange(xs)[None, :]
    return elems[idx]



def test_load_inp_2d_stride_and_padding(any_cfg):
    cfg = any_cfg
    bi = cfg.block_in
    rng = np.random.default_rng(1)
    x = rand_int8(rng, (40, bi))                       # 40 DRAM input rows
    ys, xs, stride, first = 3, 4, 6, 7
    t, btm, lft, rgt = PAD
    h, w = t + ys + btm, lft + xs + rgt
    b = ProgramBuilder(cfg, "load_inp")
    rx = b.region("x", "input", x.shape)
    rw = b.region("eye", "const", (1, cfg.block_out, bi), data=identity_tile(cfg)[None])
    out = b.region("out", "output", (h * w, cfg.block_out), "int32")
    b.load(Buffer.INP, 5, b.addr(rx, Buffer.INP) + first, ys, xs, stride, pad=PAD, pad_value=-7)
    b.load(Buffer.WGT, 3, b.addr(rw, Buffer.WGT), 1, 1)
    b.gemm(0, 5, 3, [(h * w, 1, 1, 0)], reset=True)
    b.store(Buffer.ACC, 0, b.addr(out, Buffer.ACC), 1, h * w)
    prog = build_sequential(b)
    res = run(cfg, prog, {"x": x})
    sel = _window(x, first, ys, xs, stride)
    want = np.pad(sel, ((t, btm), (lft, rgt), (0, 0)), constant_values=-7).reshape(h * w, bi)
    np.testing.assert_array_equal(res.outputs["out"], want.astype(np.int32))


def test_load_wgt_2d_stride_and_padding(any_cfg):
    cfg = any_cfg
    bi, bo = cfg.block_in, cfg.block_out
    rng = np.random.default_rng(2)
    wt = rand_int8(rng, (12, bo, bi))
    ys, xs, stride, first = 2, 2, 5, 1
    t, btm, lft, rgt = PAD
    h, w = t + ys + btm, lft + xs + rgt
    ntiles = h * w
    b = ProgramBuilder(cfg, "load_wgt")
    rw = b.region("w", "input", wt.shape)
    reye = b.region("eye", "const", (bi, bi), data=np.eye(bi, dtype=np.int8))
    out = b.region("out", "output", (ntiles * bi, bo), "int32")
    b.load(Buffer.WGT, 2, b.addr(rw, Buffer.WGT) + first, ys, xs, stride, pad=PAD, pad_value=3)
    b.load(Buffer.INP, 0, b.addr(reye, Buffer.INP), 1, bi)
    # acc[t*bi + k] = tile_t @ e_k = column k of tile t
    b.gemm(0, 0, 2, [(ntiles, bi, 0, 1), (bi, 1, 1, 0)], reset=True)
    b.store(Buffer.ACC, 0, b.addr(out, Buffer.ACC), 1, ntiles * bi)
    res = run(cfg, build_sequential(b), {"w": wt})
    sel = _window(wt, first, ys, xs, stride)
    tiles = np.pad(sel, ((t, btm), (lft, rgt), (0, 0), (0, 0)), constant_values=3)
    want = tiles.reshape(ntiles, bo, bi).transpose(0, 2, 1).reshape(ntiles * bi, bo)
    np.testing.assert_array_equal(res.outputs["out"], want.astype(np.int32))


@pytest.mark.parametrize("buffer", [Buffer.ACC, Buffer.ACC8, Buffer.ACC16])
def test_load_acc_2d_stride_padding_and_sign_extension(any_cfg, buffer):
    cfg = any_cfg
    bo = cfg.block_out
    rng = np.random.default_rng(3)
    dtype = {Buffer.ACC: np.int32, Buffer.ACC8: np.int8, Buffer.ACC16: np.int16}[buffer]
    data = {Buffer.ACC: rand_int32, Buffer.ACC8: rand_int8, Buffer.ACC16: rand_int16}[buffer](
        rng, (30, bo))
    data[0, 0] = np.iinfo(dtype).min
    data[1, 0] = np.iinfo(dtype).max
    ys, xs, stride, first = 3, 2, 4, 0
    t, btm, lft, rgt = PAD
    h, w = t + ys + btm, lft + xs + rgt
    b = ProgramBuilder(cfg, "load_acc")
    rd = b.region("d", "input", data.shape, np.dtype(dtype).name)
    out = b.region("out", "output", (h * w, bo), "int32")
    b.load(buffer, 4, b.addr(rd, buffer) + first, ys, xs, stride, pad=PAD, pad_value=-128)
    b.store(Buffer.ACC, 4, b.addr(out, Buffer.ACC), 1, h * w)
    res = run(cfg, build_sequential(b), {"d": data})
    sel = _window(data.astype(I64), first, ys, xs, stride)   # ACC8/16: sign-extended
    want = np.pad(sel, ((t, btm), (lft, rgt), (0, 0)), constant_values=-128).reshape(h * w, bo)
    np.testing.assert_array_equal(res.outputs["out"], want.astype(np.int32))


def test_store_acc_and_acc8_low_byte_with_stride(any_cfg):
    cfg = any_cfg
    bo = cfg.block_out
    rng = np.random.default_rng(4)
    vals = rand_int32(rng, (6, bo))
    vals[0, :4] = [300, -200, (1 << 31) - 1, -(1 << 31)]
    b = ProgramBuilder(cfg, "store")
    rv = b.region("v", "input", vals.shape, "int32")
    o32 = b.region("o32", "output", (4, 5, bo), "int32")
    o8 = b.region("o8", "output", (4, 5, bo), "int8")
    b.load(Buffer.ACC, 10, b.addr(rv, Buffer.ACC), 1, 6)
    # 2 rows of 3 elements, row starts 5 elements apart, from element (1, 1)
    b.store(Buffer.ACC, 10, b.addr(o32, Buffer.ACC) + 6, 2, 3, 5)
    b.store(Buffer.ACC8, 10, b.addr(o8, Buffer.ACC8) + 6, 2, 3, 5)
    res = run(cfg, build_sequential(b), {"v": vals})
    want32 = np.zeros((4, 5, bo), np.int64)
    want32[1:3, 1:4] = vals.reshape(2, 3, bo)
    np.testing.assert_array_equal(res.outputs["o32"], want32.astype(np.int32))
    low = ((want32 & 0xFF) ^ 0x80) - 0x80                     # low byte, as a signed int8
    np.testing.assert_array_equal(res.outputs["o8"], low.astype(np.int8))
    assert list(res.outputs["o8"][1, 1, :4]) == [44, 56, -1, 0]


def test_store_acc16_low_16_bits_with_stride(any_cfg):
    """ACC16 keeps the low 16 bits of each lane (values past int16 wrap, as ACC8 keeps the
    low byte) and writes 2 bytes a lane, strided; loading them back sign-extends: int16
    values survive the round trip bit for bit, others come back as their low 16 bits."""
    cfg = any_cfg
    bo = cfg.block_out
    rng = np.random.default_rng(5)
    vals = rand_int32(rng, (6, bo))
    vals[0, :8] = [32767, -32768, 32768, -32769, 65535, (1 << 31) - 1, -(1 << 31), 70000]
    vals[1] = rand_int16(rng, bo)                               # a row inside int16
    b = ProgramBuilder(cfg, "store16")
    rv = b.region("v", "input", vals.shape, "int32")
    o16 = b.region("o16", "output", (4, 5, bo), "int16")
    back = b.region("back", "output", (6, bo), "int32")
    b.load(Buffer.ACC, 10, b.addr(rv, Buffer.ACC), 1, 6)
    b.store(Buffer.ACC16, 10, b.addr(o16, Buffer.ACC16) + 6, 2, 3, 5)
    b.load(Buffer.ACC16, 40, b.addr(o16, Buffer.ACC16) + 6, 2, 3, 5)   # and back, widened
    b.store(Buffer.ACC, 40, b.addr(back, Buffer.ACC), 1, 6)
    res, _ = run_and_check(cfg, build_sequential(b), {"v": vals})
    want = np.zeros((4, 5, bo), np.int64)
    want[1:3, 1:4] = vals.reshape(2, 3, bo)
    low = ((want & 0xFFFF) ^ 0x8000) - 0x8000                 # low 16 bits, signed
    np.testing.assert_array_equal(res.outputs["o16"], low.astype(np.int16))
    assert list(res.outputs["o16"][1, 1, :8]) == [32767, -32768, -32768, 32767, -1, -1, 0,
                                                 70000 - 65536]
    np.testing.assert_array_equal(res.outputs["back"], low[1:3, 1:4].reshape(6, bo))
    np.testing.assert_array_equal(res.outputs["back"][1], vals[1])   # int16: exact
    # the bytes in DRAM: little-endian 16-bit words, 2 a lane
    assert res.outputs["o16"].tobytes()[2 * bo * 6:2 * bo * 6 + 4] == bytes([0xFF, 0x7F, 0x00,
                                                                             0x80])


# ----------------------------------------------------------------------------- broadcast LOAD

def test_load_stride_zero_broadcasts_one_row(any_cfg):
    """x_stride = 0 is legal: every row reads the same source row (a bias row copied to
    many accumulator rows; a zero-point row filling input rows), with padding around."""
    cfg = any_cfg
    bi, bo = cfg.block_in, cfg.block_out
    rng = np.random.default_rng(16)
    bias = rand_int32(rng, (2, bo))
    zp_row = np.full((1, bi), -7, np.int8)
    zp_row[0, 0] = 5
    b = ProgramBuilder(cfg, "broadcast")
    rb = b.region("bias", "input", bias.shape, "int32")
    rz = b.region("zp", "const", zp_row.shape, data=zp_row)
    rid = b.region("id", "const", (1, bo, bi), data=identity_tile(cfg)[None])
    out = b.region("out", "output", (12, bo), "int32")
    out_inp = b.region("out_inp", "output", (6, bo), "int32")
    # ACC: 6 copies of the second bias row; then the 2-row window (row 0, row 1) twice,
    # followed by one padding row of 2 elements of 9
    b.load(Buffer.ACC, 0, b.addr(rb, Buffer.ACC) + 1, 6, 1, 0)
    b.load(Buffer.ACC, 6, b.addr(rb, Buffer.ACC), 2, 2, 0, pad=(0, 1, 0, 0), pad_value=9)
    # INP: 4 copies of the zero-point row between 1 padding row above and 1 below
    b.load(Buffer.INP, 0, b.addr(rz, Buffer.INP), 4, 1, 0, pad=(1, 1, 0, 0), pad_value=1)
    b.load(Buffer.WGT, 0, b.addr(rid, Buffer.WGT), 1, 1)
    b.gemm(20, 0, 0, [(6, 1, 1, 0)], reset=True)
    b.store(Buffer.ACC, 0, b.addr(out, Buffer.ACC), 1, 12)
    b.store(Buffer.ACC, 20, b.addr(out_inp, Buffer.ACC), 1, 6)
    prog = build_sequential(b)
    res = run(cfg, prog, {"bias": bias})
    want = np.concatenate([np.repeat(bias[1:], 6, axis=0), bias, bias, np.full((2, bo), 9)])
    np.testing.assert_array_equal(res.outputs["out"], want.astype(np.int32))
    want_inp = np.concatenate([np.ones((1, bi)), np.repeat(zp_row, 4, axis=0), np.ones((1, bi))])
    np.testing.assert_array_equal(res.outputs["out_inp"], want_inp.astype(np.int32))
    run_and_check(cfg, prog, {"bias": bias})            # and the step-by-step reference


# ----------------------------------------------------------------------------- properties

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cfg_name=st.sampled_from(sorted(PROPERTY_CFGS)), buffer=st.sampled_from(list(Buffer)),
       seed=st.integers(0, 2**32 - 1))
def test_property_load_store_windows_match_loop_reference(data, cfg_name, buffer, seed):
    """Random 2-D DMA windows (row strides below, equal to and above the row length, even 0),
    padding and pad values for every buffer, read back and stored through strided STOREs."""
    cfg = PROPERTY_CFGS[cfg_name]
    bi, bo = cfg.block_in, cfg.block_out
    draw = data.draw
    n_src = 48
    ys, xs = draw(st.integers(1, 4), label="y"), draw(st.integers(1, 4), label="x")
    stride = draw(st.integers(0, 6), label="stride") if ys > 1 else xs
    assume((ys - 1) * stride + xs <= n_src)
    first = draw(st.integers(0, n_src - (ys - 1) * stride - xs), label="first")
    pad = tuple(draw(st.integers(0, 2)) for _ in range(4))
    pad_value = draw(st.integers(-128, 127), label="pad_value")
    h, w = pad[0] + ys + pad[1], pad[2] + xs + pad[3]
    rows = h * w
    sram0 = draw(st.integers(0, 8), label="sram_base")
    rng = np.random.default_rng(seed)
    shapes = {Buffer.INP: ((n_src, bi), "int8"), Buffer.WGT: ((n_src, bo, bi), "int8"),
              Buffer.ACC: ((n_src, bo), "int32"), Buffer.ACC8: ((n_src, bo), "int8"),
              Buffer.WGT4: ((n_src, bo, bi), INT4), Buffer.WGTS: ((n_src, bo, bi), "sparse2:4"),
              Buffer.ACC16: ((n_src, bo), "int16")}
    shape, dtype = shapes[buffer]
    src = (rand_int32(rng, shape) if dtype == "int32" else rand_int16(rng, shape)
           if dtype == "int16" else rand_int8(rng, shape))
    if buffer == Buffer.WGTS:  # a 2:4 array, the same description otherwise
        cfg = with_overrides(cfg, ["array.sparsity=2:4"])
    b = ProgramBuilder(cfg, "dma")
    if buffer == Buffer.WGT4:   # int4 codes live in constant DRAM, packed two a byte
        src = rng.integers(-8, 8, shape, dtype=np.int8)
        rs = b.region("src", "const", shape, dtype, data=src)
    elif buffer == Buffer.WGTS:  # compressed 2:4 tiles live in constant DRAM
        src = prune_n_m(src, 2, 4)
        rs = b.region("src", "const", shape, dtype, data=src)
    else:
        rs = b.region("src", "input", shape, dtype)
    reye = b.region("eye", "const", (bi, bi), data=np.eye(bi, dtype=np.int8))
    rid = b.region("id", "const", (1, bo, bi), data=identity_tile(cfg)[None])
    b.load(buffer, sram0, b.addr(rs, buffer) + first, ys, xs, stride, pad=pad, pad_value=pad_value)
    if buffer == Buffer.INP:
        b.load(Buffer.WGT, 0, b.addr(rid, Buffer.WGT), 1, 1)
        b.gemm(0, sram0, 0, [(rows, 1, 1, 0)], reset=True)
        acc_base, acc_rows = 0, rows
    elif buffer in (Buffer.WGT, Buffer.WGT4, Buffer.WGTS):
        b.load(Buffer.INP, 0, b.addr(reye, Buffer.INP), 1, bi)
        b.gemm(0, 0, sram0, [(rows, bi, 0, 1), (bi, 1, 1, 0)], reset=True)
        acc_base, acc_rows = 0, rows * bi
    else:
        acc_base, acc_rows = sram0, rows
    out = b.region("out", "output", (acc_rows, bo), "int32")
    b.store(Buffer.ACC, acc_base, b.addr(out, Buffer.ACC), 1, acc_rows)
    # and once more as int8 through a strided window: acc_rows = y2 rows of x2
    x2 = draw(st.sampled_from([d for d in range(1, acc_rows + 1) if acc_rows % d == 0]), label="x2")
    y2 = acc_rows // x2
    gap = draw(st.integers(0, 3), label="gap")
    out8 = b.region("out8", "output", (y2, x2 + gap, bo), "int8")
    b.store(Buffer.ACC8, acc_base, b.addr(out8, Buffer.ACC8), y2, x2, x2 + gap)
    out16 = b.region("out16", "output", (y2, x2 + gap, bo), "int16")    # and as int16
    b.store(Buffer.ACC16, acc_base, b.addr(out16, Buffer.ACC16), y2, x2, x2 + gap)
    prog = build_sequential(b)
    run_and_check(cfg, prog, {} if buffer in (Buffer.WGT4, Buffer.WGTS) else {"src": src})


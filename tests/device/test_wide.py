"""Wide (int16) tensors on the device, step 1 of the wide residual stream: the ACC16 buffer
(int32 accumulator rows, int16 in DRAM: sign-extended on load, the low 16 bits on store,
2 bytes a lane), the wide REQUANT (immediate bit 24: the output stage clamps to int16) and
NORM's ``in_wide`` (rows of int16 codes). Bit-exact against the reference machine, Python
integers and ``isa.intnorm``; byte counts and timing from the 2-byte lanes; the encodings'
round trips; the validator's refusals; the int64 bounds of the norms on int16 rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsa_tvm
from dsa_tvm.isa import intnorm as inn
from dsa_tvm.isa import norm_unit as nu
from dsa_tvm.isa import semantics as sem
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.disasm import disassemble_one
from dsa_tvm.isa.encoding import decode_instruction, encode_instruction
from dsa_tvm.isa.footprint import footprint
from dsa_tvm.isa.formats import FORMATS
from dsa_tvm.isa.instructions import (
    ACC_BUFFERS,
    Alu,
    AluLoop,
    AluOp,
    Buffer,
    Engine,
    Load,
    Norm,
    NormOp,
    Opcode,
    Store,
)
from dsa_tvm.sim.timing import compute_cycles

from ..compiler.test_intnorm import scalar_norm
from .harness import PRESETS, rand_int16, rand_int32, run, run_and_check
from .reference_machine import build_sequential, output_stage_py, requant_imm_fields, wrap32
from .test_norm import CFGS, _params, _want

I16_MIN, I16_MAX = -(1 << 15), (1 << 15) - 1
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)


# ----------------------------------------------------------------------------- ACC16

def test_acc16_is_an_accumulator_buffer_of_two_byte_lanes():
    cfg = dsa_tvm.load_config("default")
    assert int(Buffer.ACC16) == 6 and Buffer.ACC16 in ACC_BUFFERS
    assert int(Buffer.ACC16) < 1 << FORMATS[Opcode.LOAD].fields[0].width(cfg)  # buffer field
    for name in PRESETS:
        c = dsa_tvm.load_config(name)
        assert c.element_bytes(Buffer.ACC16) == 2 * c.block_out
        assert c.dram_align % c.element_bytes(Buffer.ACC16) == 0
    # like ACC/ACC8: on the compute engine, on the load engine with prefetch
    assert Load(Buffer.ACC16, 0, 0, 1, 1, 1).engine == Engine.COMPUTE
    assert Load(Buffer.ACC16, 0, 0, 1, 1, 1, prefetch=True).engine == Engine.LOAD
    ld = Load(Buffer.ACC16, 7, 3, 2, 3, 5, 1, 0, 0, 1, -4, prefetch=True)
    assert footprint(ld).writes == (("acc", 7, 7 + 3 * 4 - 1),)
    assert footprint(ld, cfg).reads == (("dram", 3 * 2 * cfg.block_out,
                                         (3 + 5 + 3) * 2 * cfg.block_out - 1),)
    st16 = Store(Buffer.ACC16, 9, 11, 2, 2, 4)
    assert footprint(st16).reads == (("acc", 9, 12),)
    for ins in (ld, st16):   # encode / decode round trip, and the listing names the buffer
        assert decode_instruction(encode_instruction(ins, cfg), cfg) == ins
        assert " ACC16 " in disassemble_one(ins)


@pytest.mark.parametrize("name", PRESETS)
def test_acc16_counters_and_timing_charge_two_bytes_a_lane(name):
    """A physics check: the DRAM byte counters are exactly the bytes the transfers move
    (the output region the ACC16 store fills, the input the ACC16 load reads), and each
    transfer holds the bus ceil(bytes / bandwidth) cycles."""
    cfg = dsa_tvm.load_config(name)
    bo = cfg.block_out
    rng = np.random.default_rng(1)
    x = rand_int16(rng, (5, bo))
    b = ProgramBuilder(cfg, "acc16_bytes")
    rx = b.region("x", "input", x.shape, "int16")
    ry = b.region("y", "output", (3, bo), "int16")
    b.load(Buffer.ACC16, 0, b.addr(rx, Buffer.ACC16), 1, 5)
    b.store(Buffer.ACC16, 1, b.addr(ry, Buffer.ACC16), 1, 3)
    prog = build_sequential(b)
    res, _ = run_and_check(cfg, prog, {"x": x})
    np.testing.assert_array_equal(res.outputs["y"], x[1:4])
    c = res.counters
    read, written = x.nbytes, res.outputs["y"].nbytes
    assert (read, written) == (5 * 2 * bo, 3 * 2 * bo)
    assert c["dram_read_bytes.acc"] == c["dram_read_bytes"] == read
    assert c["dram_write_bytes.acc16"] == c["dram_write_bytes"] == written
    assert c["dram_write_bytes.acc8"] == c["dram_write_bytes.acc32"] == 0
    bw = cfg.bandwidth_bytes_per_cycle
    assert c["dram_busy_cycles"] == math.ceil(read / bw) + math.ceil(written / bw)
    loads = [i for i, ins in enumerate(prog.instructions) if isinstance(ins, Load)]
    s = res.schedule
    assert s.end[loads[0]] - s.start[loads[0]] == math.ceil(read / bw) + cfg.latency_cycles
    assert [e - st_ for _, st_, e in s.bus] == [math.ceil(read / bw), math.ceil(written / bw)]


def test_acc16_prefetch_load_and_store_bit_exact():
    """ACC16 data through a prefetched load (load engine, tokens), an ALU add, and both an
    ACC16 and an ACC8 store: the simulator agrees with the reference machine."""
    cfg = dsa_tvm.load_config("edge")
    bo = cfg.block_out
    rng = np.random.default_rng(2)
    x = rand_int16(rng, (4, bo))
    x[0, :4] = [I16_MIN, I16_MAX, -1, 0]
    b = ProgramBuilder(cfg, "acc16_prefetch")
    rx = b.region("x", "input", x.shape, "int16")
    r16 = b.region("y16", "output", x.shape, "int16")
    r8 = b.region("y8", "output", x.shape, "int8")
    b.load(Buffer.ACC16, 0, b.addr(rx, Buffer.ACC16), 1, 4, prefetch=True, push_next=True)
    b.alu(AluOp.ADD, 0, 0, loops=[(4, 1, 1, 0)], imm=1, use_imm=True, pop_prev=True,
          push_next=True)
    b.store(Buffer.ACC16, 0, b.addr(r16, Buffer.ACC16), 1, 4, pop_prev=True)
    b.store(Buffer.ACC8, 0, b.addr(r8, Buffer.ACC8), 1, 4, push_prev=True)
    b.finish(pop_next=True)
    prog = b.build()
    assert prog.instructions[0].engine == Engine.LOAD
    res = run(cfg, prog, {"x": x})
    y = x.astype(np.int64) + 1
    np.testing.assert_array_equal(res.outputs["y16"], y.astype(np.int16))   # 32767 + 1 wraps
    np.testing.assert_array_equal(res.outputs["y8"], y.astype(np.int8))
    assert res.outputs["y16"][0, 1] == I16_MIN


def test_store_acc16_refused_where_acc8_is():
    """The validator refuses a store from a non-accumulator buffer naming ACC16 among the
    accumulator ones, and an ACC16 transfer outside its region."""
    from dsa_tvm.sim.errors import SimulationError

    cfg = dsa_tvm.load_config("default")
    b = ProgramBuilder(cfg)
    r = b.region("a", "scratch", (4 * cfg.wgt_tile_bytes,))
    b.emit(Store(Buffer.WGT, 0, b.addr(r, Buffer.WGT), 1, 1, 1))
    with pytest.raises(SimulationError, match="ACC, ACC8 or ACC16"):
        run(cfg, b.build())
    b = ProgramBuilder(cfg)
    r = b.region("a", "input", (3, cfg.block_out), "int16")
    b.load(Buffer.ACC16, 0, b.addr(r, Buffer.ACC16) + 1, 1, 3)
    with pytest.raises(SimulationError, match="outside every DRAM region"):
        run(cfg, b.build())


# ----------------------------------------------------------------------------- REQUANT wide

def _wide_py(a: int, bias: int, mult: int, shift: int, zp: int) -> int:
    """The wide output stage in Python integers: the int8 one with an int16 clamp."""
    return output_stage_py(a, bias, mult, shift, zp, I16_MIN, I16_MAX)


@settings(max_examples=400, deadline=None)
@given(acc=INT32, bias=INT32, mult=INT32, shift=st.integers(0, 62), zp=st.integers(-128, 127))
def test_wide_requant_matches_python_integers(acc, bias, mult, shift, zp):
    imm = sem.pack_requant_imm(zp, wide=True)
    one = np.array([acc], np.int32)
    got = int(sem.alu_apply(AluOp.REQUANT, one, one, np.array([bias], np.int32),
                            np.array([mult], np.int32), np.array([shift], np.int32), imm)[0])
    y = sem.rshift_round(np.int64(wrap32(acc + bias)) * np.int64(mult), shift)  # no clamp
    want = _wide_py(acc, bias, mult, shift, zp)
    assert got == want == min(max(int(y) + zp, I16_MIN), I16_MAX)
    assert I16_MIN <= got <= I16_MAX


@pytest.mark.parametrize("acc,mult,shift,zp,want", [
    (32767, 1, 0, 0, 32767), (32767, 1, 0, 1, 32767), (32766, 1, 0, 1, 32767),
    (32768, 1, 0, 0, 32767), (1 << 30, 1 << 30, 20, 0, 32767),
    (-32768, 1, 0, 0, -32768), (-32768, 1, 0, -1, -32768), (-32767, 1, 0, -1, -32768),
    (-32769, 1, 0, 0, -32768), (-(1 << 31), (1 << 31) - 1, 0, 0, -32768),
    (300, 1, 0, 5, 305),          # past int8: kept (the int8 stage would give 127)
    (-3, 1 << 30, 31, 0, -1),     # -1.5 rounds half up to -1
    (5, 1 << 30, 31, -128, -125),  # 2.5 -> 3, + zp
])
def test_wide_requant_hand_values_and_saturation(acc, mult, shift, zp, want):
    one = np.array([acc], np.int32)
    got = sem.alu_apply(AluOp.REQUANT, one, one, np.array([0], np.int32),
                        np.array([mult], np.int32), np.array([shift], np.int32),
                        sem.pack_requant_imm(zp, wide=True))
    assert int(got[0]) == want == _wide_py(acc, 0, mult, shift, zp)
    narrow = sem.output_stage(one, 0, mult, shift, zp)   # the int8 stage, for contrast
    assert int(narrow[0]) == min(max(want, -128), 127)


@settings(max_examples=200, deadline=None)
@given(zp=st.integers(-128, 127), b1=st.integers(-128, 127), b2=st.integers(-128, 127),
       wide=st.booleans(), preset=st.sampled_from(PRESETS))
def test_requant_imm_encoding_round_trip(zp, b1, b2, wide, preset):
    """pack -> ALU word -> decode -> split gives back what was packed; wide is bit 24 only."""
    cfg = dsa_tvm.load_config(preset)
    lo, hi = min(b1, b2), max(b1, b2)
    imm = sem.pack_requant_imm(zp, wide=True) if wide else sem.pack_requant_imm(zp, lo, hi)
    assert 0 <= imm < 1 << 25 and bool(imm >> 24) == wide == sem.requant_imm_is_wide(imm)
    if wide:
        assert imm == (zp & 0xFF) | (1 << 24)
        assert sem.pack_requant_imm(zp, I16_MIN, I16_MAX, wide=True) == imm
    ins = Alu(AluOp.REQUANT, 3, 3, 100, (AluLoop(4, 1, 1, 0),), imm=imm)
    back = decode_instruction(encode_instruction(ins, cfg), cfg)
    assert back == ins
    want = (zp, I16_MIN, I16_MAX) if wide else (zp, lo, hi)
    assert sem.split_requant_imm(back.imm) == want == requant_imm_fields(back.imm)
    text = disassemble_one(back)
    assert f"zp {zp}, clamp{' wide' if wide else ''} [{want[1]}, {want[2]}]" in text


def test_requant_imm_wide_refusals():
    with pytest.raises(ValueError, match="not programmable"):
        sem.pack_requant_imm(0, 0, 127, wide=True)          # no ReLU bounds on the wide stage
    with pytest.raises(ValueError, match="not programmable"):
        sem.pack_requant_imm(0, -128, 127, wide=True)
    with pytest.raises(ValueError, match="zero point must be int8"):
        sem.pack_requant_imm(128, wide=True)
    for imm in ((1 << 24) | 0x100, (1 << 24) | 0x7F8000, (1 << 24) | 0xFF0000):
        with pytest.raises(ValueError, match="bits 8-23"):
            sem.split_requant_imm(imm)
    for bit in range(25, 32):
        with pytest.raises(ValueError, match="bits 25-31"):
            sem.split_requant_imm((1 << 24) | (1 << bit))
    # the int8 immediates are unchanged
    assert sem.pack_requant_imm() == 0x7F8000 and sem.pack_requant_imm(3, 3) == 0x7F0303


@pytest.mark.parametrize("preset", PRESETS)
def test_wide_requant_program_to_acc16_bit_exact(preset):
    """A GEMM-like int32 accumulator through REQUANT wide (per-lane bias, mult, shift) and
    an ACC16 store, with values that saturate at both ends: the simulator, the reference
    machine and Python integers agree; an int8 REQUANT of the same rows is its clamp."""
    cfg = dsa_tvm.load_config(preset)
    bo, rows = cfg.block_out, 6
    rng = np.random.default_rng(7)
    acc = rand_int32(rng, (rows, bo), -(1 << 24), 1 << 24)
    acc[0, :2] = [(1 << 31) - 1, -(1 << 31)]
    mult = rng.integers(1 << 30, 1 << 31, bo).astype(np.int32)
    shift = rng.integers(25, 40, bo).astype(np.int32)
    shift[:2] = 31
    bias = rand_int32(rng, (bo,), -1000, 1000)
    params = np.stack([bias, mult, shift]).astype(np.int32)
    zp = -7
    b = ProgramBuilder(cfg, "requant_wide")
    ra = b.region("a", "input", acc.shape, "int32")
    rp = b.region("p", "const", params.shape, "int32", data=params)
    r16 = b.region("y16", "output", acc.shape, "int16")
    r8 = b.region("y8", "output", acc.shape, "int8")
    b.load(Buffer.ACC, 0, b.addr(ra, Buffer.ACC), 1, rows)
    b.load(Buffer.ACC, rows, b.addr(ra, Buffer.ACC), 1, rows)
    b.load(Buffer.ACC, 2 * rows, b.addr(rp, Buffer.ACC), 1, 3)
    b.alu(AluOp.REQUANT, 0, 0, 2 * rows, [(rows, 1, 1, 0)],
          imm=sem.pack_requant_imm(zp, wide=True))
    b.alu(AluOp.REQUANT, rows, rows, 2 * rows, [(rows, 1, 1, 0)], imm=sem.pack_requant_imm(zp))
    b.store(Buffer.ACC16, 0, b.addr(r16, Buffer.ACC16), 1, rows)
    b.store(Buffer.ACC8, rows, b.addr(r8, Buffer.ACC8), 1, rows)
    res, _ = run_and_check(cfg, build_sequential(b), {"a": acc})
    want = np.array([[_wide_py(int(acc[r, k]), int(bias[k]), int(mult[k]), int(shift[k]), zp)
                      for k in range(bo)] for r in range(rows)])
    np.testing.assert_array_equal(res.outputs["y16"], want.astype(np.int16))
    np.testing.assert_array_equal(res.outputs["y8"], np.clip(want, -128, 127).astype(np.int8))
    assert want.max() == I16_MAX and want.min() == I16_MIN      # both ends saturate
    assert (np.abs(want) > 127).mean() > 0.5                    # mostly past int8


# ----------------------------------------------------------------------------- NORM in_wide

def _norm_program(cfg, op, p, n, rows, lanes, in_zp, in_wide, load16=False):
    """Parameters (ACC load), rows (ACC or ACC16 load), NORM, ACC store of every lane."""
    bo = cfg.block_out
    span = nu.row_span(n, bo)
    blk = nu.pack_params(op, p, n, bo)
    b = ProgramBuilder(cfg, "norm16")
    rp = b.region("p", "const", blk.shape, "int32", data=blk)
    buf = Buffer.ACC16 if load16 else Buffer.ACC
    rx = b.region("x", "input", (rows * span, bo), "int16" if load16 else "int32")
    ry = b.region("y", "output", (rows * span, bo), "int32")
    src = blk.shape[0]
    b.load(Buffer.ACC, 0, b.addr(rp, Buffer.ACC), 1, src)
    b.load(buf, src, b.addr(rx, buf), 1, rows * span)
    b.norm(op, src, src, 0, rows, n, in_zp, in_wide=in_wide)
    b.store(Buffer.ACC, src, b.addr(ry, Buffer.ACC), 1, rows * span)
    dtype = np.int16 if load16 else np.int32
    return build_sequential(b), {"x": lanes.reshape(rows * span, bo).astype(dtype)}


def _lanes(x: np.ndarray, n: int, bo: int, dtype=np.int32) -> np.ndarray:
    rows = x.shape[0]
    span = nu.row_span(n, bo)
    out = np.random.default_rng(n).integers(-1000, 1000, (rows, span * bo)).astype(dtype)
    out[:, :n] = x
    return out


def _codes16(rng, rows: int, n: int, mode: int) -> np.ndarray:
    if mode == 0:
        return rng.integers(I16_MIN, I16_MAX + 1, (rows, n))
    if mode == 1:  # constant rows
        return np.broadcast_to(rng.integers(I16_MIN, I16_MAX + 1, (rows, 1)), (rows, n))
    if mode == 2:  # saturated codes
        return rng.choice([I16_MIN, I16_MAX], (rows, n))
    return rng.normal(0, 3000, (rows, n)).round().clip(I16_MIN, I16_MAX)  # a residual


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset=st.sampled_from(PRESETS), op=st.sampled_from(list(NormOp)),
       n=st.one_of(st.integers(1, 40), st.integers(41, 300)), rows=st.integers(1, 12),
       seed=st.integers(0, 2**32 - 1), in_zp=st.integers(-128, 127), mode=st.integers(0, 3),
       load16=st.booleans())
def test_norm_in_wide_bit_exact_with_intnorm(preset, op, n, rows, seed, in_zp, mode, load16):
    """NORM in_wide on int16 codes (loaded as int32 lanes or by ACC16) gives intnorm's
    result on those codes, lanes past the row zero."""
    cfg = CFGS[preset]
    rng = np.random.default_rng(seed)
    q = _codes16(rng, rows, n, mode).astype(np.int16)
    p = _params(op, n, rng, s_in=2.0 ** -8)
    span = nu.row_span(n, cfg.block_out)
    if rows * span + nu.param_rows(op, n, cfg.block_out) > cfg.acc_depth // 2:
        rows, q = 1, q[:1]
    prog, feeds = _norm_program(cfg, op, p, n, rows, _lanes(q, n, cfg.block_out), in_zp, True,
                                load16)
    got = run(cfg, prog, feeds).outputs["y"].reshape(rows, span * cfg.block_out)
    np.testing.assert_array_equal(got[:, :n], _want(op, q, in_zp, p))
    assert not got[:, n:].any()


@pytest.mark.parametrize("op", list(NormOp))
def test_norm_wide_equals_int8_path_on_int8_codes_and_clamps_to_int16(op):
    """For codes within int8 the wide and the int8 NORM give identical rows; past int8 the
    int8 NORM clamps to int8 and the wide one reads the int16 code; past int16 the wide one
    clamps to int16. The cost does not depend on the width."""
    cfg = CFGS["default"]
    n, rows = 37, 4
    rng = np.random.default_rng(4)
    q8 = rng.integers(-128, 128, (rows, n))
    p = _params(op, n, rng, s_in=0.05)
    outs = []
    for wide in (False, True):
        prog, feeds = _norm_program(cfg, op, p, n, rows, _lanes(q8, n, cfg.block_out), 5, wide)
        outs.append(run(cfg, prog, feeds).outputs["y"])
        norm = next(ins for ins in prog.instructions if isinstance(ins, Norm))
        assert norm.in_wide == wide
        outs.append(compute_cycles(norm, cfg))
    assert np.array_equal(outs[0], outs[2]) and outs[1] == outs[3]
    x = rng.integers(-(1 << 31), 1 << 31, (rows, n)).astype(np.int64)
    x[0, :6] = [-129, 128, I16_MIN - 1, I16_MAX + 1, -(1 << 31), (1 << 31) - 1]
    x[1] = rng.integers(-2000, 2000, n)
    for wide, (lo, hi) in ((False, (-128, 127)), (True, (I16_MIN, I16_MAX))):
        prog, feeds = _norm_program(cfg, op, p, n, rows, _lanes(x, n, cfg.block_out), 5, wide)
        got = run(cfg, prog, feeds).outputs["y"].reshape(rows, -1)[:, :n]
        np.testing.assert_array_equal(got, _want(op, np.clip(x, lo, hi), 5, p))
    wide_row = _want(op, x[1:2], 5, p)
    assert not np.array_equal(wide_row, _want(op, np.clip(x[1:2], -128, 127), 5, p))


def test_norm_in_wide_encodes_as_the_last_bit_and_disassembles():
    """in_wide is NORM's last field but out_wide: a NORM without either has the word it had
    before the fields existed (the bits above are zero), and the round trip keeps it."""
    for preset in PRESETS:
        cfg = CFGS[preset]
        ins = Norm(NormOp.RMSNORM, 4, 4, 0, 3, 300, in_zp=-9)
        wide = Norm(NormOp.RMSNORM, 4, 4, 0, 3, 300, in_zp=-9, in_wide=True)
        fields = FORMATS[Opcode.NORM].widths(cfg)
        fd, off, width = fields[-2]
        assert fd.name == "in_wide" and width == 1
        assert off + 2 == FORMATS[Opcode.NORM].total_bits(cfg) <= cfg.instruction_bits
        w0, w1 = encode_instruction(ins, cfg), encode_instruction(wide, cfg)
        assert w0 >> off == 0 and w1 == w0 | (1 << off)
        assert decode_instruction(w0, cfg) == ins and decode_instruction(w1, cfg) == wide
    assert "300 int16, in_zp -9" in disassemble_one(wide)
    assert "300, in_zp -9" in disassemble_one(ins)


# ----------------------------------------------------------------------------- intnorm bounds

@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("n", [1, 2, 1000, inn.MAX_ROW])
def test_norm_int16_worst_case_rows_exact_in_int64(center, n):
    """The largest sums the units can meet: rows of MAX_ROW int16 codes at the extremes,
    the zero point pushing them further (|c| = 2**15 + 128), eps at its cap: the int64
    result equals the Python-integer one (no wrap anywhere)."""
    rng = np.random.default_rng(n)
    p = inn.norm_params(n, 1.0, 1e30, rng.normal(1, 0.3, n), rng.normal(0, 0.2, n)
                        if center else None, 3.0, 0, center)
    assert p.eps_term == 1 << 58
    p_small = inn.norm_params(n, 1.0, 0.0, np.ones(n), None, 3.0, 0, center)
    q = np.full((3, n), I16_MIN, np.int64)
    q[1, ::2] = I16_MAX             # alternating extremes: the largest LayerNorm variance
    q[2] = rng.integers(I16_MIN, I16_MAX + 1, n)
    for params in (p, p_small):
        got = inn.int_norm(q, 127, params)
        want = [scalar_norm([int(v) for v in row], 127, params) for row in q]
        assert got.tolist() == want
    c = q[:1] - 127
    assert n * int((c * c).sum()) + p.eps_term < 1 << 63


def test_int_rsqrt_across_the_int16_range_of_v():
    """int_rsqrt keeps its relative accuracy for every V the int16 rows reach (up to
    ~2**62.1; here up to 2**63 - 1)."""
    v = np.array([1, 2, 3, 1 << 28, (1 << 46) + 5, 1 << 58, 4_936_000_000_000_000_000,
                  (1 << 63) - 1] + [int(x) for x in np.random.default_rng(0).integers(
                      1, (1 << 63) - 1, 200)], np.int64)
    r, e = inn.int_rsqrt(v)
    approx = r.astype(np.float64) * np.exp2(-(30.0 + e)) * np.sqrt(v.astype(np.float64))
    assert np.abs(approx - 1).max() < 3e-5


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(center=st.booleans(), n=st.one_of(st.integers(1, 64), st.integers(65, 2048)),
       seed=st.integers(0, 2**32 - 1), zp=st.integers(-128, 127),
       spread=st.sampled_from([30, 300, 3000, 30000]))
def test_norm_int16_rows_exact_and_close_to_float(center, n, seed, zp, spread):
    """Hypothesis over int16 rows: intnorm equals the Python-integer spec bit for bit, and
    stays within one output step of float64 LayerNorm / RMSNorm (the output scale sized to
    the result, eps the one the unit holds, rounded to whole input steps squared; the
    stated tolerance: |int - round(float / s_out)| <= 1, both saturated to int8);
    for rows within int8 the int16 input gives the int8 input's result."""
    rng = np.random.default_rng(seed)
    q = np.clip(rng.normal(0, spread, (3, n)).round(), I16_MIN, I16_MAX).astype(np.int16)
    s_in = 2.0 ** -8
    g = rng.normal(1, 0.2, n)
    b = rng.normal(0, 0.1, n) if center else None
    x = s_in * (q.astype(np.float64) - zp)
    # eps as the unit holds it: a whole number of (input steps)**2 (x n, x n**2 centred)
    eps = inn.norm_params(n, s_in, 1e-5, g, b, 1.0, 0, center).eps_term * s_in ** 2 / (
        n * n if center else n)
    if center:
        f = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * g + b
    else:
        f = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    s_out = max(float(np.abs(f).max()), 1e-3) / 127
    p = inn.norm_params(n, s_in, 1e-5, g, b, s_out, 0, center)
    y = inn.int_norm(q, zp, p)
    assert y.tolist() == [scalar_norm([int(v) for v in row], zp, p) for row in q]
    assert np.abs(y - np.clip(np.round(f / s_out), -128, 127)).max() <= 1
    q8 = np.clip(q, -128, 127)
    assert np.array_equal(inn.int_norm(q8.astype(np.int8), zp, p), inn.int_norm(q8, zp, p))


def test_softmax_takes_int16_codes():
    """Softmax of int16 rows (NORM in_wide): the working value (q - max q) * in_mult stays
    in int64 and the result is the float softmax within the int8 path's bound."""
    rng = np.random.default_rng(3)
    for s_in in (2.0 ** -12, 2.0 ** -8, 2.0 ** -4):
        q = rng.integers(I16_MIN, I16_MAX + 1, (4, 77)).astype(np.int16)
        q[0, 0], q[0, 1] = I16_MIN, I16_MAX
        y = inn.int_softmax(q, 0, inn.softmax_params(s_in, 1 / 256, -128))
        xs = s_in * q.astype(np.float64)
        e = np.exp(xs - xs.max(-1, keepdims=True))
        prob = (y.astype(np.float64) + 128) / 256
        assert np.abs(prob - np.clip(e / e.sum(-1, keepdims=True), 0, 255 / 256)).max() <= 1.5 / 256

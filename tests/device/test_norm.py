"""NORM, the [norm] units' instruction: hand-written programs on the simulator against
``isa.intnorm`` applied to the same codes (rows of 1..several hundred codes, never a
multiple of the block only, many rows, in place and to another destination), lanes past
the row and int32 values past int8 (clamped), encoding round trip, the cost from the
description, and the programs the validator or the functional model refuses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsa_tvm
from dsa_tvm.isa import intnorm as inn
from dsa_tvm.isa import norm_unit as nu
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.disasm import disassemble_one
from dsa_tvm.isa.encoding import EncodeError, decode_program_words, encode_program_words
from dsa_tvm.isa.instructions import Buffer, Norm, NormOp
from dsa_tvm.sim.errors import SimulationError
from dsa_tvm.sim.timing import compute_cycles

from .harness import PRESETS, run
from .reference_machine import build_sequential

CFGS = {p: dsa_tvm.load_config(p).replace(norm_units=2) for p in PRESETS}


def _params(op: NormOp, n: int, rng, s_in=0.05, s_out=0.03, out_zp=-3):
    if op == NormOp.SOFTMAX:
        return inn.softmax_params(s_in, 1 / 256, -128)
    center = op == NormOp.LAYERNORM
    return inn.norm_params(n, s_in, 1e-5, rng.normal(1, 0.3, n),
                           rng.normal(0, 0.2, n) if center else None, s_out, out_zp, center)


def _want(op, q, zp, p):
    return inn.int_softmax(q, zp, p) if op == NormOp.SOFTMAX else inn.int_norm(q, zp, p)


def _program(cfg, op, p, n, rows, data, in_zp=0, in_place=True, block=None):
    """Parameter block at row 0 (ACC load), the int32 rows after it (ACC load), NORM, store
    ACC (int32, so every lane of the result is seen)."""
    bo = cfg.block_out
    span = nu.row_span(n, bo)
    blk = nu.pack_params(op, p, n, bo) if block is None else block
    b = ProgramBuilder(cfg, "norm")
    rp = b.region("p", "const", blk.shape, "int32", data=blk)
    rx = b.region("x", "input", (rows * span, bo), "int32")
    ry = b.region("y", "output", (rows * span, bo), "int32")
    src = blk.shape[0]
    dst = src if in_place else src + rows * span
    b.load(Buffer.ACC, 0, b.addr(rp, Buffer.ACC), 1, blk.shape[0])
    b.load(Buffer.ACC, src, b.addr(rx, Buffer.ACC), 1, rows * span)
    b.norm(op, dst, src, 0, rows, n, in_zp)
    b.store(Buffer.ACC, dst, b.addr(ry, Buffer.ACC), 1, rows * span)
    return build_sequential(b), {"x": data.reshape(rows * span, bo)}


def _lanes(x: np.ndarray, n: int, bo: int) -> np.ndarray:
    """Rows of ``n`` values -> (rows, span * bo) int32 lanes, padding lanes random junk."""
    rows = x.shape[0]
    span = nu.row_span(n, bo)
    out = np.random.default_rng(n).integers(-1000, 1000, (rows, span * bo)).astype(np.int32)
    out[:, :n] = x
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset=st.sampled_from(PRESETS), op=st.sampled_from(list(NormOp)),
       n=st.one_of(st.integers(1, 40), st.integers(41, 400)), rows=st.integers(1, 24),
       seed=st.integers(0, 2**32 - 1), in_zp=st.integers(-128, 127), in_place=st.booleans(),
       mode=st.integers(0, 2))
def test_norm_bit_exact_with_intnorm(preset, op, n, rows, seed, in_zp, in_place, mode):
    cfg = CFGS[preset]
    rng = np.random.default_rng(seed)
    if mode == 0:
        q = rng.integers(-128, 128, (rows, n))
    elif mode == 1:  # constant rows
        q = np.broadcast_to(rng.integers(-128, 128, (rows, 1)), (rows, n))
    else:  # saturated codes
        q = rng.choice([-128, 127], (rows, n))
    q = q.astype(np.int8)
    p = _params(op, n, rng)
    span = nu.row_span(n, cfg.block_out)
    if rows * span + nu.param_rows(op, n, cfg.block_out) > cfg.acc_depth // 2:
        rows = 1
        q = q[:1]
    prog, feeds = _program(cfg, op, p, n, rows, _lanes(q, n, cfg.block_out), in_zp, in_place)
    got = run(cfg, prog, feeds).outputs["y"].reshape(rows, span * cfg.block_out)
    np.testing.assert_array_equal(got[:, :n], _want(op, q, in_zp, p))
    assert not got[:, n:].any(), "lanes past the row must be zero"


@pytest.mark.parametrize("op", list(NormOp))
def test_values_past_int8_are_clamped(op):
    """The units read int8 codes: int32 lanes beyond -128..127 count as the end codes."""
    cfg = CFGS["default"]
    n, rows = 37, 3
    rng = np.random.default_rng(4)
    x = rng.integers(-(1 << 31), 1 << 31, (rows, n)).astype(np.int32)
    x[0, :4] = [-129, 128, -(1 << 31), (1 << 31) - 1]
    p = _params(op, n, rng)
    prog, feeds = _program(cfg, op, p, n, rows, _lanes(x, n, cfg.block_out), 5)
    got = run(cfg, prog, feeds).outputs["y"].reshape(rows, -1)[:, :n]
    np.testing.assert_array_equal(got, _want(op, np.clip(x, -128, 127).astype(np.int8), 5, p))


def test_saturating_layernorm_and_uniform_softmax():
    cfg = CFGS["edge"]
    n = 33
    big = inn.norm_params(n, 0.1, 1e-5, np.full(n, 100.0), None, 0.01, 0, True)
    q = np.arange(n, dtype=np.int8)[None]
    prog, feeds = _program(cfg, NormOp.LAYERNORM, big, n, 1, _lanes(q, n, cfg.block_out))
    got = run(cfg, prog, feeds).outputs["y"].reshape(1, -1)[:, :n]
    assert got.min() == -128 and got.max() == 127
    sm = inn.softmax_params(0.05, 1 / 256, -128)
    flat = np.full((2, 40), 17, np.int8)
    prog, feeds = _program(cfg, NormOp.SOFTMAX, sm, 40, 2, _lanes(flat, 40, cfg.block_out))
    got = run(cfg, prog, feeds).outputs["y"].reshape(2, -1)[:, :40]
    assert np.all(got == round(256 / 40) - 128)


def test_params_round_trip_and_int64_words():
    rng = np.random.default_rng(0)
    for op in NormOp:
        for n in (1, 15, 17, 300):
            p = _params(op, n, rng)
            blk = nu.pack_params(op, p, n, 16)
            assert blk.dtype == np.int32 and blk.shape == (nu.param_rows(op, n, 16), 16)
            back = nu.unpack_params(op, blk, n)
            if op == NormOp.SOFTMAX:
                assert back == p
            else:
                assert back.eps_term == p.eps_term and back.frac == p.frac
                np.testing.assert_array_equal(back.gamma, p.gamma)
                np.testing.assert_array_equal(back.beta, p.beta)
    p = inn.NormParams(True, (1 << 58) - 7, np.array([-5]), np.array([-(1 << 57) - 3]), 30, 0)
    back = nu.unpack_params(NormOp.LAYERNORM, nu.pack_params(NormOp.LAYERNORM, p, 1, 4), 1)
    assert back.eps_term == p.eps_term and int(back.beta[0]) == int(p.beta[0])
    with pytest.raises(ValueError, match="center"):
        nu.pack_params(NormOp.RMSNORM, p, 1, 4)


def test_norm_encodes_decodes_and_disassembles():
    cfg = CFGS["default"]
    rng = np.random.default_rng(0)
    for op in NormOp:
        prog, _ = _program(cfg, op, _params(op, 300, rng), 300, 2, np.zeros((2, 304), np.int32),
                           in_zp=-128, in_place=False)
        back = decode_program_words(encode_program_words(prog.instructions, cfg), cfg)
        assert back == prog.instructions
        norm = [ins for ins in back if isinstance(ins, Norm)][0]
        assert int(norm.opcode) == 6 and norm.op == op and norm.in_zp == -128
        assert f"NORM   {op.name}" in disassemble_one(norm)
    with pytest.raises(EncodeError, match="length"):
        encode_program_words([Norm(NormOp.SOFTMAX, 0, 0, 0, 1, 1 << 17)], cfg)
    with pytest.raises(EncodeError, match="in_zp"):
        encode_program_words([Norm(NormOp.SOFTMAX, 0, 0, 0, 1, 8, in_zp=128)], cfg)


@pytest.mark.parametrize("units,epc,lat", [(1, 16, 24), (2, 1, 0), (4, 64, 100)])
def test_norm_cost_from_description(units, epc, lat):
    cfg = CFGS["default"].replace(norm_units=units, norm_elements_per_cycle=epc,
                                  norm_row_latency_cycles=lat)
    for op, passes in ((NormOp.SOFTMAX, 3), (NormOp.LAYERNORM, 2), (NormOp.RMSNORM, 2)):
        ins = Norm(op, 0, 0, 0, 7, 77)
        want = -(-7 // units) * (passes * -(-77 // epc) + lat)
        assert compute_cycles(ins, cfg) == nu.norm_cycles(cfg, op, 77, 7) == want


def test_refused_without_norm_units():
    cfg = dsa_tvm.load_config("default").replace(norm_units=0)
    rng = np.random.default_rng(0)
    p = _params(NormOp.SOFTMAX, 8, rng)
    prog, feeds = _program(cfg, NormOp.SOFTMAX, p, 8, 1, np.zeros((1, 16), np.int32))
    with pytest.raises(SimulationError, match=r"norm_units = 0"):
        run(cfg, prog, feeds)


def test_refuses_bad_fields_and_overlap():
    cfg = CFGS["default"]
    for ins, why in ((Norm(NormOp.SOFTMAX, 0, 0, 0, 0, 8), "rows"),
                     (Norm(NormOp.SOFTMAX, 0, 0, 0, 1, 0), "length"),
                     (Norm(NormOp.SOFTMAX, 0, 0, 0, 1, inn.MAX_ROW + 1), "length"),
                     (Norm(NormOp.SOFTMAX, 11, 10, 0, 2, 20), "overlap"),
                     (Norm(NormOp.LAYERNORM, 0, 0, cfg.acc_depth - 2, 1, 40),
                      "scratchpad overflow"),
                     (Norm(NormOp.SOFTMAX, 0, cfg.acc_depth - 1, 0, 2, 16),
                      "scratchpad overflow")):
        b = ProgramBuilder(cfg, "bad")
        b.emit(ins)
        with pytest.raises(SimulationError, match=why):
            run(cfg, b.build(), {})


@pytest.mark.parametrize("word,value,why", [(0, -1, "in_mult"), (1, 63, "in_shift"),
                                            (1, -1, "in_shift")])
def test_hostile_softmax_parameters_stop_the_run(word, value, why):
    cfg = CFGS["default"]
    p = inn.softmax_params(0.05, 1 / 256, -128)
    blk = nu.pack_params(NormOp.SOFTMAX, p, 8, cfg.block_out).copy()
    blk.reshape(-1)[word] = value
    prog, feeds = _program(cfg, NormOp.SOFTMAX, p, 8, 1, np.zeros((1, 16), np.int32), block=blk)
    with pytest.raises(SimulationError, match=why):
        run(cfg, prog, feeds)


@pytest.mark.parametrize("word,value,why", [(1, 1 << 27, "eps_term"), (1, -1, "eps_term"),
                                            (2, 31, "frac"), (2, -1, "frac")])
def test_hostile_norm_parameters_stop_the_run(word, value, why):
    cfg = CFGS["default"]
    rng = np.random.default_rng(0)
    p = _params(NormOp.LAYERNORM, 8, rng)
    blk = nu.pack_params(NormOp.LAYERNORM, p, 8, cfg.block_out).copy()
    blk.reshape(-1)[word] = value
    prog, feeds = _program(cfg, NormOp.LAYERNORM, p, 8, 1, np.zeros((1, 16), np.int32), block=blk)
    with pytest.raises(SimulationError, match=why):
        run(cfg, prog, feeds)
    blk = nu.pack_params(NormOp.LAYERNORM, p, 8, cfg.block_out).copy()
    blk[3, 0] = 1 << 30  # header, gamma, beta low, beta high (channel 0): |beta| > 2**58
    prog, feeds = _program(cfg, NormOp.LAYERNORM, p, 8, 1, np.zeros((1, 16), np.int32), block=blk)
    with pytest.raises(SimulationError, match="beta"):
        run(cfg, prog, feeds)

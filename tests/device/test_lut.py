"""ALU LUT, the activation table unit: semantics against an independent per-lane
reference and numpy, encoding round trip, timing from the hardware description, and the
programs the validator refuses (no table unit, a moving table, the immediate form)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsa_tvm
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.disasm import disassemble_one
from dsa_tvm.isa.encoding import decode_program_words, encode_program_words
from dsa_tvm.isa.instructions import AluOp, Buffer, lut_rows
from dsa_tvm.isa.semantics import table_lookup
from dsa_tvm.sim.errors import SimulationError
from dsa_tvm.sim.timing import compute_cycles

from .harness import PRESETS, run, run_and_check
from .reference_machine import build_sequential


def _lut_program(cfg, table: np.ndarray, data: np.ndarray, loops=None, b_stride: int = 0):
    """ACC8-load the table (256 int8 codes) at row 0, the data at row T; LUT in place."""
    bo = cfg.block_out
    t_rows = lut_rows(bo)
    rows = data.shape[0]
    b = ProgramBuilder(cfg, "lut")
    rt = b.region("t", "const", (t_rows, bo), "int8", data=table.reshape(t_rows, bo))
    rd = b.region("d", "input", data.shape, "int32")
    out = b.region("out", "output", (rows, bo), "int32")
    b.load(Buffer.ACC8, 0, b.addr(rt, Buffer.ACC8), 1, t_rows)
    b.load(Buffer.ACC, t_rows, b.addr(rd, Buffer.ACC), 1, rows)
    b.alu(AluOp.LUT, t_rows, t_rows, 0, loops or [(rows, 1, 1, b_stride)])
    b.store(Buffer.ACC, t_rows, b.addr(out, Buffer.ACC), 1, rows)
    return build_sequential(b), {"d": data}


@pytest.mark.parametrize("preset", PRESETS)
def test_lut_every_code_and_saturation(preset):
    cfg = dsa_tvm.load_config(preset)
    rng = np.random.default_rng(1)
    table = rng.integers(-128, 128, 256, dtype=np.int8)
    # every code, then values past int8 that must saturate to the end codes
    codes = np.concatenate([np.arange(-128, 128), [-129, 128, -(1 << 31), (1 << 31) - 1]])
    codes = np.resize(codes, (-(-codes.size // cfg.block_out)) * cfg.block_out)
    data = codes.astype(np.int32).reshape(-1, cfg.block_out)
    prog, inputs = _lut_program(cfg, table, data)
    res, _ = run_and_check(cfg, prog, inputs)
    want = table.astype(np.int32)[np.clip(data.astype(np.int64), -128, 127) + 128]
    np.testing.assert_array_equal(res.outputs["out"], want)
    np.testing.assert_array_equal(table_lookup(data, table.astype(np.int32)), want)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 6), reps=st.integers(1, 3),
       preset=st.sampled_from(PRESETS))
def test_lut_nests_match_reference(seed, rows, reps, preset):
    """Two-level nests (re-reading rows) agree with the step-by-step reference machine."""
    cfg = dsa_tvm.load_config(preset)
    rng = np.random.default_rng(seed)
    table = rng.integers(-128, 128, 256, dtype=np.int8)
    data = rng.integers(-300, 300, (rows * reps, cfg.block_out)).astype(np.int32)
    prog, inputs = _lut_program(cfg, table, data, loops=[(reps, rows, rows, 0), (rows, 1, 1, 0)])
    run_and_check(cfg, prog, inputs)


def test_lut_encodes_decodes_and_disassembles():
    cfg = dsa_tvm.load_config("default")
    prog, _ = _lut_program(cfg, np.zeros(256, np.int8), np.zeros((3, cfg.block_out), np.int32))
    words = encode_program_words(prog.instructions, cfg)
    back = decode_program_words(words, cfg)
    assert back == prog.instructions
    lut = [ins for ins in back if getattr(ins, "op", None) == AluOp.LUT][0]
    assert int(lut.op) == 10 and "LUT" in disassemble_one(lut)


@pytest.mark.parametrize("lookups", [0, 1, 4, 16])
def test_lut_timing_from_description(lookups):
    cfg = dsa_tvm.load_config("default").replace(table_lookups_per_cycle=lookups)
    prog, _ = _lut_program(cfg, np.zeros(256, np.int8), np.zeros((5, cfg.block_out), np.int32))
    lut = [ins for ins in prog.instructions if getattr(ins, "op", None) == AluOp.LUT][0]
    per_row = -(-cfg.block_out // (lookups or cfg.lanes))
    assert compute_cycles(lut, cfg) == 5 * per_row + cfg.alu_latency_cycles


def test_lut_energy_and_counters():
    cfg = dsa_tvm.load_config("default")
    prog, inputs = _lut_program(cfg, np.zeros(256, np.int8), np.zeros((4, cfg.block_out), np.int32))
    base = run(cfg, prog, inputs).counters
    assert base["table_lookups"] == 4 * cfg.block_out
    pricey = cfg.replace(table_lookup_pj=10.0)
    prog2, _ = _lut_program(pricey, np.zeros(256, np.int8), np.zeros((4, cfg.block_out), np.int32))
    more = run(pricey, prog2, inputs).counters
    extra = 4 * cfg.block_out * (10.0 - cfg.alu_lane_op_pj) / 1e6
    assert more["energy_uj"] == pytest.approx(base["energy_uj"] + extra)


def test_default_fields_keep_fingerprints():
    """The [table] fields at their defaults leave a description's fingerprint alone (the
    presets' programs stay valid); a changed one changes it."""
    cfg = dsa_tvm.load_config("default")
    assert cfg.table_present
    assert cfg.replace(table_unit=1).fingerprint == cfg.fingerprint
    assert cfg.replace(table_unit=0).fingerprint != cfg.fingerprint


def test_lut_refused_without_table_unit():
    cfg = dsa_tvm.load_config("default").replace(table_unit=0)
    prog, inputs = _lut_program(cfg, np.zeros(256, np.int8), np.zeros((2, cfg.block_out), np.int32))
    with pytest.raises(SimulationError, match="activation table unit"):
        run(cfg, prog, inputs)


def test_lut_refuses_moving_table_and_immediate():
    cfg = dsa_tvm.load_config("default")
    prog, inputs = _lut_program(cfg, np.zeros(256, np.int8), np.zeros((2, cfg.block_out), np.int32),
                                b_stride=1)
    with pytest.raises(SimulationError, match="b stride"):
        run(cfg, prog, inputs)
    b = ProgramBuilder(cfg, "lut_imm")
    b.alu(AluOp.LUT, 0, 0, 0, [(1, 0, 0, 0)], use_imm=True, imm=3)
    with pytest.raises(SimulationError, match="immediate form"):
        run(cfg, b.build(), {})


def test_table_past_scratchpad_end_is_overflow():
    cfg = dsa_tvm.load_config("default")
    b = ProgramBuilder(cfg, "lut_oob")
    b.alu(AluOp.LUT, 0, 0, cfg.acc_depth - 2, [(1, 0, 0, 0)])
    with pytest.raises(SimulationError, match="scratchpad overflow"):
        run(cfg, b.build(), {})

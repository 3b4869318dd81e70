"""Bad programs stop with a specific error naming the instruction, and never hang."""

from __future__ import annotations

import numpy as np
import pytest

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.encoding import DecodeError
from dsa_tvm.isa.instructions import Alu, AluOp, Buffer, Deps, Engine, Finish, Load, Store, Sync
from dsa_tvm.isa.program import Program
from dsa_tvm.sim.errors import DeadlockError, HazardError, SimulationError
from dsa_tvm.sim.simulator import Simulator

from .harness import PRESETS, run
from .test_program import reseal

pytestmark = pytest.mark.usefixtures("no_hang")


def _raises(cfg, prog, exc, index, *fragments, inputs=None, **kw) -> str:
    with pytest.raises(exc) as ei:
        run(cfg, prog, inputs, **kw)
    err = ei.value
    assert type(err) is exc, f"expected exactly {exc.__name__}, got {type(err).__name__}"
    assert err.index == index
    msg = str(err)
    if index is not None:
        assert msg.startswith(f"instruction {index}: "), msg
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


def _b(cfg, rows=64):
    """A builder with one scratch DRAM region big enough for ``rows`` of any buffer."""
    b = ProgramBuilder(cfg, "bad")
    r = b.region("buf", "scratch", (rows * cfg.wgt_tile_bytes,))
    return b, r


def test_error_hierarchy():
    assert issubclass(DeadlockError, SimulationError)
    assert issubclass(HazardError, SimulationError)
    assert SimulationError(None, "x").index is None


# ----------------------------------------------------------------------------- scratchpads

@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("buffer,sram", [(Buffer.INP, "INP"), (Buffer.WGT, "WGT"),
                                         (Buffer.ACC, "ACC"), (Buffer.ACC8, "ACC"),
                                         (Buffer.ACC16, "ACC")])
def test_load_past_scratchpad_end(name, buffer, sram):
    cfg = load_config(name)
    depth = {"INP": cfg.inp_depth, "WGT": cfg.wgt_depth, "ACC": cfg.acc_depth}[sram]
    b, r = _b(cfg)
    b.sync(Engine.COMPUTE)
    b.load(buffer, depth - 2, b.addr(r, buffer), 1, 2)                # rows depth-2, depth-1: ok
    b.load(buffer, depth - 2, b.addr(r, buffer), 1, 2, pad=(0, 0, 0, 1))  # one row too many
    _raises(cfg, b.build(), SimulationError, 2, "scratchpad overflow", f"{sram} rows",
            f"{depth}-row {sram}")


@pytest.mark.parametrize("which", ["gemm_inp", "gemm_wgt", "gemm_acc", "alu_dst", "alu_a",
                                   "alu_b_pair", "store"])
def test_compute_and_store_past_scratchpad_end(default_cfg, which):
    cfg = default_cfg
    inp, wgt, acc = cfg.inp_depth, cfg.wgt_depth, cfg.acc_depth
    b, r = _b(cfg)
    if which == "gemm_inp":
        b.gemm(0, inp - 4, 0, [(2, 1, 2, 0), (3, 0, 1, 0)])      # last input row inp - 4 + 4
        sram = "INP"
    elif which == "gemm_wgt":
        b.gemm(0, 0, wgt - 1, [(2, 0, 0, 1)])
        sram = "WGT"
    elif which == "gemm_acc":
        b.gemm(acc - 3, 0, 0, [(2, 3, 0, 0)])
        sram = "ACC"
    elif which == "alu_dst":
        b.alu(AluOp.ADD, acc - 2, 0, 0, [(2, 1, 0, 0), (2, 1, 0, 0)])
        sram = "ACC"
    elif which == "alu_a":
        b.alu(AluOp.ADD, 0, acc, 0, [(1, 0, 0, 0)], use_imm=True)
        sram = "ACC"
    elif which == "alu_b_pair":                                     # CLIP reads row b + 1
        b.alu(AluOp.CLIP, 0, 0, acc - 1, [(1, 0, 0, 0)])
        sram = "ACC"
    else:
        b.sync(Engine.COMPUTE, push_next=True)
        b.store(Buffer.ACC, acc - 1, b.addr(r, Buffer.ACC), 1, 2, pop_prev=True)
        sram = "ACC"
    idx = len(b.instructions) - 1
    _raises(cfg, b.build(), SimulationError, idx, "scratchpad overflow", f"{sram} rows")


# ----------------------------------------------------------------------------- DRAM

@pytest.mark.parametrize("case", ["past_end", "before_start", "gap", "stride", "store"])
def test_dram_outside_every_region(default_cfg, case):
    cfg = default_cfg
    b = ProgramBuilder(cfg, "bad")
    r1 = b.region("a", "input", (100,))                  # 100 bytes, then an alignment gap
    r2 = b.region("b", "output", (4, cfg.block_out), "int32")
    inp_a, acc_b = b.addr(r1, Buffer.INP), b.addr(r2, Buffer.ACC)
    if case == "past_end":
        b.load(Buffer.ACC, 0, acc_b + 3, 1, 2)
    elif case == "before_start":
        b.load(Buffer.ACC, 0, acc_b - 1, 1, 2)
    elif case == "gap":                                   # bytes 96..112 of a 100-byte region
        b.load(Buffer.INP, 0, inp_a + 6, 1, 1)
    elif case == "stride":                               # the 2nd row lands past the region
        b.load(Buffer.INP, 0, inp_a, 2, 1, x_stride=7)
    else:
        b.sync(Engine.COMPUTE, push_next=True)
        b.store(Buffer.ACC, 0, acc_b, 1, 5, pop_prev=True)
    idx = len(b.instructions) - 1
    _raises(cfg, b.build(), SimulationError, idx, "outside every DRAM region", "a=[0, 100)")


def test_dram_within_region_is_fine(default_cfg):
    cfg = default_cfg
    b = ProgramBuilder(cfg)
    r = b.region("a", "input", (96,))
    b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 2, 1, x_stride=5)     # rows 0 and 5 of 6
    run(cfg, b.build(), {"a": np.zeros(96, np.int8)})


def test_store_into_const_region(default_cfg):
    cfg = default_cfg
    b = ProgramBuilder(cfg)
    c = b.region("k", "const", (2, cfg.block_out), "int32", data=np.zeros((2, cfg.block_out)))
    b.sync(Engine.COMPUTE, push_next=True)
    b.store(Buffer.ACC, 0, b.addr(c, Buffer.ACC), 1, 1, pop_prev=True)
    _raises(cfg, b.build(), SimulationError, 1, "constant DRAM region 'k'")


@pytest.mark.parametrize("kind", ["load", "store"])
def test_acc16_transfers_span_two_bytes_a_lane(default_cfg, kind):
    """ACC16 elements are 2 * block_out bytes: a region of 4 int8 rows holds 4 ACC8 rows but
    only 2 ACC16 rows, so 3 run past it (refused as ACC8 past the region is); an ACC16 store
    into a constant region is refused like any other."""
    cfg = default_cfg
    bo = cfg.block_out
    assert cfg.element_bytes(Buffer.ACC16) == 2 * bo == 2 * cfg.element_bytes(Buffer.ACC8)
    b = ProgramBuilder(cfg, "bad16")
    r = b.region("a", "output", (4, bo), "int8")
    b.sync(Engine.COMPUTE, push_next=True)
    if kind == "load":
        b.load(Buffer.ACC8, 0, b.addr(r, Buffer.ACC8), 1, 4)        # 4 int8 rows: fits
        b.load(Buffer.ACC16, 0, b.addr(r, Buffer.ACC16), 1, 2)      # 2 int16 rows: fits
        b.load(Buffer.ACC16, 0, b.addr(r, Buffer.ACC16), 1, 3)      # 3: past the region
    else:
        b.store(Buffer.ACC16, 0, b.addr(r, Buffer.ACC16), 1, 2, pop_prev=True)
        b.store(Buffer.ACC16, 0, b.addr(r, Buffer.ACC16) + 1, 1, 2)
    idx = len(b.instructions) - 1
    _raises(cfg, b.build(), SimulationError, idx, "outside every DRAM region")
    b = ProgramBuilder(cfg, "const16")
    c = b.region("k", "const", (2, bo), "int16", data=np.zeros((2, bo), np.int16))
    b.sync(Engine.COMPUTE, push_next=True)
    b.store(Buffer.ACC16, 0, b.addr(c, Buffer.ACC16), 1, 1, pop_prev=True)
    _raises(cfg, b.build(), SimulationError, 1, "constant DRAM region 'k'")


def test_store_from_input_buffer(default_cfg):
    cfg = default_cfg
    b, r = _b(cfg)
    b.emit(Store(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 1, 1))
    _raises(cfg, b.build(), SimulationError, 0, "accumulator only", "INP")


# ----------------------------------------------------------------------------- tokens

def test_deadlock_pop_without_push(default_cfg):
    cfg = default_cfg
    b, r = _b(cfg)
    b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 1)               # forgets push_next
    b.gemm(0, 0, 0, [(1, 0, 0, 0)], pop_prev=True)
    _raises(cfg, b.build(), DeadlockError, 1, "deadlock", "GEMM #1", "compute engine", "l2c")


def test_deadlock_finish_waits_for_missing_store_token(default_cfg):
    cfg = default_cfg
    b, r = _b(cfg)
    b.sync(Engine.COMPUTE, push_next=True)
    b.store(Buffer.ACC, 0, b.addr(r, Buffer.ACC), 1, 1, pop_prev=True)  # forgets push_prev
    b.finish(pop_next=True)
    _raises(cfg, b.build(), DeadlockError, 2, "deadlock", "FINISH #2", "s2c")


def test_deadlock_two_engines_wait_for_each_other(default_cfg):
    cfg = default_cfg
    b, r = _b(cfg)
    b.sync(Engine.COMPUTE, pop_next=True, push_next=True)     # waits for the store
    b.sync(Engine.STORE, pop_prev=True, push_prev=True)       # waits for the compute
    msg = _raises(cfg, b.build(), DeadlockError, 0, "SYNC #0", "SYNC #1")
    assert "store engine" in msg and "compute engine" in msg


def test_deadlock_full_fetch_queue():
    """The token the compute engine waits for comes from a LOAD that fetch can never
    dispatch: a 1-deep compute queue is full of the instruction behind it."""
    results = {}
    for depth in (1, 2):
        cfg = load_config("default").replace(compute_depth=depth)
        b, r = _b(cfg)
        b.sync(Engine.COMPUTE, pop_prev=True)
        b.sync(Engine.COMPUTE)
        b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 1, push_next=True)
        prog = b.build()
        if depth == 1:
            _raises(cfg, prog, DeadlockError, 0, "fetch is stalled at #1", "compute queue",
                    "1 deep", "full")
        else:
            results[depth] = run(cfg, prog)
    # with a 2-deep queue the same program runs: LOAD dispatched at 2 ends at 2 + 1 + 100,
    # then SYNC, SYNC, FINISH take a cycle each
    assert results[2].cycles == 2 + 1 + 100 + 3


@pytest.mark.parametrize("engine_ins,flag,words", [
    (lambda r: Load(Buffer.INP, 0, r, 1, 1, 1), "pop_prev", "load engine"),
    (lambda r: Load(Buffer.WGT, 0, r, 1, 1, 1), "push_prev", "load engine"),
    (lambda r: Sync(Engine.LOAD), "pop_prev", "load engine"),
    (lambda r: Store(Buffer.ACC, 0, r, 1, 1, 1), "push_next", "store engine"),
    (lambda r: Sync(Engine.STORE), "pop_next", "store engine"),
])
def test_illegal_token_direction(default_cfg, engine_ins, flag, words):
    cfg = default_cfg
    b, r = _b(cfg)
    b.sync(Engine.COMPUTE)
    ins = engine_ins(b.addr(r, Buffer.WGT))
    b.emit(type(ins)(**{**ins.__dict__, "deps": Deps(**{flag: True})}))
    _raises(cfg, b.build(), SimulationError, 1, words, "not allowed")


# ----------------------------------------------------------------------------- structure

def test_malformed_word_in_bytes(default_cfg):
    cfg = default_cfg
    b, r = _b(cfg)
    b.sync(Engine.COMPUTE)
    b.sync(Engine.COMPUTE)
    data = bytearray(b.build().to_bytes(cfg))
    nbytes = cfg.instruction_bits // 8
    start = len(data) - 2 * nbytes                  # instruction 1 (no constant data follows)
    data[start] = (data[start] & ~7) | 7            # opcode 7
    with pytest.raises(DecodeError) as ei:
        Simulator(cfg).run(reseal(data))
    assert ei.value.index == 1 and "opcode 7" in str(ei.value)
    data[start] = (data[start] & ~7) | 4            # a SYNC again, but with a bit set above it
    data[start + 4] = 0x80
    with pytest.raises(DecodeError) as ei:
        Simulator(cfg).run(reseal(data))
    assert ei.value.index == 1 and "bits above" in str(ei.value)


def test_missing_finish(default_cfg):
    cfg = default_cfg
    prog = Program("nofinish", cfg.fingerprint, cfg.instruction_bits,
                   [Sync(Engine.COMPUTE), Sync(Engine.LOAD)])
    _raises(cfg, prog, SimulationError, 1, "does not end with FINISH")
    empty = Program("empty", cfg.fingerprint, cfg.instruction_bits, [])
    _raises(cfg, empty, SimulationError, None, "does not end with FINISH")


def test_finish_in_the_middle(default_cfg):
    cfg = default_cfg
    prog = Program("twofinish", cfg.fingerprint, cfg.instruction_bits,
                   [Sync(Engine.COMPUTE), Finish(), Sync(Engine.LOAD), Finish()])
    _raises(cfg, prog, SimulationError, 1, "FINISH before the end")


@pytest.mark.parametrize("case", ["gemm0", "gemm3", "alu1", "load_y", "load_x", "store_x"])
def test_zero_extent(default_cfg, case):
    cfg = default_cfg
    b, r = _b(cfg)
    b.sync(Engine.COMPUTE, push_next=True)
    if case == "gemm0":
        b.gemm(0, 0, 0, [(0, 1, 1, 0), (2, 0, 1, 1), (1, 0, 0, 0), (1, 0, 0, 0)])
        want = ("GEMM loop level 0 has extent 0",)
    elif case == "gemm3":
        b.gemm(0, 0, 0, [(2, 1, 1, 0), (0, 0, 1, 1)])
        want = ("GEMM loop level 3 has extent 0",)
    elif case == "alu1":
        b.alu(AluOp.ADD, 0, 0, 0, [(0, 1, 1, 1), (3, 1, 1, 1)])
        want = ("ALU loop level 1 has extent 0",)
    elif case == "load_y":
        b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 0, 1)
        want = ("LOAD moves nothing", "y_size=0")
    elif case == "load_x":
        b.load(Buffer.ACC, 0, b.addr(r, Buffer.ACC), 1, 0)
        want = ("LOAD moves nothing", "x_size=0")
    else:
        b.store(Buffer.ACC, 0, b.addr(r, Buffer.ACC), 1, 0, pop_prev=True)
        want = ("STORE moves nothing",)
    _raises(cfg, b.build(), SimulationError, 1, *want)


@pytest.mark.parametrize("shift", [63, -1, 1 << 20])
def test_requant_shift_out_of_range(default_cfg, shift):
    cfg = default_cfg
    bo = cfg.block_out
    params = np.zeros((4, bo), np.int32)             # a, then bias, mult, shift
    params[2] = 1 << 30
    params[3] = 5
    params[3, bo - 1] = shift                        # one bad lane
    b = ProgramBuilder(cfg)
    rp = b.region("p", "input", params.shape, "int32")
    b.load(Buffer.ACC, 0, b.addr(rp, Buffer.ACC), 1, 4)
    b.sync(Engine.COMPUTE)
    b.alu(AluOp.REQUANT, 0, 0, 1, [(1, 0, 0, 0)])
    _raises(cfg, b.build(), SimulationError, 2, "REQUANT shift", str(shift), "0..62",
            "row 3", inputs={"p": params})


def test_requant_immediate_form_rejected(default_cfg):
    cfg = default_cfg
    b = ProgramBuilder(cfg)
    b.emit(Alu(AluOp.REQUANT, 0, 0, 0, use_imm=True, imm=3))
    _raises(cfg, b.build(), SimulationError, 0, "REQUANT", "immediate form is not allowed")


@pytest.mark.parametrize("imm", [1 << 25, 0x7F7F807F, -1, -(1 << 31)])
def test_requant_immediate_reserved_bits(default_cfg, imm):
    """Bits 25-31 of the REQUANT immediate must be zero: caught before anything runs, also
    for programs that went through the encoder (the word itself is well formed)."""
    cfg = default_cfg
    b = ProgramBuilder(cfg)
    b.sync(Engine.COMPUTE)
    b.alu(AluOp.REQUANT, 0, 0, 4, [(2, 1, 1, 0)], imm=imm)
    prog = b.build()
    msg = _raises(cfg, prog, SimulationError, 1, "REQUANT immediate", "bits 25-31")
    assert f"{imm & 0xFFFFFFFF:#010x}" in msg
    decoded = Program.from_bytes(prog.to_bytes(cfg), cfg)       # encodes and decodes fine
    _raises(cfg, decoded, SimulationError, 1, "REQUANT immediate", "bits 25-31")
    # the same with bits 24-31 clear runs
    b = ProgramBuilder(cfg)
    b.sync(Engine.COMPUTE)
    b.alu(AluOp.REQUANT, 0, 0, 4, [(2, 1, 1, 0)], imm=imm & 0xFFFFFF)
    run(cfg, b.build())


@pytest.mark.parametrize("imm", [(1 << 24) | 0x7F8000, (1 << 24) | 0x100, (1 << 24) | 0x10000,
                                 (1 << 24) | 0x7F807F])
def test_wide_requant_with_clamp_bytes_refused(default_cfg, imm):
    """A wide REQUANT (bit 24) clamps to int16: bits 8-23 (the int8 lo, hi) must be zero,
    refused before anything runs as a malformed reserved bit is; without them it runs."""
    cfg = default_cfg
    b = ProgramBuilder(cfg)
    b.sync(Engine.COMPUTE)
    b.alu(AluOp.REQUANT, 0, 0, 4, [(2, 1, 1, 0)], imm=imm)
    prog = b.build()
    msg = _raises(cfg, prog, SimulationError, 1, "REQUANT immediate", "wide", "bits 8-23")
    assert f"{imm:#010x}" in msg
    decoded = Program.from_bytes(prog.to_bytes(cfg), cfg)
    _raises(cfg, decoded, SimulationError, 1, "REQUANT immediate", "wide", "bits 8-23")
    b = ProgramBuilder(cfg)
    b.sync(Engine.COMPUTE)
    b.alu(AluOp.REQUANT, 0, 0, 4, [(2, 1, 1, 0)], imm=imm & ~0xFFFF00)
    run(cfg, b.build())


# ----------------------------------------------------------------------------- races

@pytest.mark.parametrize("case", ["load_inp_vs_gemm", "load_wgt_vs_gemm", "alu_vs_store",
                                  "gemm_vs_store", "load_acc_vs_store"])
def test_race_without_tokens(default_cfg, case):
    cfg = default_cfg
    b, r = _b(cfg)
    if case == "load_inp_vs_gemm":
        b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 8)                  # writes INP 0..7
        b.gemm(0, 4, 0, [(2, 1, 1, 0)])                                     # reads INP 4..5
        writer, sram = 0, "INP"
    elif case == "load_wgt_vs_gemm":
        b.load(Buffer.WGT, 2, b.addr(r, Buffer.WGT), 1, 1)
        b.gemm(0, 0, 0, [(4, 0, 0, 1)])
        writer, sram = 0, "WGT"
    elif case == "alu_vs_store":
        b.sync(Engine.COMPUTE, push_next=True)
        b.store(Buffer.ACC, 0, b.addr(r, Buffer.ACC), 1, 4, pop_prev=True)  # reads ACC 0..3
        b.alu(AluOp.ADD, 3, 3, 0, [(1, 0, 0, 0)], imm=1, use_imm=True)      # writes ACC 3
        writer, sram = 2, "ACC"
    elif case == "gemm_vs_store":
        b.sync(Engine.COMPUTE, push_next=True)
        b.store(Buffer.ACC8, 8, b.addr(r, Buffer.ACC8), 1, 4, pop_prev=True)
        b.gemm(10, 0, 0, [(1, 0, 0, 0)])
        writer, sram = 2, "ACC"
    else:
        b.sync(Engine.COMPUTE, push_next=True)
        b.store(Buffer.ACC, 0, b.addr(r, Buffer.ACC), 1, 4, pop_prev=True)
        b.load(Buffer.ACC, 2, b.addr(r, Buffer.ACC) + 8, 1, 1)
        writer, sram = 2, "ACC"
    prog = b.build()
    msg = _raises(cfg, prog, HazardError, len(prog.instructions) - 2,
                  f"#{writer} writes {sram} rows", "add a dependency token")
    assert "at the same time" in msg
    # the same program is accepted when hazard checking is off, or with timing only
    run(cfg, prog, check_hazards=False)


def test_disjoint_rows_are_not_a_race(default_cfg):
    cfg = default_cfg
    b, r = _b(cfg)
    b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 8)
    b.gemm(0, 8, 0, [(2, 1, 1, 0)])                          # INP 8..9: no overlap
    res = run(cfg, b.build())
    assert res.schedule.start[1] < res.schedule.end[0]       # they did run concurrently


# ----------------------------------------------------------------------------- inputs

def _input_prog(cfg):
    b = ProgramBuilder(cfg)
    rx = b.region("x", "input", (4, cfg.block_in))
    b.region("y", "input", (2,), "int32")
    b.load(Buffer.INP, 0, b.addr(rx, Buffer.INP), 1, 4)
    return b.build()


@pytest.mark.parametrize("inputs,fragments", [
    ({"x": np.zeros((4, 16), np.int8), "y": np.zeros(2, np.int32), "z": np.zeros(1)},
     ("unknown program inputs", "'z'")),
    ({"x": np.zeros((4, 16), np.int8)}, ("missing program input 'y'", "int32[2]")),
    ({"x": np.zeros((4, 15), np.int8), "y": np.zeros(2, np.int32)},
     ("input 'x' must be int8[4, 16]", "got int8[4, 15]")),
    ({"x": np.zeros((4, 16), np.int16), "y": np.zeros(2, np.int32)},
     ("input 'x' must be int8[4, 16]", "got int16[4, 16]")),
    ({"x": np.zeros((4, 16), np.int8), "y": np.zeros(2, np.int64)},
     ("input 'y' must be int32[2]",)),
    ({"x": np.zeros((64,), np.int8), "y": np.zeros(2, np.int32)}, ("input 'x'",)),
])
def test_wrong_inputs(default_cfg, inputs, fragments):
    cfg = default_cfg
    _raises(cfg, _input_prog(cfg), SimulationError, None, *fragments, inputs=inputs)


def test_right_inputs_accepted(default_cfg):
    cfg = default_cfg
    x = np.arange(64, dtype=np.int8).reshape(4, 16)[:, ::-1]      # non-contiguous is fine
    run(cfg, _input_prog(cfg), {"x": x, "y": np.zeros(2, np.int32)})


# ----------------------------------------------------------------------------- in-memory fields

@pytest.mark.parametrize("case", ["alu_negative_dst", "load_negative_sram", "pad_value_300"])
def test_out_of_range_fields_of_in_memory_program(default_cfg, case):
    """Programs handed to Simulator.run as objects are never encoded, so the simulator must
    reject fields the encoder would refuse, like any other bad program."""
    cfg = default_cfg
    b, r = _b(cfg)
    b.sync(Engine.COMPUTE)
    if case == "alu_negative_dst":      # today: silently writes the last accumulator row
        b.alu(AluOp.MOV, -1, 0, 0, [(1, 0, 0, 0)], imm=7, use_imm=True)
    elif case == "load_negative_sram":  # today: ValueError from numpy's reshape
        b.load(Buffer.INP, -2, b.addr(r, Buffer.INP), 1, 4)
    else:                               # today: OverflowError from numpy
        b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 4, pad=(1, 0, 0, 0), pad_value=300)
    prog = b.build()
    assert not prog.fields_checked(cfg)          # the builder found the bad field
    with pytest.raises(SimulationError) as ei:
        run(cfg, prog)
    assert ei.value.index == 1
    # constructed directly (never through the builder): checked all the same
    direct = Program("direct", cfg.fingerprint, cfg.instruction_bits, list(prog.instructions),
                     list(prog.regions))
    with pytest.raises(SimulationError) as ei:
        run(cfg, direct)
    assert ei.value.index == 1


def _mov(dst):
    return Alu(AluOp.MOV, dst, 0, 0, use_imm=True, imm=7)


def test_field_checks_are_skipped_only_while_vouched_for(default_cfg, monkeypatch):
    """Builder-made, decoded and encoded programs skip the per-run field checks; replacing
    or changing an instruction afterwards brings them back."""
    import dsa_tvm.sim.validate as validate

    cfg = default_cfg
    calls = []
    real = validate.check_fields
    monkeypatch.setattr(validate, "check_fields", lambda ins, c, i=0: calls.append(i) or real(
        ins, c, i))
    b, r = _b(cfg)
    b.emit(_mov(3))
    prog = b.build()
    assert prog.fields_checked(cfg) and not prog.fields_checked(load_config("edge"))
    run(cfg, prog)
    assert calls == []                                            # checked once, at build
    decoded = Program.from_bytes(prog.to_bytes(cfg), cfg)
    assert decoded.fields_checked(cfg)
    run(cfg, decoded)
    assert calls == []
    # an in-place change of the list: checked again, and the bad field is found
    prog.instructions[0] = Alu(AluOp.ADD, 3, 3, 0, use_imm=True, imm=1 << 31)   # 33-bit imm
    assert not prog.fields_checked(cfg)
    with pytest.raises(SimulationError, match="field 'imm'"):
        run(cfg, prog)
    assert calls == [0]
    # a fresh list (as reference_machine.sequential makes) of good instructions: checked once, then
    # vouched for by that successful validation
    calls.clear()
    prog.instructions = [_mov(5), Finish()]
    run(cfg, prog)
    assert calls == [0, 1]
    run(cfg, prog)
    assert calls == [0, 1]
    # an object Program never built, encoded or validated starts unchecked
    fresh = Program("fresh", cfg.fingerprint, cfg.instruction_bits, [_mov(1), Finish()])
    assert not fresh.fields_checked(cfg)

"""Timing against cycle counts worked out by hand from the config (cost model in
``dsa_tvm/sim/timing.py``), determinism, timing-only runs, and double buffering."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import AluOp, Buffer, Engine, Gemm, Load, Store
from dsa_tvm.isa.semantics import quantize_multiplier
from dsa_tvm.programs.matmul import (
    MatmulTiling,
    matmul_program,
    pack_qparams,
    pack_weights,
    pad_cols,
    reference_matmul,
)

from .harness import PRESETS, rand_int8, run
from .test_program import sample_program


def _builder(cfg, rows=64):
    b = ProgramBuilder(cfg, "timing")
    r = b.region("buf", "scratch", (rows * cfg.acc_row_bytes,))
    return b, r


# ----------------------------------------------------------------------------- single costs

@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("buffer,n", [(Buffer.INP, 5), (Buffer.WGT, 3), (Buffer.ACC, 4),
                                      (Buffer.ACC8, 7), (Buffer.ACC16, 6)])
def test_single_load_cost(name, buffer, n):
    cfg = load_config(name)
    b, r = _builder(cfg)
    b.load(buffer, 0, b.addr(r, buffer), 1, n)
    b.finish()
    res = run(cfg, b.build(), timing_only=True)
    nbytes = n * {Buffer.INP: cfg.block_in, Buffer.WGT: cfg.block_in * cfg.block_out,
                  Buffer.ACC: 4 * cfg.block_out, Buffer.ACC8: cfg.block_out,
                  Buffer.ACC16: 2 * cfg.block_out}[buffer]
    want = math.ceil(nbytes / cfg.bandwidth_bytes_per_cycle) + cfg.latency_cycles
    assert (res.schedule.start[0], res.schedule.end[0]) == (0, want)
    # FINISH: compute engine, one cycle, after the accumulator load when it is on compute
    finish_start = (want if buffer in (Buffer.ACC, Buffer.ACC8, Buffer.ACC16)
                    else cfg.dispatch_cycles)
    assert res.schedule.start[1] == finish_start and res.schedule.end[1] == finish_start + 1
    assert res.cycles == max(want, finish_start + 1)


def test_load_cost_rounds_up_and_pays_dispatch():
    # 3 bytes/cycle: 80 bytes take ceil(80 / 3) = 27 cycles; 7 cycles to dispatch each instruction
    cfg = load_config("default").replace(bandwidth_bytes_per_cycle=3.0, dispatch_cycles=7,
                                         latency_cycles=50)
    b, r = _builder(cfg)
    b.sync(Engine.LOAD)                                   # dispatched at 0, runs 0..1
    b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 5)    # dispatched at 7
    b.finish()                                            # dispatched at 14
    res = run(cfg, b.build(), timing_only=True)
    s = res.schedule
    assert s.dispatch.tolist() == [0, 7, 14]
    assert (s.start[0], s.end[0]) == (0, 1)
    assert (s.start[1], s.end[1]) == (7, 7 + 27 + 50)
    assert (s.start[2], s.end[2]) == (14, 15)
    assert res.cycles == 84
    assert s.bus == [(1, 7, 34)]
    assert res.counters["dram_busy_cycles"] == 27


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("loops", [[(1, 0, 0, 0)], [(3, 1, 1, 0), (4, 0, 1, 1)],
                                   [(2, 1, 0, 1), (2, 2, 2, 0), (5, 0, 1, 0), (3, 0, 0, 2)]])
def test_gemm_cost(name, loops):
    cfg = load_config(name)
    b = ProgramBuilder(cfg)
    b.gemm(0, 0, 0, loops)
    b.finish()
    res = run(cfg, b.build(), timing_only=True)
    steps = int(np.prod([lp[0] for lp in loops]))
    want = steps + cfg.block_in + cfg.block_out
    assert (res.schedule.start[0], res.schedule.end[0]) == (0, want)
    assert (res.schedule.start[1], res.schedule.end[1]) == (want, want + 1)   # FINISH waits
    assert res.cycles == want + 1
    assert res.counters["compute.busy_cycles"] == want + 1


@pytest.mark.parametrize("name,lanes", [("default", None), ("edge", None), ("large", None),
                                        ("default", 4), ("default", 1)])
@pytest.mark.parametrize("use_imm", [False, True])
def test_alu_cost(name, lanes, use_imm):
    cfg = load_config(name)
    if lanes:
        cfg = cfg.replace(lanes=lanes)
    b = ProgramBuilder(cfg)
    b.alu(AluOp.ADD, 0, 10, 20, [(2, 3, 3, 0), (3, 1, 1, 1)], imm=1, use_imm=use_imm)
    b.finish()
    res = run(cfg, b.build(), timing_only=True)
    want = math.ceil(6 * cfg.block_out / cfg.lanes) if cfg.lanes > cfg.block_out \
        else 6 * math.ceil(cfg.block_out / cfg.lanes)
    want += cfg.alu_latency_cycles
    assert res.schedule.end[0] - res.schedule.start[0] == want
    assert res.cycles == want + 1


def test_alu_cost_hand_numbers():
    # edge: 8 lanes of output / 4 ALU lanes = 2 cycles per row, latency 3: 5 rows -> 13;
    # default: 64 lanes take 4 rows of 16 a cycle, 5 rows in 2 cycles, latency 4
    for name, want in (("edge", 5 * 2 + 3), ("default", 2 + 4), ("large", 5 * 1 + 6)):
        cfg = load_config(name)
        b = ProgramBuilder(cfg)
        b.alu(AluOp.MAX, 0, 0, 8, [(5, 1, 1, 1)])
        b.finish()
        assert run(cfg, b.build(), timing_only=True).schedule.end[0] == want


@pytest.mark.parametrize("ways", [1, 2, 4])
def test_mac8_takes_ways_reduction_points_a_step(ways):
    """MAC8 over (8 rows, 5 taps of destination stride 0): ceil(5 / ways) steps a row; the
    same nest as MAC, or with the taps in a level that writes new rows, 40 steps."""
    cfg = load_config("default").replace(mac8_ways=ways)
    for op, loops, steps in ((AluOp.MAC8, [(8, 1, 1, 0), (5, 0, 1, 1)], 8 * -(-5 // ways)),
                             (AluOp.MAC, [(8, 1, 1, 0), (5, 0, 1, 1)], 40),
                             (AluOp.MAC8, [(5, 8, 1, 1), (8, 1, 1, 0)], 40)):
        b = ProgramBuilder(cfg)
        b.alu(op, 0, 100, 200, loops)
        b.finish()
        want = cfg.alu_step_cycles(steps) + cfg.alu_latency_cycles
        assert run(cfg, b.build(), timing_only=True).schedule.end[0] == want, (op, loops)


def test_sync_and_finish_take_one_cycle():
    cfg = load_config("default")
    b = ProgramBuilder(cfg)
    b.sync(Engine.COMPUTE)
    b.sync(Engine.COMPUTE)
    b.finish()
    res = run(cfg, b.build(), timing_only=True)
    assert res.schedule.start.tolist() == [0, 1, 2]
    assert res.schedule.end.tolist() == [1, 2, 3]
    assert res.cycles == 3


# ----------------------------------------------------------------------------- interaction

def test_token_serializes_dependent_instructions():
    cfg = load_config("default")     # 16 B/cycle, latency 100, 16x16 array
    out = {}
    for tokens in (True, False):
        b, r = _builder(cfg)
        b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 4, push_next=tokens)   # 64 B: 4 + 100
        # with tokens the GEMM reads the loaded rows; without, other rows (no race)
        b.gemm(0, 0 if tokens else 100, 0, [(4, 1, 1, 0)], pop_prev=tokens)       # 4 + 32
        b.finish()
        out[tokens] = run(cfg, b.build(), timing_only=True)
    s = out[True].schedule
    assert (s.start[0], s.end[0]) == (0, 104)
    assert (s.start[1], s.end[1]) == (104, 140)
    assert out[True].cycles == 141
    assert out[True].counters["compute.token_wait_cycles"] == 104 - 1   # dispatched at 1
    s = out[False].schedule
    assert (s.start[1], s.end[1]) == (1, 37)                 # overlaps the load
    assert out[False].cycles == 104
    assert out[False].counters["compute.token_wait_cycles"] == 0


def test_token_round_trip_between_three_engines():
    cfg = load_config("default")
    b, r = _builder(cfg)
    b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 1, push_next=True)      # 0 .. 101
    b.gemm(0, 0, 0, [(1, 0, 0, 0)], pop_prev=True, push_next=True)         # 101 .. 134
    b.store(Buffer.ACC, 0, b.addr(r, Buffer.ACC), 1, 2, pop_prev=True,     # 128 B: 8 + 100
            push_prev=True)                                                # 134 .. 242
    b.finish(pop_next=True)                                                # 242 .. 243
    res = run(cfg, b.build(), timing_only=True)
    assert res.schedule.start.tolist() == [0, 101, 134, 242]
    assert res.schedule.end.tolist() == [101, 134, 242, 243]
    assert res.cycles == 243
    assert res.counters["store.token_wait_cycles"] == 134 - 2


def test_dma_transfers_share_the_dram_channel():
    cfg = load_config("default")
    b, r = _builder(cfg)
    b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 8)      # load engine: bus 0..8, done 108
    b.load(Buffer.ACC, 0, b.addr(r, Buffer.ACC), 1, 4)      # compute engine, dispatched at 1:
    b.finish()                                              # waits for the bus until 8
    res = run(cfg, b.build(), timing_only=True)
    s = res.schedule
    assert s.bus == [(0, 0, 8), (1, 8, 24)]
    assert (s.start[1], s.end[1]) == (1, 24 + 100)          # the latency overlaps
    assert res.cycles == 125
    assert res.counters["compute.dram_wait_cycles"] == 7
    assert res.counters["dram_busy_cycles"] == 24
    assert res.counters["dram_utilization"] == pytest.approx(24 / 125)


def test_dma_on_one_engine_pipelines_the_latency():
    """A DMA engine is free again when its transfer leaves the DRAM channel: two
    back-to-back loads take bus1 + bus2 + latency, not (bus1 + latency) + (bus2 + latency)."""
    cfg = load_config("edge")        # 4 B/cycle, latency 60
    b, r = _builder(cfg)
    b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 8)     # 64 B: bus 0..16, done 76
    b.load(Buffer.WGT, 0, b.addr(r, Buffer.WGT), 1, 2)     # 128 B: bus 16..48, done 108
    b.finish()
    res = run(cfg, b.build(), timing_only=True)
    s = res.schedule
    assert s.start.tolist()[:2] == [0, 16]
    assert s.end.tolist()[:2] == [76, 16 + 32 + 60]
    assert s.release.tolist()[:2] == [16, 48]               # engine free at bus end
    assert s.bus == [(0, 0, 16), (1, 16, 48)]
    assert res.cycles == 16 + 32 + 60
    assert res.counters["load.busy_cycles"] == 16 + 32      # occupied: transferring
    assert res.counters["load.active_cycles"] == 108        # something in flight: 0..108
    assert res.counters["load.dram_wait_cycles"] == 0


def test_eight_one_row_loads_pay_the_latency_once():
    """8 one-row INP loads on the default preset: 8 x 1 bus cycle + 100 latency = 108
    cycles (808 when every load held its engine until completion)."""
    cfg = load_config("default")     # 16 B/cycle: one 16-byte row per cycle, latency 100
    b, r = _builder(cfg)
    for k in range(8):
        b.load(Buffer.INP, k, b.addr(r, Buffer.INP) + k, 1, 1, push_next=k == 7)
    b.gemm(0, 0, 0, [(8, 1, 1, 0)], pop_prev=True)          # needs all 8 rows
    b.finish()
    res = run(cfg, b.build(), timing_only=True)
    s = res.schedule
    assert s.start.tolist()[:8] == list(range(8))           # dispatched and issued 1/cycle
    assert s.end.tolist()[:8] == [k + 1 + 100 for k in range(8)]
    assert s.bus == [(k, k, k + 1) for k in range(8)]
    assert (s.start[8], s.end[8]) == (108, 108 + 8 + 32)    # the last load's token at 108
    assert res.cycles == 108 + 40 + 1
    assert res.counters["load.busy_cycles"] == 8
    assert res.counters["load.active_cycles"] == 108


def test_completions_on_one_dma_engine_stay_in_order():
    """A long transfer then a short one: the short one leaves the channel later, so it
    also completes later; tokens come out in program order."""
    cfg = load_config("default")
    b, r = _builder(cfg)
    b.load(Buffer.WGT, 0, b.addr(r, Buffer.WGT), 1, 4, push_next=True)   # 1 KiB: bus 0..64
    b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 1, push_next=True)   # bus 64..65
    b.sync(Engine.COMPUTE, pop_prev=True)
    b.sync(Engine.COMPUTE, pop_prev=True)
    b.finish()
    res = run(cfg, b.build(), timing_only=True)
    s = res.schedule
    assert s.end.tolist()[:2] == [164, 165]
    assert (s.start[2], s.start[3]) == (164, 165)
    assert res.cycles == 167


def test_sync_behind_transfers_in_flight_retires_with_them():
    """Instructions retire in program order: a SYNC issued on the load engine while a load
    is in flight frees the engine after its cycle but pushes its token only when the load
    has completed, so the token still covers everything before it on that engine."""
    cfg = load_config("edge")        # 4 B/cycle, latency 60
    b, r = _builder(cfg)
    b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 8)             # bus 0..16, done 76
    b.sync(Engine.LOAD, push_next=True)                            # 16..17, retires at 76
    b.load(Buffer.INP, 8, b.addr(r, Buffer.INP) + 8, 1, 1)         # bus 17..19, done 79
    b.gemm(0, 0, 0, [(8, 1, 1, 0)], pop_prev=True)                 # reads the first load
    b.finish()
    res = run(cfg, b.build(), timing_only=True)                    # hazard checker on
    s = res.schedule
    assert s.start.tolist()[:4] == [0, 16, 17, 76]
    assert s.release.tolist()[:3] == [16, 17, 19]
    assert s.end.tolist()[:4] == [76, 76, 79, 76 + 8 + 16]
    assert res.counters["load.busy_cycles"] == 16 + 1 + 2


def test_accumulator_loads_hold_the_compute_engine():
    """ACC loads run on the compute engine, whose next instruction may read the loaded
    rows (no token in between): they hold it until they complete."""
    cfg = load_config("default")
    b, r = _builder(cfg)
    b.load(Buffer.ACC, 0, b.addr(r, Buffer.ACC), 1, 4)      # 256 B: bus 0..16, done 116
    b.load(Buffer.ACC8, 4, b.addr(r, Buffer.ACC8), 1, 4)    # 64 B: starts 116, bus ..120
    b.alu(AluOp.ADD, 0, 0, 4, [(4, 1, 1, 1)])               # reads both: 116 + 104 .. + 5
    b.finish()                                              # (4 rows: 1 cycle + latency 4)
    res = run(cfg, b.build(), timing_only=True)
    s = res.schedule
    assert s.start.tolist() == [0, 116, 220, 225]
    assert s.end.tolist() == [116, 220, 225, 226]
    assert s.release.tolist() == s.end.tolist()
    assert res.counters["compute.busy_cycles"] == 226
    assert res.counters["compute.active_cycles"] == 226


def test_store_engine_pipelines_too():
    cfg = load_config("default")
    b, r = _builder(cfg)
    b.sync(Engine.COMPUTE, push_next=True)
    b.store(Buffer.ACC, 0, b.addr(r, Buffer.ACC), 1, 2, pop_prev=True)        # bus 1..9
    b.store(Buffer.ACC8, 2, b.addr(r, Buffer.ACC8) + 8, 1, 2, push_prev=True)  # bus 9..11
    b.finish(pop_next=True)
    res = run(cfg, b.build(), timing_only=True)
    s = res.schedule
    assert s.start.tolist() == [0, 1, 9, 111]
    assert s.end.tolist() == [1, 109, 111, 112]
    assert res.counters["store.busy_cycles"] == 8 + 2
    assert res.counters["store.active_cycles"] == 110


def test_store_and_load_engines_contend_for_dram():
    cfg = load_config("default")
    b, r = _builder(cfg)
    b.sync(Engine.COMPUTE, push_next=True)                          # lets the store go at 1
    b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 16)             # dispatched 1: bus 1..17
    b.store(Buffer.ACC, 0, b.addr(r, Buffer.ACC), 1, 2, pop_prev=True)  # dispatched 2: bus 17..25
    b.finish()
    res = run(cfg, b.build(), timing_only=True)
    s = res.schedule
    assert s.bus == [(1, 1, 17), (2, 17, 25)]
    assert (s.start[2], s.end[2]) == (2, 125)
    assert res.counters["store.dram_wait_cycles"] == 15


def test_full_queue_stalls_fetch():
    out = {}
    for depth in (2, 32):
        cfg = load_config("default").replace(compute_depth=depth)
        b, r = _builder(cfg)
        b.gemm(0, 0, 0, [(1000, 0, 0, 0)])          # 0 .. 1032
        for _ in range(3):
            b.gemm(0, 0, 0, [(1, 0, 0, 0)])         # 33 cycles each
        b.load(Buffer.INP, 100, b.addr(r, Buffer.INP), 1, 1)
        b.finish()
        out[depth] = run(cfg, b.build(), timing_only=True)
    deep, shallow = out[32], out[2]
    assert deep.schedule.start[4] == 4 and deep.counters["fetch_stall_cycles"] == 0
    # depth 2: the 4th GEMM waits in fetch until the 2nd starts (at 1032)
    # and FINISH (compute) until the 3rd starts at 1032 + 33
    assert shallow.schedule.dispatch.tolist() == [0, 1, 2, 1032, 1033, 1065]
    assert shallow.counters["fetch_stall_cycles"] == (1032 - 3) + (1065 - 1034)
    assert shallow.schedule.start[4] == 1033
    assert shallow.cycles == 1033 + 1 + 100
    assert deep.cycles == 1032 + 3 * 33 + 1


# ----------------------------------------------------------------------------- determinism

def _matmul_case(cfg, m=40, n=None, k=None, seed=0, tiling=None, double_buffer=True):
    n = n or 3 * cfg.block_out
    k = k or 2 * cfg.block_in
    rng = np.random.default_rng(seed)
    x = rand_int8(rng, (m, k))
    w = rand_int8(rng, (n, k))
    ms = [quantize_multiplier(rng.uniform(1e-4, 1e-2)) for _ in range(n)]
    qp = pack_qparams([mult for mult, _ in ms], [shift for _, shift in ms], cfg,
                      bias=rng.integers(-(1 << 16), 1 << 16, n))
    prog = matmul_program(cfg, m, n, k, double_buffer=double_buffer, tiling=tiling)
    xp = pad_cols(x, cfg.block_in)
    inputs = {"x": xp, "w": pack_weights(w, cfg), "qp": qp}
    return prog, inputs, reference_matmul(xp, w, qp, cfg)


@pytest.mark.parametrize("name", PRESETS)
def test_deterministic_and_timing_only_identical(name):
    cfg = load_config(name)
    prog, inputs, want = _matmul_case(cfg, tiling=MatmulTiling(8, 1))
    r1, r2 = run(cfg, prog, inputs), run(cfg, prog, inputs)
    t = run(cfg, prog, timing_only=True)
    for other in (r2, t):
        assert other.cycles == r1.cycles
        assert other.counters == r1.counters
        np.testing.assert_array_equal(other.schedule.start, r1.schedule.start)
        np.testing.assert_array_equal(other.schedule.end, r1.schedule.end)
        assert other.schedule.bus == r1.schedule.bus
    np.testing.assert_array_equal(r1.outputs["out"], want)
    np.testing.assert_array_equal(r2.outputs["out"], want)
    assert t.outputs == {}
    # hazard checking does not change timing either
    assert run(cfg, prog, inputs, check_hazards=False).counters == r1.counters


def test_timing_only_identical_for_hand_program():
    cfg = load_config("default")
    p = sample_program(cfg)
    full = run(cfg, p, {"x": np.zeros((4, 16), np.int8)})
    t = run(cfg, p, timing_only=True)
    assert full.cycles == t.cycles and full.counters == t.counters


def test_schedule_invariants():
    cfg = load_config("default")
    prog, inputs, _ = _matmul_case(cfg, tiling=MatmulTiling(4, 1))
    res = run(cfg, prog, inputs)
    s = res.schedule
    ins = prog.instructions
    assert (s.start >= s.dispatch).all() and (s.end > s.start).all()
    assert res.cycles == s.end.max()
    assert ((s.release >= s.start) & (s.release <= s.end)).all()
    for e in Engine:                       # each engine runs its instructions in order
        idx = [i for i, x in enumerate(ins) if x.engine == e]
        starts, ends, rel = s.start[idx], s.end[idx], s.release[idx]
        assert (np.diff(starts) >= 0).all()
        assert (np.diff(ends) >= 0).all()                 # and completes them in order
        assert (starts[1:] >= rel[:-1]).all()             # next start: engine free again
        assert res.counters[f"{e.name.lower()}.busy_cycles"] == int((rel - starts).sum())
        covered = np.zeros(res.cycles, bool)
        for a, z in zip(starts, ends):
            covered[a:z] = True
        assert res.counters[f"{e.name.lower()}.active_cycles"] == int(covered.sum())
        prev_end = 0
        for i in idx:                                     # pipelined: DMA on load/store
            dma = isinstance(ins[i], (Load, Store))
            if e == Engine.COMPUTE:
                assert s.release[i] == s.end[i]
            elif dma:
                bus_end = next(z for j, _, z in s.bus if j == i)
                assert s.release[i] == bus_end
                assert s.end[i] == max(bus_end + cfg.latency_cycles, prev_end)
            else:                                         # SYNC: one cycle, retires in order
                assert s.release[i] == s.start[i] + 1
                assert s.end[i] == max(s.start[i] + 1, prev_end)
            prev_end = s.end[i]
    bus = sorted(s.bus, key=lambda x: x[1])  # the channel carries one transfer at a time
    for (_, _, e1), (_, s2, _) in zip(bus, bus[1:]):
        assert s2 >= e1
    assert len(s.bus) == sum(isinstance(x, Load) for x in ins) + res.counters["instr.store"]


# ----------------------------------------------------------------------------- double buffering

def _overlaps(s, a: list[int], b: list[int]) -> int:
    return sum(1 for i in a for j in b if s.start[i] < s.end[j] and s.start[j] < s.end[i])


@pytest.mark.parametrize("name", PRESETS)
def test_double_buffering_overlaps_transfers_with_compute(name):
    cfg = load_config(name)
    tiling = MatmulTiling(4, 1)                       # 64 rows x 4 N blocks: 64 tiles
    res = {}
    for db in (True, False):
        prog, inputs, want = _matmul_case(cfg, m=64, n=4 * cfg.block_out, k=3 * cfg.block_in,
                                          tiling=tiling, double_buffer=db, seed=3)
        r = run(cfg, prog, inputs)
        np.testing.assert_array_equal(r.outputs["out"], want)            # bit-exact
        assert r.counters["instr.gemm"] == 64
        res[db] = (prog, r)
    ratio = {}
    for db, (_prog, r) in res.items():
        serialized = int((r.schedule.end - r.schedule.start).sum())
        ratio[db] = r.cycles / serialized
    db_prog, db_res = res[True]
    sb_prog, sb_res = res[False]
    assert ratio[True] < 0.8
    assert db_res.cycles < 0.85 * sb_res.cycles
    assert ratio[False] > ratio[True] + 0.1           # much less overlap without double buffers

    def kinds(prog):
        inp = [i for i, x in enumerate(prog.instructions)
               if isinstance(x, Load) and x.buffer == Buffer.INP]
        gem = [i for i, x in enumerate(prog.instructions) if isinstance(x, Gemm)]
        return inp, gem

    # single buffer: an input tile is never loaded while a GEMM runs (one slot)
    assert _overlaps(sb_res.schedule, *kinds(sb_prog)) == 0
    # double buffer: the next input tile loads while most GEMMs run
    assert _overlaps(db_res.schedule, *kinds(db_prog)) >= 32


@pytest.mark.parametrize("name", PRESETS)
def test_matmul_default_tiling_and_int32_output_exact(name):
    cfg = load_config(name)
    rng = np.random.default_rng(4)
    m, n, k = 37, cfg.block_out + 3, 2 * cfg.block_in + 5
    x = pad_cols(rand_int8(rng, (m, k)), cfg.block_in)
    w = rand_int8(rng, (n, k))
    for db in (True, False):
        prog = matmul_program(cfg, m, n, k, requant=False, double_buffer=db)
        r = run(cfg, prog, {"x": x, "w": pack_weights(w, cfg)})
        want = reference_matmul(x, w, None, cfg)
        np.testing.assert_array_equal(r.outputs["out"], want)
        full = x.astype(np.int64) @ pad_cols(w, cfg.block_in).astype(np.int64).T
        np.testing.assert_array_equal(r.outputs["out"][:, :n], full.astype(np.int32))

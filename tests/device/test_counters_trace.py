"""Performance counters against hand-computed values, and the Chrome trace."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import AluOp, Buffer, Engine
from dsa_tvm.programs.matmul import MatmulTiling
from dsa_tvm.sim.counters import COUNTER_DOCS

from .harness import rand_int8, rand_int32, run
from .test_timing import _matmul_case


def small_program(cfg):
    """Default preset (16x16, 16 B/cycle, latency 100). Hand timeline in the test below."""
    bi, bo = cfg.block_in, cfg.block_out
    b = ProgramBuilder(cfg, "small")
    rx = b.region("x", "input", (4, bi))
    rw = b.region("w", "input", (2, bo, bi))
    ra = b.region("a", "input", (3, bo), "int32")
    o8 = b.region("o8", "output", (4, bo), "int8")
    o32 = b.region("o32", "output", (2, bo), "int32")
    b.meta["layers"] = [{"name": "loads", "first": 0, "last": 2},
                        {"name": "math", "first": 3, "last": 8}]
    b.load(Buffer.INP, 0, b.addr(rx, Buffer.INP), 1, 4)                      # 0
    b.load(Buffer.WGT, 5, b.addr(rw, Buffer.WGT), 1, 2, push_next=True)      # 1
    b.load(Buffer.ACC, 10, b.addr(ra, Buffer.ACC), 1, 3, pop_prev=True)      # 2
    b.gemm(0, 0, 5, [(4, 1, 1, 0), (2, 0, 0, 1)], reset=True)                # 3
    b.alu(AluOp.SHR, 0, 0, loops=[(4, 1, 1, 0)], imm=4, use_imm=True)        # 4
    b.alu(AluOp.ADD, 0, 0, 10, [(4, 1, 1, 0)], push_next=True)               # 5
    b.store(Buffer.ACC8, 0, b.addr(o8, Buffer.ACC8), 1, 4, pop_prev=True)    # 6
    b.store(Buffer.ACC, 0, b.addr(o32, Buffer.ACC), 1, 2, push_prev=True)    # 7
    b.finish(pop_next=True)                                                  # 8
    return b.build()


@pytest.fixture(scope="module")
def small_run():
    # hand numbers below: a vector unit one row wide (default's 64 lanes take 4 rows a cycle)
    cfg = load_config("default").replace(lanes=16)
    rng = np.random.default_rng(0)
    x = rand_int8(rng, (4, 16))
    w = rand_int8(rng, (2, 16, 16))
    a = rand_int32(rng, (3, 16), -1000, 1000)
    res = run(cfg, small_program(cfg), {"x": x, "w": w, "a": a})
    return cfg, res, (x, w, a)


def test_small_program_values(small_run):
    cfg, res, (x, w, a) = small_run
    acc = x.astype(np.int64) @ w[0].astype(np.int64).T + x.astype(np.int64) @ w[1].astype(
        np.int64).T
    acc = np.floor(acc / 16 + 0.5).astype(np.int64) + a[0]          # SHR 4 (half up), ADD row 10
    np.testing.assert_array_equal(res.outputs["o32"], acc[:2].astype(np.int32))
    np.testing.assert_array_equal(res.outputs["o8"], ((acc + 128) % 256 - 128).astype(np.int8))


def test_small_program_timeline(small_run):
    _, res, _ = small_run
    s = res.schedule
    # 0 LOAD INP   64 B   0..104 (bus 0..4)
    # 1 LOAD WGT  512 B   4..136 (bus 4..36): the load engine is free once #0 left the bus
    # 2 LOAD ACC  192 B   waits for #1's token: 136..248 (bus 136..148), holds compute
    # 3 GEMM  8 steps     248..288 (8 + 16 + 16)
    # 4 ALU   4 rows      288..296 (4 + 4)
    # 5 ALU   4 rows      296..304
    # 6 STORE ACC8 64 B   304..408 (bus 304..308)
    # 7 STORE ACC 128 B   308..416 (bus 308..316)
    # 8 FINISH            waits for #7's token: 416..417
    assert s.start.tolist() == [0, 4, 136, 248, 288, 296, 304, 308, 416]
    assert s.end.tolist() == [104, 136, 248, 288, 296, 304, 408, 416, 417]
    assert s.release.tolist() == [4, 36, 248, 288, 296, 304, 308, 316, 417]
    assert s.bus == [(0, 0, 4), (1, 4, 36), (2, 136, 148), (6, 304, 308), (7, 308, 316)]
    assert s.dispatch.tolist() == list(range(9))
    assert res.cycles == 417


def test_small_program_counters(small_run):
    cfg, res, _ = small_run
    c = res.counters
    want = {
        "cycles": 417, "instructions": 9,
        "instr.load": 3, "instr.store": 2, "instr.gemm": 1, "instr.alu": 2, "instr.sync": 0,
        "instr.finish": 1,
        "macs": 8 * 256, "alu_lane_ops": 8 * 16,
        "dram_read_bytes.inp": 64, "dram_read_bytes.wgt": 512, "dram_read_bytes.acc": 192,
        "dram_read_bytes": 768,
        "dram_write_bytes.acc8": 64, "dram_write_bytes.acc32": 128, "dram_write_bytes": 192,
        "dram_busy_cycles": 4 + 32 + 12 + 4 + 8,
        "load.busy_cycles": 4 + 32, "compute.busy_cycles": 112 + 40 + 8 + 8 + 1,
        "store.busy_cycles": 4 + 8,
        "load.active_cycles": 136, "compute.active_cycles": 112 + 40 + 8 + 8 + 1,
        "store.active_cycles": 416 - 304,
        "load.token_wait_cycles": 0, "compute.token_wait_cycles": (136 - 2) + (416 - 304),
        "store.token_wait_cycles": 304 - 6,
        "load.dram_wait_cycles": 0, "compute.dram_wait_cycles": 0, "store.dram_wait_cycles": 0,
        "fetch_stall_cycles": 0,
        # highest row touched + 1, in bytes: INP rows 0..3, WGT tiles 5..6, ACC rows 0..12
        "sram_peak_bytes.inp": 4 * 16, "sram_peak_bytes.wgt": 7 * 256,
        "sram_peak_bytes.acc": 13 * 64,
    }
    for k, v in want.items():
        assert c[k] == v, k
    assert c["time_us"] == pytest.approx(417 / 1000.0)
    assert c["mac_utilization"] == pytest.approx(2048 / (417 * 256))
    assert c["dram_utilization"] == pytest.approx(60 / 417)
    # energy: MACs, lane ops, scratchpad bytes, DRAM bytes at the preset's pJ figures
    sram_bytes = (8 * (16 + 256 + 2 * 64) + 4 * 64 * 2 + 4 * 64 * 3 + 64 + 512 + 192
                  + 4 * 64 + 2 * 64)
    assert c["sram_bytes"] == sram_bytes
    pj = 2048 * 0.2 + 128 * 0.4 + sram_bytes * 0.6 + 960 * 40.0
    assert c["energy_uj"] == pytest.approx(pj / 1e6)


def test_alu_scratchpad_bytes_count_every_parameter_row():
    """Energy's scratchpad traffic: an ALU step reads row a, its b rows (REQUANT 3, CLIP 2,
    others 1, none with the immediate), the destination too for MAC, and writes one row."""
    cfg = load_config("default")                      # 64-byte accumulator rows
    b = ProgramBuilder(cfg, "alu_bytes")
    b.alu(AluOp.REQUANT, 0, 0, 100, [(4, 1, 1, 0)])
    b.alu(AluOp.CLIP, 0, 0, 100, [(2, 1, 1, 0)])
    b.alu(AluOp.MAC, 0, 0, 100, [(3, 1, 1, 0)])
    b.alu(AluOp.ADD, 0, 0, loops=[(5, 1, 1, 0)], imm=1, use_imm=True)
    b.alu(AluOp.SUB, 0, 0, 100, [(6, 1, 1, 0)])
    res = run(cfg, b.build(), timing_only=True)
    assert res.counters["sram_bytes"] == 64 * (4 * 5 + 2 * 4 + 3 * 4 + 5 * 2 + 6 * 3)
    assert res.counters["alu_lane_ops"] == (4 + 2 + 3 + 5 + 6) * 16


def test_counter_set_and_report(small_run):
    _, res, _ = small_run
    c = res.counters
    assert len(c) >= 12
    for k in COUNTER_DOCS:
        assert k in c
    for v in c.values():
        assert isinstance(v, (int, float)) and v >= 0
    text = res.report()
    assert "small" in text and "default" in text
    for k in ("cycles", "macs", "dram_read_bytes.wgt", "sram_peak_bytes.acc", "instr.gemm"):
        assert k in text
    assert "417" in text and "2,048" in text
    # per-engine counters carry their unit; the MAC counters say padding lanes count
    assert any(ln.startswith("load.active_cycles") and ln.rstrip().endswith("cycles")
               for ln in text.splitlines())
    assert "padding lanes count" in COUNTER_DOCS["mac_utilization"][1]
    assert "padding lanes count" in COUNTER_DOCS["macs"][1]


def test_energy_absent_without_energy_table():
    cfg = load_config("default").replace(mac_pj=0.0, alu_lane_op_pj=0.0, sram_byte_pj=0.0,
                                         dram_byte_pj=0.0)
    res = run(cfg, small_program(cfg), timing_only=True)
    assert "energy_uj" not in res.counters and res.counters["macs"] == 2048


def test_matmul_counters_match_hand_computation():
    cfg = load_config("edge")
    m, n, k = 24, 3 * cfg.block_out, 2 * cfg.block_in
    prog, inputs, want = _matmul_case(cfg, m=m, n=n, k=k, tiling=MatmulTiling(8, 1))
    res = run(cfg, prog, inputs)
    np.testing.assert_array_equal(res.outputs["out"], want)
    c = res.counters
    kb, nb = 2, 3
    tiles = (m // 8) * nb
    assert c["instr.gemm"] == tiles and c["instr.alu"] == tiles and c["instr.store"] == tiles
    assert c["macs"] == m * kb * nb * cfg.block_in * cfg.block_out
    assert c["alu_lane_ops"] == m * nb * cfg.block_out
    assert c["dram_read_bytes.inp"] == nb * m * k            # x is re-read for each N block
    assert c["dram_read_bytes.wgt"] == n * k                 # each weight tile once
    # REQUANT parameter groups (bias, mult, shift): 3 int32 rows per output block
    assert c["dram_read_bytes.acc"] == 3 * nb * cfg.block_out * 4
    assert c["dram_write_bytes.acc8"] == m * n
    assert c["dram_write_bytes.acc32"] == 0


# ----------------------------------------------------------------------------- trace

def _instr_events(events):
    return [e for e in events if e["ph"] == "X" and e.get("cat") == "instr"]


def _thread_names(events):
    return {e["tid"]: e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name"}


def _assert_no_overlap_per_track(instr):
    per_track = {}
    for e in instr:
        per_track.setdefault(e["tid"], []).append(e)
    for evs in per_track.values():          # slices on one track never overlap
        evs.sort(key=lambda e: e["ts"])
        for a, b in zip(evs, evs[1:]):
            assert b["ts"] >= a["ts"] + a["dur"] - 1e-9
    return per_track


def test_trace_is_valid_chrome_json(small_run, tmp_path):
    cfg, res, _ = small_run
    events = res.trace()
    text = json.dumps(events)                               # serializable
    assert json.loads(text) == events
    tracks = _thread_names(events)
    for eng in Engine:
        assert int(eng) in tracks and tracks[int(eng)] == f"{eng.name.lower()} engine"
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in events)
    instr = _instr_events(events)
    prog = res.program
    assert sorted(e["args"]["index"] for e in instr) == list(range(len(prog.instructions)))
    us = 1.0 / cfg.mhz
    for e in instr:
        i = e["args"]["index"]
        eng = prog.instructions[i].engine
        assert e["args"]["engine"] == eng.name.lower()
        assert tracks[e["tid"]].startswith(f"{eng.name.lower()} engine")
        assert e["pid"] == 1
        assert e["ts"] == pytest.approx(res.schedule.start[i] * us)
        # the slice ends at completion (DRAM latency included)
        assert e["dur"] == pytest.approx((res.schedule.end[i] - res.schedule.start[i]) * us)
        assert e["dur"] > 0 and e["ts"] >= 0
        assert e["args"]["layer"] == ("loads" if i <= 2 else "math")
    names = [e["name"] for e in sorted(instr, key=lambda e: e["args"]["index"])]
    assert names[0] == "LOAD INP" and names[3] == "GEMM" and names[4] == "ALU SHR"
    assert names[6] == "STORE ACC8" and names[8] == "FINISH"
    # #1 starts at 4 while #0 is in flight until 104, #7 at 308 while #6 runs until 408:
    # each goes on its engine's second track
    by_index = {e["args"]["index"]: e for e in instr}
    for i, eng in ((0, Engine.LOAD), (6, Engine.STORE)):
        assert by_index[i]["tid"] == int(eng)
        assert tracks[by_index[i + 1]["tid"]] == f"{eng.name.lower()} engine (in flight 2)"
        assert by_index[i + 1]["args"]["engine_free_cycle"] == int(res.schedule.release[i + 1])
    assert all(by_index[i]["tid"] == int(Engine.COMPUTE) for i in (2, 3, 4, 5, 8))
    _assert_no_overlap_per_track(instr)
    dram = [e for e in events if e["ph"] == "X" and e.get("cat") == "dram"]
    assert len(dram) == 5 and all(tracks[e["tid"]] == "dram" for e in dram)
    path = res.write_trace(tmp_path / "trace.json")
    data = json.loads(path.read_text())
    assert data["traceEvents"] == events


def test_trace_of_large_program_has_one_slice_per_instruction():
    cfg = load_config("default")
    prog, inputs, _ = _matmul_case(cfg, tiling=MatmulTiling(4, 1))
    res = run(cfg, prog, timing_only=True)
    events = res.trace()
    json.dumps(events)
    instr = _instr_events(events)
    assert len(instr) == len(prog.instructions)
    assert "layer" not in instr[0]["args"]
    tracks = _thread_names(events)
    per_track = _assert_no_overlap_per_track(instr)
    assert {0, 1, 2} <= set(per_track)
    for tid, evs in per_track.items():       # every track holds one engine's instructions
        assert {e["args"]["engine"] for e in evs} == {tracks[tid].split()[0]}

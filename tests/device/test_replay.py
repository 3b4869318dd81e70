"""Replaying a program with its plan (``dsa_tvm.sim.replay``): loads whose rows already
hold their data are skipped, GEMMs that read the same input rows are computed together;
neither may change a value. Each program runs stepped and replayed against the
step-by-step reference machine (``harness.run_and_check``), and the plan is checked to
skip what it may and nothing it must not."""

from __future__ import annotations

import numpy as np

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import Buffer, Gemm, Load
from dsa_tvm.sim.simulator import Simulator

from .harness import gemm_path, rand_int8, run_and_check
from .reference_machine import build_sequential

CFG = load_config("default")
BI, BO = CFG.block_in, CFG.block_out


def _loads(prog, sram_base: int, buffer=Buffer.INP) -> list[int]:
    return [i for i, ins in enumerate(prog.instructions)
            if isinstance(ins, Load) and ins.buffer == buffer and ins.sram_base == sram_base]


def _plan(prog, inputs):
    run_and_check(CFG, prog, inputs)             # stepped, replayed, reference: all equal
    sim = Simulator(CFG)
    sim.run(prog, inputs)
    sim.run(prog, inputs)
    return sim.replay_plan(prog)


def _store_then_reload(rng):
    """An input tile re-read unchanged (skippable), a scratch tile re-read after a store
    rewrote its DRAM (not), three GEMMs on one input (one group)."""
    b = ProgramBuilder(CFG, "store_then_reload")
    x = b.region("x", "input", (8, BI))
    w = b.region("w", "const", (2, BO, BI), data=rand_int8(rng, (2, BO, BI)))
    mid = b.region("mid", "scratch", (8, BO))
    outs = [b.region(f"out{k}", "output", (8, BO), "int32") for k in range(3)]
    b.load(Buffer.INP, 0, b.addr(x, Buffer.INP), 1, 8)
    b.load(Buffer.WGT, 0, b.addr(w, Buffer.WGT), 1, 2)
    b.gemm(0, 0, 0, [(8, 1, 1, 0)], reset=True)
    b.store(Buffer.ACC8, 0, b.addr(mid, Buffer.ACC8), 1, 8)
    b.load(Buffer.INP, 8, b.addr(mid, Buffer.INP), 1, 8)
    b.gemm(8, 8, 0, [(8, 1, 1, 0)], reset=True)
    b.store(Buffer.ACC, 8, b.addr(outs[0], Buffer.ACC), 1, 8)
    b.gemm(0, 0, 1, [(8, 1, 1, 0)], reset=True)               # same input, other weights
    b.store(Buffer.ACC8, 0, b.addr(mid, Buffer.ACC8), 1, 8)    # rewrites mid
    b.load(Buffer.INP, 8, b.addr(mid, Buffer.INP), 1, 8)       # same load: new data
    b.gemm(16, 8, 0, [(8, 1, 1, 0)], reset=True)
    b.store(Buffer.ACC, 16, b.addr(outs[1], Buffer.ACC), 1, 8)
    b.load(Buffer.INP, 0, b.addr(x, Buffer.INP), 1, 8)         # same load: same data
    b.gemm(24, 0, 1, [(8, 1, 1, 0)], reset=True)
    b.store(Buffer.ACC, 24, b.addr(outs[2], Buffer.ACC), 1, 8)
    return build_sequential(b)


def test_a_reload_after_a_store_is_not_skipped_an_unchanged_one_is():
    rng = np.random.default_rng(0)
    prog = _store_then_reload(rng)
    for float32 in (False, True):
        with gemm_path(float32=float32):
            plan = _plan(prog, {"x": rand_int8(rng, (8, BI))})
            first_x, again_x = _loads(prog, 0)
            first_mid, again_mid = _loads(prog, 8)
            assert again_x in plan.skip
            assert not {first_x, first_mid, again_mid} & plan.skip
            on_x = [i for i, ins in enumerate(prog.instructions)
                    if isinstance(ins, Gemm) and ins.inp_base == 0]
            group, _ = plan.gemms[on_x[0]]
            assert group.members == on_x and len(on_x) == 3


def test_a_partly_overwritten_tile_is_loaded_again():
    rng = np.random.default_rng(1)
    b = ProgramBuilder(CFG, "partly_overwritten")
    x = b.region("x", "input", (12, BI))
    w = b.region("w", "const", (1, BO, BI), data=rand_int8(rng, (1, BO, BI)))
    outs = [b.region(f"out{k}", "output", (8, BO), "int32") for k in range(2)]
    b.load(Buffer.WGT, 0, b.addr(w, Buffer.WGT), 1, 1)
    b.load(Buffer.INP, 0, b.addr(x, Buffer.INP), 1, 8)
    b.gemm(0, 0, 0, [(8, 1, 1, 0)], reset=True)
    b.load(Buffer.INP, 4, b.addr(x, Buffer.INP) + 8, 1, 4)    # rows 4..7 now x[8..11]
    b.load(Buffer.INP, 0, b.addr(x, Buffer.INP), 1, 8)        # x[0..7] again: needed
    b.gemm(8, 0, 0, [(8, 1, 1, 0)], reset=True)
    b.store(Buffer.ACC, 0, b.addr(outs[0], Buffer.ACC), 1, 8)
    b.store(Buffer.ACC, 8, b.addr(outs[1], Buffer.ACC), 1, 8)
    prog = build_sequential(b)
    plan = _plan(prog, {"x": rand_int8(rng, (12, BI))})
    assert not (set(_loads(prog, 0)) | set(_loads(prog, 4))) & plan.skip
    # the weight tile feeds only GEMMs whose matrices the plan built: no copy needed
    assert set(_loads(prog, 0, Buffer.WGT)) <= plan.skip
    gemms = [i for i, ins in enumerate(prog.instructions) if isinstance(ins, Gemm)]
    assert plan.gemms[gemms[0]][0] is not plan.gemms[gemms[1]][0]   # different data


def test_weights_from_an_input_are_never_shared():
    """Weight tiles loaded from a region input (as the host packs K^T) differ per run:
    their GEMMs run as usual, batched runs stay each input's own."""
    rng = np.random.default_rng(2)
    b = ProgramBuilder(CFG, "input_weights")
    x = b.region("x", "input", (4, BI))
    w = b.region("w", "input", (1, BO, BI))
    out = b.region("out", "output", (4, BO), "int32")
    b.load(Buffer.INP, 0, b.addr(x, Buffer.INP), 1, 4)
    b.load(Buffer.WGT, 0, b.addr(w, Buffer.WGT), 1, 1)
    b.gemm(0, 0, 0, [(4, 1, 1, 0)], reset=True)
    b.store(Buffer.ACC, 0, b.addr(out, Buffer.ACC), 1, 4)
    prog = build_sequential(b)
    feeds = {"x": rand_int8(rng, (4, BI)), "w": rand_int8(rng, (1, BO, BI))}
    plan = _plan(prog, feeds)
    assert not plan.gemms and not set(_loads(prog, 0, Buffer.WGT)) & plan.skip
    sim = Simulator(CFG)
    xs, ws = rand_int8(rng, (3, 4, BI)), rand_int8(rng, (3, 1, BO, BI))
    singles = [sim.run(prog, {"x": xs[k], "w": ws[k]}).outputs["out"] for k in range(3)]
    many = sim.run_batch(prog, {"x": xs, "w": ws}).outputs["out"]
    for k in range(3):
        np.testing.assert_array_equal(many[k], singles[k])



def test_loads_in_a_row_run_as_one_copy_padding_included():
    """Loads that follow each other with one geometry and fixed steps (the tiles of a
    convolution's input) are copied together; padding and the int8 bias come out as
    when they are copied one by one."""
    rng = np.random.default_rng(4)
    b = ProgramBuilder(CFG, "load_run")
    x = b.region("x", "input", (40, BI))
    w = b.region("w", "const", (1, BO, BI), data=rand_int8(rng, (1, BO, BI)))
    out = b.region("out", "output", (4 * 12, BO), "int32")
    b.load(Buffer.WGT, 0, b.addr(w, Buffer.WGT), 1, 1)
    for k in range(4):           # 2x2 windows padded to 3x4 = 12 rows, 12 rows apart
        b.load(Buffer.INP, 12 * k, b.addr(x, Buffer.INP) + 5 * k, 2, 2, 7,
               pad=(1, 0, 1, 1), pad_value=-3)
    b.gemm(0, 0, 0, [(48, 1, 1, 0)], reset=True)
    b.store(Buffer.ACC, 0, b.addr(out, Buffer.ACC), 1, 48)
    prog = build_sequential(b)
    for float32 in (False, True):
        with gemm_path(float32=float32):
            plan = _plan(prog, {"x": rand_int8(rng, (40, BI))})
            first = _loads(prog, 0)[0]
            assert plan.load_runs == {first: (4, 12, 5)}

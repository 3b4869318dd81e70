"""Dependency tokens derived from footprints (dsa_tvm.isa.sync.insert_dependencies).

The simulator's race checker is the judge: a program whose tokens miss a
dependency raises HazardError (or computes wrong values); one with the derived
tokens must run bit-exact, and about as fast as hand-placed tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import NO_DEPS, AluOp, Buffer, Sync
from dsa_tvm.isa.semantics import pack_clip_imm
from dsa_tvm.isa.sync import insert_dependencies
from dsa_tvm.programs.matmul import (
    MatmulTiling,
    matmul_program,
    pack_weights,
    pad_cols,
    reference_matmul,
)
from dsa_tvm.sim.errors import HazardError
from dsa_tvm.sim.simulator import Simulator


def _strip(prog):
    """The program without any token or SYNC: what a code generator emits."""
    return [dataclasses.replace(i, deps=NO_DEPS) for i in prog.instructions
            if not isinstance(i, Sync)]


@pytest.mark.parametrize("preset", ["edge", "default", "large"])
@pytest.mark.parametrize("double_buffer", [True, False])
def test_derived_tokens_match_hand_placed_ones(preset, double_buffer):
    cfg = load_config(preset)
    rng = np.random.default_rng(0)
    m, n, k = 96, 70, 150
    x = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    prog = matmul_program(cfg, m, n, k, requant=False, double_buffer=double_buffer,
                          tiling=MatmulTiling(16, 2))
    auto = dataclasses.replace(prog, instructions=insert_dependencies(_strip(prog), cfg))
    sim = Simulator(cfg)
    inputs = {"x": pad_cols(x, cfg.block_in), "w": pack_weights(w, cfg)}
    hand, derived = sim.run(prog, inputs), sim.run(auto, inputs)   # hazard checks on
    np.testing.assert_array_equal(derived.outputs["out"],
                                  reference_matmul(inputs["x"], w, None, cfg))
    assert derived.cycles <= hand.cycles * 1.02


def test_without_tokens_the_race_is_caught():
    cfg = load_config("default")
    prog = matmul_program(cfg, 64, 64, 64, requant=False, tiling=MatmulTiling(16, 1))
    bare = dataclasses.replace(prog, instructions=_strip(prog))
    with pytest.raises(HazardError):
        Simulator(cfg).run(bare, timing_only=True)


def test_store_to_load_dependency_is_relayed_through_compute():
    """Layer 2's input LOAD (load engine) reads what layer 1 STOREd (store engine); the
    two engines share no token queue, so a SYNC on the compute engine must relay."""
    cfg = load_config("default")
    bi, bo = cfg.block_in, cfg.block_out
    b = ProgramBuilder(cfg, "two_layers")
    rin = b.region("x", "input", (4, bo), "int32")
    mid = b.region("mid", "scratch", (4, bo), "int8")
    eye = b.region("eye", "const", (1, bo, bi), "int8", data=np.eye(bo, bi, dtype=np.int8)[None])
    out = b.region("y", "output", (4, bo), "int8")
    b.load(Buffer.ACC, 0, b.addr(rin, Buffer.ACC), 1, 4)
    b.alu(AluOp.ADD, 0, 0, 0, [(4, 1, 1, 0)], imm=1, use_imm=True)
    b.store(Buffer.ACC8, 0, b.addr(mid, Buffer.ACC8), 1, 4)      # layer 1 output
    b.load(Buffer.INP, 0, b.addr(mid, Buffer.INP), 1, 4)         # layer 2 input
    b.load(Buffer.WGT, 0, b.addr(eye, Buffer.WGT), 1, 1)
    b.gemm(8, 0, 0, [(4, 1, 1, 0)], reset=True)                   # acc = inp @ I
    b.store(Buffer.ACC8, 8, b.addr(out, Buffer.ACC8), 1, 4)
    b.finish()
    plain = list(b.instructions)
    b.instructions = insert_dependencies(plain, cfg)
    prog = b.build()
    relays = [i for i in prog.instructions if isinstance(i, Sync)]
    assert relays and relays[0].deps.pop_next and relays[0].deps.push_prev
    x = (np.arange(4 * bo, dtype=np.int32).reshape(4, bo) % 100) - 50
    res = Simulator(cfg).run(prog, {"x": x})
    np.testing.assert_array_equal(res.outputs["y"], (x + 1).astype(np.int8))


def test_refuses_programs_that_already_carry_tokens():
    cfg = load_config("default")
    prog = matmul_program(cfg, 32, 32, 32, requant=False)
    with pytest.raises(ValueError, match="already carries dependency tokens"):
        insert_dependencies(prog.instructions, cfg)


def _eltwise(cfg, prefetch: bool, tiles: int = 8, rows: int = 32):
    """Double-buffered y = a + b over ``tiles`` tiles of int8 rows loaded into ACC8."""
    b = ProgramBuilder(cfg, "eltwise")
    ra = b.region("a", "input", (tiles * rows, cfg.block_out), "int8")
    rb = b.region("b", "input", (tiles * rows, cfg.block_out), "int8")
    ry = b.region("y", "output", (tiles * rows, cfg.block_out), "int8")
    for t in range(tiles):
        base = (t % 2) * 2 * rows
        off = t * rows
        b.load(Buffer.ACC8, base, b.addr(ra, Buffer.ACC8) + off, 1, rows,
               prefetch=prefetch)
        b.load(Buffer.ACC8, base + rows, b.addr(rb, Buffer.ACC8) + off, 1,
               rows, prefetch=prefetch)
        b.alu(AluOp.ADD, base, base, base + rows, [(rows, 1, 1, 1)])
        b.alu(AluOp.CLIP, base, base, 0, [(rows, 1, 1, 0)], imm=pack_clip_imm(-128, 127),
              use_imm=True)
        b.store(Buffer.ACC8, base, b.addr(ry, Buffer.ACC8) + off, 1, rows)
    b.finish()
    return b


def test_prefetched_acc_loads_overlap_compute_and_need_tokens():
    """ACC8 loads with ``prefetch`` run on the load engine: without tokens the race is
    caught; with derived tokens the values are the same and the loads overlap the ALU."""
    cfg = load_config("default")
    rng = np.random.default_rng(2)
    a, bb = (rng.integers(-128, 128, (8 * 32, cfg.block_out), dtype=np.int8) for _ in "ab")
    want = np.clip(a.astype(np.int32) + bb, -128, 127).astype(np.int8)
    runs = {}
    for prefetch in (False, True):
        b = _eltwise(cfg, prefetch)
        if prefetch:
            with pytest.raises(HazardError):
                Simulator(cfg).run(b.build(), {"a": a, "b": bb})
        b.instructions = insert_dependencies(b.instructions, cfg)
        runs[prefetch] = Simulator(cfg).run(b.build(), {"a": a, "b": bb})
        np.testing.assert_array_equal(runs[prefetch].outputs["y"], want)
    assert runs[True].cycles < 0.8 * runs[False].cycles

"""Legal but huge programs are refused before anything is allocated (issue 11).

Before, these met a raw ``MemoryError`` (32 GiB, 2 PiB), ``OverflowError`` or numpy's
``ValueError: array is too big`` deep inside the run. Now each names the instruction
or region and the size.
"""

from __future__ import annotations

import numpy as np
import pytest

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import AluOp, Buffer, Engine
from dsa_tvm.isa.program import ProgramError, Region
from dsa_tvm.sim import limits
from dsa_tvm.sim.errors import SimulationError
from dsa_tvm.sim.simulator import Simulator

CFG = load_config("default")
BIG = 65535  # the largest loop extent the instruction fields hold


def _gemm(levels: int):
    b = ProgramBuilder(CFG, "gemm")
    b.gemm(0, 0, 0, [(BIG, 0, 0, 0)] * levels)       # strides 0: every point in bounds
    return b.build()


def _alu(levels: int):
    b = ProgramBuilder(CFG, "alu")
    b.alu(AluOp.ADD, 0, 0, 0, [(BIG, 0, 0, 0)] * levels, imm=1, use_imm=True)
    return b.build()


@pytest.mark.parametrize("timing_only", [False, True])
def test_gemm_nest_whose_cycles_overflow_is_refused(timing_only):
    """65535^4 points: 'array is too big' (values) / cycle overflow (timing) before."""
    with pytest.raises(SimulationError) as ei:
        Simulator(CFG).run(_gemm(4), timing_only=timing_only)
    assert ei.value.index == 0
    msg = str(ei.value)
    assert "GEMM loop nest 65535 x 65535 x 65535 x 65535" in msg and "1.84e+19" in msg
    assert "split the nest" in msg
    with pytest.raises(SimulationError, match="2\\*\\*40 points"):
        Simulator(CFG).cycles(_gemm(4))


def test_alu_nest_of_petabytes_is_refused():
    """65535^3 points: MemoryError for 2 PiB of int64 indices before."""
    with pytest.raises(SimulationError, match="instruction 0: ALU loop nest 65535 x 65535 x "
                                              "65535 has 2.81e\\+14 points"):
        Simulator(CFG).run(_alu(3))


@pytest.mark.parametrize("make,op", [(_alu, "ALU"), (_gemm, "GEMM")])
def test_functional_run_of_a_huge_nest_is_refused_but_timing_runs(make, op):
    """65535^2 points: MemoryError for 32 GiB (ALU) before. Timing needs no arrays."""
    prog = make(2)
    with pytest.raises(SimulationError) as ei:
        Simulator(CFG).run(prog)
    msg = str(ei.value)
    nest = "1 x 65535 x 65535" if op == "ALU" else "1 x 1 x 65535 x 65535"
    assert ei.value.index == 0 and f"{op} loop nest {nest} (4,294,836,225 points)" in msg
    assert "GiB of host memory" in msg and "timing_only=True" in msg
    res = Simulator(CFG).run(prog, timing_only=True)
    # one step a cycle at least (the array), 4 a cycle on default's 64-lane vector unit
    assert res.cycles >= BIG * BIG * min(1.0, CFG.alu_cycles_per_row if op == "ALU" else 1.0)


def test_largest_real_nests_stay_far_below_the_limits():
    """A nest filling the whole accumulator and weight scratchpads once (what a compiled
    layer can reach) is well inside the functional limit."""
    b = ProgramBuilder(CFG, "full")
    b.gemm(0, 0, 0, [(CFG.acc_depth, 1, 1, 0), (CFG.wgt_depth // 4, 0, 0, 1)])
    (ins,) = [i for i in b.build().instructions if i.opcode.name == "GEMM"]
    assert limits.functional_bytes(ins, CFG) < limits.FUNCTIONAL_BYTES_LIMIT / 4


@pytest.mark.parametrize("nbytes", [32 << 30, 1 << 51])
def test_region_beyond_dram_is_refused_before_allocating(nbytes):
    """A 32 GiB / 2 PiB region: MemoryError allocating the DRAM image before."""
    b = ProgramBuilder(CFG, "big")
    b.sync(Engine.COMPUTE)
    prog = b.build()
    prog.regions.append(Region("big", "scratch", 0, "int8", (nbytes,)))
    with pytest.raises(ProgramError, match=f"DRAM region 'big' \\(scratch, {nbytes:,} bytes"):
        Simulator(CFG).run(prog)


def test_dram_image_larger_than_the_host_is_refused(monkeypatch):
    """A region the part's DRAM holds but the host cannot: named with both sizes; a
    timing-only run needs no image and goes ahead."""
    cfg = CFG.replace(size_mib=65536)
    b = ProgramBuilder(cfg, "wide")
    r = b.region("table", "const", (16, cfg.block_in), data=np.ones((16, cfg.block_in)))
    b.region("image", "scratch", (48 << 30,))
    b.load(Buffer.INP, 0, b.addr(r, Buffer.INP), 1, 16)
    prog = b.build()
    monkeypatch.setattr(limits, "host_memory_bytes", lambda: 16 << 30)
    with pytest.raises(SimulationError, match="needs a 48.0 GiB DRAM image \\(region 'image' "
                                              "ends at byte .*this host has 16.0 GiB"):
        Simulator(cfg).run(prog)
    assert Simulator(cfg).run(prog, timing_only=True).cycles > 0

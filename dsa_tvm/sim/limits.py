"""What the simulator can hold on this host: refuse huge programs before allocating.

A legal program can ask for more than any host gives: a GEMM nest of 65535^4 points
(the timing model's 64-bit cycle counters overflow), an ALU nest of 65535^3 points (the
functional model builds index and operand arrays per point: 2 PiB), a DRAM image of
more bytes than the host has. Each is refused here with the instruction or region and
the size, instead of a raw ``MemoryError``, ``OverflowError`` or numpy's "array is too
big" from deep inside the run.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..intmath import ceil_div
from ..isa.instructions import Alu, Gemm, Norm
from .errors import SimulationError
from .plans import EXACT_F32_PRODUCTS

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig
    from ..isa.program import Program

#: loop points of one GEMM/ALU instruction the timing model takes (one cycle each, at
#: least): with this bound and fewer than 2**22 instructions no cycle count can overflow
MAX_NEST_POINTS = 1 << 40
#: host bytes the functional model may build for one instruction's operands and indices
FUNCTIONAL_BYTES_LIMIT = 2 << 30


def _nest(ins: Gemm | Alu) -> str:
    return " x ".join(str(lp.extent) for lp in ins.loops)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):,.1f} MiB"


def check_nest_points(i: int, ins: Gemm | Alu) -> None:
    """Refuse a loop nest whose cycles the timing model cannot count."""
    points = ins.steps
    if points > MAX_NEST_POINTS:
        raise SimulationError(i, f"{ins.opcode.name} loop nest {_nest(ins)} has {points:.3g} "
                                 f"points (cycles); the simulator takes at most 2**40 points per "
                                 f"instruction: split the nest into several instructions")


def check_cycle_total(program: "Program") -> None:
    """With 2**22 instructions or more, the sum of the nests' points itself must fit."""
    if len(program.instructions) < 1 << 22:
        return
    total = 0
    for i, ins in enumerate(program.instructions):
        if isinstance(ins, (Gemm, Alu)):
            total += ins.steps
            if total > 1 << 62:
                raise SimulationError(i, f"the program's loop nests take over 2**62 cycles by "
                                         f"{ins.opcode.name} #{i}; the timing model counts "
                                         f"cycles in 64-bit integers: split the program")


def _gemm_bytes(ins: Gemm, cfg: "HardwareConfig") -> int:
    """Bytes of the arrays the functional model builds for a GEMM nest (sim.plans.gemm_plan
    and Machine.gemm): offsets per point, the gathered inputs, the expanded weights, the
    products."""
    size = {"B": 1, "M": 1, "N": 1, "K": 1}
    for lp in ins.loops:
        if lp.extent > 1:
            g = "K" if lp.acc == 0 else "M" if lp.wgt == 0 else "N" if lp.inp == 0 else "B"
            size[g] *= lp.extent
    nb, nm, nn, nk = size["B"], size["M"], size["N"], size["K"]
    bi, bo = cfg.block_in, cfg.block_out
    max_blocks = max(1, EXACT_F32_PRODUCTS // bi)
    nchunk = ceil_div(nk, max_blocks)
    kpad = nchunk * ceil_div(nk, nchunk)
    return (16 * ins.steps + 8 * (nb * nm * kpad + nb * nn * nk + nb * nm * nn)
            + 5 * bi * nb * nm * kpad + 4 * bi * bo * nb * kpad * nn
            + 8 * bo * nb * nchunk * nm * nn)


def _alu_bytes(ins: Alu, cfg: "HardwareConfig") -> int:
    """Bytes of the ALU plan (offsets per point, regrouped) and of the operand rows of one
    vector step (int64 intermediates in isa.semantics), bounded by all points."""
    return ins.steps * (64 + 32 * cfg.block_out)


def _norm_bytes(ins: Norm, cfg: "HardwareConfig") -> int:
    """int64 intermediates of ``isa.intnorm`` on every lane of the rows (a dozen arrays)."""
    return ins.rows * -(-ins.length // cfg.block_out) * cfg.block_out * 8 * 12


def functional_bytes(ins: Gemm | Alu | Norm, cfg: "HardwareConfig") -> int:
    if isinstance(ins, Norm):
        return _norm_bytes(ins, cfg)
    return _gemm_bytes(ins, cfg) if isinstance(ins, Gemm) else _alu_bytes(ins, cfg)


def host_memory_bytes() -> int | None:
    """Physical memory of this host, if the platform says."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_functional(program: "Program", cfg: "HardwareConfig", batch: int = 1) -> None:
    """Refuse a values-and-timing run (of ``batch`` inputs at once) whose DRAM images or
    loop nests the host cannot hold (a timing-only run builds none of it and is not
    limited by this)."""
    need = program.dram_size * batch
    have = host_memory_bytes()
    if have is not None and need > have:
        last = max(program.regions, key=lambda r: r.offset + r.nbytes)
        per = f"{batch} DRAM images of {_gib(program.dram_size)}" if batch > 1 else \
            f"a {_gib(need)} DRAM image"
        raise SimulationError(None, f"program '{program.name}' needs {per} (region "
                                    f"'{last.name}' ends at byte {program.dram_size:,}); this "
                                    f"host has {_gib(have)} of memory. Run a smaller batch, "
                                    f"with timing_only=True or on a larger host")
    seen: set[int] = set()
    for i, ins in enumerate(program.instructions):
        if not isinstance(ins, (Gemm, Alu, Norm)) or id(ins) in seen:
            continue
        seen.add(id(ins))
        nbytes = functional_bytes(ins, cfg) * batch
        if nbytes > FUNCTIONAL_BYTES_LIMIT:
            what = (f"{ins.rows} x {ins.length} rows" if isinstance(ins, Norm)
                    else f"loop nest {_nest(ins)} ({ins.steps:,} points)")
            raise SimulationError(i, f"{ins.opcode.name} {what} would need about {_gib(nbytes)} "
                                     f"of host memory in the functional model (limit "
                                     f"{_gib(FUNCTIONAL_BYTES_LIMIT)}); split the nest into "
                                     f"smaller instructions, run a smaller batch, or run with "
                                     f"timing_only=True")

"""The DSA's instructions as Python values.

Six kinds, VTA-style decoupled access/execute:

* ``LOAD``  DRAM -> scratchpad, 2-D strided, padding on load (load engine for
  INP/WGT, compute engine for ACC, as the accumulator belongs to compute).
* ``STORE`` accumulator scratchpad -> DRAM, int32 or narrowed to int16 or int8 (store engine).
* ``GEMM``  a 4-level loop nest of MAC-array steps (compute engine).
* ``ALU``   a 3-level loop nest of vector operations on accumulator rows (compute).
* ``SYNC``  no work; carries dependency tokens on a chosen engine.
* ``FINISH`` marks the end of the program (compute engine).
* ``NORM``  softmax / LayerNorm / RMSNorm of rows held in the accumulator, on the
  ``[norm]`` units (compute engine).

Every instruction carries four dependency-token flags. Tokens flow through four
FIFOs between neighbouring engines: load->compute, compute->load,
compute->store, store->compute. ``pop_prev`` waits for (and takes) a token from
the previous engine, ``pop_next`` from the next one; ``push_prev`` / ``push_next``
send one when the instruction completes. The load engine has no previous
engine and the store engine no next one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Opcode(enum.IntEnum):
    LOAD = 0
    STORE = 1
    GEMM = 2
    ALU = 3
    SYNC = 4
    FINISH = 5
    NORM = 6


class Buffer(enum.IntEnum):
    """Scratchpad (and DRAM element type) a LOAD or STORE moves."""

    INP = 0    # int8 rows of block_in
    WGT = 1    # int8 tiles of block_out x block_in
    ACC = 2    # int32 rows of block_out (DRAM int32)
    ACC8 = 3   # int32 rows of block_out, DRAM int8 (sign-extended on load, low byte on store)
    WGT4 = 4   # int8 tiles of block_out x block_in, DRAM int4 two a byte, low nibble first
    #            (sign-extended on load; LOAD only, on parts with dram.int4_weights)
    WGTS = 5   # int8 tiles of block_out x block_in, DRAM compressed N:M (isa.sparse_tiles;
    #            expanded on load; LOAD only, on parts with array.sparsity)
    ACC16 = 6  # int32 rows of block_out, DRAM int16 (sign-extended on load, low 16 bits on
    #            store): a wide (residual-stream) tensor, 2 bytes a lane


#: buffers whose LOAD writes (and STORE reads) accumulator rows: int32, int8 and int16 DRAM
ACC_BUFFERS = frozenset({Buffer.ACC, Buffer.ACC8, Buffer.ACC16})


class Engine(enum.IntEnum):
    LOAD = 0
    COMPUTE = 1
    STORE = 2


class AluOp(enum.IntEnum):
    """Vector operations; ``a`` is source A, ``b`` source B or the immediate.

    The comment beside each member is its definition in the ISA reference
    (continuation lines start with ``#``). Integer semantics: ``isa.semantics``.
    """

    MOV = 0      # dst = b
    ADD = 1      # dst = a + b            (int32 wrap-around)
    SUB = 2      # dst = a - b            (int32 wrap-around)
    MUL = 3      # dst = a * b            (int32 wrap-around)
    MAC = 4      # dst = dst + a * b      (int32 wrap-around)
    MIN = 5      # dst = min(a, b)
    MAX = 6      # dst = max(a, b)
    SHR = 7      # dst = a >> b, rounding half up; a negative b shifts left (wraps)
    CLIP = 8     # dst = clamp(a, lo, hi) = min(max(a, lo), hi). Immediate form: lo = low
    #              16 bits, hi = high 16 bits of imm (each signed). Tensor form: lo = row b,
    #              hi = row b + 1.
    REQUANT = 9  # the fused output stage: dst = clamp(rshift_round(wrap32(a + bias) * mult,
    #              shift) + zp, lo, hi), product exact in 64 bits, rounding half up. Per lane
    #              (per output channel): bias = row b, mult = row b + 1, shift = row b + 2
    #              (0..62). imm: zp = bits 0-7, lo = bits 8-15, hi = bits 16-23 (each signed
    #              int8), bit 24 wide, bits 25-31 zero. Wide (bit 24 set): the clamp is int16,
    #              lo = -32768, hi = 32767 (the zp of bits 0-7 still added; bits 8-23 zero),
    #              for int16 (ACC16) outputs. Tensor form only. One pass does bias add,
    #              requantize and a ReLU (lo = zp) or ReLU6 clamp.
    LUT = 10     # the activation table: dst = table[clamp(a, -128, 127) + 128]. The table is
    #              256 int32 entries packed into rows b, b + 1, ... (entry i in row b + i //
    #              block_out, lane i % block_out; 256 / block_out rows, ACC8-loaded int8
    #              codes). Tensor form only; every b stride 0 (one table per instruction).
    #              Needs the table unit (`[table] table_unit`).
    MAC8 = 11    # dst = dst + a8 * b8 with a8, b8 the low bytes of a and b, sign-extended
    #              (int32 wrap-around): MAC on int8 codes. A dot-product lane adds
    #              `[vector] mac8_ways` products of the reduction levels (destination stride
    #              0) in one step, taps read through a sliding window (a depthwise conv).


#: ALU ops that read their destination (accumulate into it)
ACCUMULATING_OPS = frozenset({AluOp.MAC, AluOp.MAC8})


class NormOp(enum.IntEnum):
    """Row operations of the ``[norm]`` units (``NORM``); integer semantics:
    ``isa.intnorm``, parameter block layout: ``isa.norm_unit``.

    The comment beside each member is its definition in the ISA reference."""

    SOFTMAX = 0    # dst = int_softmax(clamp(src, -128, 127)) per row (I-BERT i-exp, table +
    #                Newton reciprocal); parameters: in_mult, in_shift, out_mult, out_shift,
    #                out_zp. in_wide: clamp(src, -32768, 32767); out_wide: int16 results
    LAYERNORM = 1  # dst = int_norm(clamp(src, -128, 127) - in_zp), centred; parameters: eps_term
    #                (int64), frac, out_zp, per-channel gamma (int32) and beta (int64). in_wide:
    #                clamp(src, -32768, 32767), int16 codes (e.g. an ACC16-loaded residual)
    RMSNORM = 2    # as LAYERNORM, not centred (root mean square; sqrt(n) folded in gamma)


#: Consecutive parameter rows the tensor form of an ALU op reads from row b on
#: (every op not listed reads one).
B_PARAM_ROWS: dict[AluOp, int] = {AluOp.CLIP: 2, AluOp.REQUANT: 3}
#: ALU ops that must use the tensor form (their parameters are per lane).
TENSOR_ONLY_OPS = frozenset({AluOp.REQUANT, AluOp.LUT})
#: Entries of the activation table LUT reads: one per int8 input code.
LUT_ENTRIES = 256


def lut_rows(block_out: int) -> int:
    """Accumulator rows one LUT table fills (LUT_ENTRIES packed block_out per row)."""
    return -(-LUT_ENTRIES // block_out)


def b_rows(op: AluOp, block_out: int | None = None) -> int:
    """Rows the tensor form of ``op`` reads from row b on (b, b + 1, ...); LUT's table
    depends on the row width, so it needs ``block_out``."""
    if op == AluOp.LUT:
        if block_out is None:
            raise ValueError("LUT reads a table whose row count depends on block_out")
        return lut_rows(block_out)
    return B_PARAM_ROWS.get(op, 1)


@dataclass(frozen=True)
class Deps:
    """Dependency-token flags carried by every instruction."""

    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False

    def any(self) -> bool:
        return self.pop_prev or self.pop_next or self.push_prev or self.push_next


NO_DEPS = Deps()


@dataclass(frozen=True)
class GemmLoop:
    """One level of a GEMM loop nest: extent and per-operand strides (rows / tiles)."""

    extent: int
    acc: int = 0
    inp: int = 0
    wgt: int = 0


@dataclass(frozen=True)
class AluLoop:
    """One level of an ALU loop nest: extent and per-operand strides (accumulator rows)."""

    extent: int
    dst: int = 0
    a: int = 0
    b: int = 0


GEMM_LEVELS = 4
ALU_LEVELS = 3


def _pad_loops(loops, levels: int, unit):
    loops = tuple(loops)
    if len(loops) > levels:
        raise ValueError(f"at most {levels} loop levels, got {len(loops)}")
    return (unit,) * (levels - len(loops)) + loops


@dataclass(frozen=True)
class Load:
    """DRAM -> scratchpad. Writes (pad_top + y_size + pad_bottom) x (pad_left + x_size +
    pad_right) elements contiguously from ``sram_base``; padding is ``pad_value``.
    DRAM addresses, sizes and strides count elements of the buffer's type.

    ``x_stride`` is the distance between the DRAM starts of consecutive rows. It may be
    smaller than ``x_size`` (rows overlap) and it may be 0: every row then reads the
    same source row, a broadcast, e.g. one bias row copied to many accumulator rows or
    one zero-point row filling many input rows.

    ``prefetch`` (ACC/ACC8/ACC16 only) queues the load on the load engine, where it overlaps
    compute; the program must then order it against the compute engine with tokens
    like any INP/WGT load. Without it an ACC load runs on the compute engine, in order
    with the instructions that read its rows (no tokens needed, no overlap).

    ``WGT4`` reads weight tiles of int4 codes (two a byte, ``semantics.pack_int4``) and
    writes them sign-extended as int8 tiles; only on parts with ``dram.int4_weights``.
    ``WGTS`` reads compressed N:M weight tiles (``isa.sparse_tiles``) and writes them
    expanded, with their sparse mark for a ``Gemm(sparse=True)``; only on parts with
    ``array.sparsity``."""

    buffer: Buffer
    sram_base: int
    dram_base: int
    y_size: int
    x_size: int
    x_stride: int
    pad_top: int = 0
    pad_bottom: int = 0
    pad_left: int = 0
    pad_right: int = 0
    pad_value: int = 0
    deps: Deps = NO_DEPS
    prefetch: bool = False
    opcode = Opcode.LOAD

    @property
    def engine(self) -> Engine:
        if self.buffer in ACC_BUFFERS and not self.prefetch:
            return Engine.COMPUTE
        return Engine.LOAD

    @property
    def rows_written(self) -> int:
        return (self.pad_top + self.y_size + self.pad_bottom) * (
            self.pad_left + self.x_size + self.pad_right)


@dataclass(frozen=True)
class Store:
    """Accumulator scratchpad -> DRAM, ``y_size`` x ``x_size`` rows read contiguously from
    ``sram_base``; ACC stores int32, ACC8 the low byte of each lane, ACC16 its low 16 bits."""

    buffer: Buffer
    sram_base: int
    dram_base: int
    y_size: int
    x_size: int
    x_stride: int
    deps: Deps = NO_DEPS
    opcode = Opcode.STORE
    engine = Engine.STORE


@dataclass(frozen=True)
class Gemm:
    """acc[acc] (+)= inp[inp] @ wgt[wgt].T for every point of the loop nest (one per cycle).

    Row index of each operand = base + sum(level index * level stride). ``reset`` zeroes
    every accumulator row the nest touches before accumulating. ``sparse`` (parts with
    ``array.sparsity`` N:M): every weight tile it reads was loaded by WGTS, so the array
    multiplies only the kept N of each M and M / N reduction points share a cycle; the
    values are those of the dense product."""

    acc_base: int
    inp_base: int
    wgt_base: int
    loops: tuple[GemmLoop, ...] = ()
    reset: bool = False
    deps: Deps = NO_DEPS
    sparse: bool = False
    opcode = Opcode.GEMM
    engine = Engine.COMPUTE

    def __post_init__(self):
        object.__setattr__(self, "loops", _pad_loops(self.loops, GEMM_LEVELS, GemmLoop(1)))

    @property
    def steps(self) -> int:
        n = 1
        for lp in self.loops:
            n *= lp.extent
        return n


@dataclass(frozen=True)
class Alu:
    """dst[dst] = op(a[a], b[b] or imm) for every point of the loop nest, in loop order."""

    op: AluOp
    dst_base: int
    a_base: int = 0
    b_base: int = 0
    loops: tuple[AluLoop, ...] = ()
    use_imm: bool = False
    imm: int = 0
    deps: Deps = NO_DEPS
    opcode = Opcode.ALU
    engine = Engine.COMPUTE

    def __post_init__(self):
        object.__setattr__(self, "loops", _pad_loops(self.loops, ALU_LEVELS, AluLoop(1)))

    @property
    def steps(self) -> int:
        n = 1
        for lp in self.loops:
            n *= lp.extent
        return n


@dataclass(frozen=True)
class Sync:
    """No work: waits for and sends tokens on ``on`` engine."""

    on: Engine
    deps: Deps = NO_DEPS
    opcode = Opcode.SYNC

    @property
    def engine(self) -> Engine:
        return self.on


@dataclass(frozen=True)
class Finish:
    """End of program (compute engine)."""

    deps: Deps = field(default=NO_DEPS)
    opcode = Opcode.FINISH
    engine = Engine.COMPUTE


@dataclass(frozen=True)
class Norm:
    """``rows`` rows of ``length`` int8 codes (int32 lanes, each row spanning
    ``ceil(length / block_out)`` accumulator rows from ``src_base`` on, the last one
    padded) through the ``[norm]`` units' ``op``; results (int8 codes, lanes past
    ``length`` zero) to the same layout from ``dst_base`` (``dst_base = src_base``: in
    place). The integer parameters are the block at ``param_base`` (``isa.norm_unit``).
    ``in_wide``: the lanes hold int16 codes (clamped to int16 rather than int8), e.g. a
    residual stream loaded by ACC16. ``out_wide``: the results saturate at int16 rather
    than int8 (stored by ACC16), e.g. attention probabilities finer than 1/256."""

    op: NormOp
    dst_base: int
    src_base: int
    param_base: int
    rows: int
    length: int
    in_zp: int = 0
    deps: Deps = NO_DEPS
    in_wide: bool = False
    out_wide: bool = False
    opcode = Opcode.NORM
    engine = Engine.COMPUTE


Instruction = Load | Store | Gemm | Alu | Sync | Finish | Norm

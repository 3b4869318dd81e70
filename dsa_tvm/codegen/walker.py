"""Lower scheduled TIR to DSA instructions by walking it.

The schedules (``tir_schedules``) leave TIR of a known shape: tile loops, and
under them opaque blocks that allocate tile buffers in the scratchpad scopes
and run *stages*: a loop nest around one leaf, which is a tensorized intrinsic
call (GEMM step, requantize row, vector op), a copy between DRAM and a
scratchpad (a DMA: LOAD, or STORE), or the constant init of an accumulator tile.
The walker

* iterates the tile loops in Python, binding their variables;
* turns every stage into one instruction whose loop nest is the stage's loops
  (affine index expressions become strides; contiguous levels merge; levels
  beyond what a format holds are peeled into several instructions; a loop that
  revisits the destination, stride 0, is an ALU reduction level);
* runs an intrinsic implemented as several vector ops as one instruction each
  over the whole nest, when that is the same computation (element-wise nests);
* assigns scratchpad rows to tile buffers with a stack allocator, two slots
  each when the enclosing loop is annotated ``dsa.double_buffer``; a tile of
  any element type takes whole rows (int8 and int16 accumulator tiles hold one
  widened value per lane: their copies from int8 / int16 DRAM are ACC8 / ACC16 loads);
* folds a zero-init into the reset flag of the GEMM that first writes the rows,
  and turns any other init into an ALU MOV before the rows are first read.

Dependency tokens are left to :func:`dsa_tvm.isa.sync.insert_dependencies`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tir_schedules.names import ANN_DOUBLE_BUFFER, CALL_ALU, CALL_GEMM, CALL_REQUANT, SCOPES
from tir_schedules.nests import (
    MAX_PAD,
    CodegenError,
    dma_shapes,
    first_step_split,
    peel,
    touched,
)

from ..intmath import ceil_div
from ..isa.builder import ProgramBuilder
from ..isa.instructions import (
    ACC_BUFFERS,
    ACCUMULATING_OPS,
    ALU_LEVELS,
    GEMM_LEVELS,
    AluOp,
    Buffer,
)
from ..isa.program import Region
from ..isa.semantics import INT32_MAX, INT32_MIN
from .texpr import (
    Env,
    ExprError,
    affine,
    compiled,
    load_offset,
    node_cached,
    pad_box,
    store_offset,
)

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig


@dataclass
class _Tile:
    """A scratchpad tile buffer: where its slots are and which one is current."""

    sram: str
    base: int
    rows: int
    nbuf: int
    uses: int = 0

    @property
    def slot_base(self) -> int:
        return self.base + ((self.uses - 1) % self.nbuf) * self.rows


def _cls(node: Any) -> str:
    return type(node).__name__


class TirWalker:
    """Emits the instructions of one scheduled PrimFunc into a ProgramBuilder."""

    def __init__(self, cfg: "HardwareConfig", builder: ProgramBuilder,
                 dram: dict[str, Region], sram_base: dict[str, int] | None = None):
        self.cfg = cfg
        self.b = builder
        self.dram = dram
        self.top = dict(sram_base or {"inp": 0, "wgt": 0, "acc": 0})
        self.peak = dict(self.top)
        self.tiles: dict[str, _Tile] = {}
        self.pending_reset: dict[str, frozenset[int]] = {}  # tile rows still to initialize
        self.init_value: dict[str, int] = {}
        self.depth = {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "acc": cfg.acc_depth}
        self.row_elems = {"inp": cfg.block_in, "wgt": cfg.block_in * cfg.block_out,
                          "acc": cfg.block_out}

    # ------------------------------------------------------------------ traversal
    def run(self, func) -> None:
        self._walk(func.body, {}, False)

    def _walk(self, node: Any, env: Env, dbuf: bool) -> None:
        kind = _cls(node)
        if kind == "SBlockRealize":
            self._walk(node.block, env, dbuf)
        elif kind == "SBlock":
            self._block(node, env, dbuf)
        elif kind == "SeqStmt":
            for s in node.seq:
                self._walk(s, env, dbuf)
        elif kind == "For":
            leaf, loops, var, lo_fn, ext_fn, body, ann = _for_info(node)
            if leaf is not None:
                self._emit(leaf, loops, env)
                return
            db = dbuf or ann
            lo = int(lo_fn(env))
            for v in range(lo, lo + int(ext_fn(env))):
                self._walk(body, {**env, var: v}, db)
        elif kind in ("BufferStore", "Evaluate"):
            self._emit(node, [], env)
        else:
            raise CodegenError(f"unexpected {kind} in scheduled TIR")

    def _block(self, block: Any, env: Env, dbuf: bool) -> None:
        saved = dict(self.top)
        for buf in block.alloc_buffers:
            self._allocate(buf, dbuf)
        self._walk(block.body, env, dbuf)
        for name in list(self.pending_reset):
            self._flush_reset(name)
        self.top = saved

    def _allocate(self, buf: Any, dbuf: bool) -> None:
        sram, elems = node_cached("alloc", buf, _scratchpad_size)
        rows = ceil_div(elems, self.row_elems[sram])
        nbuf = 2 if dbuf else 1
        base = self.top[sram]
        if base + nbuf * rows > self.depth[sram]:
            raise CodegenError(
                f"tile buffer '{buf.name}' needs {nbuf} x {rows} rows of {sram.upper()} at row "
                f"{base}; the scratchpad has {self.depth[sram]} (the schedule's tiles are too big)")
        t = self.tiles.get(buf.name)
        if t is None or (t.base, t.rows, t.nbuf) != (base, rows, nbuf):
            t = _Tile(sram, base, rows, nbuf, t.uses if t else 0)
            self.tiles[buf.name] = t
        t.uses += 1
        self.top[sram] = base + nbuf * rows
        self.peak[sram] = max(self.peak[sram], self.top[sram])

    @staticmethod
    def _stage(node: Any) -> tuple[Any, list[tuple[str, Any, Any]]]:
        """(leaf, loops) if ``node`` is a loop nest around exactly one leaf, else (None, [])."""
        loops = []
        while True:
            kind = _cls(node)
            if kind == "For":
                loops.append((node.loop_var.name, compiled(node.min), compiled(node.extent)))
                node = node.body
            elif kind == "SBlockRealize":
                node = node.block
            elif kind == "SBlock":
                if len(node.alloc_buffers):
                    return None, []
                node = node.body
            elif kind in ("BufferStore", "Evaluate"):
                return node, loops
            elif kind == "SeqStmt" and all(_cls(x) == "Evaluate" for x in node.seq):
                return node, loops  # an intrinsic implemented as several vector ops
            else:
                return None, []

    # ------------------------------------------------------------------ stages
    def _emit(self, leaf: Any, loops: list, env: Env) -> None:
        lp = []
        for name, lo_fn, ext_fn in loops:
            if int(lo_fn(env)) != 0:
                raise CodegenError(f"loop '{name}' does not start at 0")
            lp.append((name, int(ext_fn(env))))
        try:
            kind, what = node_cached("leaf", leaf, _leaf_kind)
            if kind == "seq":
                return self._alu_sequence(what, lp, env)
            if kind == CALL_GEMM:
                return self._gemm(what, lp, env)
            if kind == CALL_REQUANT:
                return self._requant(what, lp, env)
            if kind == CALL_ALU:
                return self._alu(what, lp, env)
            return self._store(leaf, lp, env)
        except ExprError as e:
            raise CodegenError(f"stage writing '{_target(leaf)}': {e}") from e

    def _tile(self, name: str) -> _Tile:
        t = self.tiles.get(name)
        if t is None or t.uses == 0:
            raise CodegenError(f"scratchpad buffer '{name}' is used before it is allocated")
        return t

    def _rows(self, name: str, off_fn, env: Env, lp) -> tuple[_Tile, int, list[int]]:
        """Tile, first row and row strides of an element-offset expression."""
        t = self._tile(name)
        unit = self.row_elems[t.sram]
        base, strides = affine(off_fn, env, lp)
        if base % unit or any(s % unit for s in strides):
            raise CodegenError(f"access to '{name}' is not aligned to whole "
                               f"{t.sram.upper()} rows of {unit} elements")
        return t, t.slot_base + base // unit, [s // unit for s in strides]

    def _gemm(self, call: Any, lp, env: Env) -> None:
        acc_name, acc_fn, inp_name, inp_fn, wgt_name, wgt_fn = node_cached(
            "gemm", call, lambda c: (_data(c.args[1]), compiled(c.args[2]), _data(c.args[3]),
                                     compiled(c.args[4]), _data(c.args[5]),
                                     compiled(c.args[6])))
        _, ab, as_ = self._rows(acc_name, acc_fn, env, lp)
        _, ib, is_ = self._rows(inp_name, inp_fn, env, lp)
        _, wb, ws = self._rows(wgt_name, wgt_fn, env, lp)
        levels = [(ext, s1, s2, s3) for (_, ext), s1, s2, s3 in zip(lp, as_, is_, ws)]
        for bases, nest in peel(levels, (ab, ib, wb), GEMM_LEVELS):
            reset = acc_name in self.pending_reset and self._take_reset(
                acc_name, touched(bases[0], [(e, s[0]) for e, *s in nest]))
            self.b.gemm(*bases, nest, reset=reset)

    def _requant(self, call: Any, lp, env: Env) -> None:
        dst, dst_fn, src, src_fn, par, par_fn, imm = node_cached(
            "requant", call, lambda c: (_data(c.args[1]), compiled(c.args[2]), _data(c.args[3]),
                                        compiled(c.args[4]), _data(c.args[5]),
                                        compiled(c.args[6]), int(c.args[7].value)))
        _, db, ds = self._rows(dst, dst_fn, env, lp)
        _, sb, ss = self._rows(src, src_fn, env, lp)
        _, pb, ps = self._rows(par, par_fn, env, lp)
        self._flush_reset(src)
        self._flush_reset(dst)
        levels = [(ext, s1, s2, s3) for (_, ext), s1, s2, s3 in zip(lp, ds, ss, ps)]
        for bases, nest in peel(levels, (db, sb, pb), ALU_LEVELS):
            self.b.alu(AluOp.REQUANT, *bases, nest, imm=imm)

    def _alu_operands(self, call: Any, lp, env: Env) -> dict[str, tuple[str, int, list[int]]]:
        """``dsa.alu(op, dst, dst_off, a, a_off, b, b_off, imm, use_imm)``: buffer, first row
        and row strides of dst, a and (tensor form) b over the stage's loops."""
        ops = {}
        for key, name, fn in _alu_call(call)[3]:
            _, base, strides = self._rows(name, fn, env, lp)
            ops[key] = (name, base, strides)
        return ops

    def _alu(self, call: Any, lp, env: Env) -> None:
        """One ALU instruction (more when the nest has more levels than the format)."""
        op, imm, use_imm, _ = _alu_call(call)
        ops = self._alu_operands(call, lp, env)
        b_base, b_strides = (ops["b"][1], ops["b"][2]) if "b" in ops else (0, [0] * len(lp))
        levels = [(ext, s1, s2, s3) for (_, ext), s1, s2, s3
                  in zip(lp, ops["dst"][2], ops["a"][2], b_strides)]
        bases = (ops["dst"][1], ops["a"][1], b_base)
        first = self._absorb_init(op, ops, use_imm, lp)
        if first is not None:  # the reduction's first step writes the initial value
            for box_bases, box, is_first in first_step_split(levels, bases):
                for bb, nest in peel(box, box_bases, ALU_LEVELS):
                    self.b.alu(first if is_first else op, *bb, nest, imm=imm, use_imm=use_imm)
            return
        # every buffer the op touches must hold its initial value first (the op reads it,
        # or overwrites it and a later op must not see the init still pending)
        for name in {opnd[0] for opnd in ops.values()}:
            self._flush_reset(name)
        for bb, nest in peel(levels, bases, ALU_LEVELS):
            self.b.alu(op, *bb, nest, imm=imm, use_imm=use_imm)

    #: accumulating op -> (op of its first step, initial value that step makes redundant)
    _FIRST_STEP = {AluOp.MAC: (AluOp.MUL, 0), AluOp.MAC8: (AluOp.MUL, 0),
                   AluOp.ADD: (AluOp.MOV, 0),
                   AluOp.MAX: (AluOp.MOV, INT32_MIN), AluOp.MIN: (AluOp.MOV, INT32_MAX)}

    def _absorb_init(self, op: AluOp, ops: dict, use_imm: bool, lp) -> AluOp | None:
        """The op for the first reduction step when it can absorb the destination's
        pending init (as a GEMM absorbs a zero init in its reset flag): the op
        accumulates into its destination (MAC; ADD/MAX/MIN reading the destination as
        source A, tensor form), the init is that op's identity, and it covers exactly the
        rows this nest writes. The init is then taken off the pending list."""
        if op not in self._FIRST_STEP or (op not in ACCUMULATING_OPS
                                          and (use_imm or ops["a"] != ops["dst"])):
            return None
        name, base, strides = ops["dst"]
        first, identity = self._FIRST_STEP[op]
        pend = self.pending_reset.get(name)
        if pend is None or self.init_value.get(name) != identity:
            return None
        if touched(base, [(ext, s) for (_, ext), s in zip(lp, strides)]) != pend:
            return None
        del self.pending_reset[name]
        del self.init_value[name]
        return first

    def _alu_sequence(self, calls: list[Any], lp, env: Env) -> None:
        """Several vector ops implementing one intrinsic, each over the whole loop nest in
        turn (loop distribution). That is the same computation only when every point of
        the nest writes its own rows and a row one op writes is read or written by the
        others at the same point, which is checked here."""
        for c in calls:
            if _callee(c) != CALL_ALU:
                raise CodegenError(f"an intrinsic sequence may only hold '{CALL_ALU}' calls, "
                                   f"got '{_callee(c)}'")
        operands = [self._alu_operands(c, lp, env) for c in calls]
        written = {ops["dst"][0]: ops["dst"] for ops in operands}
        for ops in operands:
            name, _, strides = ops["dst"]
            if any(ext > 1 and st == 0 for (_, ext), st in zip(lp, strides)):
                raise CodegenError(f"intrinsic sequence writing '{name}' reduces over a loop; "
                                   f"only element-wise sequences can be distributed")
            for opnd in ops.values():
                if opnd[0] in written and opnd != written[opnd[0]]:
                    raise CodegenError(f"intrinsic sequence touches '{opnd[0]}' at different "
                                       f"rows in different ops; it cannot be distributed")
        for c in calls:
            self._alu(c, lp, env)

    def _store(self, st: Any, lp, env: Env) -> None:
        plan = node_cached("copy", st, _copy_plan)
        if plan.kind == "init":
            return self._init(st, lp, env, plan.init_value)
        if plan.kind == "load":
            return self._dma_load(plan, lp, env)
        return self._dma_store(plan, lp, env)

    def _init(self, st: Any, lp, env: Env, value: int) -> None:
        """Record an accumulator tile's initial value; a GEMM absorbs a zero init as its
        reset flag, anything else becomes an ALU MOV when the tile is first read."""
        nest = _drop_lane_loop(st, lp, self.row_elems["acc"])
        lane_env = {**env, lp[-1][0]: 0}
        _, base, strides = self._rows(st.buffer.name, store_offset(st), lane_env, nest)
        rows = touched(base, [(ext, s) for (_, ext), s in zip(nest, strides)])
        name = st.buffer.name
        if name in self.pending_reset and self.init_value.get(name) != value:
            self._flush_reset(name)
        prev = self.pending_reset.get(name)
        self.pending_reset[name] = rows if prev is None else prev | rows
        self.init_value[name] = value

    def _take_reset(self, name: str, rows: frozenset[int]) -> bool:
        pend = self.pending_reset.get(name)
        if pend is None:
            return False
        if self.init_value.get(name, 0) != 0:
            self._flush_reset(name)
            return False
        if not rows <= pend:
            if not rows.isdisjoint(pend):
                self._flush_reset(name)
            return False
        rest = pend - rows
        if rest:
            self.pending_reset[name] = rest
        else:
            del self.pending_reset[name]
        return True

    def _flush_reset(self, name: str) -> None:
        """Fill rows whose init no GEMM absorbed (an ALU MOV per contiguous run)."""
        rows = self.pending_reset.pop(name, None)
        if rows is None:
            return
        value = self.init_value.pop(name, 0)
        rows = sorted(rows)
        start = 0
        for k in range(1, len(rows) + 1):
            if k == len(rows) or rows[k] != rows[k - 1] + 1:
                self.b.alu(AluOp.MOV, rows[start], rows[start], 0, [(k - start, 1, 1, 0)],
                           imm=value, use_imm=True)
                start = k

    # ------------------------------------------------------------------ DMA
    def _dma_load(self, plan: "_Copy", lp, env: Env) -> None:
        region = self._region(plan.dram)
        t = self._tile(plan.sram)
        unit = self.row_elems[t.sram]
        sram_fn, dram_fn = plan.sram_fn, plan.dram_fn
        rows_lp, dst_b, dst_s, src_b, src_s = self._vector_split(
            plan.sram, lp, env, sram_fn, dram_fn, unit)
        pad_value = 0 if plan.pad_fn is None else int(plan.pad_fn(env))
        pads = [(0, 0)] * len(rows_lp)
        if plan.cond is not None and rows_lp:
            pads = pad_box(plan.cond, env, rows_lp)
            first = {**env, **{n: 0 for n, _ in lp},
                     **{n: lo for (n, _), (lo, _) in zip(rows_lp, pads)}}
            src_b = int(dram_fn(first))
        if src_b % unit:
            raise CodegenError(f"DRAM read of '{plan.dram}' is not aligned to {unit}-element rows")
        buf = {"inp": Buffer.INP, "wgt": Buffer.WGT, "acc": Buffer.ACC}[t.sram]
        if buf == Buffer.ACC:  # int8 / int16 DRAM widened into int32 lanes
            buf = _NARROW.get(np.dtype(region.dtype).name, Buffer.ACC)
        dram0 = self._dram_addr(region, src_b, buf)
        levels = [(ext, ds, ss // unit, pl, ph) for (_, ext), ds, ss, (pl, ph)
                  in zip(rows_lp, dst_s, src_s, pads)]
        what = f"copy into '{plan.sram}'"
        for kind, dst_row, src_el, shape in dma_shapes(
                levels, t.slot_base + dst_b // unit, dram0, what):
            if kind == "load":
                y, x, stride, p = shape
                # ACC loads too go on the load engine: the derived tokens order them
                self.b.load(buf, dst_row, src_el, y, x, stride, pad=p, pad_value=pad_value,
                            prefetch=buf in ACC_BUFFERS)
            elif t.sram == "acc":  # border rows the LOAD pad fields cannot hold
                self.b.alu(AluOp.MOV, dst_row, dst_row, 0, [(shape, 1, 1, 0)], imm=pad_value,
                           use_imm=True)
            else:
                raise CodegenError(f"{what}: {shape} rows of padding exceed the "
                                   f"{MAX_PAD}-row LOAD pad fields")

    def _dma_store(self, plan: "_Copy", lp, env: Env) -> None:
        region = self._region(plan.dram)
        unit = self.row_elems["acc"]
        rows_lp, src_b, src_s, dst_b, dst_s = self._vector_split(
            plan.sram, lp, env, plan.sram_fn, plan.dram_fn, unit)
        t = self._tile(plan.sram)
        buf = _NARROW.get(plan.narrow, Buffer.ACC)
        dram0 = self._dram_addr(region, dst_b, buf)
        levels = [(ext, ss, ds // unit, 0, 0) for (_, ext), ss, ds in zip(rows_lp, src_s, dst_s)]
        for _, src_row, dst_el, (y, x, stride, _p) in dma_shapes(
                levels, t.slot_base + src_b // unit, dram0, f"store of '{plan.dram}'"):
            self.b.store(buf, src_row, dst_el, y, x, stride)

    def _vector_split(self, name, lp, env, sram_fn, dram_fn, unit):
        """Split a copy's loops into the element vector (innermost, one row) and row loops."""
        _, s_strides = affine(sram_fn, env, lp)
        _, d_strides = affine(dram_fn, env, lp)
        k, covered = len(lp), 1
        while k > 0 and covered < unit:
            k -= 1
            ext = lp[k][1]
            if s_strides[k] != covered or d_strides[k] != covered:
                raise CodegenError(f"copy of '{name}': elements of one row are not contiguous")
            covered *= ext
        if covered != unit:
            raise CodegenError(f"copy of '{name}': the innermost loops cover {covered} elements, "
                               f"not one {unit}-element row")
        rows_lp = lp[:k]
        at0 = {**env, **{n: 0 for n, _ in lp}}
        return (rows_lp, int(sram_fn(at0)), [s // unit for s in s_strides[:k]],
                int(dram_fn(at0)), d_strides[:k])

    def _region(self, name: str) -> Region:
        try:
            return self.dram[name]
        except KeyError:
            raise CodegenError(f"DRAM buffer '{name}' has no program region") from None

    def _dram_addr(self, region: Region, elem: int, buf: Buffer) -> int:
        byte = region.offset + elem * np.dtype(region.dtype).itemsize
        unit = self.cfg.element_bytes(buf)
        if byte % unit:
            raise CodegenError(f"DRAM address in '{region.name}' not aligned to {unit} bytes")
        return byte // unit


# ---------------------------------------------------------------------- helpers
def _target(leaf: Any) -> str:
    return leaf.buffer.name if _cls(leaf) == "BufferStore" else "intrinsic call"


def _callee(call: Any) -> str:
    return call.args[0].value if len(call.args) else ""


def _data(arg: Any) -> str:
    """Buffer name behind ``buf.data`` in an extern call."""
    if _cls(arg) == "Call" and arg.op.name == "tirx.buffer_data":
        return arg.args[0].name
    if _cls(arg) == "Var":
        return arg.name
    raise CodegenError(f"intrinsic argument {arg} is not a buffer")


def _for_info(node: Any):
    """A For's stage (leaf, loops), loop variable, min, extent, body, double buffering."""
    return node_cached("for", node, lambda n: (
        *TirWalker._stage(n), n.loop_var.name, compiled(n.min), compiled(n.extent), n.body,
        ANN_DOUBLE_BUFFER in n.annotations))


def _scratchpad_size(buf: Any) -> tuple[str, int]:
    """(scratchpad, elements) of a tile buffer."""
    scope = buf.scope()
    if scope not in SCOPES:
        raise CodegenError(f"buffer '{buf.name}' is in scope '{scope}', not a DSA scratchpad")
    return SCOPES[scope], math.prod(int(d) for d in buf.shape)


@dataclass(frozen=True)
class _Copy:
    """What a BufferStore stage is: an accumulator init, a DRAM -> scratchpad copy (load)
    or a scratchpad -> DRAM copy (store), with its buffers and offset evaluators."""

    kind: str                 # "init" | "load" | "store"
    sram: str = ""            # scratchpad tile buffer
    dram: str = ""            # DRAM buffer
    sram_fn: Any = None
    dram_fn: Any = None
    cond: Any = None          # a load's padding condition (TIR), if any
    pad_fn: Any = None        # evaluator of a load's padding value
    init_value: int = 0       # an init's value
    narrow: str = ""          # a store that narrows int32 lanes: to "int8" or "int16"


#: the accumulator buffer that moves int32 lanes to and from a narrower DRAM type
_NARROW = {"int8": Buffer.ACC8, "int16": Buffer.ACC16}


def _copy_plan(st: Any) -> _Copy:
    dst, value = st.buffer, st.value
    scope = dst.scope()
    if scope in SCOPES:
        if _cls(value) == "IntImm":
            if SCOPES[scope] != "acc":
                raise CodegenError(f"only accumulator tiles can be initialized, "
                                   f"got '{dst.name}' = {value.value}")
            return _Copy("init", init_value=int(value.value))
        while _cls(value) == "Cast":
            value = value.value
        cond = pad_fn = None
        if _cls(value) == "Call" and value.op.name.endswith("if_then_else"):
            cond, value, pad = value.args
            pad_fn = compiled(pad)
        if _cls(value) != "TensorLoad":
            raise CodegenError(f"copy into '{dst.name}' is not a plain DRAM read")
        return _Copy("load", dst.name, value.source.name, store_offset(st), load_offset(value),
                     cond, pad_fn)
    narrow = ""
    if _cls(value) == "Cast":
        narrow = str(dst.dtype) if str(dst.dtype) in _NARROW else ""
        value = value.value
    if _cls(value) != "TensorLoad" or value.source.scope() not in SCOPES:
        raise CodegenError(f"write of DRAM '{dst.name}' is not a scratchpad copy")
    return _Copy("store", value.source.name, dst.name, load_offset(value), store_offset(st),
                 narrow=narrow)


def _alu_call(call: Any) -> tuple[AluOp, int, bool, list[tuple[str, str, Any]]]:
    """(op, imm, use_imm, [(operand, buffer, offset evaluator)]) of a ``dsa.alu`` call."""
    def decode(c):
        a = c.args
        use_imm = bool(int(a[9].value))
        keys = (("dst", 2), ("a", 4)) + ((("b", 6),) if not use_imm else ())
        return (AluOp(int(a[1].value)), int(a[8].value), use_imm,
                [(key, _data(a[k]), compiled(a[k + 1])) for key, k in keys])
    return node_cached("alu", call, decode)


def _leaf_kind(leaf: Any) -> tuple[str, Any]:
    """("seq", calls) for an intrinsic made of several vector ops, (callee, call) for an
    intrinsic call, ("store", leaf) for a copy or an init."""
    if _cls(leaf) == "SeqStmt":
        return "seq", [ev.value for ev in leaf.seq]
    if _cls(leaf) == "Evaluate":
        callee = _callee(leaf.value)
        if callee not in (CALL_GEMM, CALL_REQUANT, CALL_ALU):
            raise CodegenError(f"unknown intrinsic call '{callee}'")
        return callee, leaf.value
    return "store", leaf


def _drop_lane_loop(st: Any, lp, lanes: int):
    """Loops of an element-wise accumulator stage without the innermost lane loop."""
    if not lp or lp[-1][1] != lanes:
        raise CodegenError(f"stage writing '{st.buffer.name}' has no innermost "
                           f"{lanes}-lane loop")
    return lp[:-1]

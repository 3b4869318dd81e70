"""DSA tensor intrinsics for ``sch.tensorize``: one MAC-array step, one requantize row,
and one accumulator row of a vector op (element-wise, a reduction step, the residual add).

Each is registered once per array shape (and per immediate: the requantize zero
point and clip range, an ALU immediate). The implementations leave extern calls
with element offsets that the TIR walker turns into GEMM / ALU instructions.
"""

from __future__ import annotations

from functools import cache

import tvm
from tvm.script import tirx as T

from dsa_tvm.isa.instructions import AluOp
from dsa_tvm.isa.semantics import pack_requant_imm
from dsa_tvm.layers.ir import WIDE_CLIP

from .names import (
    CALL_ALU,
    CALL_GEMM,
    CALL_REQUANT,
    SCALAR_REQUANT,
    SCOPE_ACC,
    SCOPE_INP,
    SCOPE_WGT,
)


class _Script:
    """``T.prim_func(s_tir=True)`` for the intrinsics, parsed the same way without the
    two ``inspect.stack()`` walks the stock decorator makes (one when applied, one when
    the parser evaluates the decorator): most of an intrinsic's registration time.
    Only for functions whose annotations name module globals (``T.handle``)."""

    @staticmethod
    def prim_func(s_tir: bool = False):
        def wrapper(func):
            from tvm.script.parser._core import parse, utils

            extra_vars = utils.inspect_function_capture(func)
            utils.resolve_closure_vars(func, extra_vars, [])
            f = parse(func, extra_vars, check_well_formed=True)
            f.__name__ = func.__name__
            return f

        wrapper.dispatch_token = "tirx"
        return wrapper


@cache
def gemm_intrin(block_in: int, block_out: int) -> str:
    """``acc[o] += inp[i] * wgt[o, i]`` over one block_out x block_in tile: one array step."""
    bi, bo = block_in, block_out
    name = f"dsa.gemm_{bo}x{bi}"

    @_Script.prim_func(s_tir=True)
    def desc(a: T.handle, w: T.handle, c: T.handle):
        A = T.match_buffer(a, (bi,), "int8", offset_factor=1, scope=SCOPE_INP)
        W = T.match_buffer(w, (bo, bi), "int8", offset_factor=1, scope=SCOPE_WGT)
        C = T.match_buffer(c, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(C[0:bo], A[0:bi], W[0:bo, 0:bi])
            T.writes(C[0:bo])
            for o, i in T.grid(bo, bi):
                with T.sblock("update"):
                    vo, vi = T.axis.remap("SR", [o, i])
                    C[vo] = C[vo] + T.Cast("int32", A[vi]) * T.Cast("int32", W[vo, vi])

    @_Script.prim_func(s_tir=True)
    def impl(a: T.handle, w: T.handle, c: T.handle):
        A = T.match_buffer(a, (bi,), "int8", offset_factor=1, scope=SCOPE_INP)
        W = T.match_buffer(w, (bo, bi), "int8", offset_factor=1, scope=SCOPE_WGT)
        C = T.match_buffer(c, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(C[0:bo], A[0:bi], W[0:bo, 0:bi])
            T.writes(C[0:bo])
            T.evaluate(T.call_extern("int32", CALL_GEMM, C.data, C.elem_offset, A.data,
                                     A.elem_offset, W.data, W.elem_offset))

    tvm.s_tir.TensorIntrin.register(name, desc, impl, override=True)
    return name


@cache
def requant_intrin(block_out: int, zero_point: int, lo: int, hi: int,
                   src_dtype: str = "int32") -> str:
    """One accumulator row through the output stage (bias, scale, zero point, clamp).

    ``src_dtype`` int8: the source row was loaded from int8 DRAM (ACC8, widened on
    load), as when a layer requantizes its input directly (Rescale). ``(lo, hi)`` =
    ``WIDE_CLIP``: REQUANT's wide mode (an int16 output)."""
    bo = block_out
    wide = (lo, hi) == WIDE_CLIP
    imm = pack_requant_imm(zero_point, wide=True) if wide else pack_requant_imm(zero_point, lo, hi)
    name = f"dsa.requant_{bo}_{zero_point}_{lo}_{hi}_{src_dtype}"

    def src(x):
        return x if src_dtype == "int32" else T.Cast("int32", x)

    @_Script.prim_func(s_tir=True)
    def desc(s: T.handle, p: T.handle, d: T.handle):
        S = T.match_buffer(s, (bo,), src_dtype, offset_factor=1, scope=SCOPE_ACC)
        P = T.match_buffer(p, (3, bo), "int32", offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(S[0:bo], P[0:3, 0:bo])
            T.writes(D[0:bo])
            for o in T.serial(bo):
                with T.sblock("requant"):
                    vo = T.axis.remap("S", [o])
                    D[vo] = T.call_pure_extern("int32", SCALAR_REQUANT, src(S[vo]), P[0, vo],
                                               P[1, vo], P[2, vo], zero_point, lo, hi)

    @_Script.prim_func(s_tir=True)
    def impl(s: T.handle, p: T.handle, d: T.handle):
        S = T.match_buffer(s, (bo,), src_dtype, offset_factor=1, scope=SCOPE_ACC)
        P = T.match_buffer(p, (3, bo), "int32", offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(S[0:bo], P[0:3, 0:bo])
            T.writes(D[0:bo])
            T.evaluate(T.call_extern("int32", CALL_REQUANT, D.data, D.elem_offset, S.data,
                                     S.elem_offset, P.data, P.elem_offset, imm))

    tvm.s_tir.TensorIntrin.register(name, desc, impl, override=True)
    return name


_ALU_EXPR = {
    # op: (expression of (d, a, b) for the scalar body of an element-wise row)
    "add": lambda d, a, b: a + b,
    "sub": lambda d, a, b: a - b,
    "mul": lambda d, a, b: a * b,
    "mac": lambda d, a, b: d + a * b,
    "mac8": lambda d, a, b: d + a * b,   # int8 operands: their low bytes are themselves
    "min": lambda d, a, b: T.min(a, b),
    "max": lambda d, a, b: T.max(a, b),
}


def _widen(x, dtype: str):
    """An operand as the int32 lane value the ALU sees (int8 tiles were widened on load)."""
    return x if dtype == "int32" else T.Cast("int32", x)


def _alu_call(op: str, d, a, b, imm: int = 0, use_imm: int = 0, rows=0):
    """One ALU call; ``rows``: elements past ``a``'s and ``b``'s offsets (a later row of
    the same buffer)."""
    return T.call_extern("int32", CALL_ALU, int(AluOp[op.upper()]), d.data, d.elem_offset,
                         a.data, a.elem_offset + rows, b.data, b.elem_offset + rows, imm,
                         use_imm)


@cache
def alu_intrin(op: str, block_out: int, a_dtype: str = "int32", b_dtype: str = "int32",
               imm: int | None = None) -> str:
    """One accumulator row of a vector op: ``d[o] = f(d[o], a[o], b[o] or imm)``.

    ``op`` is one of add, sub, mul, mac, mac8 (int8 operands), min, max; operands in the accumulator
    scratchpad are int32 lanes (``a_dtype``/``b_dtype`` int8 when they were loaded
    from int8 DRAM, widened on load). ``imm`` selects the immediate form. Only mac
    reads ``d``: the description's read set says so, or a stage that never reads its
    output would not match the other ops."""
    bo = block_out
    expr = _ALU_EXPR[op]
    reads_dst = op in ("mac", "mac8")
    name = f"dsa.alu_{op}_{bo}_{a_dtype}_{b_dtype}_{'t' if imm is None else f'i{imm}'}"

    if imm is None:
        @_Script.prim_func(s_tir=True)
        def desc(a: T.handle, b: T.handle, d: T.handle):
            A = T.match_buffer(a, (bo,), a_dtype, offset_factor=1, scope=SCOPE_ACC)
            B = T.match_buffer(b, (bo,), b_dtype, offset_factor=1, scope=SCOPE_ACC)
            D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
            with T.sblock("root"):
                if reads_dst:
                    T.reads(D[0:bo], A[0:bo], B[0:bo])
                else:
                    T.reads(A[0:bo], B[0:bo])
                T.writes(D[0:bo])
                for o in T.serial(bo):
                    with T.sblock("alu"):
                        vo = T.axis.remap("S", [o])
                        D[vo] = expr(D[vo], _widen(A[vo], a_dtype), _widen(B[vo], b_dtype))

        @_Script.prim_func(s_tir=True)
        def impl(a: T.handle, b: T.handle, d: T.handle):
            A = T.match_buffer(a, (bo,), a_dtype, offset_factor=1, scope=SCOPE_ACC)
            B = T.match_buffer(b, (bo,), b_dtype, offset_factor=1, scope=SCOPE_ACC)
            D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
            with T.sblock("root"):
                T.reads(D[0:bo], A[0:bo], B[0:bo])
                T.writes(D[0:bo])
                T.evaluate(_alu_call(op, D, A, B))
    else:
        @_Script.prim_func(s_tir=True)
        def desc(a: T.handle, d: T.handle):
            A = T.match_buffer(a, (bo,), a_dtype, offset_factor=1, scope=SCOPE_ACC)
            D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
            with T.sblock("root"):
                if reads_dst:
                    T.reads(D[0:bo], A[0:bo])
                else:
                    T.reads(A[0:bo])
                T.writes(D[0:bo])
                for o in T.serial(bo):
                    with T.sblock("alu"):
                        vo = T.axis.remap("S", [o])
                        D[vo] = expr(D[vo], _widen(A[vo], a_dtype), T.int32(imm))

        @_Script.prim_func(s_tir=True)
        def impl(a: T.handle, d: T.handle):
            A = T.match_buffer(a, (bo,), a_dtype, offset_factor=1, scope=SCOPE_ACC)
            D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
            with T.sblock("root"):
                T.reads(D[0:bo], A[0:bo])
                T.writes(D[0:bo])
                T.evaluate(_alu_call(op, D, A, A, imm, 1))

    tvm.s_tir.TensorIntrin.register(name, desc, impl, override=True)
    return name


_ACC_EXPR = {
    "add": lambda d, a: d + a,
    "max": lambda d, a: T.max(d, a),
    "min": lambda d, a: T.min(d, a),
}


@cache
def acc_intrin(op: str, block_out: int, a_dtype: str = "int32") -> str:
    """One reduction step into an accumulator row: ``d[o] = d[o] + a[o]`` (or max/min).

    This is the update block of a sum or max reduction (pools, global average
    pool): the ALU op reads the destination as its source A and the tile as B; the
    reduction loops around it become ALU levels with destination stride 0."""
    bo = block_out
    expr = _ACC_EXPR[op]
    name = f"dsa.acc_{op}_{bo}_{a_dtype}"

    @_Script.prim_func(s_tir=True)
    def desc(a: T.handle, d: T.handle):
        A = T.match_buffer(a, (bo,), a_dtype, offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(D[0:bo], A[0:bo])
            T.writes(D[0:bo])
            for o in T.serial(bo):
                with T.sblock("acc"):
                    vo = T.axis.remap("S", [o])
                    D[vo] = expr(D[vo], _widen(A[vo], a_dtype))

    @_Script.prim_func(s_tir=True)
    def impl(a: T.handle, d: T.handle):
        A = T.match_buffer(a, (bo,), a_dtype, offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(D[0:bo], A[0:bo])
            T.writes(D[0:bo])
            T.evaluate(_alu_call(op, D, D, A))

    tvm.s_tir.TensorIntrin.register(name, desc, impl, override=True)
    return name


#: scalar body of the residual-add stage, ``a * a_mult + b * b_mult`` (int32 wrap-around):
#: an opaque call, so TVM's simplifier cannot reorder the sum away from the intrinsic's
#: description (it sorts the operands of a plain ``+``)
SCALAR_AXPBY = "dsa.axpby_scalar"


@cache
def axpby_intrin(block_out: int, a_mult: int, b_mult: int, a_dtype: str = "int8",
                 b_dtype: str = "int8") -> str:
    """``d[o] = a[o] * a_mult + b[o] * b_mult`` as two vector ops into ``d``: MUL then MAC
    (immediate forms).

    A single TIR stage cannot update its output in place, and a reduction whose
    init reads a tensor loses that read in ``decompose_reduction``; one intrinsic
    whose implementation is two calls keeps the residual add at two ALU passes.
    The walker runs the calls one after the other over the stage's loop nest."""
    bo = block_out
    name = f"dsa.axpby_{bo}_{a_mult}_{b_mult}_{a_dtype}_{b_dtype}"

    @_Script.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, d: T.handle):
        A = T.match_buffer(a, (bo,), a_dtype, offset_factor=1, scope=SCOPE_ACC)
        B = T.match_buffer(b, (bo,), b_dtype, offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(A[0:bo], B[0:bo])
            T.writes(D[0:bo])
            for o in T.serial(bo):
                with T.sblock("axpby"):
                    vo = T.axis.remap("S", [o])
                    D[vo] = T.call_pure_extern("int32", SCALAR_AXPBY, _widen(A[vo], a_dtype),
                                               _widen(B[vo], b_dtype), a_mult, b_mult)

    @_Script.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, d: T.handle):
        A = T.match_buffer(a, (bo,), a_dtype, offset_factor=1, scope=SCOPE_ACC)
        B = T.match_buffer(b, (bo,), b_dtype, offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(A[0:bo], B[0:bo])
            T.writes(D[0:bo])
            T.evaluate(_alu_call("mul", D, A, A, a_mult, 1))
            T.evaluate(_alu_call("mac", D, B, B, b_mult, 1))

    tvm.s_tir.TensorIntrin.register(name, desc, impl, override=True)
    return name


#: scalar body of a dense's byte-plane join, ``hi * mult + rshift_round(lo, shift)``:
#: opaque, as ``SCALAR_AXPBY``
SCALAR_JOIN_SHIFTED = "dsa.join_shifted_scalar"


@cache
def join_rows_intrin(block_out: int, a_mult: int = 1, lo_shift: int | None = None,
                     units: int = 1) -> str:
    """Two rows of one buffer (byte planes' sums, ``s0`` apart on its first axis, then
    ``units`` axes of extent 1 (the row's other loops, so tensorize matches a pair of a
    larger accumulator) and the lanes) joined into ``d`` by two immediate-form ALU ops:

    * ``lo_shift`` None: ``d = a[0] * a_mult + a[1]``, MUL then MAC (the batch matmul's
      exact join, ``layers.reference.join_planes``);
    * else ``d = rshift_round(a[1], lo_shift) + a[0] * a_mult``, SHR then MAC (the dense's
      join, ``join_planes_shifted``)."""
    bo = block_out
    name = f"dsa.join_rows_{bo}_{a_mult}_{lo_shift}_{units}"
    shape = (2,) + (1,) * units + (bo,)
    if units not in (1, 2):
        raise ValueError(f"join_rows_intrin: units {units} (1 or 2)")

    def joined(hi, lo):
        if lo_shift is not None:
            return T.call_pure_extern("int32", SCALAR_JOIN_SHIFTED, hi, lo, a_mult, lo_shift)
        return T.call_pure_extern("int32", SCALAR_AXPBY, hi, lo, a_mult, 1)

    def calls(D, A, s0):
        if lo_shift is not None:
            return (_alu_call("shr", D, A, A, lo_shift, 1, rows=s0),
                    _alu_call("mac", D, A, A, a_mult, 1))
        return (_alu_call("mul", D, A, A, a_mult, 1), _alu_call("mac", D, A, A, 1, 1, rows=s0))

    @_Script.prim_func(s_tir=True)
    def desc(a: T.handle, d: T.handle):
        s0, s1, s2 = T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, shape, "int32", strides=[s0, s1, s2][:units + 1] + [1],
                           offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(A[0:2, *([0] * units), 0:bo])
            T.writes(D[0:bo])
            for o in T.serial(bo):
                with T.sblock("join"):
                    vo = T.axis.remap("S", [o])
                    D[vo] = joined(A[0, *([0] * units), vo], A[1, *([0] * units), vo])

    @_Script.prim_func(s_tir=True)
    def impl(a: T.handle, d: T.handle):
        s0, s1, s2 = T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, shape, "int32", strides=[s0, s1, s2][:units + 1] + [1],
                           offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(A[0:2, *([0] * units), 0:bo])
            T.writes(D[0:bo])
            T.evaluate(calls(D, A, s0)[0])
            T.evaluate(calls(D, A, s0)[1])

    tvm.s_tir.TensorIntrin.register(name, desc, impl, override=True)
    return name


#: scalar body of a grouped dense's group stage, ``rshift_round(p * scale + s * offset,
#: shift)`` (int32 wrap-around): opaque, as ``SCALAR_AXPBY``
SCALAR_GROUP_SCALE = "dsa.group_scale_scalar"


@cache
def group_scale_intrin(block_out: int) -> str:
    """One row of a group's partial sums ``p`` scaled by the group's factors: ``d =
    rshift_round(p * g[0] + s * g[1], h)`` with ``s`` the group's input sum (every lane),
    ``g`` the group's two int16 factor rows and ``h`` a row of shifts (a byte plane's).
    Three vector ops into ``d``: MUL, MAC, SHR (``tir_schedules.kinds.grouped_dense``)."""
    bo = block_out
    name = f"dsa.group_scale_{bo}"

    @_Script.prim_func(s_tir=True)
    def desc(p: T.handle, s: T.handle, g: T.handle, h: T.handle, d: T.handle):
        s0 = T.int32()
        P = T.match_buffer(p, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        S = T.match_buffer(s, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        G = T.match_buffer(g, (2, bo), "int16", strides=[s0, 1], offset_factor=1,
                           scope=SCOPE_ACC)
        H = T.match_buffer(h, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(P[0:bo], S[0:bo], G[0:2, 0:bo], H[0:bo])
            T.writes(D[0:bo])
            for o in T.serial(bo):
                with T.sblock("group_scale"):
                    vo = T.axis.remap("S", [o])
                    D[vo] = T.call_pure_extern("int32", SCALAR_GROUP_SCALE, P[vo], S[vo],
                                               T.Cast("int32", G[0, vo]),
                                               T.Cast("int32", G[1, vo]), H[vo])

    @_Script.prim_func(s_tir=True)
    def impl(p: T.handle, s: T.handle, g: T.handle, h: T.handle, d: T.handle):
        s0 = T.int32()
        P = T.match_buffer(p, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        S = T.match_buffer(s, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        G = T.match_buffer(g, (2, bo), "int16", strides=[s0, 1], offset_factor=1,
                           scope=SCOPE_ACC)
        H = T.match_buffer(h, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        D = T.match_buffer(d, (bo,), "int32", offset_factor=1, scope=SCOPE_ACC)
        with T.sblock("root"):
            T.reads(P[0:bo], S[0:bo], G[0:2, 0:bo], H[0:bo])
            T.writes(D[0:bo])
            T.evaluate(T.call_extern("int32", CALL_ALU, int(AluOp.MUL), D.data, D.elem_offset,
                                     P.data, P.elem_offset, G.data, G.elem_offset, 0, 0))
            T.evaluate(T.call_extern("int32", CALL_ALU, int(AluOp.MAC), D.data, D.elem_offset,
                                     S.data, S.elem_offset, G.data, G.elem_offset + s0, 0, 0))
            T.evaluate(_alu_call("shr", D, D, H))

    tvm.s_tir.TensorIntrin.register(name, desc, impl, override=True)
    return name

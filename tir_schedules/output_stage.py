"""The output stage of the vector-unit layers: the ``requant`` and ``y`` stages of their
compute, and where their schedules place and tensorize them.

``params[cb, 3, c]`` holds bias, multiplier, shift per channel; the channel block is
the second-to-last axis of the accumulator stage.
"""

from __future__ import annotations

from tvm import s_tir, te, tirx

from dsa_tvm.layers.ir import WIDE_CLIP

from .intrinsics import requant_intrin
from .names import SCALAR_REQUANT, SCOPE_ACC


def requant_stage(acc: te.Tensor, params: te.Tensor, zp: int, clip: tuple[int, int],
                  widen: bool = False) -> te.Tensor:
    """The ``requant`` and ``y`` stages after ``acc`` (``widen``: a narrower ``acc``,
    widened on load); ``y`` is int16 when ``clip`` is REQUANT's wide mode."""
    lo, hi = clip

    def rq_value(*idx):
        ob, o = idx[-2], idx[-1]
        v = acc(*idx).astype("int32") if widen else acc(*idx)
        return tirx.call_pure_extern("int32", SCALAR_REQUANT, v, params[ob, 0, o],
                                     params[ob, 1, o], params[ob, 2, o], zp, lo, hi)

    rq = te.compute(acc.shape, rq_value, name="requant")
    out = "int16" if tuple(clip) == WIDE_CLIP else "int8"
    return te.compute(acc.shape, lambda *i: rq(*i).astype(out), name="y")


def place_output(sch: s_tir.Schedule, s, src_dtype: str, params_at, out_at,
                 placed: bool = False) -> None:
    """Place the output-stage table at ``params_at``, the requant (unless ``placed``
    already) and the store at ``out_at``, and tensorize the requant."""
    rq, y = sch.get_sblock("requant"), sch.get_sblock("y")
    sch.set_scope(rq, 0, SCOPE_ACC)
    if not placed:
        sch.reverse_compute_at(rq, out_at)
    sch.reverse_compute_at(y, out_at)
    prm = sch.cache_read(rq, 1, SCOPE_ACC)
    sch.compute_at(prm, params_at)
    sch.tensorize(sch.get_loops(rq)[-1],
                  requant_intrin(s.block, s.output_zp, s.clip[0], s.clip[1], src_dtype))

"""A batch matmul whose first operand is int16 (attention's P @ V with int16 probabilities)
as two int8 byte planes on the int8 MAC array.

A softmax row over a long context holds weights near ``1 / context``; on its int8 grid
(steps of 1/256) most of them round to 0 or 1/256. SmolLM2's probabilities on an int16
grid (``quant.api.SOFTMAX_OUT_WIDE``, NORM's ``out_wide``) cut the W8A8 step's KL
divergence from FP32 by 29% (``benchmarks/llm_qdq_proxy.py``, docs/llm.md). The array
multiplies int8 codes, so ``a`` is split exactly as a dense's int16 input is
(``dense_planes.split_layers``: ``a = 256 hi + lo``) and each plane runs through its own
batch matmul against ``b``, onto an int16 grid of its own:

* ``hi @ b`` onto a grid spanning twice the output's range (``2 R``, ``R`` the largest
  magnitude ``y``'s codes stand for): its rounding costs ``1/256`` of an output step at
  most. A hi share beyond ``2 R`` saturates there; since ``y`` clips at ``R``, that
  changes ``y`` only where the lo plane's share is itself beyond ``R``, against the hi
  share's sign (weights below 1/254 of a row, whose hi code is 0, on values far beyond
  the output's range).
* ``lo @ b`` onto the grid that holds its largest sum, ``128 * 128 * K`` codes: it never
  saturates.
* ``y = Add(p_hi, p_lo)`` with the two grids' factors.

Unlike a dense's planes, which share one matmul (the weights stream once), the two planes
need different grids, which a per-column requantize cannot give rows of one matrix; at
decode the second matmul reads ``b`` (the V cache) a second time. Every step is an
existing layer, so the integer reference and the DSA agree by construction.

When ``a`` is a softmax's in the same region, read by nothing else (attention's P @ V),
:func:`fuse_softmax_planes` does better: the softmax writes the planes itself, rows
interleaved (``Softmax.planes``: the int16 codes never cross DRAM) and one batch matmul
runs both against ``b``'s tiles, read once, joining the sums exactly in int32 before its
one requantize (``BatchMatmul.planes``): no plane grid, no joining add. That needs the
joined sum to stay within int32, which a softmax's non-negative codes (a row sums to
about ``1 / s_a``) guarantee; any other int16 ``a`` keeps the layers above.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers.ir import (
    WIDE_CLIP,
    Add,
    BatchMatmul,
    Layer,
    QTensor,
    Requant,
    Softmax,
    layer_inputs,
)
from dsa_tvm.lowering.region import lowering_supports

from .add import WIDE_ADD_MULT_BITS, add_multipliers
from .dense_planes import PLANE, join_fits, split_layers

#: the largest |code| of an int8 plane or operand
_CODE = 128


def output_range(y: QTensor, clip: tuple[int, int]) -> float:
    """``R``: the largest magnitude ``y``'s codes within ``clip`` stand for."""
    return max(abs(clip[0] - y.zero_point), abs(clip[1] - y.zero_point)) * y.scale


def plane_grids(a: QTensor, b: QTensor, y: QTensor, clip: tuple[int, int]
                ) -> tuple[float, float]:
    """The real steps ``(g_hi, g_lo)`` of the two planes' int16 partial sums (each the
    plane's share of ``y``: ``256 s_a s_b sum(hi b)`` and ``s_a s_b sum(lo b)``)."""
    most = _CODE * _CODE * int(a.shape[-1]) * a.scale * b.scale
    g_hi = min(2 * output_range(y, clip), PLANE * most) / sem.INT16_MAX
    return max(g_hi, 1e-30), max(most / sem.INT16_MAX, 1e-30)


def join_factors(a: QTensor, b: QTensor, y: QTensor, clip: tuple[int, int]
                 ) -> tuple[float, float]:
    """The real factors of the add that joins the planes: ``(g_hi / s_y, g_lo / s_y)``."""
    g_hi, g_lo = plane_grids(a, b, y, clip)
    return g_hi / y.scale, g_lo / y.scale


def planes_fit(a: QTensor, b: QTensor, y: QTensor, clip: tuple[int, int]) -> str | None:
    """None if the joining add takes the planes' factors (``dense_planes.join_fits``)."""
    return join_fits(join_factors(a, b, y, clip), y.scale)


def matmul_plane_layers(name: str, a: QTensor, b: QTensor, y: QTensor, clip: tuple[int, int],
                        on_device: bool) -> tuple[Layer, ...]:
    """The layers of ``y = a @ b`` for an int16 ``a`` (B, M, K) with zero point 0 and an
    int8 ``b`` (B, K, N), into ``y`` (B, M, N) with ``clip`` (int8 bounds or WIDE_CLIP)."""
    split, hi, lo = split_layers(name, a)
    g_hi, g_lo = plane_grids(a, b, y, clip)
    out = tuple(y.shape)
    p_hi = QTensor(f"{name}/p_hi", out, g_hi, 0, "int16")
    p_lo = QTensor(f"{name}/p_lo", out, g_lo, 0, "int16")

    def plane(t: QTensor, p: QTensor, factor: float) -> BatchMatmul:
        mult, shift = sem.quantize_multipliers(np.array([factor]))
        return BatchMatmul(p.name, t, b, p, Requant(mult, shift, 0, WIDE_CLIP), on_device)

    s_ab = a.scale * b.scale
    am, bm, sh = add_multipliers(*join_factors(a, b, y, clip),
                                 bits=(WIDE_ADD_MULT_BITS, WIDE_ADD_MULT_BITS))
    return (*split, plane(hi, p_hi, PLANE * s_ab / g_hi), plane(lo, p_lo, s_ab / g_lo),
            Add(name, p_hi, p_lo, y, am, bm,
                Requant(np.array([1], np.int32), np.array([sh], np.int32), y.zero_point, clip)))


def fuse_softmax_planes(layers: list[Layer], outputs: set[str],
                        cfg: HardwareConfig) -> list[Layer]:
    """``layers`` with each softmax -> byte-plane split -> two plane matmuls -> joining add
    (:func:`matmul_plane_layers` on a softmax's output) replaced by a softmax writing the
    planes and one planes batch matmul, when no tensor between them is read elsewhere or
    leaves the region (``outputs``), the joined sums fit int32 and ``cfg`` lowers both
    (the softmax's second staging tile must fit the accumulator)."""
    by_name = {ly.name: ly for ly in layers}
    made_by = {ly.output.name: ly for ly in layers}
    readers: dict[str, set[str]] = {}
    for ly in layers:
        for t in layer_inputs(ly):
            readers.setdefault(t.name, set()).add(ly.name)
    swap: dict[str, Layer] = {}
    drop: set[str] = set()
    for ly in layers:
        if not (isinstance(ly, BatchMatmul) and ly.name.endswith("/p_hi")):
            continue
        name = ly.name[:-len("/p_hi")]
        parts = [by_name.get(f"{name}{s}") for s in ("/hi", "/lo", "/p_lo", "")]
        if any(p is None for p in parts):
            continue
        hi, lo, p_lo, join = parts
        soft = made_by.get(hi.input.name)
        if not isinstance(soft, Softmax) or soft.planes:
            continue
        p = soft.output
        inner = {p.name: {hi.name, lo.name}, hi.output.name: {lo.name, ly.name},
                 lo.output.name: {p_lo.name}, ly.output.name: {join.name},
                 p_lo.output.name: {join.name}}
        if (any(readers.get(t, set()) != want for t, want in inner.items())
                or outputs & set(inner) or not _sums_fit(p, ly.b)):
            continue
        k = int(p.shape[-1])
        rows = tuple(p.shape[:-2]) + (2 * int(p.shape[-2]), k)
        planes = QTensor(f"{name}/planes", rows, p.scale, 0)
        a = ly.a                                          # the matmul's (B, M, K) view
        a2 = QTensor(planes.name, (a.shape[0], 2 * a.shape[1], k), p.scale, 0)
        y = join.output
        mult, shift = sem.quantize_multipliers(np.array([p.scale * ly.b.scale / y.scale]))
        pair = (dataclasses.replace(soft, output=planes, planes=True),
                BatchMatmul(name, a2, ly.b, y, Requant(mult, shift, y.zero_point,
                                                       join.requant.clip),
                            on_device=True, planes=True))
        if lowering_supports(pair, cfg) is not None:
            continue
        swap[soft.name], swap[join.name] = pair
        drop |= {hi.name, lo.name, ly.name, p_lo.name}
    return [swap.get(ly.name, ly) for ly in layers if ly.name not in drop]


def _sums_fit(p: QTensor, b: QTensor) -> bool:
    """True if the planes' joined sums (and ``256 * sum(hi b)`` on the way) stay within
    int32 for the softmax codes ``p``: non-negative, a row summing to at most ``1 / s_p``
    plus half a code an element (rounding), no code above int16."""
    k = int(p.shape[-1])
    total = min(sem.INT16_MAX * k, 1.01 / p.scale + k)   # a row's codes, at most
    # |256 sum(hi b)| <= 256 * 128 * sum(a / 256 + 1/2): the largest partial of the join
    return _CODE * (total + _CODE * k) < 2 ** 31 and b.zero_point == 0

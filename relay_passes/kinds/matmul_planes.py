"""A batch matmul with int16 operands (attention's probabilities, K or V with their cache)
as int8 byte planes on the int8 MAC array.

A softmax row over a long context holds weights near ``1 / context``; on its int8 grid
(steps of 1/256) most of them round to 0 or 1/256. SmolLM2's probabilities on an int16
grid (``quant.api.SOFTMAX_OUT_WIDE``, NORM's ``out_wide``) cut the W8A8 step's KL
divergence from FP32 by 29% (``benchmarks/llm_qdq_proxy.py``, docs/llm.md); K and V with
their cache on int16 grids take another fifth off (docs/llm.md). The array multiplies int8
codes, so the int16 operand is split exactly (``layers.plane_split``: ``x = 256 hi + lo``)
and each plane runs through its own batch matmul against the other operand, onto an int16
grid of its own:

* the hi plane's product onto a grid spanning twice the output's range (``2 R``, ``R``
  the largest magnitude ``y``'s codes stand for): its rounding costs ``1/256`` of an int8
  output step at most. A hi share beyond ``2 R`` saturates there; since ``y`` clips at
  ``R``, that changes ``y`` only where the lo plane's share is itself beyond ``R``,
  against the hi share's sign (weights below 1/254 of a row, whose hi code is 0, on
  values far beyond the output's range).
* the lo plane's product onto the grid that holds its largest sum (``128 * 128 * K``
  codes, an int8 operand's zero point widening its reach): it never saturates.
* ``y = Add(p_hi, p_lo)`` with the two grids' factors.

K or V (the second operand, ``side="b"``) is split where it is made, before the pattern's
movements (:func:`split_before_moves`), so each plane is an int8 weight-tiles operand and
a decode step's cache concat splits only the new rows (``lowering.cache_planes``). Both
operands int16 (P @ V on an int16 V, :func:`double_plane_layers`) is the first operand's
planes against each of the second's, each pair onto a grid spanning ``2 R``, joined by one
more add.

Unlike a dense's planes, which share one matmul (the weights stream once), the two planes
need different grids, which a per-column requantize cannot give rows of one matrix; at
decode a second matmul reads ``b`` (the V cache) a second time. Every step is an
existing layer, so the integer reference and the DSA agree by construction.

When ``a`` is a softmax's in the same region, read by nothing else (attention's P @ V),
:func:`fuse_plane_matmuls` does better: the softmax writes the planes itself, rows
interleaved (``Softmax.planes``: the int16 codes never cross DRAM) and one batch matmul
per second operand (or per plane of it) runs both against its tiles, read once, joining
the sums exactly in int32 before its one requantize (``BatchMatmul.planes``): no plane
grid, no joining add. That needs the joined sum to stay within int32, which a softmax's
non-negative codes (a row sums to about ``1 / s_a``) guarantee; any other int16 ``a``
keeps the layers above.
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
    BytePlanes,
    Layer,
    Permute,
    QTensor,
    Requant,
    Rescale,
    Softmax,
    reader_layers,
)
from dsa_tvm.layers.plane_split import PLANE, is_split, split_layers
from dsa_tvm.lowering.region import lowering_supports

from .add import WIDE_ADD_MULT_BITS, add_multipliers
from .dense_planes import join_fits

#: the largest |code| of an int8 plane or operand
_CODE = 128


def output_range(y: QTensor, clip: tuple[int, int]) -> float:
    """``R``: the largest magnitude ``y``'s codes within ``clip`` stand for."""
    return max(abs(clip[0] - y.zero_point), abs(clip[1] - y.zero_point)) * y.scale


def plane_grids(a: QTensor, b: QTensor, y: QTensor, clip: tuple[int, int]
                ) -> tuple[float, float]:
    """The real steps ``(g_hi, g_lo)`` of the two planes' int16 partial sums (each the
    plane's share of ``y``: ``256 s_a s_b sum(hi b)`` and ``s_a s_b sum(lo b)``, or the
    same with ``b``'s planes); an int8 operand's codes reach ``128 + |zero point|`` from
    its zero point."""
    reach = (_CODE + abs(int(a.zero_point))) * (_CODE + abs(int(b.zero_point)))
    most = reach * int(a.shape[-1]) * a.scale * b.scale
    g_hi = min(2 * output_range(y, clip), PLANE * most) / sem.INT16_MAX
    return max(g_hi, 1e-30), max(most / sem.INT16_MAX, 1e-30)


def join_factors(a: QTensor, b: QTensor, y: QTensor, clip: tuple[int, int]
                 ) -> tuple[float, float]:
    """The real factors of the add that joins the planes: ``(g_hi / s_y, g_lo / s_y)``."""
    g_hi, g_lo = plane_grids(a, b, y, clip)
    return g_hi / y.scale, g_lo / y.scale


def _both_grid(y: QTensor, clip: tuple[int, int]) -> float:
    """The step of each of :func:`double_plane_layers`' two partial products (one per plane
    of ``b``): ``2 R`` over int16. The lo plane's share, at most ``128 s_b sum |a|`` (a
    256th of ``b``'s range times a row's ``sum |a|``), is far inside ``2 R``: for P a row
    sums to 1 and ``R`` is about ``b``'s range; for Q ``sum |q| <= sqrt(d) |q|`` against
    scores near ``|q| |k|``. Beyond it the share would saturate (a wrong score, never a
    wrapped one)."""
    return max(2 * output_range(y, clip) / sem.INT16_MAX, 1e-30)


def planes_fit(a: QTensor, b: QTensor, y: QTensor, clip: tuple[int, int]) -> str | None:
    """None if the joining adds take the planes' factors (``dense_planes.join_fits``)."""
    if a.dtype == b.dtype == "int16":
        g = _both_grid(y, clip)
        return join_fits((g / y.scale, g / y.scale), y.scale)
    return join_fits(join_factors(a, b, y, clip), y.scale)


def _plane_products(name: str, planes: tuple[QTensor, QTensor], other: QTensor, side: str,
                    y: QTensor, clip: tuple[int, int], grids: tuple[float, float],
                    on_device: bool) -> tuple[Layer, Layer, Layer]:
    """``y = hi (x) other + lo (x) other`` (``side``: the planes' operand, "a" or "b"):
    each plane's matmul onto its int16 grid of ``grids``, then the joining add."""
    parts = []
    for t, tag, g in zip(planes, ("p_hi", "p_lo"), grids):
        p = QTensor(f"{name}/{tag}", tuple(y.shape), g, 0, "int16")
        mult, shift = sem.quantize_multipliers(np.array([t.scale * other.scale / g]))
        ta, tb = (t, other) if side == "a" else (other, t)
        parts.append(BatchMatmul(p.name, ta, tb, p, Requant(mult, shift, 0, WIDE_CLIP),
                                 on_device))
    am, bm, sh = add_multipliers(grids[0] / y.scale, grids[1] / y.scale,
                                 bits=(WIDE_ADD_MULT_BITS, WIDE_ADD_MULT_BITS))
    join = Add(name, parts[0].output, parts[1].output, y, am, bm,
               Requant(np.array([1], np.int32), np.array([sh], np.int32), y.zero_point, clip))
    return parts[0], parts[1], join


def matmul_plane_layers(name: str, a: QTensor, b: QTensor, y: QTensor, clip: tuple[int, int],
                        on_device: bool, side: str = "a") -> tuple[Layer, ...]:
    """The layers of ``y = a @ b`` (``a`` (B, M, K), ``b`` (B, K, N), ``y`` (B, M, N) with
    ``clip``: int8 bounds or WIDE_CLIP) for one int16 operand with zero point 0, the other
    int8: ``side`` "a" (P @ V's probabilities) or "b" (K or V on int16: the split is named
    ``<name>/b/hi``, ``/b/lo``, each plane a weight-tiles operand of its own matmul)."""
    split, hi, lo = split_layers(name if side == "a" else f"{name}/b", a if side == "a" else b)
    other = b if side == "a" else a
    return (*split, *_plane_products(name, (hi, lo), other, side, y, clip,
                                     plane_grids(a, b, y, clip), on_device))


def double_plane_layers(name: str, a: QTensor, b: QTensor, y: QTensor,
                        clip: tuple[int, int], on_device: bool) -> tuple[Layer, ...]:
    """``y = a @ b`` for int16 ``a`` and ``b`` (zero points 0): ``a``'s planes against each
    of ``b``'s (:func:`matmul_plane_layers` per plane of ``b``, ``a`` split once), the two
    partial products on :func:`_both_grid`, joined by one add."""
    split_a, a_hi, a_lo = split_layers(name, a)
    split_b, b_hi, b_lo = split_layers(f"{name}/b", b)
    g = _both_grid(y, clip)
    layers: list[Layer] = [*split_a, *split_b]
    parts = []
    for tag, bj in (("bhi", b_hi), ("blo", b_lo)):
        q = QTensor(f"{name}/{tag}", tuple(y.shape), g, 0, "int16")
        layers += _plane_products(q.name, (a_hi, a_lo), bj, "a", q, WIDE_CLIP,
                                  plane_grids(a, bj, q, WIDE_CLIP), on_device)
        parts.append(q)
    am, bm, sh = add_multipliers(g / y.scale, g / y.scale,
                                 bits=(WIDE_ADD_MULT_BITS, WIDE_ADD_MULT_BITS))
    layers.append(Add(name, parts[0], parts[1], y, am, bm,
                      Requant(np.array([1], np.int32), np.array([sh], np.int32), y.zero_point,
                              clip)))
    return tuple(layers)


def split_before_moves(moves: list[Permute], layers: list[Layer]
                       ) -> tuple[list[Layer], list[Permute], list[Layer]]:
    """``(split, moves, layers)``: each byte-plane split (``split_layers``: a Rescale making
    ``hi`` and an Add making ``lo``) in ``layers`` of an int16 second operand that one of
    ``moves`` made (a pattern's head split, K^T's transpose) done before that movement
    instead (``split``), each plane then moved by a copy of it: the planes move as int8
    codes (the weight tiles an on-device matmul reads are int8) and a cache concat before
    the movement can split its new rows alone (``lowering.cache_planes``). Exact: the
    split is element-wise."""
    made = {p.output.name: p for p in moves}
    readers = reader_layers(layers)
    split: list[Layer] = []
    swap: dict[str, Permute] = {}
    gone: set[str] = set()
    for hi in layers:
        p = made.get(hi.input.name) if isinstance(hi, Rescale) else None
        if p is None or p.output.dtype != "int16" or hi.output.dtype != "int8":
            continue
        lo = [ly for ly in readers.get(p.output.name, ()) if ly is not hi]
        if (len(lo) != 1 or not isinstance(lo[0], Add) or lo[0].a.name != p.output.name
                or lo[0].b.name != hi.output.name):
            continue
        users = [ly for t in (hi.output, lo[0].output) for ly in readers.get(t.name, ())
                 if ly is not lo[0]]
        if not all(isinstance(ly, BatchMatmul) and ly.b.name in (hi.output.name,
                                                                 lo[0].output.name)
                   for ly in users):
            continue      # a first operand's planes: no tiles to make, the split stays
        pair, hi0, lo0 = split_layers(f"{p.name}/planes", p.input)
        split += pair
        swap[p.name] = dataclasses.replace(p, name=f"{p.name}/hi", input=hi0, output=hi.output)
        swap[f"{p.name}/lo"] = dataclasses.replace(p, name=f"{p.name}/lo", input=lo0,
                                                   output=lo[0].output)
        gone |= {hi.name, lo[0].name}
    if not swap:
        return [], moves, layers
    moved = []
    for p in moves:
        moved += [swap[p.name], swap[f"{p.name}/lo"]] if p.name in swap else [p]
    return split, moved, [ly for ly in layers if ly.name not in gone]


def fuse_plane_matmuls(layers: list[Layer], outputs: set[str],
                       cfg: HardwareConfig) -> list[Layer]:
    """``layers`` with each byte-plane split of an int16 first operand -> pairs of plane
    matmuls -> joining adds (:func:`matmul_plane_layers`, or :func:`double_plane_layers`'
    pair per plane of ``b``) replaced by the planes as interleaved rows and one planes
    batch matmul per pair, joining the sums exactly in int32: a softmax's planes written
    by the softmax itself (attention's P), any other operand's (Q on int16) by a
    :class:`BytePlanes` and a move interleaving its rows. Only when no tensor between them
    is read elsewhere or leaves the region (``outputs``), the joined sums fit int32 and
    ``cfg`` lowers them (the softmax's second staging tile must fit the accumulator)."""
    readers = reader_layers(layers)
    made_by = {ly.output.name: ly for ly in layers}
    swap: dict[str, tuple[Layer, ...]] = {}
    drop: set[str] = set()
    for hi in layers:
        x = hi.input if isinstance(hi, Rescale) else None
        lo = [ly for ly in readers.get(x.name, ()) if ly is not hi] if x is not None else []
        if len(lo) != 1 or not is_split(hi, lo[0]) or x.name in outputs:
            continue
        lo = lo[0]
        groups = _plane_pairs(hi, lo, readers, outputs)
        if not groups:
            continue
        soft = made_by.get(x.name)
        fused_softmax = (isinstance(soft, Softmax) and not soft.planes
                         and len(readers[x.name]) == 2)
        if not all(_sums_fit(x, mm.b, fused_softmax) for mm, _, _ in groups):
            continue
        name = hi.name[:-len("/hi")] if hi.name.endswith("/hi") else hi.name
        a = groups[0][0].a                                # the matmul's (B, M, K) view
        bt, m, k = (int(d) for d in a.shape)
        a2 = QTensor(f"{name}/planes", (bt, 2 * m, k), x.scale, 0)
        if fused_softmax:
            rows = tuple(x.shape[:-2]) + (2 * int(x.shape[-2]), k)
            made: list[Layer] = [dataclasses.replace(soft, output=dataclasses.replace(
                a2, shape=rows), planes=True)]
        else:                     # stacked planes (hi rows, lo rows), then interleaved
            stacked = QTensor(f"{name}/stacked", (bt, 2 * m, k), x.scale, 0)
            made = [BytePlanes(stacked.name, dataclasses.replace(x, shape=(bt, m, k)),
                               stacked),
                    Permute(f"{name}/interleave", dataclasses.replace(stacked, shape=(
                        bt * 2 * m, k)), a2, (bt, 2, m, k), (0, 2, 1, 3))]
        for mm, _, join in groups:
            y = join.output
            mult, shift = sem.quantize_multipliers(np.array([x.scale * mm.b.scale / y.scale]))
            made.append(BatchMatmul(join.name, a2, mm.b, y,
                                    Requant(mult, shift, y.zero_point, join.requant.clip),
                                    on_device=True, planes=True))
        if lowering_supports(tuple(made), cfg) is not None:
            continue
        planes = len(made) - len(groups)
        if fused_softmax:
            swap[soft.name] = tuple(made[:planes])
        else:
            swap[hi.name] = tuple(made[:planes])
        for (mm, mm_lo, join), fused in zip(groups, made[planes:]):
            swap[join.name] = (fused,)
            drop |= {mm.name, mm_lo.name}
        drop |= {lo.name} | (set() if not fused_softmax else {hi.name})
    return [out for ly in layers if ly.name not in drop or ly.name in swap
            for out in swap.get(ly.name, (ly,))]


def _plane_pairs(hi: Layer, lo: Layer, readers: dict[str, list[Layer]], outputs: set[str]
                 ) -> list[tuple[BatchMatmul, BatchMatmul, Add]] | None:
    """The (hi plane's matmul, lo plane's matmul, joining add) of each second operand the
    planes ``hi`` and ``lo`` (a split's outputs) are multiplied with; None unless every
    reader of the planes and of the products is one of them and none leaves the region."""
    his = [ly for ly in readers.get(hi.output.name, []) if ly is not lo]
    los = readers.get(lo.output.name, [])
    if (len(his) != len(los) or {hi.output.name, lo.output.name} & outputs
            or not all(isinstance(ly, BatchMatmul) for ly in his + los)):
        return None
    by_b = {mm.b.name: mm for mm in los if mm.a.name == lo.output.name}
    out = []
    for mm in his:
        mm_lo = by_b.get(mm.b.name)
        joins = readers.get(mm.output.name, [])
        if (mm.a.name != hi.output.name or mm_lo is None or len(joins) != 1
                or not isinstance(joins[0], Add) or joins[0].a.name != mm.output.name
                or joins[0].b.name != mm_lo.output.name
                or readers.get(mm_lo.output.name) != joins
                or {mm.output.name, mm_lo.output.name} & outputs):
            return None
        out.append((mm, mm_lo, joins[0]))
    return out


def _sums_fit(x: QTensor, b: QTensor, softmax: bool) -> bool:
    """True if the planes' joined sums (and ``256 * sum(hi b)`` on the way) stay within
    int32 for the int16 codes ``x`` against int8 codes ``b`` (zero point 0): a softmax's
    codes are non-negative, a row summing to at most ``1 / s_x`` plus half a code an
    element (rounding); any other's reach 32768."""
    k = int(x.shape[-1])
    if softmax:
        total = min(sem.INT16_MAX * k, 1.01 / x.scale + k)   # a row's codes, at most
        # |256 sum(hi b)| <= 256 * 128 * sum(a / 256 + 1/2): the largest partial of the join
        return _CODE * (total + _CODE * k) < 2 ** 31 and b.zero_point == 0
    return (PLANE + 1) * _CODE * _CODE * k < 2 ** 31 and b.zero_point == 0

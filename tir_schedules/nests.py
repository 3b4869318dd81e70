"""Loop-nest geometry of the instructions a schedule's stages become: merging and
peeling instruction loop levels, 2-D DMA transfer shapes with padding.

Pure functions on (extent, stride, ...) tuples, shared by the TIR walker
(``dsa_tvm.codegen.walker``, which emits the instructions) and the instruction-count
model (``counts.py``, which predicts them), so the two cannot disagree.
"""

from __future__ import annotations

import itertools

from dsa_tvm.isa.formats import PAD_BITS

#: largest LOAD padding count (8-bit pad fields)
MAX_PAD = (1 << PAD_BITS) - 1


class CodegenError(ValueError):
    """Scheduled TIR the walker cannot lower; the message names the stage and the reason."""


def touched(base: int, levels: list[tuple[int, int]]) -> frozenset[int]:
    """The rows a loop nest touches through one operand."""
    rows = [base]
    for ext, stride in levels:
        if ext == 1 or stride == 0:  # revisits the same rows: adds nothing to the set
            continue
        rows = [r + i * stride for r in rows for i in range(ext)]
    return frozenset(rows)


def merge_levels(levels: list[tuple]) -> list[tuple]:
    """Drop unit levels and merge a level into the one outside it when every stride allows."""
    out: list[tuple] = []
    for lv in levels:
        if lv[0] == 1:
            continue
        if out:
            prev = out[-1]
            if all(ps == s * lv[0] for ps, s in zip(prev[1:], lv[1:])):
                out[-1] = (prev[0] * lv[0], *lv[1:])
                continue
        out.append(lv)
    return out


def peel(levels: list[tuple], bases: tuple[int, ...], max_levels: int):
    """(bases, nest) per instruction: outer levels beyond ``max_levels`` become copies."""
    levels = merge_levels(levels)
    outer, inner = levels[:max(0, len(levels) - max_levels)], levels[-max_levels:]
    for idx in itertools.product(*[range(lv[0]) for lv in outer]):
        b = list(bases)
        for i, lv in zip(idx, outer):
            for k in range(len(b)):
                b[k] += i * lv[1 + k]
        yield tuple(b), [tuple(lv) for lv in inner] or [(1,) + (0,) * len(bases)]


def first_step_split(levels: list[tuple], bases: tuple[int, ...]):
    """(bases, levels, is_first) boxes covering a loop nest: first the points where every
    reduction level (destination stride 0) is at 0, then the rest, one box per reduction
    level. A reduction whose destination starts at its identity can then run its first
    step as a plain write (MUL for MAC, MOV for an accumulating ADD/MAX/MIN) instead of
    initializing the destination in a pass of its own."""
    red = [k for k, lv in enumerate(levels) if lv[1] == 0 and lv[0] > 1]
    yield bases, [(1, *lv[1:]) if k in red else lv for k, lv in enumerate(levels)], True
    for i, k in enumerate(red):
        lv = list(levels)
        for kk in red[:i]:
            lv[kk] = (1, *levels[kk][1:])
        ext, *strides = levels[k]
        lv[k] = (ext - 1, *strides)
        yield tuple(b + s for b, s in zip(bases, strides)), lv, False


def dma_shapes(levels, sram0: int, dram0: int, what: str, max_pad: int | None = None):
    """2-D transfers covering a copy: ``("load", sram row, dram element, (y, x, x_stride,
    pads))``, and ``("fill", sram row, None, rows)`` for border rows no transfer can hold.

    ``levels``: (extent, sram stride, dram stride, pad before, pad after) per row loop,
    outermost first. One transfer writes (pads + y) x (pads + x) contiguous rows; levels
    it cannot hold are peeled into several transfers. Of those, the innermost may be
    padded when its slices are contiguous in the scratchpad (a tile narrower than the
    image in channels, with a border): its all-border slices join the neighbouring
    transfer's top/bottom padding, or become fills when the pad fields are too small."""
    max_pad = MAX_PAD if max_pad is None else max_pad
    merged: list[list[int]] = []
    for ext, ss, ds, pl, ph in levels:
        if ext == 1:
            continue
        if merged:
            p = merged[-1]
            if (p[1] == ss * ext and p[2] == ds * ext and pl == ph == 0
                    and max(p[3], p[4]) * ext <= max_pad):
                merged[-1] = [p[0] * ext, ss, ds, p[3] * ext, p[4] * ext]
                continue
        merged.append([ext, ss, ds, pl, ph])
    unit = [1, 1, 1, 0, 0]
    rest = list(merged)
    x = unit
    if rest and rest[-1][1] == 1 and rest[-1][2] == 1:
        x = rest.pop()
    y = unit
    if rest and rest[-1][1] == x[0]:
        y = rest.pop()
    z = None
    if rest and (rest[-1][3] or rest[-1][4]) and y is not unit and rest[-1][1] == y[0] * x[0]:
        z = rest.pop()
    for lv in rest:
        if lv[3] or lv[4]:
            raise CodegenError(f"{what}: padding on a loop the 2-D DMA cannot express")
    if max(y[3], y[4], x[3], x[4]) > max_pad:
        raise CodegenError(f"{what}: padding {max(y[3], y[4], x[3], x[4])} exceeds the "
                           f"{max_pad}-element LOAD pad fields")
    y_valid = y[0] - y[3] - y[4]
    x_valid = x[0] - x[3] - x[4]
    stride = y[2] if y is not unit else x_valid
    for idx in itertools.product(*[range(lv[0]) for lv in rest]):
        s, d = sram0, dram0
        for i, lv in zip(idx, rest):
            s += i * lv[1]
            d += i * lv[2]
        if z is None:
            yield "load", s, d, (y_valid, x_valid, stride, (y[3], y[4], x[3], x[4]))
            continue
        ext, zs, zd, zl, zh = z
        last = ext - zh - 1
        for j in range(zl, last + 1):
            top, bottom, start, after = y[3], y[4], s + j * zs, None
            if j == zl and zl:
                if top + zl * y[0] <= max_pad:
                    top, start = top + zl * y[0], s
                else:
                    yield "fill", s, None, zl * zs
            if j == last and zh:
                if bottom + zh * y[0] <= max_pad:
                    bottom += zh * y[0]
                else:
                    after = (s + (j + 1) * zs, zh * zs)
            yield "load", start, d + (j - zl) * zd, (y_valid, x_valid, stride,
                                                    (top, bottom, x[3], x[4]))
            if after:
                yield "fill", after[0], None, after[1]

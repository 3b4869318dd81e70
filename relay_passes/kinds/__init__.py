"""The DSA's front-end kinds, one module each, assembled into the tables the partitioner reads.

A kind module (``conv2d.py``, ``pooling.py``, ...) declares ``KINDS``, a tuple of
:class:`~.spec.Kind`: its DPL patterns with their variants, how a match is read
back, its constraints and its conversion to the integer layer IR. This package
finds every such module itself, so adding a kind is adding one module.

Pattern order: FuseOpsByPattern tries the table in order and the first pattern
that claims an op keeps it, so a pattern that contains another must come first.
Each kind has a ``priority``; the table lists kinds by priority, highest first,
each kind's variants in the order it builds them (larger first). Two kinds may
not share a priority. Today: conv2d 900 and dense 800 (a dense pattern without
permute_dims is a batch_matmul one with a constant operand: batch_matmul 700),
then the pools (max 600, avg 590, global 500), add 400, relu 300, clip 290, and
rescale 0 (``quantize(dequantize(x))`` is the tail of every other pattern).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Mapping

from tvm import relax

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.layers.ir import BatchMatmul, Layer, Permute, QTensor, layer_inputs
from dsa_tvm.layers.layouts import rows_view

from .common import Constraint, codegen_constraint
from .match import LoweringError, Match, Reader, Root, shape_of
from .matmul_planes import split_before_moves
from .spec import Kind, PatternSpec


def _discover() -> dict[str, Kind]:
    """Every ``KINDS`` entry of the package's modules, by name, highest priority first."""
    found: list[Kind] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        found += getattr(importlib.import_module(f"{__name__}.{info.name}"), "KINDS", ())
    names = [k.name for k in found]
    priorities = [k.priority for k in found]
    if len(set(names)) != len(names) or len(set(priorities)) != len(priorities):
        raise RuntimeError(f"kinds must have distinct names and priorities: "
                           f"{sorted(zip(priorities, names), reverse=True)}")
    return {k.name: k for k in sorted(found, key=lambda k: -k.priority)}


#: kind name -> its declaration, highest priority first
KINDS: dict[str, Kind] = _discover()

def layer_from_match(m: Match, name: str, inputs: list[QTensor], output: QTensor
                     ) -> Layer | tuple[Layer, ...]:
    """The integer layer description of one matched pattern: the kind's layer(s), after a
    :class:`Permute` for each operand the pattern took in through int8 moves
    (``inputs``: the region tensors, in their own shapes)."""
    if m.kind not in KINDS:
        raise LoweringError(f"no layer for pattern kind '{m.kind}'")
    moved = list(inputs)
    pre: list[Permute] = []
    for i, (op, t) in enumerate(zip(m.inputs, inputs)):
        if op.moves:
            dst = QTensor(f"{t.name}>{name}.{i}", tuple(op.shape), t.scale, t.zero_point,
                          t.dtype)
            (view, perm), *then = op.moves
            pre.append(Permute(f"{name}.move{i}", rows_view(t), dst, view, perm, tuple(then)))
            moved[i] = dst
    made = KINDS[m.kind].to_layer(m, name, moved, output)
    layers = list(made if isinstance(made, tuple) else (made,))
    split, pre, layers = split_before_moves(pre, layers)
    tiled_as: dict[str, QTensor] = {}  # an on-device matmul's b: laid out as weight tiles
    made_here = {ly.output.name for ly in layers}
    late: dict[int, list[Permute]] = {}  # tiles of a b the kind makes: before its first reader
    for j, ly in enumerate(layers):    # once, however many matmuls read it (byte planes)
        if (isinstance(ly, BatchMatmul) and ly.on_device
                and not any(p.output.name == ly.b.name for p in pre)):
            if ly.b.name not in tiled_as:
                tiles = dataclasses.replace(ly.b, name=f"{ly.b.name}>{name}.tiles")
                nth = str(len(tiled_as) or "")   # a second operand per plane of an int16 b
                move = Permute(f"{name}.tiles{nth}", rows_view(ly.b), tiles, tuple(ly.b.shape),
                               tuple(range(len(ly.b.shape))))
                (late.setdefault(j, []) if ly.b.name in made_here else pre).append(move)
                tiled_as[ly.b.name] = tiles
            layers[j] = dataclasses.replace(ly, b=tiled_as[ly.b.name])
    if not pre and not late:
        return made
    # b's movement lays it out as weight tiles and, when a has a zero point, writes the
    # matmul's column correction -zp_a * sum_k b
    tiled = {ly.b.name: -ly.a.zero_point for ly in layers
             if isinstance(ly, BatchMatmul) and ly.on_device}
    views = {t.name: t for ly in layers for t in layer_inputs(ly)}

    def placed(p: Permute) -> Permute:
        return dataclasses.replace(p, output=views.get(p.output.name, p.output),
                                   weight_tiles=p.output.name in tiled,
                                   column_sums=tiled.get(p.output.name, 0))

    return (*split, *map(placed, pre),
            *(x for j, ly in enumerate(layers) for x in (*map(placed, late.get(j, ())), ly)))


#: kind -> its constraints, in check order (the codegen's own check last).
CONSTRAINTS: dict[str, list[Constraint]] = {
    name: list(k.constraints) + [codegen_constraint(layer_from_match)]
    for name, k in KINDS.items()
}

#: the ops kinds are named after, in table order: the report blames a match's anchor first
ANCHOR_OPS: tuple[str, ...] = tuple(dict.fromkeys(k.anchor for k in KINDS.values() if k.anchor))


def pattern_specs() -> list[PatternSpec]:
    """The DSA pattern table, larger patterns first (FuseOpsByPattern tries them in order)."""
    return [s for k in KINDS.values() for s in k.specs()]


def describe(kind: str, root: relax.Expr,
             lookup: Mapping[relax.Var, relax.Expr] | Callable[[relax.Var], relax.Expr | None]
             ) -> Match:
    """Read the match of pattern ``kind`` rooted at quantize ``root``; NotAMatch if it is not one."""
    get = lookup if callable(lookup) else (lambda v: lookup.get(v))
    r = Reader(get)
    q = r.need(root, "relax.quantize")
    end = Root(q, r.qparams(q), shape_of(q), q.args[0])
    if kind not in KINDS:
        raise ValueError(f"unknown pattern kind '{kind}'")
    m = KINDS[kind].read(r, end)
    m.calls = list(dict.fromkeys(r.calls + m.calls))
    return m


def check(m: Match, cfg: HardwareConfig) -> tuple[bool, str]:
    """(True, "") if the DSA can run the match, else (False, "<constraint>: <reason>")."""
    for c in CONSTRAINTS[m.kind]:
        try:
            why = c.test(m, cfg)
        except Exception as e:  # a graph we do not understand is a graph we do not offload
            why = f"cannot check ({type(e).__name__}: {e})"
        if why:
            return False, f"{c.name}: {why}"
    return True, ""



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

import importlib
import pkgutil
from collections.abc import Callable, Mapping

from tvm import relax

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.layers.ir import Layer, QTensor

from .common import Constraint, codegen_constraint
from .match import LoweringError, Match, Reader, Root, shape_of
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

#: kind -> its constraints, in check order (the codegen's own check last).
CONSTRAINTS: dict[str, list[Constraint]] = {
    name: list(k.constraints) + [codegen_constraint(k.to_layer)] for name, k in KINDS.items()
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


def layer_from_match(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    """The integer layer description of one matched pattern."""
    if m.kind not in KINDS:
        raise LoweringError(f"no layer for pattern kind '{m.kind}'")
    return KINDS[m.kind].to_layer(m, name, inputs, output)

"""The DSA schedule space in MetaSchedule terms: knobs as sampling decisions.

A DSA schedule is fully described by its knobs (each room's knobs dataclass).
For the tuner, each knob becomes a MetaSchedule sampling instruction on the
unscheduled compute, so the trace of a candidate *is* its knob setting and
the evolutionary search, its mutators and the database work on it unchanged:

* a tile size is ``sample_perfect_tile(loop, n=2)`` on the loop it tiles (the
  inner factor is the tile; every divisor of the extent is reachable);
* a boolean knob (resident operand / loop order, double buffering) is
  ``sample_categorical([0, 1])``.

Each sampled value is annotated on the root block (``dsa.knob.<field>``), so
the module a trace produces carries its knobs and :func:`knobs_from_mod` reads
them back; the real schedule is then applied by the existing schedule
functions (each room's ``schedule``), which keeps one source of truth for what
a knob setting means.
"""

from __future__ import annotations

import dataclasses

from dsa_tvm.hw.config import HardwareConfig

from . import kind_of

KNOB_PREFIX = "dsa.knob."


class MissingKnob(ValueError):
    """A sampled module lacks a knob its room has now (a record of an older knob space)."""


def perf_shape(shape):
    """``shape`` with the fields that change values but not the instruction stream (zero
    points, clip bounds, rescale factors) set to fixed values: layers that differ only
    there share one tuning task and one database entry."""
    return kind_of(shape).perf_shape(shape)


def sample_knobs(sch, shape, fixed: object | None = None) -> None:
    """Add the sampling instructions of every knob of ``shape`` to ``sch`` (an
    unscheduled compute) and annotate the sampled values on the root block. With
    ``fixed`` knobs the decisions are those knobs (a trace that replays them)."""
    kind = kind_of(shape)
    root = sch.get_sblock("root")
    tiles = kind.tiles(shape)
    loops: dict[str, list] = {}
    for f in dataclasses.fields(kind.knobs):
        want = getattr(fixed, f.name) if fixed is not None else None
        if f.name in tiles:
            block, index = tiles[f.name]
            if block not in loops:
                loops[block] = sch.get_loops(sch.get_sblock(block))
            loop = loops[block][index]
            extent = int(sch.get(loop).extent)
            decision = None if want is None else [extent // want, want]
            _, inner = sch.sample_perfect_tile(loop, n=2, max_innermost_factor=extent,
                                               decision=decision)
            sch.annotate(root, KNOB_PREFIX + f.name, inner)
        else:
            decision = None if want is None else int(bool(want))
            v = sch.sample_categorical([0, 1], [0.5, 0.5], decision=decision)
            sch.annotate(root, KNOB_PREFIX + f.name, v)


def knobs_from_mod(mod, shape):
    """The knobs a sampled module carries (see :func:`sample_knobs`)."""
    kind = kind_of(shape)
    func = mod["main"] if hasattr(mod, "functions_items") else mod
    ann = func.body.block.annotations
    values = {}
    for f in dataclasses.fields(kind.knobs):
        key = KNOB_PREFIX + f.name
        if key not in ann:
            raise MissingKnob(f"the module carries no '{key}' annotation: not a sampled "
                              f"{type(shape).__name__} schedule of this version's knobs")
        v = int(ann[key])
        values[f.name] = bool(v) if f.type in (bool, "bool") else v
    return kind.knobs(**values)


def check_knobs(cfg: HardwareConfig, shape, knobs) -> str | None:
    """None if ``knobs`` is a valid schedule of ``shape`` on ``cfg``, else why not: tiles
    divide their loops and fit the scratchpads and the instruction fields."""
    kind = kind_of(shape)
    for f in dataclasses.fields(knobs):
        v = getattr(knobs, f.name)
        if not isinstance(v, bool) and v < 1:
            return f"{f.name}={v} is not a tile size"
    problem = kind.fits(cfg, shape, knobs)
    if problem:
        return problem
    return None

"""The DSA schedule space in MetaSchedule terms: knobs as sampling decisions.

A DSA schedule is fully described by its knobs (``ConvKnobs`` and the vector-unit
knobs). For the tuner, each knob becomes a MetaSchedule sampling instruction on
the unscheduled compute, so the trace of a candidate *is* its knob setting and
the evolutionary search, its mutators and the database work on it unchanged:

* a tile size is ``sample_perfect_tile(loop, n=2)`` on the loop it tiles (the
  inner factor is the tile; every divisor of the extent is reachable);
* a boolean knob (resident operand / loop order, double buffering) is
  ``sample_categorical([0, 1])``.

Each sampled value is annotated on the root block (``dsa.knob.<field>``), so
the module a trace produces carries its knobs and :func:`knobs_from_mod` reads
them back; the real schedule is then applied by the existing schedule
functions (``schedule_conv2d`` & co.), which keeps one source of truth for what
a knob setting means.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from dsa_tvm.hw.config import HardwareConfig

from .compute import ConvShape, conv2d
from .compute_vector import EltwiseShape, GlobalSumShape, WindowShape, eltwise, global_sum, window
from .counts import (
    conv_instructions,
    eltwise_instructions,
    global_sum_instructions,
    matmul_instructions,
    window_instructions,
)
from .matmul import (
    MatmulKnobs,
    MatmulShape,
    batch_matmul,
    candidate_matmul_knobs,
    default_matmul_knobs,
    estimate_matmul_cycles,
    matmul_fits,
    schedule_batch_matmul,
)
from .schedule import (
    ConvKnobs,
    candidate_knobs,
    default_conv_knobs,
    estimate_cycles,
    fits,
    schedule_conv2d,
)
from .schedule_vector import (
    EltwiseKnobs,
    GlobalSumKnobs,
    WindowKnobs,
    candidate_vector_knobs,
    default_vector_knobs,
    estimate_vector_cycles,
    schedule_eltwise,
    schedule_global_sum,
    schedule_window,
    vector_fits,
)

KNOB_PREFIX = "dsa.knob."


@dataclass(frozen=True)
class Kind:
    """How one layer kind is computed, scheduled and tiled."""

    knobs: type
    build: Callable                   # shape -> PrimFunc
    schedule: Callable                # (func, cfg, shape, knobs) -> Schedule
    fits: Callable                    # (cfg, shape, knobs) -> None | reason
    candidates: Callable              # (cfg, shape) -> knobs that fit
    default: Callable                 # (cfg, shape) -> knobs
    estimate: Callable                # (cfg, shape, knobs) -> cycles (analytic)
    instructions: Callable            # (cfg, shape, knobs) -> instructions of the program
    #: knob field -> (block, loop index) of the loop it tiles, for the tile-size knobs
    tiles: Callable[[object], dict[str, tuple[str, int]]]


KINDS: dict[type, Kind] = {
    ConvShape: Kind(ConvKnobs, conv2d, schedule_conv2d, fits, candidate_knobs, default_conv_knobs,
                    estimate_cycles, conv_instructions,
                    lambda s: {"tile_oh": ("conv", 1), "tile_ow": ("conv", 2),
                               "tile_ocb": ("conv", 3)}),
    WindowShape: Kind(WindowKnobs, window, schedule_window, vector_fits, candidate_vector_knobs,
                      default_vector_knobs, estimate_vector_cycles, window_instructions,
                      lambda s: {"tile_oh": ("acc", 1), "tile_ow": ("acc", 2),
                                 "tile_cb": ("acc", 3)}),
    GlobalSumShape: Kind(GlobalSumKnobs, global_sum, schedule_global_sum, vector_fits,
                         candidate_vector_knobs, default_vector_knobs, estimate_vector_cycles,
                         global_sum_instructions,
                         lambda s: {"tile_hw": ("acc", 3), "tile_cb": ("acc", 1)}),
    EltwiseShape: Kind(EltwiseKnobs, eltwise, schedule_eltwise, vector_fits,
                       candidate_vector_knobs, default_vector_knobs, estimate_vector_cycles,
                       eltwise_instructions,
                       lambda s: {"tile_p": ("acc" if s.kind == "add" else "requant", 0),
                                  "tile_cb": ("acc" if s.kind == "add" else "requant", 1)}),
    MatmulShape: Kind(MatmulKnobs, batch_matmul, schedule_batch_matmul, matmul_fits,
                      candidate_matmul_knobs, default_matmul_knobs, estimate_matmul_cycles,
                      matmul_instructions,
                      lambda s: {"tile_m": ("matmul", 1), "tile_nb": ("matmul", 2)}),
}


def kind_of(shape: object) -> Kind:
    try:
        return KINDS[type(shape)]
    except KeyError:
        raise TypeError(f"no tunable schedule for {type(shape).__name__} "
                        f"(known: {', '.join(t.__name__ for t in KINDS)})") from None


def perf_shape(shape):
    """``shape`` with the fields that change values but not the instruction stream (zero
    points, clip bounds, rescale factors) set to fixed values: layers that differ only
    there share one tuning task and one database entry."""
    full = (-128, 127)
    if isinstance(shape, ConvShape):
        return dataclasses.replace(shape, input_zp=0, output_zp=0, clip=full)
    if isinstance(shape, WindowShape):
        return dataclasses.replace(shape, pad_value=-128 if shape.kind == "max" else 0,
                                   output_zp=0, clip=full)
    if isinstance(shape, GlobalSumShape):
        return dataclasses.replace(shape, output_zp=0, clip=full)
    if isinstance(shape, EltwiseShape):
        return dataclasses.replace(shape, output_zp=0, clip=full, a_mult=1,
                                   b_mult=1 if shape.kind == "add" else 0)
    if isinstance(shape, MatmulShape):
        return dataclasses.replace(shape, output_zp=0, clip=full)
    raise TypeError(f"no tunable schedule for {type(shape).__name__}")


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
            raise ValueError(f"the module carries no '{key}' annotation: not a sampled "
                             f"{type(shape).__name__} schedule")
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

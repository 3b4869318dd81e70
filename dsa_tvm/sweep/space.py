"""The design space of a sweep: axes of hardware-description values and their grid.

``--set dram.bandwidth_bytes_per_cycle=4,16,64`` is one axis; ``--set array=8,16,32``
is shorthand for a square array (``array.block_in`` and ``array.block_out`` together).
A point is one value per axis, applied to the base description with
:func:`dsa_tvm.hw.config.with_overrides`; a combination the schema rejects is kept as a
point with its error (the sweep reports it instead of stopping).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..hw.config import ConfigError, HardwareConfig, with_overrides

#: axis names that stand for several fields at once
SHORTHANDS = {"array": ("array.block_in", "array.block_out")}
#: more points than this need a search (--search optuna) instead of the whole grid
MAX_GRID = 4096


@dataclass(frozen=True)
class Axis:
    key: str                 # as written: "dram.bandwidth_bytes_per_cycle" or "array"
    values: tuple[str, ...]  # as written, each parsed as TOML by with_overrides

    def assignments(self, value: str) -> list[str]:
        return [f"{k}={value}" for k in SHORTHANDS.get(self.key, (self.key,))]


@dataclass(frozen=True)
class Point:
    """One design: a value per axis (``label`` names it in tables and plots)."""

    values: tuple[tuple[str, str], ...]   # (axis key, value)

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values) or "base"

    def assignments(self, axes: list[Axis]) -> list[str]:
        by_key = dict(self.values)
        return [a for axis in axes for a in axis.assignments(by_key[axis.key])]


def parse_axes(specs: list[str]) -> list[Axis]:
    """Axes from ``--set KEY=V1,V2,...`` texts; ValueError naming the bad one."""
    axes: list[Axis] = []
    for text in specs:
        key, sep, raw = text.partition("=")
        key = key.strip()
        values = tuple(v.strip() for v in raw.split(",") if v.strip())
        if not sep or not key or not values:
            raise ValueError(f"--set {text!r}: expected SECTION.FIELD=V1,V2,... "
                             f"(e.g. --set dram.bandwidth_bytes_per_cycle=4,16,64)")
        if any(a.key == key for a in axes):
            raise ValueError(f"--set {key} is given twice; list all its values in one --set")
        if len(set(values)) != len(values):
            raise ValueError(f"--set {text!r} repeats a value")
        axes.append(Axis(key, values))
    return axes


def check_axes(base: HardwareConfig, axes: list[Axis]) -> None:
    """Every axis names a field of the description (checked on its first value, so a typo
    fails before any compile, not as 27 failed points)."""
    for axis in axes:
        try:
            with_overrides(base, axis.assignments(axis.values[0]))
        except ConfigError as e:
            if "expected section.field=value" in str(e):
                raise ValueError(f"--set {axis.key}: not a field of the hardware description "
                                 f"(docs/hardware.md lists them; 'array' sets both block "
                                 f"sizes)") from None


def grid_size(axes: list[Axis]) -> int:
    return math.prod(len(a.values) for a in axes)


def grid(axes: list[Axis]) -> list[Point]:
    """Every combination, the first axis varying slowest (rows read like nested loops)."""
    return [Point(tuple(zip((a.key for a in axes), combo)))
            for combo in itertools.product(*(a.values for a in axes))]


def config_of(base: HardwareConfig, axes: list[Axis], point: Point) -> tuple[HardwareConfig, str]:
    """The description of ``point`` and a note on what was derived (ConfigError when the
    schema rejects the combination); named after the base and the point so reports and
    programs say which design it is.

    The instruction width follows from the design (its fields address the scratchpads):
    when the point's scratchpads need wider fields than the base's width and no axis
    sets ``isa.instruction_bits``, the narrowest width that fits is taken, and said."""
    assignments = point.assignments(axes)
    note = ""
    try:
        cfg = with_overrides(base, assignments)
    except ConfigError as e:
        if "isa.instruction_bits" not in str(e) or any(a.key == "isa.instruction_bits"
                                                        for a in axes):
            raise
        cfg = _widened(base, assignments, e)
        note = (f"isa.instruction_bits raised from {base.instruction_bits} to "
                f"{cfg.instruction_bits} to hold the fields")
    cfg = cfg.replace(name=f"{base.name}[{point.label}]") if point.values else cfg
    return cfg, note


def _widened(base: HardwareConfig, assignments: list[str], first: ConfigError) -> HardwareConfig:
    for bits in range(base.instruction_bits + 64, 1025, 64):
        try:
            return with_overrides(base, [*assignments, f"isa.instruction_bits={bits}"])
        except ConfigError:
            continue
    raise first

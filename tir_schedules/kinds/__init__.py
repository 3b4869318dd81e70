"""The rooms: one module per layer kind in this package, and every dispatch over layer
or shape types.

A room is a module of this package that defines ``KIND``, a :class:`~.base.Kind`
(the others, ``base`` and ``space``, define none). The registry finds the rooms by
listing the package, so adding a layer kind is adding one module here. A layer
goes to the room whose ``layers`` hold its type and whose ``claims`` accept it
(where one type splits: a depthwise ``Conv2d`` is the depthwise room's, every
other conv the conv room's); a TIR shape goes to the room of its type.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

import numpy as np

from dsa_tvm.layers.rope_tables import io_entries as rope_table_entries

from .base import Kind, Recipe, UnsupportedLayer, checked, describe_layer

__all__ = ["Kind", "Recipe", "UnsupportedLayer", "describe", "kind_of", "kinds",
           "layer_bounds", "layer_ops", "recipe", "room_of", "run_layer", "run_region",
           "shape_types"]


@functools.cache
def kinds() -> tuple[Kind, ...]:
    """Every room's kind, by module name (imported on first use)."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        kind = getattr(importlib.import_module(f"{__name__}.{info.name}"), "KIND", None)
        if isinstance(kind, Kind):
            found.append(kind)
    return tuple(found)


@functools.cache
def _by_shape() -> dict[type, Kind]:
    return {k.shape: k for k in kinds() if k.shape is not None}


@functools.cache
def _by_layer() -> dict[type, tuple[Kind, ...]]:
    out: dict[type, list[Kind]] = {}
    for k in kinds():
        for t in k.layers:
            out.setdefault(t, []).append(k)
    return {t: tuple(ks) for t, ks in out.items()}


def shape_types() -> tuple[type, ...]:
    """The TIR shape types the rooms schedule (the tuning database's task types)."""
    return tuple(_by_shape())


def kind_of(shape: object) -> Kind:
    """The room of a TIR shape; TypeError if no room schedules its type."""
    try:
        return _by_shape()[type(shape)]
    except KeyError:
        raise TypeError(f"no tunable schedule for {type(shape).__name__} "
                        f"(known: {', '.join(t.__name__ for t in _by_shape())})") from None


def room_of(layer) -> Kind | None:
    """The room that takes ``layer`` (None: no room does)."""
    claiming = [k for k in _by_layer().get(type(layer), ()) if k.claims(layer)]
    if len(claiming) > 1:
        raise RuntimeError(f"{layer.name}: rooms {', '.join(k.name for k in claiming)} all "
                           f"claim this {type(layer).__name__}; their claims must not overlap")
    return claiming[0] if claiming else None


# ----------------------------------------------------------------------------- dispatch
def recipe(layer, cfg, consts: bool = True) -> Recipe:
    """The lowering of ``layer`` (constants packed only when ``consts``); raises
    UnsupportedLayer with the reason when there is none."""
    if cfg.block_in != cfg.block_out:
        raise UnsupportedLayer(f"'{cfg.name}': layers chain only when block_in == block_out")
    room = room_of(layer)
    if room is None:
        raise UnsupportedLayer(f"{layer.name}: no DSA lowering for {type(layer).__name__}")
    return room.recipe(layer, cfg, consts)


def run_layer(layer, env: dict[str, np.ndarray]) -> np.ndarray:
    """One layer's int8 (or int16) output on the CPU (the integer reference), reading its inputs
    from ``env`` by tensor name."""
    room = room_of(layer)
    if room is None:
        raise TypeError(f"unknown layer type {type(layer).__name__}")
    return checked(layer, room.reference(layer, env))


def run_region(region, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run every layer of ``region`` in order on the CPU; its outputs (int8, int16 for a
    wide tensor) by name."""
    env: dict[str, np.ndarray] = {}
    tables = rope_table_entries(region.layers)
    for t in region.inputs:
        if t.name not in inputs:
            raise KeyError(f"region '{region.name}': missing input '{t.name}'")
        arr = np.asarray(inputs[t.name])
        want = np.float32 if t.name in tables else np.dtype(t.dtype)  # rotary tables: float
        if arr.dtype != want:
            raise TypeError(f"region '{region.name}': input '{t.name}' must be "
                            f"{np.dtype(want).name}, got {arr.dtype}")
        env[t.name] = arr.reshape(t.shape)
    for ly in region.layers:
        env[ly.output.name] = run_layer(ly, env)
    return {t.name: env[t.name] for t in region.outputs}


def layer_bounds(layer) -> tuple[int, int]:
    """(bytes the layer must read, bytes it must write) from DRAM, all int8
    (``dsa_tvm.layers.checks``)."""
    room = room_of(layer)
    if room is None:
        raise TypeError(f"no bounds for layer type {type(layer).__name__}")
    return room.bounds(layer)


def layer_ops(layer) -> int:
    """Arithmetic of a layer in MAC equivalents: MACs for the array layers, one
    operation per input element read for the vector layers (window taps, both addends)."""
    room = room_of(layer)
    if room is None:
        raise TypeError(f"no operation count for layer type {type(layer).__name__}")
    return room.ops(layer)


def describe(layer) -> str:
    """One line per layer for the report: kind, name, shapes."""
    room = room_of(layer)
    return (room.describe if room is not None else describe_layer)(layer)

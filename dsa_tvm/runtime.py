"""Run compiled DSA regions from a TVM VirtualMachine: the ``dsa.launch`` packed function.

A compiled module calls ``R.call_dps_packed("dsa.launch", [program, *inputs])``
for every offloaded region. ``program`` is the region's program container as a
uint8 constant (it survives ``export_library``); this function unpacks it once,
packs the int8 inputs into the DSA layout, runs the simulator (values and
timing), and unpacks the outputs into the destination tensors. Every launch is
recorded for :func:`last_run_report`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from .hw.config import HardwareConfig, config_from_dict
from .isa.program import Program, read_header
from .lowering.host_pack import pack_region_input
from .lowering.layouts import unpack_activation
from .sim.simulator import SimResult, Simulator

LAUNCH = "dsa.launch"


@dataclass
class Launch:
    """One region run: its program, the simulator's result, and the int8 tensors
    (logical layout) it consumed and produced, for checking against a reference."""

    program: Program
    result: SimResult
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]


_programs: dict[bytes, tuple[Program, Simulator]] = {}
_launches: list[Launch] = []
_settings = {"trace": False}


def _program(blob: bytes) -> tuple[Program, Simulator]:
    key = hashlib.sha1(blob).digest()
    hit = _programs.get(key)
    if hit is None:
        cfg = _config_of(blob)
        sim = Simulator(cfg)
        hit = (sim.load_program(blob), sim)
        _programs[key] = hit
    return hit


def _config_of(blob: bytes) -> HardwareConfig:
    """The hardware description a program was built for (embedded in its header, read
    after the container's checksum is verified)."""
    head = read_header(blob)
    meta = head.get("meta")
    hw = meta.get("hardware") if isinstance(meta, dict) else None
    if hw is None:
        raise RuntimeError("DSA program carries no hardware description; recompile it")
    return config_from_dict(hw, source="<program>")


def launch(*args: Any) -> None:
    """``dsa.launch(program, *inputs, *outputs)``: destination-passing style."""
    blob = args[0].numpy().tobytes()
    prog, sim = _program(blob)
    names_in, names_out = prog.meta["inputs"], prog.meta["outputs"]
    if len(args) != 1 + len(names_in) + len(names_out):
        raise RuntimeError(f"dsa.launch of '{prog.name}' takes {len(names_in)} inputs and "
                           f"{len(names_out)} outputs, got {len(args) - 1} tensors")
    block = sim.config.block_in
    feeds, logical_in, logical_out = {}, {}, {}
    for name, t in zip(names_in, args[1:1 + len(names_in)]):
        x = t.numpy()
        want = tuple(prog.meta["io"][name]["shape"])
        if x.shape != want and x.size == int(np.prod(want)):
            x = x.reshape(want)  # a batch matmul operand with its leading dimensions flattened
        if x.shape != want or x.dtype != np.int8:
            raise RuntimeError(f"dsa.launch of '{prog.name}': input '{name}' must be "
                               f"int8{list(want)}, got {x.dtype}{list(x.shape)}")
        logical_in[name] = x
        feeds.update(pack_region_input(name, x, prog.meta["io"][name], block,
                                       sim.config.block_out))
    res = sim.run(prog, feeds)
    for name, t in zip(names_out, args[1 + len(names_in):]):
        y = unpack_activation(res.outputs[name], tuple(prog.meta["io"][name]["shape"]))
        t.copyfrom(y.reshape(tuple(int(d) for d in t.shape)))
        logical_out[name] = y
    _launches.append(Launch(prog, res, logical_in, logical_out))


def register() -> None:
    """Register ``dsa.launch`` (again after ``load_module`` is harmless)."""
    import tvm_ffi

    tvm_ffi.register_global_func(LAUNCH, launch, override=True)


def take_launches() -> list[Launch]:
    """The launches recorded since the last call (and forget them)."""
    out = list(_launches)
    _launches.clear()
    return out

"""Run compiled DSA regions from a TVM VirtualMachine: the ``dsa.launch`` packed function.

A compiled module calls ``R.call_dps_packed("dsa.launch", [program, *inputs])``
for every offloaded region. ``program`` is the region's program container as a
uint8 constant (it survives ``export_library``); this function unpacks it once,
packs the int8 inputs into the DSA layout, runs the simulator (values and
timing), and unpacks the outputs into the destination tensors.

State, and why it stays small and consistent under threads:

* unpacked programs are cached by content digest (least recently used dropped
  beyond :data:`PROGRAM_CACHE_ENTRIES` programs or :data:`PROGRAM_CACHE_BYTES`
  bytes), behind a lock;
* launches are recorded per thread, and only those of the current model run:
  a run ends when a program of it launches again or a program of another compile
  launches (each program carries its compile's id), so a serving loop keeps one
  run's records, not all of them. :func:`take_launches` and
  ``dsa_tvm.last_run_report()`` read the calling thread's run.

TVM's ``relax.VirtualMachine`` is not thread-safe (a VM shared by threads gives
wrong outputs and internal errors, with or without DSA regions): give every
thread its own ``VirtualMachine`` of the executable; they run concurrently and
exactly.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .hw.config import HardwareConfig, config_from_dict
from .isa.program import Program, read_header
from .lowering.host_pack import pack_region_input
from .lowering.layouts import unpack_activation
from .sim.simulator import SimResult, Simulator

LAUNCH = "dsa.launch"
#: unpacked programs kept (the least recently launched go first beyond either bound)
PROGRAM_CACHE_ENTRIES = 512
PROGRAM_CACHE_BYTES = 256 << 20


@dataclass
class Launch:
    """One region run: its program, the simulator's result, and the int8 tensors
    (logical layout) it consumed and produced, for checking against a reference."""

    program: Program
    result: SimResult
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]

    @property
    def compile_id(self) -> str | None:
        """The compile the program came from (``None`` for programs made elsewhere)."""
        return self.program.meta.get("compile")


class _ProgramCache:
    """Unpacked programs by the digest of their bytes, bounded, shared by all threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, tuple[Program, Simulator, int]] = OrderedDict()
        self._bytes = 0

    def get(self, blob: bytes) -> tuple[bytes, Program, Simulator]:
        key = hashlib.sha1(blob).digest()
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return key, hit[0], hit[1]
        sim = Simulator(_config_of(blob))  # unpacked outside the lock: threads do not wait
        prog = sim.load_program(blob)
        with self._lock:
            if key not in self._entries:
                self._entries[key] = (prog, sim, len(blob))
                self._bytes += len(blob)
                while len(self._entries) > 1 and (len(self._entries) > PROGRAM_CACHE_ENTRIES
                                                  or self._bytes > PROGRAM_CACHE_BYTES):
                    _, (_, _, n) = self._entries.popitem(last=False)
                    self._bytes -= n
        return key, prog, sim

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


@dataclass
class _Run:
    """The calling thread's current model run."""

    launches: list[Launch] = field(default_factory=list)
    keys: set[bytes] = field(default_factory=set)

    def add(self, key: bytes, launch: Launch) -> None:
        if self.launches and (key in self.keys
                              or launch.compile_id != self.launches[-1].compile_id):
            self.launches.clear()   # a new run of this model, or a run of another one
            self.keys.clear()
        self.launches.append(launch)
        self.keys.add(key)


_programs = _ProgramCache()
_local = threading.local()


def _run() -> _Run:
    run = getattr(_local, "run", None)
    if run is None:
        run = _local.run = _Run()
    return run


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
    key, prog, sim = _programs.get(blob)
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
    _run().add(key, Launch(prog, res, logical_in, logical_out))


def register() -> None:
    """Register ``dsa.launch`` (again after ``load_module`` is harmless)."""
    import tvm_ffi

    tvm_ffi.register_global_func(LAUNCH, launch, override=True)


def take_launches() -> list[Launch]:
    """The launches of the calling thread's last model run (and forget them)."""
    run = _run()
    out = list(run.launches)
    run.launches.clear()
    run.keys.clear()
    return out

"""Run compiled DSA regions from a TVM VirtualMachine: the ``dsa.launch`` packed function.

A compiled module calls ``R.call_dps_packed("dsa.launch", [program, *inputs])``
for every offloaded region. ``program`` is the region's program container as a
uint8 constant (it survives ``export_library``); this function unpacks it once,
packs the int8 inputs into the DSA layout, runs the simulator (values and
timing), and unpacks the outputs into the destination tensors.

State, and why it stays small and consistent under threads:

* unpacked programs are cached by content digest (least recently used dropped
  beyond :data:`PROGRAM_CACHE_ENTRIES` programs or :data:`PROGRAM_CACHE_BYTES`
  bytes), behind a lock; a program tensor launched before is found by its memory
  (the cache holds the tensor, so no other can take its place) without reading,
  copying and hashing its bytes again: an LLM's decode program carries its 135 MB of
  weights, which cost a fifth of a simulated token's wall time each launch;
* each thread keeps its last packing of every input that packs by gathering (a KV
  cache's weight tiles, bounded by :data:`~dsa_tvm.layers.pack_memo.MEMO_BYTES`), so
  the next step repacks only the cache positions that changed
  (:class:`~dsa_tvm.layers.pack_memo.PackMemo`; not inside a launch batch, whose runs
  start later);
* launches are recorded per thread and per compile (each program carries its
  compile's id), and only those of each executable's last model run: a run ends when
  a program of it launches again, and a thread keeps the runs of its
  :data:`RUNS_PER_THREAD` most recently run executables, so a serving loop keeps one
  run's records, not all of them. :func:`launches_of` (``dsa_tvm.run_report(vm)``)
  reads one executable's last run, :func:`take_launches`
  (``dsa_tvm.last_run_report()``) the newest one.

TVM's ``relax.VirtualMachine`` is not thread-safe (a VM shared by threads gives
wrong outputs and internal errors, with or without DSA regions): give every
thread its own ``VirtualMachine`` of the executable; they run concurrently and
exactly.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .isa.program import LAUNCH, PREFIX_BYTES, Program, recorded_config
from .launch_batch import batch_of_this_thread
from .layers.host_pack import pack_region_input
from .layers.layouts import unpack_activation
from .layers.pack_memo import PackMemo
from .layers.rope_tables import IO_KEY as ROPE_TABLE
from .sim.simulator import SimResult, Simulator

if TYPE_CHECKING:
    from .hw.config import HardwareConfig

#: unpacked programs kept (the least recently launched go first beyond either bound)
PROGRAM_CACHE_ENTRIES = 512
PROGRAM_CACHE_BYTES = 256 << 20
#: executables per thread whose last run is kept (the least recently run go first)
RUNS_PER_THREAD = 8


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

    def __init__(self, max_entries: int = PROGRAM_CACHE_ENTRIES,
                 max_bytes: int = PROGRAM_CACHE_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, tuple[Program, Simulator, int]] = OrderedDict()
        self._bytes = 0
        #: (address, size) of a launched program tensor -> (the tensor, held so its memory
        #: stays its own; its first bytes, with the container's checksum; digest)
        self._tensors: dict[tuple[int, int], tuple[Any, bytes, bytes]] = {}

    def get_tensor(self, tensor: Any) -> tuple[bytes, Program, Simulator]:
        """:meth:`get` of a program tensor's bytes; a tensor launched before (the same
        memory, its first bytes unchanged) without reading the rest."""
        try:
            view = np.from_dlpack(tensor)
        except (TypeError, BufferError, RuntimeError, AttributeError):   # not a host tensor
            return self.get(tensor.numpy().tobytes())
        where = (view.ctypes.data, view.nbytes)
        prefix = view.reshape(-1)[:PREFIX_BYTES].tobytes()
        with self._lock:
            seen = self._tensors.get(where)
            hit = None if seen is None or seen[1] != prefix else self._entries.get(seen[2])
            if hit is not None:
                self._entries.move_to_end(seen[2])
                return seen[2], hit[0], hit[1]
        key, prog, sim = self.get(view.tobytes())
        with self._lock:
            if key in self._entries:
                self._tensors[where] = (tensor, prefix, key)
        return key, prog, sim

    def get(self, blob: bytes) -> tuple[bytes, Program, Simulator]:
        key = hashlib.sha1(blob).digest()
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return key, hit[0], hit[1]
        sim = Simulator(recorded_config(blob))  # unpacked outside the lock: threads do not wait
        prog = sim.load_program(blob)
        with self._lock:
            if key not in self._entries:
                self._entries[key] = (prog, sim, len(blob))
                self._bytes += len(blob)
                self._evict()
        return key, prog, sim

    def _evict(self) -> None:
        while len(self._entries) > 1 and (len(self._entries) > self.max_entries
                                          or self._bytes > self.max_bytes):
            key, (_, _, n) = self._entries.popitem(last=False)
            self._bytes -= n
            for where in [w for w, (_, _, k) in self._tensors.items() if k == key]:
                del self._tensors[where]

    @contextmanager
    def bounded(self, max_entries: int | None = None, max_bytes: int | None = None):
        """Other bounds for a while (every thread's launches see them), then the old ones."""
        old = self.max_entries, self.max_bytes
        with self._lock:
            self.max_entries = old[0] if max_entries is None else max_entries
            self.max_bytes = old[1] if max_bytes is None else max_bytes
            self._evict()
        try:
            yield self
        finally:
            with self._lock:
                self.max_entries, self.max_bytes = old

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._tensors.clear()
            self._bytes = 0


@dataclass
class _Run:
    """One executable's current model run in the calling thread."""

    launches: list[Launch] = field(default_factory=list)
    keys: set[bytes] = field(default_factory=set)


class _ThreadRuns:
    """The calling thread's last run of each of its ``limit`` most recently run compiles."""

    def __init__(self, limit: int = RUNS_PER_THREAD) -> None:
        self.limit = limit
        self._runs: OrderedDict[str | None, _Run] = OrderedDict()
        self._taken = False  # take() has returned the newest run already

    def add(self, key: bytes, launch: Launch) -> None:
        cid = launch.compile_id
        run = self._runs.get(cid)
        if run is None or key in run.keys:  # this executable's first or next run
            run = self._runs[cid] = _Run()
        self._runs.move_to_end(cid)
        while len(self._runs) > self.limit:
            self._runs.popitem(last=False)
        run.launches.append(launch)
        run.keys.add(key)
        self._taken = False

    def of(self, compile_id: str | None) -> list[Launch]:
        run = self._runs.get(compile_id)
        return list(run.launches) if run is not None else []

    def take(self) -> list[Launch]:
        """The newest run's launches, once (until something launches again)."""
        if self._taken or not self._runs:
            return []
        self._taken = True
        return list(next(reversed(self._runs.values())).launches)


_programs = _ProgramCache()
_local = threading.local()


def thread_pack_memo() -> PackMemo:
    """The calling thread's last packings of the inputs that pack by gathering (a KV
    cache repacks only the positions that changed since the step before)."""
    memo = getattr(_local, "pack_memo", None)
    if memo is None:
        memo = _local.pack_memo = PackMemo()
    return memo


def _runs() -> _ThreadRuns:
    runs = getattr(_local, "runs", None)
    if runs is None:
        runs = _local.runs = _ThreadRuns()
    return runs


#: [cim] fields that decide where weights go (and so the compile's crossbar placement):
#: device conditions may change everything else
PLACEMENT_FIELDS = ("crossbars", "crossbar_rows", "crossbar_cols", "bits_per_cell",
                    "cells_per_weight")
_conditions: ContextVar["_Conditions | None"] = ContextVar("dsa_tvm_cim_conditions",
                                                           default=None)


class _Conditions:
    """Device conditions launches run under instead of their compiled description: each
    program restamped for it, with a simulator of its own (made once per program)."""

    def __init__(self, cfg: HardwareConfig):
        self.cfg = cfg
        # one simulator per program, as the runtime keeps them: each holds its program's
        # programmed crossbars and their calibration (a shared simulator keeps only a few)
        self.programs: dict[bytes, tuple[Program, Simulator]] = {}
        self.lock = threading.Lock()

    def program(self, key: bytes, prog: Program) -> tuple[Program, Simulator]:
        from .lowering.program_cache import restamp

        with self.lock:
            hit = self.programs.get(key)
        if hit is None:
            _check_conditions(prog, self.cfg)
            hit = (restamp(prog, self.cfg), Simulator(self.cfg))
            with self.lock:
                self.programs[key] = hit
        return hit


def _check_conditions(prog: Program, cfg: HardwareConfig) -> None:
    """``cfg`` may differ from the program's description only in [cim] device conditions."""
    from .hw.config import config_from_dict

    built = config_from_dict(prog.meta["hardware"], source="<program>")
    differ = sorted(k for k in cfg.values if cfg.values[k] != built.values[k])
    bad = [k for k in differ if k in PLACEMENT_FIELDS or not _is_cim_field(k)]
    if not built.is_cim or bad:
        raise RuntimeError(
            f"dsa.launch of '{prog.name}' under other conditions: the program was compiled "
            f"for '{built.name}'" + ("" if built.is_cim else ", which has no crossbars")
            + (f", and {', '.join(bad)} would change what it compiles to" if bad else "")
            + "; compile for that description instead (only the [cim] device conditions - "
            "noise, ADC, drift, mitigations, seed, timing and energy - may change at run time)")


def compiled_view(cfg: HardwareConfig) -> tuple:
    """What a compile for ``cfg`` depends on: every field but the [cim] device conditions
    (two descriptions with the same view run one compiled model under
    :func:`cim_conditions`)."""
    return tuple(sorted((k, repr(v)) for k, v in cfg.values.items()
                        if k in PLACEMENT_FIELDS or not _is_cim_field(k)))


def _is_cim_field(name: str) -> bool:
    from .hw.schema import FIELDS

    return any(f.name == name and f.section == "cim" for f in FIELDS)


@contextmanager
def cim_conditions(cfg: HardwareConfig):
    """Launches inside run on ``cfg`` instead of the CIM description their programs were
    compiled for: the same compiled model on the same crossbars under other device
    conditions (noise, ADC, time since programming, mitigations), without recompiling.
    Only [cim] fields other than the placement ones (:data:`PLACEMENT_FIELDS`) may differ;
    a launch of anything else is refused. The conditions' programmed crossbars are
    released on exit."""
    token = _conditions.set(_Conditions(cfg))
    try:
        yield
    finally:
        _conditions.reset(token)


def launch(*args: Any) -> None:
    """``dsa.launch(program, *inputs, *outputs)``: destination-passing style."""
    key, prog, sim = _programs.get_tensor(args[0])
    cond = _conditions.get()
    if cond is not None:
        prog, sim = cond.program(key, prog)
    names_in, names_out = prog.meta["inputs"], prog.meta["outputs"]
    if len(args) != 1 + len(names_in) + len(names_out):
        raise RuntimeError(f"dsa.launch of '{prog.name}' takes {len(names_in)} inputs and "
                           f"{len(names_out)} outputs, got {len(args) - 1} tensors")
    block = sim.config.block_in
    batch = batch_of_this_thread()
    feeds, logical_in, logical_out = {}, {}, {}
    for name, t in zip(names_in, args[1:1 + len(names_in)]):
        x = t.numpy()
        want = tuple(prog.meta["io"][name]["shape"])
        if x.shape != want and x.size == int(np.prod(want)):
            x = x.reshape(want)  # a batch matmul operand with its leading dimensions flattened
        io = prog.meta["io"][name]
        dtype = np.float32 if ROPE_TABLE in io else np.dtype(io.get("dtype", "int8"))
        if x.shape != want or x.dtype != dtype:
            raise RuntimeError(f"dsa.launch of '{prog.name}': input '{name}' must be "
                               f"{np.dtype(dtype).name}{list(want)}, got "
                               f"{x.dtype}{list(x.shape)}")
        logical_in[name] = x
        if batch is None:   # the memo's arrays change at the next launch: run them now
            feeds.update(thread_pack_memo().pack(key, name, x, io, block, sim.config.block_out))
        else:
            feeds.update(pack_region_input(name, x, io, block, sim.config.block_out))
    if batch is not None and not sim.config.is_cim:   # a CIM read's noise is per run
        res = batch.run(key, prog, sim, feeds)
    else:
        res = sim.run(prog, feeds)
    for name, t in zip(names_out, args[1 + len(names_in):]):
        y = unpack_activation(res.outputs[name], tuple(prog.meta["io"][name]["shape"]))
        t.copyfrom(y.reshape(tuple(int(d) for d in t.shape)))
        logical_out[name] = y
    _runs().add(key, Launch(prog, res, logical_in, logical_out))


def register() -> None:
    """Register ``dsa.launch`` (again after ``load_module`` is harmless)."""
    import tvm_ffi

    tvm_ffi.register_global_func(LAUNCH, launch, override=True)


def take_launches() -> list[Launch]:
    """The launches of the calling thread's last model run (once: a second call without
    a launch in between returns none)."""
    return _runs().take()


def launches_of(compile_id: str | None) -> list[Launch]:
    """The launches of the calling thread's last run of compile ``compile_id`` (empty when
    it has not run in this thread, or not since RUNS_PER_THREAD other executables ran)."""
    return _runs().of(compile_id)


def program_cache_bounds(max_entries: int | None = None, max_bytes: int | None = None):
    """``with program_cache_bounds(max_entries=1):`` bounds the shared program cache
    differently for a while (tests of eviction)."""
    return _programs.bounded(max_entries, max_bytes)


def release_programs() -> None:
    """Forget every unpacked program and its simulator (a CIM part's programmed crossbars
    with them): a study that compiles one model for many descriptions frees each one's
    memory before the next (and the calling thread's kept input packings)."""
    _programs.clear()
    thread_pack_memo().clear()

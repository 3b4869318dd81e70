"""Join the DSA launches of threads that run one model into batched simulations.

A dataset loop runs the same compiled model on many inputs, and every run launches the
same region programs in the same order. Under a :class:`LaunchBatch`, member threads (each
with its own ``VirtualMachine`` of the executable: a VM is not thread-safe) run inputs
concurrently, and each ``dsa.launch`` waits until every member still working has reached
it; then one of them runs the program once over all their inputs
(``Simulator.run_batch``: bit for bit the single runs, the timing simulated once and
shared, as it is data independent) and each thread takes its own outputs. The members
move in lockstep, launch by launch, so a group is always the same launch of each
member's current input. A member that finishes (or fails) leaves, and the groups it would
have joined go ahead without it.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    from .isa.program import Program
    from .sim.simulator import SimResult, Simulator

#: a launch waiting longer than this for the other members is a bug, said so
WAIT_S = 3600.0
#: the batch the running thread is a member of (a thread's context is its own)
_CURRENT: contextvars.ContextVar[LaunchBatch | None] = contextvars.ContextVar(
    "dsa_launch_batch", default=None)


@dataclass
class _Group:
    feeds: list[dict[str, np.ndarray]] = field(default_factory=list)
    result: Any = None
    error: BaseException | None = None
    running: bool = False
    done: bool = False


class LaunchBatch:
    """Threads that call :meth:`member` have their launches batched together."""

    def __init__(self, wait_s: float = WAIT_S) -> None:
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._members: set[int] = set()
        self._groups: dict[bytes, _Group] = {}
        self.batches = 0          # batched simulations run
        self.launches = 0         # launches they served

    @contextmanager
    def member(self):
        """The calling thread's launches join this batch while inside."""
        ident = threading.get_ident()
        with self._cond:
            self._members.add(ident)
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)
            with self._cond:
                self._members.discard(ident)
                self._cond.notify_all()   # groups waiting for this member go ahead

    def run(self, key: bytes, prog: "Program", sim: "Simulator",
            feeds: dict[str, np.ndarray]) -> "SimResult":
        """This member's launch of ``prog`` (``key``: its digest), run with the others'."""
        with self._cond:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group()
            slot = len(group.feeds)
            group.feeds.append(feeds)
            self._cond.notify_all()
            deadline = time.monotonic() + self.wait_s
            mine = False
            while not group.done:
                if not group.running and len(group.feeds) >= len(self._members):
                    group.running = mine = True
                    del self._groups[key]   # the next launch of this program starts anew
                    break
                if not self._cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                    raise RuntimeError(
                        f"dsa.launch of '{prog.name}' waited {self.wait_s:.0f} s for the other "
                        f"threads of a launch batch: they must run the same model, each in "
                        f"its own VirtualMachine, inside LaunchBatch.member()")
        if mine:
            try:
                stacked = {k: np.stack([f[k] for f in group.feeds]) for k in group.feeds[0]}
                group.result = sim.run_batch(prog, stacked)
            except BaseException as e:  # noqa: BLE001 - every member of the group re-raises it
                group.error = e
            with self._cond:
                group.done = True
                self.batches += 1
                self.launches += len(group.feeds)
                self._cond.notify_all()
        if group.error is not None:
            raise group.error
        res = group.result
        return replace(res, outputs={k: v[slot] for k, v in res.outputs.items()}, batch=1)


def batch_of_this_thread() -> LaunchBatch | None:
    """The launch batch the calling thread is a member of, if any."""
    return _CURRENT.get()


def _one_tvm_thread() -> None:
    """The calling thread's TVM thread pool down to one worker: with a pool per member
    thread, their spinning workers take the cores from the one thread that simulates
    (measured on ResNet-18: 179 ms an image with the pools, 127 ms without, 206 ms one
    image at a time)."""
    import tvm

    tvm.get_global_func("runtime.config_threadpool")(1, 1)


Item = TypeVar("Item")
Out = TypeVar("Out")


def run_joined(make_vm: Callable[[], Any], run: Callable[[Any, Item], Out],
               items: Sequence[Item], threads: int,
               advance: Callable[[int], Any] | None = None) -> list[Out]:
    """``run(vm, item)`` for every item, ``threads`` at a time: each thread has its own VM
    (``make_vm``) and takes the next item when it is done; their launches are joined
    (:class:`LaunchBatch`). The results in item order; the first error is raised after
    every thread has stopped. ``advance(1)`` after each item (a progress bar)."""
    threads = max(1, min(threads, len(items)))
    out: list[Any] = [None] * len(items)
    todo = iter(range(len(items)))
    lock, errors = threading.Lock(), []
    joined = LaunchBatch()
    ready = threading.Barrier(threads)   # every member in before the first launch

    def work() -> None:
        try:
            _one_tvm_thread()
            vm = make_vm()
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller
            errors.append(e)
            ready.abort()   # the others must not wait for this thread
            return
        with joined.member():
            try:
                ready.wait()
            except threading.BrokenBarrierError:
                return
            while not errors:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                try:
                    out[i] = run(vm, items[i])
                except BaseException as e:  # noqa: BLE001 - re-raised by the caller
                    errors.append(e)
                    return
                if advance is not None:
                    with lock:
                        advance(1)

    # each thread runs in a copy of the caller's context: its compile options and device
    # conditions (runtime.cim_conditions) hold there too
    pool = [threading.Thread(target=contextvars.copy_context().run, args=(work,), daemon=True)
            for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return out

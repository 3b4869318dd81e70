"""Errors a bad program raises: each names the instruction index and the reason."""

from __future__ import annotations


class SimulationError(RuntimeError):
    """The program cannot run: a bad address, an illegal field, a deadlock, a race."""

    def __init__(self, index: int | None, message: str):
        self.index = index
        where = f"instruction {index}: " if index is not None else ""
        super().__init__(where + message)


class DeadlockError(SimulationError):
    """No engine can make progress: every waiting instruction waits on a token that never comes."""


class HazardError(SimulationError):
    """Two engines touch the same scratchpad rows at overlapping times without a token between."""

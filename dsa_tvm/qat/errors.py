"""The one error QAT raises for input it cannot take."""

from __future__ import annotations


class QatError(ValueError):
    """A module or argument QAT cannot take; the message says why and what to do."""


class NonFiniteError(QatError):
    """Training drove a weight, scale or loss to NaN or infinity."""

"""Evaluate TIR index expressions in Python, on ints or on numpy grids of loop values.

The walker needs the value of an index or offset expression for given loop
variables, and sometimes for every point of a loop nest at once (to check that
it is affine, or to find the padding a condition describes); numpy
broadcasting gives both from one evaluator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Env = dict[str, Any]


class ExprError(ValueError):
    """An expression the walker cannot evaluate (not an index expression)."""


def _floordiv(a, b):
    return np.floor_divide(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) \
        else a // b


def _floormod(a, b):
    return np.mod(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else a % b


_BINARY = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "FloorDiv": _floordiv,
    "FloorMod": _floormod,
    "Div": _floordiv,   # index arithmetic: operands are non-negative here
    "Mod": _floormod,
    "Min": np.minimum,
    "Max": np.maximum,
    "LT": lambda a, b: a < b,
    "LE": lambda a, b: a <= b,
    "GT": lambda a, b: a > b,
    "GE": lambda a, b: a >= b,
    "EQ": lambda a, b: a == b,
    "NE": lambda a, b: a != b,
    "And": np.logical_and,
    "Or": np.logical_or,
}


def evaluate(e: Any, env: Env) -> Any:
    """Value of ``e`` with loop variables bound by name in ``env`` (ints or arrays)."""
    kind = type(e).__name__
    if kind == "IntImm":
        return int(e.value)
    if kind == "Var":
        try:
            return env[e.name]
        except KeyError:
            raise ExprError(f"unbound variable '{e.name}' in index expression") from None
    if kind in _BINARY:
        return _BINARY[kind](evaluate(e.a, env), evaluate(e.b, env))
    if kind == "Not":
        return np.logical_not(evaluate(e.a, env))
    if kind == "Cast":
        return evaluate(e.value, env)
    if kind == "Select":
        return np.where(evaluate(e.condition, env), evaluate(e.true_value, env),
                        evaluate(e.false_value, env))
    if kind == "Call" and e.op.name.endswith("if_then_else"):
        c, t, f = e.args
        return np.where(evaluate(c, env), evaluate(t, env), evaluate(f, env))
    raise ExprError(f"cannot evaluate {kind} in an index expression: {e}")


def grid_env(env: Env, loops: list[tuple[str, int]]) -> Env:
    """``env`` plus every loop variable as a broadcastable arange over its extent."""
    out = dict(env)
    n = len(loops)
    for k, (name, ext) in enumerate(loops):
        shape = [1] * n
        shape[k] = ext
        out[name] = np.arange(ext, dtype=np.int64).reshape(shape)
    return out


def affine(fn: Callable[[Env], Any], env: Env,
           loops: list[tuple[str, int]]) -> tuple[int, list[int]]:
    """(value at the first point, stride per loop) of ``fn(env)`` (an expression's value),
    which must be affine in the loop variables; raises ExprError when it is not."""
    at0 = {**env, **{name: 0 for name, _ in loops}}
    base = int(fn(at0))
    strides = []
    for name, ext in loops:
        strides.append(int(fn({**at0, name: 1})) - base if ext > 1 else 0)
    full = np.broadcast_to(fn(grid_env(env, loops)), [ext for _, ext in loops])
    want = np.full([ext for _, ext in loops], base, dtype=np.int64)
    for k, (_, ext) in enumerate(loops):
        shape = [1] * len(loops)
        shape[k] = ext
        want = want + strides[k] * np.arange(ext, dtype=np.int64).reshape(shape)
    if not np.array_equal(full, want):
        raise ExprError(f"index expression is not affine in {[n for n, _ in loops]}")
    return base, strides


def expr_fn(e: Any) -> Callable[[Env], Any]:
    return lambda env: evaluate(e, env)


def flat_offset(indices: list[Any], shape: list[int]) -> Callable[[Env], Any]:
    """The row-major element offset of ``buffer[indices]`` as a function of env."""
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    strides.reverse()

    def value(env: Env) -> Any:
        return sum(evaluate(ix, env) * st for ix, st in zip(indices, strides))

    return value

"""Evaluate TIR index expressions in Python, on ints or on numpy grids of loop values.

The walker needs the value of an index or offset expression for given loop
variables, and sometimes for every point of a loop nest at once (to check that
it is affine, or to find the padding a condition describes); numpy
broadcasting gives both from one evaluator.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from tir_schedules.nests import CodegenError

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
    return compiled(e)(env)


#: expression handle -> (expression, its evaluator); the expression is kept alive so
#: its handle cannot be reused by another object while the entry exists
_COMPILED: dict[int, tuple[Any, Callable[[Env], Any]]] = {}
_MAX_COMPILED = 200_000


def compiled(e: Any) -> Callable[[Env], Any]:
    """``env -> value of e``: the expression turned into Python closures once (walking
    the TIR objects on every evaluation is what made index arithmetic slow)."""
    key = e.__chandle__()
    hit = _COMPILED.get(key)
    if hit is not None:
        return hit[1]
    fn, linear = _compile(e)
    fn.linear = linear
    if linear:
        fn = _linear_form(fn, _var_names(e))
    if len(_COMPILED) >= _MAX_COMPILED:
        _COMPILED.clear()
    _COMPILED[key] = (e, fn)
    return fn


def _var_names(e: Any) -> list[str]:
    """Names of the variables ``e`` reads (index expressions: Vars under arithmetic)."""
    kind = type(e).__name__
    if kind == "Var":
        return [e.name]
    if kind == "IntImm":
        return []
    if kind == "Cast":
        return _var_names(e.value)
    return list(dict.fromkeys(_var_names(e.a) + _var_names(e.b)))


def _linear_form(fn: Callable[[Env], Any], names: list[str]) -> Callable[[Env], Any]:
    """An evaluator of the linear ``fn`` from its coefficients: ``c0 + sum(c_v * v)``, read
    off ``fn`` at zero and at each unit vector. It carries them as ``.coef`` so
    :func:`affine` needs no evaluation at all."""
    zero = {n: 0 for n in names}
    c0 = int(fn(zero))
    coef = {n: int(fn({**zero, n: 1})) - c0 for n in names}
    return _from_coef(c0, {n: c for n, c in coef.items() if c})


def _from_coef(c0: int, coef: dict[str, int]) -> Callable[[Env], Any]:
    items = tuple(coef.items())

    def value(env: Env) -> Any:
        try:
            return c0 + sum(c * env[n] for n, c in items)
        except KeyError as e:
            raise ExprError(f"unbound variable '{e.args[0]}' in index expression") from None

    value.linear = True
    value.coef = (c0, coef)
    return value


_COMPARE = ("LT", "LE", "GT", "GE")


def convex(e: Any) -> bool:
    """Whether condition ``e`` is a conjunction of comparisons of linear expressions: the
    points of a loop box where it holds are then a convex set, so it holds on the whole
    box exactly when it holds at the box's corners."""
    kind = type(e).__name__
    if kind == "And":
        return convex(e.a) and convex(e.b)
    return kind in _COMPARE and _linear(e.a) and _linear(e.b)


def _linear(e: Any) -> bool:
    """Whether ``compiled(e)`` is linear (sums and constant multiples of variables)."""
    return getattr(compiled(e), "linear", False)


def _constant(e: Any) -> bool:
    return type(e).__name__ == "IntImm"


def _compile(e: Any) -> tuple[Callable[[Env], Any], bool]:
    """The evaluator of ``e`` and whether it is linear in its variables: then values at
    single points determine it everywhere (see :func:`affine`)."""
    kind = type(e).__name__
    if kind == "IntImm":
        value = int(e.value)
        return (lambda env: value), True
    if kind == "Var":
        name = e.name

        def var(env: Env) -> Any:
            try:
                return env[name]
            except KeyError:
                raise ExprError(f"unbound variable '{name}' in index expression") from None

        return var, True
    if kind in _BINARY:
        op, fa, fb = _BINARY[kind], compiled(e.a), compiled(e.b)
        linear = (kind in ("Add", "Sub") and _linear(e.a) and _linear(e.b)) or \
            (kind == "Mul" and ((_constant(e.a) and _linear(e.b)) or
                                (_constant(e.b) and _linear(e.a))))
        return (lambda env: op(fa(env), fb(env))), linear
    if kind == "Not":
        fa = compiled(e.a)
        return (lambda env: np.logical_not(fa(env))), False
    if kind == "Cast":
        inner = compiled(e.value)
        return (lambda env: inner(env)), _linear(e.value)
    if kind == "Select":
        fc, ft, ff = compiled(e.condition), compiled(e.true_value), compiled(e.false_value)
        return (lambda env: np.where(fc(env), ft(env), ff(env))), False
    if kind == "Call" and e.op.name.endswith("if_then_else"):
        fc, ft, ff = (compiled(a) for a in e.args)
        return (lambda env: np.where(fc(env), ft(env), ff(env))), False

    def unsupported(env: Env) -> Any:
        raise ExprError(f"cannot evaluate {kind} in an index expression: {e}")

    return unsupported, False


_ARANGE: dict[tuple[int, int, int], np.ndarray] = {}


def _axis(n: int, k: int, ext: int) -> np.ndarray:
    """``arange(ext)`` shaped to broadcast along axis ``k`` of ``n`` (shared, read-only)."""
    a = _ARANGE.get((n, k, ext))
    if a is None:
        shape = [1] * n
        shape[k] = ext
        a = np.arange(ext, dtype=np.int64).reshape(shape)
        a.flags.writeable = False
        if len(_ARANGE) > 4096:
            _ARANGE.clear()
        _ARANGE[(n, k, ext)] = a
    return a


def grid_env(env: Env, loops: list[tuple[str, int]]) -> Env:
    """``env`` plus every loop variable as a broadcastable arange over its extent."""
    out = dict(env)
    n = len(loops)
    for k, (name, ext) in enumerate(loops):
        out[name] = _axis(n, k, ext)
    return out


def affine(fn: Callable[[Env], Any], env: Env,
           loops: list[tuple[str, int]]) -> tuple[int, list[int]]:
    """(value at the first point, stride per loop) of ``fn(env)`` (an expression's value),
    which must be affine in the loop variables; raises ExprError when it is not."""
    dims = [ext for _, ext in loops]
    form = getattr(fn, "coef", None)
    if form is not None:
        c0, coef = form
        inner = {name for name, _ in loops}
        try:
            base = c0 + sum(c * env[n] for n, c in coef.items() if n not in inner)
        except KeyError as e:
            raise ExprError(f"unbound variable '{e.args[0]}' in index expression") from None
        return int(base), [coef.get(name, 0) if ext > 1 else 0 for name, ext in loops]
    if 0 in dims:
        # an empty nest has no grid to read the first point and the steps from
        at0 = {**env, **{name: 0 for name, _ in loops}}
        base = int(fn(at0))
        return base, [int(fn({**at0, name: 1})) - base if ext > 1 else 0
                      for name, ext in loops]
    full = np.broadcast_to(fn(grid_env(env, loops)), dims)
    # the value at the first point and one step along each loop, read off the grid
    # (the same element-wise arithmetic as evaluating those points one by one)
    origin = (0,) * len(loops)
    base = int(full[origin])
    strides = []
    for k, ext in enumerate(dims):
        strides.append(int(full[origin[:k] + (1,) + origin[k + 1:]]) - base if ext > 1 else 0)
    want = np.full(dims, base, dtype=np.int64)
    for k, ext in enumerate(dims):
        if strides[k]:
            want = want + strides[k] * _axis(len(dims), k, ext)
    if not np.array_equal(full, want):
        raise ExprError(f"index expression is not affine in {[n for n, _ in loops]}")
    return base, strides


def expr_fn(e: Any) -> Callable[[Env], Any]:
    return compiled(e)


def flat_offset(indices: list[Any], shape: list[int]) -> Callable[[Env], Any]:
    """The row-major element offset of ``buffer[indices]`` as a function of env."""
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    strides.reverse()

    fns = [compiled(ix) for ix in indices]
    if all(hasattr(f, "coef") for f in fns):
        c0, coef = 0, {}
        for f, st in zip(fns, strides):
            f0, fc = f.coef
            c0 += f0 * st
            for n, c in fc.items():
                coef[n] = coef.get(n, 0) + c * st
        return _from_coef(c0, {n: c for n, c in coef.items() if c})

    def value(env: Env) -> Any:
        return sum(f(env) * st for f, st in zip(fns, strides))

    return value


#: (tag, node handle) -> (node, what was derived from it): the walker visits the same
#: scheduled TIR once per tile, and reading TIR objects through the FFI dominated that
_NODE_CACHE: dict[tuple[str, int], tuple[Any, Any]] = {}


def node_cached(tag: str, node: Any, make: Callable[[Any], Any]) -> Any:
    """``make(node)``, computed once per TIR node (the node is kept alive with it)."""
    key = (tag, node.__chandle__())
    hit = _NODE_CACHE.get(key)
    if hit is None:
        if len(_NODE_CACHE) > 200_000:
            _NODE_CACHE.clear()
        hit = _NODE_CACHE[key] = (node, make(node))
    return hit[1]


def store_offset(st: Any) -> Callable[[Env], Any]:
    """Element offset of a BufferStore's destination (cached per node)."""
    return node_cached("store", st, lambda n: flat_offset(
        list(n.indices), [int(d) for d in n.buffer.shape]))


def load_offset(ld: Any) -> Callable[[Env], Any]:
    """Element offset of a TensorLoad's source (cached per node)."""
    return node_cached("load", ld, lambda n: flat_offset(
        list(n.indices), [int(d) for d in n.source.shape]))


def pad_box(cond: Any, env: Env, rows_lp) -> list[tuple[int, int]]:
    """Per row loop, the (before, after) counts of points where ``cond`` is false."""
    if node_cached("convex", cond, convex) and _holds_at_corners(cond, env, rows_lp):
        return [(0, 0)] * len(rows_lp)  # a tile away from the borders: no padding
    mask = np.broadcast_to(evaluate(cond, grid_env(env, rows_lp)), [e for _, e in rows_lp])
    pads = []
    proj = []
    for k, (name, ext) in enumerate(rows_lp):
        axes = tuple(j for j in range(len(rows_lp)) if j != k)
        valid = mask.any(axis=axes) if axes else mask
        idx = np.flatnonzero(valid)
        if len(idx) == 0:
            raise CodegenError(f"a tile of the copy is all padding along '{name}'")
        lo, hi = int(idx[0]), int(idx[-1]) + 1
        if not valid[lo:hi].all():
            raise CodegenError(f"padding along '{name}' is not at the edges")
        pads.append((lo, ext - hi))
        shape = [1] * len(rows_lp)
        shape[k] = ext
        proj.append(valid.reshape(shape))
    if not np.array_equal(mask, np.logical_and.reduce(np.broadcast_arrays(*proj))):
        raise CodegenError("the padding condition is not a box")
    return pads


def _holds_at_corners(cond: Any, env: Env, rows_lp) -> bool:
    fn = compiled(cond)
    for corner in itertools.product(*[(0, ext - 1) if ext > 1 else (0,) for _, ext in rows_lp]):
        point = dict(env)
        for (name, _), v in zip(rows_lp, corner):
            point[name] = v
        if not fn(point):
            return False
    return True

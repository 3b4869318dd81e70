"""Does the graph intake hands on compute what the user's graph computes?

Both run on onnxruntime with graph optimizations off (op by op, the reference the
project compares against everywhere) on one seeded input of the fixed shapes.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

#: float outputs agree when max |diff| <= RTOL * max(1, max |reference|)
RTOL = 1e-4
SEED = 0


def seeded_feed(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """One deterministic input: normal floats, small non-negative integers (valid indices), bools."""
    rng = np.random.default_rng(SEED)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    feed = {}
    for name, shape in shapes.items():
        dt = onnx.helper.tensor_dtype_to_np_dtype(types[name]) if types.get(name) else np.dtype(np.float32)
        if dt == np.bool_:
            feed[name] = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(dt, np.integer):
            feed[name] = rng.integers(0, 2, shape).astype(dt)
        else:
            feed[name] = rng.normal(0, 1, shape).astype(dt)
    return feed


def run(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    from ..ort_session import session

    return session(model, optimize=False).run(None, dict(feed))


def compare(ref: list[np.ndarray], got: list[np.ndarray], names: list[str]) -> tuple[float, str | None]:
    """(worst max |diff| over the float outputs, a mismatch description or None)."""
    worst = 0.0
    if len(ref) != len(got):
        return 0.0, f"{len(got)} outputs instead of {len(ref)}"
    for name, r, g in zip(names, ref, got):
        r, g = np.asarray(r), np.asarray(g)
        if r.shape != g.shape:
            return 0.0, f"output '{name}' has shape {g.shape} instead of {r.shape}"
        if not np.issubdtype(r.dtype, np.floating):
            if not np.array_equal(r, g):
                return 0.0, f"output '{name}' differs in {int((r != g).sum())} of {r.size} values"
            continue
        if r.size == 0:
            continue
        diff = float(np.nanmax(np.abs(r.astype(np.float64) - g.astype(np.float64))))
        if not np.array_equal(np.isnan(r), np.isnan(g)):
            return diff, f"output '{name}' has NaNs where the original has none (or the reverse)"
        tol = RTOL * max(1.0, float(np.nanmax(np.abs(r))))
        worst = max(worst, diff)
        if diff > tol:
            return diff, f"output '{name}' differs by {diff:.3g} (tolerance {tol:.3g})"
    return worst, None

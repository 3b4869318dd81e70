"""Running device programs in tests: the presets the suite covers, random operands,
and a simulator run alone or checked bit for bit against the reference machine."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import strategies as st

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.program import Program
from dsa_tvm.sim import int8_gemm
from dsa_tvm.sim.simulator import Simulator
from dsa_tvm.sim.timing import Schedule

from .reference_machine import reference_outputs, wrap32

#: the bundled hardware presets the suite is written for
PRESETS = ("default", "edge", "large")
#: the presets the property tests draw from (two array shapes)
PROPERTY_CFGS = {n: load_config(n) for n in ("default", "edge")}


def run(cfg, program: Program, inputs=None, **kw):
    return Simulator(cfg).run(program, inputs or {}, **kw)


def run_and_check(cfg, program: Program, inputs=None):
    """Run on the simulator and the reference; assert every output is bit-identical. The
    simulator runs the program twice: step by step as it is timed, then replayed with its
    plan (``sim.replay``: skipped loads, shared-input GEMMs); both must match."""
    sim = Simulator(cfg)
    res = sim.run(program, inputs or {})
    again = sim.run(program, inputs or {})
    assert again.timing_reused
    ref = reference_outputs(cfg, program, inputs)
    assert set(res.outputs) == set(ref) == set(again.outputs)
    for name, want in ref.items():
        for got, how in ((res.outputs[name], "stepped"), (again.outputs[name], "replayed")):
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_array_equal(got, want, err_msg=f"output '{name}' ({how})")
    return res, ref


def prune_n_m(codes: np.ndarray, n: int, m: int) -> np.ndarray:
    """``codes`` with all but the N largest magnitudes of every aligned group of M along
    the last axis set to zero (ties to the lower index): N:M-sparse tiles for tests."""
    c = np.array(codes, copy=True)
    groups = c.reshape(c.shape[:-1] + (c.shape[-1] // m, m))
    order = np.argsort(-np.abs(groups.astype(np.int64)), axis=-1, kind="stable")
    np.put_along_axis(groups, order[..., n:], 0, axis=-1)
    return groups.reshape(c.shape)


def rand_int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def rand_int16(rng, shape):
    return rng.integers(-(1 << 15), 1 << 15, shape, dtype=np.int16)


def rand_int32(rng, shape, lo=-(1 << 31), hi=(1 << 31)):
    return rng.integers(lo, hi, shape, dtype=np.int64).astype(np.int32)


def schedule_of(start, end, engine) -> Schedule:
    """A timing schedule from instruction intervals and engines (attribution tests)."""
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    return Schedule(start, end, np.asarray(engine, np.int64), np.zeros_like(start),
                    int(end.max()) if end.size else 0)


def random_layers(instrs, n_layers: int, rnd) -> tuple[Schedule, list[tuple[int, int]]]:
    """The schedule of hypothesis-drawn ``(start, duration, engine)`` instructions and a
    random cut of them into up to ``n_layers`` consecutive layers (first, last)."""
    sched = schedule_of([s for s, _, _ in instrs], [s + d for s, d, _ in instrs],
                        [e for _, _, e in instrs])
    cuts = sorted(rnd.sample(range(1, len(instrs)), min(n_layers, len(instrs)) - 1))
    bounds = [0, *cuts, len(instrs)]
    return sched, [(lo, hi - 1) for lo, hi in zip(bounds, bounds[1:])]


@contextmanager
def gemm_path(float32: bool):
    """Simulate GEMMs on the float32 path (as on a CPU whose int8 products are not exact)
    or on the int8 one where this CPU has it: tests run both."""
    int8_gemm.available()
    saved = dict(int8_gemm._STATE)
    if float32:
        int8_gemm._STATE["ok"] = False
    try:
        yield
    finally:
        int8_gemm._STATE.update(saved)


def wrap32_np(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=object)
    return np.vectorize(wrap32, otypes=[np.int64])(x).astype(np.int32)


def identity_tile(cfg) -> np.ndarray:
    """A block_out x block_in weight tile whose GEMM copies an input row to the accumulator."""
    assert cfg.block_in == cfg.block_out  # true for every bundled preset
    return np.eye(cfg.block_out, cfg.block_in, dtype=np.int8)


@pytest.fixture(scope="module", params=["int8", "float32"])
def both_gemm_paths(request):
    """A module's every test on the exact int8 GEMM path (where this CPU proves it exact)
    and on the float32 path a CPU without it takes (``pytestmark`` uses it)."""
    with gemm_path(float32=request.param == "float32"):
        yield request.param


def draw_nest(draw, levels: int, names: str, max_ext: int, max_stride: int) -> list[tuple]:
    """A random loop nest for the property tests: ``levels`` loops of (extent, one stride
    per operand in ``names``)."""
    loops = []
    for _ in range(levels):
        e = draw(st.integers(1, max_ext))
        loops.append((e,) + tuple(draw(st.integers(0, max_stride)) for _ in names))
    return loops


def nest_span(loops: list[tuple], k: int) -> int:
    """The largest offset operand ``k`` (1-based in each loop tuple) reaches in ``loops``."""
    return sum((lp[0] - 1) * lp[k] for lp in loops)

"""Rotary embedding with runtime tables (an LLM step's cos/sin of its positions): the
float tables are region inputs the host packs in a fixed point chosen at compile time
from their bound; compiled, simulated and compared bit for bit with the integer
reference, within one output step of float RoPE, and a table beyond its bound is refused
by the host packer with a message naming it (never a wrong result)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers import ir as L
from dsa_tvm.layers.host_pack import pack_region_input
from dsa_tvm.layers.layouts import unpack_activation
from dsa_tvm.layers.rope_tables import (
    TABLE_BOUND,
    RopeTableError,
    frac_for_bound,
    table_tensor,
)
from dsa_tvm.lowering.region import compile_region, lowering_supports
from dsa_tvm.sim.simulator import Simulator
from tir_schedules.kinds import run_region

from .test_lowering import CFGS, FEW, PRESETS

FRAC = frac_for_bound(TABLE_BOUND)


def angles(positions: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Llama's float32 tables of ``positions`` (base 10000)."""
    inv = 1.0 / 10000 ** (np.arange(0, d, 2) / d)
    ang = positions[:, None].astype(np.float64) * inv[None, :]
    ang = np.concatenate([ang, ang], -1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rope_region(shape: tuple[int, ...], sx: float, zx: int, sy: float, zy: int,
                table_shape: tuple[int, ...]) -> L.Region:
    m, s = sem.quantize_multiplier(sx / (sy * 2**FRAC))
    rq = L.Requant(np.array([m], np.int32), np.array([s], np.int32), zy)
    x, y = L.QTensor("x", shape, sx, zx), L.QTensor("y", shape, sy, zy)
    cos, sin = (table_tensor(n, table_shape, FRAC) for n in ("cos", "sin"))
    ly = L.Rope("rope", x, y, None, None, rq, tables=(cos, sin), frac=FRAC,
                bound=TABLE_BOUND)
    return L.Region("r", [x, cos, sin], [y], [ly])


def simulate(reg: L.Region, cfg, feeds: dict[str, np.ndarray]) -> np.ndarray:
    prog = compile_region(reg, cfg).program
    packed = {}
    for k, v in feeds.items():
        packed.update(pack_region_input(k, v, prog.meta["io"][k], cfg.block_in,
                                        cfg.block_out))
    res = Simulator(cfg).run(prog, packed)
    return unpack_activation(res.outputs["y"], reg.outputs[0].shape)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_runtime_tables_bit_exact_and_within_a_step_of_float(preset, data):
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    d = cfg.block_out * draw(st.sampled_from([2, 4]))
    p = draw(st.integers(1, 6))
    heads = draw(st.integers(1, 4))
    start = draw(st.integers(0, 4000))           # far positions: every angle
    zx, zy = draw(st.integers(-128, 127)), draw(st.integers(-20, 20))
    sx, sy = 0.04, 0.05
    reg = rope_region((heads, p, d), sx, zx, sy, zy, (p, d))
    assert lowering_supports(reg.layers[0], cfg) is None
    cos, sin = angles(np.arange(start, start + p), d)
    codes = rng.integers(-128, 128, (heads, p, d), dtype=np.int8)
    feeds = {"x": codes, "cos": cos, "sin": sin}
    want = run_region(reg, feeds)["y"]
    np.testing.assert_array_equal(simulate(reg, cfg, feeds), want)
    xf = (codes.astype(np.float64) - zx) * sx
    rot = np.concatenate([-xf[..., d // 2:], xf[..., :d // 2]], -1)
    ref = np.clip(np.round((xf * cos + rot * sin) / sy) + zy, -128, 127)
    assert np.abs(want.astype(np.float64) - ref).max() <= 1


def test_the_same_program_serves_every_position():
    """One compile, two positions' tables: the tables are data, not program."""
    cfg = CFGS["default"]
    reg = rope_region((3, 1, 64), 0.04, 5, 0.05, -1, (1, 64))
    prog = compile_region(reg, cfg).program
    assert "cos" in prog.meta["io"] and prog.meta["io"]["cos"]["rope_table"]["frac"] == FRAC
    codes = np.random.default_rng(1).integers(-128, 128, (3, 1, 64), dtype=np.int8)
    outs = []
    for pos in (7, 900):
        cos, sin = angles(np.array([pos]), 64)
        feeds = {"x": codes, "cos": cos, "sin": sin}
        got = simulate(reg, cfg, feeds)
        np.testing.assert_array_equal(got, run_region(reg, feeds)["y"])
        outs.append(got)
    assert (outs[0] != outs[1]).any()


@pytest.mark.parametrize("bad, why", [(1.5, "magnitude 1.5, beyond the bound 1"),
                                      (np.nan, "non-finite")])
def test_a_table_beyond_its_bound_is_refused_by_name(bad, why):
    cfg = CFGS["default"]
    reg = rope_region((1, 2, 32), 0.04, 0, 0.05, 0, (2, 32))
    prog = compile_region(reg, cfg).program
    cos, sin = angles(np.arange(2), 32)
    sin[1, 3] = bad
    with pytest.raises(RopeTableError, match=f"'sin'.*{why}"):
        pack_region_input("sin", sin, prog.meta["io"]["sin"], cfg.block_in, cfg.block_out)
    with pytest.raises(RopeTableError, match="'sin'"):
        run_region(reg, {"x": np.zeros((1, 2, 32), np.int8), "cos": cos, "sin": sin})

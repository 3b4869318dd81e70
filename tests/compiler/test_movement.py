"""Concat and nearest resize inside a region (``tir_schedules.kinds.movement``): DMA-only
layers between compute layers, compiled, simulated and compared bit for bit with the
integer reference (``numpy.concatenate`` / ``numpy.repeat``)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dsa_tvm.layers import ir as L  # noqa: E402
from dsa_tvm.lowering.region import lowering_supports  # noqa: E402

from .test_lowering import CFGS, FEW, PRESETS, check, conv, qt, region  # noqa: E402


def same_grid(t: L.QTensor, name: str, shape, like: L.QTensor) -> L.QTensor:
    return L.QTensor(name, tuple(shape), like.scale, like.zero_point)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_concat_between_convs(preset, data):
    """conv_i -> concat (2-4 inputs, the last one a partial block) -> conv, one region."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    block = cfg.block_out
    n, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
    k = draw(st.integers(2, 4))
    chans = [block * draw(st.integers(1, 2)) for _ in range(k - 1)] + \
        [draw(st.integers(1, 2 * block))]
    x = qt(rng, "x", (n, 3, h, w))
    convs = [conv(rng, x, c, 1, 1, 0, name=f"c{i}") for i, c in enumerate(chans)]
    grid = convs[0].output
    convs = [L.Conv2d(**{**c.__dict__, "output": same_grid(c.output, c.output.name,
                                                           c.output.shape, grid)})
             for c in convs]
    cat_y = same_grid(grid, "cat", (n, sum(chans), h, w), grid)
    cat = L.Concat("cat", tuple(c.output for c in convs), cat_y)
    tail = conv(rng, cat_y, draw(st.integers(1, 2 * block)), 3, 1, 1, name="tail")
    check(region([x], convs + [cat, tail]), cfg, rng)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_resize_then_concat(preset, data):
    """The YOLO neck: conv -> nearest upsample x2/x3 -> concat with a skip -> conv."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    block = cfg.block_out
    s = draw(st.sampled_from([(2, 2), (3, 3), (2, 1)]))
    n, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    c_up = block * draw(st.integers(1, 2))
    x = qt(rng, "x", (n, 4, h, w))
    skip = qt(rng, "skip", (n, draw(st.integers(1, 2 * block)), h * s[0], w * s[1]))
    c0 = conv(rng, x, c_up, 1, 1, 0, name="c0")
    up = L.Resize("up", c0.output, same_grid(c0.output, "up", (n, c_up, h * s[0], w * s[1]),
                                             c0.output), s)
    skip = same_grid(skip, "skip", skip.shape, c0.output)
    cat_y = same_grid(c0.output, "cat", (n, c_up + skip.shape[1], h * s[0], w * s[1]),
                      c0.output)
    cat = L.Concat("cat", (up.output, skip), cat_y)
    tail = conv(rng, cat_y, draw(st.integers(1, 2 * block)), 3, 1, 1, name="tail")
    check(region([x, skip], [c0, up, cat, tail]), cfg, rng)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_resize_partial_block(preset, data):
    """A resize of a region input with a partial channel block, as the region's output."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    x = qt(rng, "x", (1, draw(st.integers(1, 3 * cfg.block_out)), draw(st.integers(1, 5)),
                      draw(st.integers(1, 5))))
    n, c, h, w = x.shape
    up = L.Resize("up", x, same_grid(x, "up", (n, c, h * s[0], w * s[1]), x), s)
    check(region([x], [up]), cfg, rng)


def test_unsupported_forms_give_reasons():
    cfg = CFGS["default"]
    b = cfg.block_out
    a = L.QTensor("a", (1, b + 1, 2, 2), 0.1, 0)
    c = L.QTensor("c", (1, 4, 2, 2), 0.1, 0)
    y = L.QTensor("y", (1, b + 5, 2, 2), 0.1, 0)
    assert "multiple of the" in lowering_supports(L.Concat("k", (a, c), y), cfg)
    other = L.QTensor("c", (1, 4, 2, 2), 0.2, 0)
    y2 = L.QTensor("y", (1, 2 * b + 4, 2, 2), 0.1, 0)
    a2 = L.QTensor("a", (1, 2 * b, 2, 2), 0.1, 0)
    assert "one grid" in lowering_supports(L.Concat("k", (a2, other), y2), cfg)
    yb = L.QTensor("y", (2, 2 * b, 2, 2), 0.1, 0)
    assert lowering_supports(L.Concat("k", (a2, a2), yb, axis=0), cfg)
    r = L.Resize("r", a, L.QTensor("r", (1, b + 1, 4, 5), 0.1, 0), (2, 2))
    assert "integer nearest" in lowering_supports(r, cfg)


@pytest.mark.parametrize("preset", PRESETS)
def test_movement_layers_within_their_bounds(preset):
    """Measured DMA bytes of concat and resize never fall below the compulsory bytes."""
    from .test_layer_checks import _run_region

    cfg, rng = CFGS[preset], np.random.default_rng(4)
    b = cfg.block_out
    x = qt(rng, "x", (1, b, 3, 5))
    s = same_grid(x, "s", (1, b + 3, 6, 10), x)
    up = L.Resize("up", x, same_grid(x, "up", (1, b, 6, 10), x), (2, 2))
    cat = L.Concat("cat", (up.output, s), same_grid(x, "cat", (1, 2 * b + 3, 6, 10), x))
    rep = _run_region(region([x, s], [up, cat]), cfg, rng)
    assert len(rep.rows) == 2
    assert not rep.violations, "\n" + str(rep)

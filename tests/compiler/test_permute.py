"""Reshape and transpose inside a region (``tir_schedules.kinds.permute``): DMA-only block
copies, compiled, simulated and compared bit for bit with TVM's llvm build of the same
reshape -> permute_dims -> reshape; what moves lanes is refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dsa_tvm.layers import ir as L  # noqa: E402
from dsa_tvm.lowering.region import lowering_supports  # noqa: E402
from tir_schedules.kinds.permute import block_map  # noqa: E402

from .test_lowering import CFGS, FEW, PRESETS, check, conv, qt, region  # noqa: E402


def _tvm_move(x: np.ndarray, view, perm, out) -> np.ndarray:
    """reshape -> permute_dims -> reshape on int8, built by TVM for llvm."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    v = relax.Var("x", relax.TensorType(x.shape, "int8"))
    with bb.function("main", [v]):
        with bb.dataflow():
            y = bb.emit(relax.op.reshape(v, view))
            y = bb.emit(relax.op.permute_dims(y, list(perm)))
            y = bb.emit_output(relax.op.reshape(y, out))
        bb.emit_func_output(y)
    ex = tvm.compile(bb.get(), target="llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _move(x: L.QTensor, view, perm, out) -> L.Permute:
    return L.Permute("mv", x, L.QTensor("mv", tuple(out), x.scale, x.zero_point),
                     tuple(view), tuple(perm))


def _merge_leading(shape: tuple[int, ...], keep: int) -> tuple[int, ...]:
    """``shape`` with its leading axes merged down to ``keep`` axes (at least 2)."""
    k = max(2, min(keep, len(shape)))
    return (int(np.prod(shape[:len(shape) - k + 1])),) + tuple(shape[len(shape) - k + 1:])


def _run_against_tvm(cfg, rng, mv: L.Permute) -> None:
    res = check(region([mv.input], [mv]), cfg, rng)
    assert res is not None
    x = rng.integers(-128, 128, mv.input.shape, dtype=np.int8)
    np.testing.assert_array_equal(mv.apply(x), _tvm_move(x, mv.view, mv.perm, mv.output.shape))


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_row_axis_permutations_bit_exact(preset, data):
    """Ranks 2-5, any permutation of the row axes (the lane axis last), inputs and
    outputs in any leading-axis grouping of 2-3 axes (not 4: a 4-D tensor is an image)."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rank = draw(st.integers(2, 5))
    lanes = draw(st.sampled_from([1, cfg.block_out - 1, cfg.block_out, 2 * cfg.block_out + 3]))
    view = tuple(draw(st.integers(1, 4)) for _ in range(rank - 1)) + (lanes,)
    rows = draw(st.permutations(range(rank - 1)))
    perm = tuple(rows) + (rank - 1,)
    x = qt(rng, "x", _merge_leading(view, draw(st.integers(2, 3))))
    out = _merge_leading(tuple(view[p] for p in perm), draw(st.integers(2, 3)))
    mv = _move(x, view, perm, out)
    assert lowering_supports(mv, cfg) is None
    _run_against_tvm(cfg, rng, mv)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_head_split_and_merge(preset, data):
    """(B*S, H*D) -> (B*H, S, D) and back, D whole blocks (the attention heads)."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b, s, h = draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 4))
    d = cfg.block_out * draw(st.integers(1, 2))
    split = _move(qt(rng, "x", (b * s, h * d)), (b, s, h, d), (0, 2, 1, 3), (b * h, s, d))
    _run_against_tvm(cfg, rng, split)
    merge = _move(qt(rng, "x", (b * h, s, d)), (b, h, s, d), (0, 2, 1, 3), (b * s, h * d))
    _run_against_tvm(cfg, rng, merge)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_int16_head_merge_and_split_bit_exact(preset, data):
    """int16 codes (attention's output on an int16 grid, read by o_proj as byte planes)
    move as int16: every lane of every block, both ends of the code range. (The room once
    moved them as int8 rows: half of each block arrived, the rest was zero.)"""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b, s, h = draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 4))
    d = cfg.block_out * draw(st.integers(1, 2))
    for shape, view, out in (((b * h, s, d), (b, h, s, d), (b * s, h * d)),
                             ((b * s, h * d), (b, s, h, d), (b * h, s, d))):
        x = L.QTensor("x", shape, 0.001, 0, "int16")
        mv = L.Permute("mv", x, L.QTensor("mv", out, x.scale, 0, "int16"), view, (0, 2, 1, 3))
        codes = rng.integers(-32768, 32768, shape).astype(np.int16)
        codes.reshape(-1)[:2] = (-32768, 32767)
        got = check(region([x], [mv]), cfg, rng, xs={"x": codes})
        assert got is not None
        np.testing.assert_array_equal(mv.apply(codes), codes.reshape(view).transpose(
            0, 2, 1, 3).reshape(out))
    tiles = L.Permute("mv", x, L.QTensor("mv", out, x.scale, 0, "int16"), view, (0, 2, 1, 3),
                      weight_tiles=True)
    assert "int8 codes" in lowering_supports(tiles, cfg)


@pytest.mark.parametrize("preset", PRESETS)
def test_between_convs_and_flatten(preset):
    """conv -> NCHW flattened to rows (N*H*W, C): the ViT patch embedding's
    flatten+transpose, in one region with the conv; an in-order reshape is a copy."""
    cfg, rng = CFGS[preset], np.random.default_rng(3)
    x = qt(rng, "x", (2, 3, 4, 5))
    c = conv(rng, x, cfg.block_out + 2, 1, 1, 0, name="c")
    n, ch, h, w = c.output.shape
    flat = _move(c.output, (n, ch, h * w), (0, 2, 1), (n * h * w, ch))
    check(region([x], [c, flat]), cfg, rng)
    same = _move(c.output, c.output.shape, (0, 1, 2, 3), c.output.shape)
    check(region([x], [c, same]), cfg, rng)


def test_lane_moves_are_refused_with_reasons():
    cfg = CFGS["default"]
    blk = cfg.block_out
    x = qt(np.random.default_rng(0), "x", (3, 2 * blk))
    kt = _move(x, (3, 2 * blk), (1, 0), (2 * blk, 3))      # K^T: lanes become rows
    assert "between lanes" in lowering_supports(kt, cfg)
    odd = _move(x, (3, 2, blk), (0, 1, 2), (6, blk))         # fine: whole blocks
    assert lowering_supports(odd, cfg) is None
    cut = _move(x, (3, 4, blk // 2), (0, 1, 2), (12, blk // 2))  # halves of a block
    assert lowering_supports(cut, cfg) is not None
    other = L.Permute("mv", x, L.QTensor("mv", (3, 2 * blk), 0.5, 0), (3, 2 * blk), (0, 1))
    assert "one grid" in lowering_supports(other, cfg)
    assert isinstance(block_map(_move(x, (4, blk), (0, 1), (4, blk)), blk), str)


@pytest.mark.parametrize("preset", PRESETS)
def test_permute_within_its_bounds(preset):
    """Measured DMA bytes never fall below the compulsory bytes; cycles above the bound."""
    from .test_layer_checks import _run_region

    cfg, rng = CFGS[preset], np.random.default_rng(4)
    d = cfg.block_out
    mv = _move(qt(rng, "x", (2 * 5, 3 * d)), (2, 5, 3, d), (0, 2, 1, 3), (2 * 3, 5, d))
    rep = _run_region(region([mv.input], [mv]), cfg, rng)
    assert len(rep.rows) == 1
    assert not rep.violations, "\n" + str(rep)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_nchw_nhwc_layout_permutes_bit_exact(preset, data):
    """The layout_permute kind's two moves (ConvNeXt): an NCHW image to its NHWC rows
    ``(N*H*W, C)`` and back, batch 1-2, whole and partial channel blocks."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    c = draw(st.sampled_from([1, cfg.block_out - 1, cfg.block_out, 2 * cfg.block_out + 3]))
    if draw(st.booleans()):   # image -> rows
        x = qt(rng, "x", (n, c, h, w))
        mv = _move(x, (n, c, h, w), (0, 2, 3, 1), (n * h * w, c))
    else:                     # rows -> image
        x = qt(rng, "x", (n * h * w, c))
        mv = _move(x, (n, h, w, c), (0, 3, 1, 2), (n, c, h, w))
    assert lowering_supports(mv, cfg) is None
    _run_against_tvm(cfg, rng, mv)

"""The hand-written matmul program's fused output stage (bias, requantize, zero point,
clamp in one ALU REQUANT per tile) against Python-integer and numpy references."""

from __future__ import annotations

import numpy as np
import pytest

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.instructions import Alu, AluOp
from dsa_tvm.isa.semantics import quantize_multiplier, split_requant_imm
from dsa_tvm.programs.matmul import (
    MatmulTiling,
    matmul_program,
    pack_qparams,
    pack_weights,
    pad_cols,
    reference_matmul,
)

from .harness import PRESETS, rand_int8, run
from .reference_machine import output_stage_py


def _qparams(cfg, n, rng, with_bias=True):
    ms = [quantize_multiplier(float(s)) for s in rng.uniform(1e-4, 1e-2, n)]
    bias = rng.integers(-(1 << 17), 1 << 17, n) if with_bias else None
    return pack_qparams([m for m, _ in ms], [s for _, s in ms], cfg, bias=bias), ms, bias


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("zp,clamp", [(0, (-128, 127)), (-7, (-7, 127)), (3, (-20, 40))])
def test_matmul_fused_output_stage(name, zp, clamp):
    cfg = load_config(name)
    rng = np.random.default_rng(7)
    m, n, k = 19, 2 * cfg.block_out + 5, 3 * cfg.block_in + 2
    x = pad_cols(rand_int8(rng, (m, k)), cfg.block_in)
    w = rand_int8(rng, (n, k))
    qp, ms, bias = _qparams(cfg, n, rng)
    prog = matmul_program(cfg, m, n, k, tiling=MatmulTiling(5, 2), output_zp=zp, clamp=clamp)
    res = run(cfg, prog, {"x": x, "w": pack_weights(w, cfg), "qp": qp})
    got = res.outputs["out"]
    np.testing.assert_array_equal(got, reference_matmul(x, w, qp, cfg, zp, clamp))
    # independent: Python integers, element by element, on a sample of outputs
    acc = x[:, :k].astype(np.int64) @ w.astype(np.int64).T
    for i, j in [(0, 0), (m - 1, n - 1), (7, 3), (11, n // 2), (3, n - 2)]:
        mult, shift = ms[j]
        assert got[i, j] == output_stage_py(int(acc[i, j]), int(bias[j]), mult, shift, zp, *clamp)
    assert got[:, :n].min() >= clamp[0] and got[:, :n].max() <= clamp[1]
    # the padding channels (mult 0) come out as the zero point, clamped
    assert (got[:, n:] == min(max(zp, clamp[0]), clamp[1])).all()
    # one REQUANT per tile and no other vector work
    alus = [ins for ins in prog.instructions if isinstance(ins, Alu)]
    nb = -(-n // cfg.block_out)
    assert len(alus) == -(-m // 5) * -(-nb // 2)                # M tiles x N tiles
    assert {ins.op for ins in alus} == {AluOp.REQUANT}
    assert {split_requant_imm(ins.imm) for ins in alus} == {(zp, *clamp)}


def test_matmul_bias_is_optional_and_exact():
    cfg = load_config("default")
    rng = np.random.default_rng(8)
    m, n, k = 8, 16, 32
    x = pad_cols(rand_int8(rng, (m, k)), cfg.block_in)
    w = rand_int8(rng, (n, k))
    qp, _, _ = _qparams(cfg, n, rng, with_bias=False)
    assert not qp[:, 0].any()
    with_bias = qp.copy()
    with_bias[:, 0] = 1 << 20                            # a large bias moves every output
    outs = []
    for table in (qp, with_bias):
        prog = matmul_program(cfg, m, n, k, w=w, qparams=table)
        outs.append(run(cfg, prog, {"x": x}).outputs["out"])
        np.testing.assert_array_equal(outs[-1], reference_matmul(x, w, table, cfg))
    assert (outs[1] >= outs[0]).all() and (outs[1] > outs[0]).any()


def test_matmul_refuses_bad_qparams_and_clamps():
    cfg = load_config("edge")
    with pytest.raises(ValueError, match=r"qparams must be \[1, 3, 8\]"):
        matmul_program(cfg, 4, 8, 8, qparams=np.zeros((1, 2, 8), np.int32))
    with pytest.raises(ValueError, match="lo 5 > hi 4"):
        matmul_program(cfg, 4, 8, 8, clamp=(5, 4))
    with pytest.raises(ValueError, match="zero point must be int8"):
        matmul_program(cfg, 4, 8, 8, output_zp=200)


def test_pack_qparams_layout_by_hand():
    """The output-stage table the hand-written programs read: per block of block_out
    channels, rows bias, mult, shift; padding channels and a missing bias are zeros."""
    cfg = load_config("edge")                        # block_out 8
    qp = pack_qparams([10, 11, 12], [1, 2, 3], cfg, bias=[-1, -2, -3])
    assert qp.shape == (1, 3, 8) and qp.dtype == np.int32
    assert qp[0, 0].tolist() == [-1, -2, -3, 0, 0, 0, 0, 0]     # bias row
    assert qp[0, 1].tolist() == [10, 11, 12, 0, 0, 0, 0, 0]     # mult row
    assert qp[0, 2].tolist() == [1, 2, 3, 0, 0, 0, 0, 0]        # shift row
    assert pack_qparams(np.arange(9), np.arange(9), cfg).shape == (2, 3, 8)
    assert not pack_qparams([1], [1], cfg)[:, 0].any()          # no bias: zero row
    with pytest.raises(ValueError):
        pack_qparams([1, 2], [1], cfg)
    with pytest.raises(ValueError):
        pack_qparams([1, 2], [1, 2], cfg, bias=[1])

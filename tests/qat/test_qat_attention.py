"""Attention in QAT (``prepare(..., quantize_norms=True)``): the products of two
activations and the softmax run as the DSA's integers, in the prepared module and on the
DSA, bit for bit where nothing float sits between them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import dsa_tvm
from dsa_tvm import qat
from dsa_tvm.models.minilm_torch import MiniLM
from dsa_tvm.qat.attention import SoftmaxInputGrid, SoftmaxLayer
from dsa_tvm.quant.observers import MASKED

from .test_qat_transformer import _tokens, trained_on_dsa


class _Attention(nn.Module):
    """One head of attention between projections, nothing float in between: every op an
    integer layer."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.matmul(self.q(x), self.k(x).transpose(-1, -2))
        return self.o(torch.matmul(torch.softmax(s, dim=-1), self.v(x)))


def _run(model, *inputs: np.ndarray) -> np.ndarray:
    with dsa_tvm.options(offload="all"):
        ex = dsa_tvm.compile(model, "default", verbose=False)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in inputs)).numpy()


def test_integer_attention_on_the_dsa_equals_the_prepared_module_bit_for_bit():
    torch.manual_seed(0)
    net = _Attention().eval()
    x = torch.randn(8, 6, 16)
    p = qat.prepare(net, (x[:1],), [(x,)], quantize_norms=True)
    assert [k for _, k in p.qat_report.layers] == [
        "linear", "linear", "batch_matmul", "softmax", "linear", "batch_matmul", "linear"]
    qat.set_mode(p, "float")
    with torch.no_grad():
        np.testing.assert_array_equal(p(x).numpy(), net(x).numpy())
    qat.set_mode(p, "quant")
    # training moves the weights and the learned scales through the new layers
    for g in qat.layers.grids(p):
        g.gain.requires_grad_(not isinstance(g, qat.attention.FixedGrid))
    opt = torch.optim.Adam(p.parameters(), lr=1e-2)
    for _ in range(3):
        loss = (p(x) - net(x).detach()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(q.grad).all() for q in p.parameters() if q.grad is not None)
        assert p.qat_q.weight.grad.abs().sum() > 0     # through softmax and both products
        opt.step()
    model = qat.export(p)
    for k in range(2):
        with torch.no_grad():
            want = p(x[k:k + 1]).numpy()
        np.testing.assert_array_equal(_run(model, x[k:k + 1].numpy()), want)
    kinds = [type(ly).__name__ for r in dsa_tvm.last_compile_report().regions
             if r.target == "dsa" for ly in r.region.layers]
    assert {"Softmax", "BatchMatmul"} <= set(kinds) and kinds.count("Dense") == 4, kinds


def test_softmax_output_grid_is_fixed_and_second_operands_are_symmetric():
    torch.manual_seed(1)
    net = _Attention().eval()
    x = torch.randn(4, 5, 16)
    p = qat.prepare(net, (x[:1],), [(x,)], quantize_norms=True, learn_scales=True)
    (sm,) = [m for m in p.modules() if isinstance(m, SoftmaxLayer)]
    assert sm.out.s == 1 / 256 and sm.out.zero_point == -128
    assert not sm.out.gain.requires_grad
    assert p.qat_k.out.zero_point == 0 and p.qat_v.out.zero_point == 0   # K^T and V


def test_padded_sentences_do_not_stretch_the_softmax_input_grid():
    """MiniLM's mask adds float32's minimum at padded keys; the softmax input's grid holds
    the real scores (before PTQ's fix the mask set it, 1e38 wide)."""
    torch.manual_seed(0)
    net = MiniLM(vocab=50, hidden=32, layers=2, heads=2, inner=64, positions=16).eval()
    ids, mask = _tokens(np.random.default_rng(0), 6, 8, 50)
    p = qat.prepare(net, (ids[:1], mask[:1]), [(ids, mask)], quantize_norms=True)
    grids = [m for m in p.modules() if isinstance(m, SoftmaxInputGrid)]
    assert len(grids) == 2
    for g in grids:
        assert -g.zero_point * g.s - 128 * g.s > MASKED and g.s < 1.0
    kinds = [k for _, k in p.qat_report.layers]
    assert kinds.count("batch_matmul") == 4 and kinds.count("softmax") == 2
    with torch.no_grad():
        cos = torch.nn.functional.cosine_similarity(p(ids, mask), net(ids, mask)).min()
    assert cos > 0.98, cos
    on_dsa = trained_on_dsa(p, net, ids, mask)   # the host's LayerNorm: a float tolerance
    assert on_dsa.count("Softmax") == 2 and on_dsa.count("BatchMatmul") == 4, on_dsa


def test_softmax_over_another_axis_stays_fp32():
    class _Cols(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return torch.softmax(self.fc(x), dim=1)

    x = torch.randn(2, 3, 8)
    p = qat.prepare(_Cols().eval(), (x,), quantize_norms=True)
    assert [k for _, k in p.qat_report.layers] == ["linear"]
    assert any(op == "softmax" for _, op, _ in p.qat_report.fp32), p.qat_report.fp32


@pytest.mark.parametrize("norms", [False, True])
def test_without_the_option_attention_stays_fp32(norms):
    net = _Attention().eval()
    x = torch.randn(2, 4, 16)
    p = qat.prepare(net, (x,), quantize_norms=norms)
    kinds = {k for _, k in p.qat_report.layers}
    assert ("softmax" in kinds) == norms and ("batch_matmul" in kinds) == norms


def test_norm_kinds_can_be_chosen():
    x = torch.randn(2, 4, 24)

    class _Both(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = _NormBlock()

        def forward(self, x):
            h = self.block(x)
            return torch.softmax(torch.matmul(h, h.transpose(-1, -2)), -1)

    p = qat.prepare(_Both().eval(), (x,), quantize_norms={"softmax"})
    kinds = [k for _, k in p.qat_report.layers]
    assert "softmax" in kinds and "batch_matmul" in kinds and "layer_norm" not in kinds
    p = qat.prepare(_Both().eval(), (x,), quantize_norms="layer_norm")
    kinds = [k for _, k in p.qat_report.layers]
    assert "layer_norm" in kinds and "softmax" not in kinds
    with pytest.raises(qat.QatError, match="unknown kind.*group_norm.*'rms_norm'"):
        qat.prepare(_Both().eval(), (x,), quantize_norms={"group_norm"})
    with pytest.raises(qat.QatError, match="pass True, False or some of"):
        qat.prepare(_Both().eval(), (x,), quantize_norms=1)
    assert "softmax" not in {k for _, k in qat.prepare(_Both().eval(), (x,),
                                                      quantize_norms=None).qat_report.layers}


class _NormBlock(nn.Module):
    """Post-norm residual block: LayerNorm after a projection, a residual add, LayerNorm."""

    def __init__(self, d: int = 24) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d, eps=1e-5)
        with torch.no_grad():
            self.ln1.weight.uniform_(0.5, 2.0)
            self.ln1.bias.normal_(0, 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(self.fc1(x))
        return self.ln2(self.fc2(h) + h)


def test_layer_norm_on_the_dsa_equals_the_prepared_module_bit_for_bit():
    torch.manual_seed(2)
    net = _NormBlock().eval()
    x = torch.randn(8, 5, 24)
    p = qat.prepare(net, (x[:1],), [(x,)], quantize_norms=True)
    assert [k for _, k in p.qat_report.layers] == [
        "linear", "layer_norm", "linear", "add", "layer_norm"]
    qat.set_mode(p, "float")
    with torch.no_grad():
        np.testing.assert_array_equal(p(x).numpy(), net(x).numpy())
    qat.set_mode(p, "quant")
    opt = torch.optim.Adam(p.parameters(), lr=1e-2)
    for _ in range(3):   # gamma and beta train, through the integer norm's float gradient
        loss = (p(x) - net(x).detach()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        assert p.qat_ln1.weight.grad.abs().sum() > 0 and p.qat_ln2.bias.grad.abs().sum() > 0
        opt.step()
    model = qat.export(p)
    with torch.no_grad():
        want = p(x[:1]).numpy()
    np.testing.assert_array_equal(_run(model, x[:1].numpy()), want)
    kinds = [type(ly).__name__ for r in dsa_tvm.last_compile_report().regions
             if r.target == "dsa" for ly in r.region.layers]
    assert kinds.count("LayerNorm") == 2, kinds
    with torch.no_grad():   # and close to FP32 (int8 in and out of each norm)
        cos = torch.nn.functional.cosine_similarity(p(x), net(x), dim=-1).min()
    assert cos > 0.97, cos


def test_layer_norm_over_two_axes_stays_fp32():
    class _Wide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.ln = nn.Linear(8, 8), nn.LayerNorm((3, 8))

        def forward(self, x):
            return self.ln(self.fc(x))

    x = torch.randn(2, 3, 8)
    p = qat.prepare(_Wide().eval(), (x,), quantize_norms=True)
    assert [k for _, k in p.qat_report.layers] == ["linear"]
    assert any("last axis only" in why for *_, why in p.qat_report.fp32), p.qat_report.fp32


class _Masked(nn.Module):
    """Scores with a -inf mask (``masked_fill``'s usual value) before the softmax."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.matmul(self.q(x), self.k(x).transpose(-1, -2)) + bias, -1)


def test_minus_infinity_masks_calibrate_and_nan_is_refused():
    torch.manual_seed(3)
    x = torch.randn(4, 6, 16)
    bias = torch.zeros(4, 1, 6)
    bias[::2, :, 4:] = float("-inf")
    p = qat.prepare(_Masked().eval(), (x[:1], bias[:1]), [(x, bias)], quantize_norms=True)
    (g,) = [m for m in p.modules() if isinstance(m, SoftmaxInputGrid)]
    assert MASKED < -g.zero_point * g.s - 128 * g.s < 0
    with torch.no_grad():
        got = p(x, bias)
    assert (got[::2, :, 4:] == 0).all()    # masked keys: exactly 0 from the integer unit
    bias[1, 0, 0] = float("nan")
    with pytest.raises(qat.QatError, match="NaN"):
        qat.prepare(_Masked().eval(), (x[:1], bias[:1]), [(x, bias)], quantize_norms=True)

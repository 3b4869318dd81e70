"""RMSNorm in QAT (``prepare(..., quantize_norms=True)``): ``nn.RMSNorm`` and a decoder's own
``...RMSNorm`` module as the DSA's [norm] unit runs them, bit for bit on the DSA; what it
cannot mirror stays FP32, named, and still exports."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from dsa_tvm import qat

from .test_qat_attention import _run
from .test_qat_wide import _dsa_kinds, _int16_tensors, _train


class LlamaStyleRMSNorm(nn.Module):
    """Hugging Face's form: float32 statistics, ``weight * x / rms``."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon)).to(x.dtype)


class GemmaStyleRMSNorm(LlamaStyleRMSNorm):
    """Scales by ``1 + weight``: not what the unit computes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (1 + self.weight) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class _PreNormBlock(nn.Module):
    """A decoder's pre-norm residual block (attention without a mask, then an MLP), every op
    an integer layer once the norms are."""

    def __init__(self, norm: type[nn.Module], d: int = 16) -> None:
        super().__init__()
        self.n1, self.n2 = norm(d), norm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        with torch.no_grad():
            self.n1.weight.uniform_(0.5, 2.0)
            self.n2.weight.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.n1(x)
        att = torch.softmax(torch.matmul(self.q(h), self.k(h).transpose(-1, -2)), dim=-1)
        x = x + self.o(torch.matmul(att, self.v(h)))
        return x + self.down(torch.relu(self.up(self.n2(x))))


def _rms_norm(d: int) -> nn.Module:
    return nn.RMSNorm(d, eps=1e-5)


@pytest.mark.parametrize("norm", [_rms_norm, LlamaStyleRMSNorm])
@pytest.mark.parametrize("wide", [False, True])
def test_rms_norm_on_the_dsa_equals_the_prepared_module_bit_for_bit(norm, wide):
    torch.manual_seed(4)
    net = _PreNormBlock(norm).eval()
    x = torch.randn(8, 5, 16)
    p = qat.prepare(net, (x[:2],), [(x,)], quantize_norms=True, wide_norms=wide)
    kinds = [k for _, k in p.qat_report.layers]
    assert kinds.count("rms_norm") == 2 and kinds.count("softmax") == 1, p.qat_report.summary()
    assert bool(p.qat_report.wide) == wide
    qat.set_mode(p, "float")
    with torch.no_grad():   # the float form is the module's own
        np.testing.assert_allclose(p(x).numpy(), net(x).numpy(), rtol=1e-5, atol=1e-5)
    qat.set_mode(p, "quant")
    _train(p, net, x)
    assert p.qat_n1.weight.grad is not None and p.qat_n1.weight.grad.abs().sum() > 0
    model = qat.export(p)
    assert (_int16_tensors(model) > 0) == wide
    with torch.no_grad():
        want = p(x[:2]).numpy()
    np.testing.assert_array_equal(_run(model, x[:2].numpy()), want)
    assert _dsa_kinds().count("RMSNorm") == 2, _dsa_kinds()
    with torch.no_grad():
        cos = torch.nn.functional.cosine_similarity(p(x), net(x), dim=-1).min()
    assert cos > 0.98, cos


def test_an_rms_norm_of_another_formula_runs_as_written():
    torch.manual_seed(0)
    net = _PreNormBlock(GemmaStyleRMSNorm).eval()
    x = torch.randn(4, 5, 16)
    p = qat.prepare(net, (x[:2],), [(x,)], quantize_norms=True)
    assert "rms_norm" not in {k for _, k in p.qat_report.layers}
    why = [w for n, op, w in p.qat_report.fp32 if op == "GemmaStyleRMSNorm"]
    assert len(why) == 2 and "does not compute x / sqrt(mean(x^2) + eps) * weight" in why[0]
    qat.export(p)   # its own forward exports


def _onnx_run(model, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("shape", [(16,), (5, 16)])
def test_an_fp32_nn_rms_norm_still_exports(shape):
    """``aten::rms_norm`` has no ONNX export at opset 17: before, any prepared module with an
    ``nn.RMSNorm`` failed ``qat.export`` with the exporter's error."""
    class _Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.fc = nn.RMSNorm(shape), nn.Linear(16, 16)
            with torch.no_grad():
                self.norm.weight.uniform_(0.5, 2.0)

        def forward(self, x):
            return self.fc(self.norm(x))

    torch.manual_seed(1)
    x = torch.randn(3, 5, 16)
    p = qat.prepare(_Net().eval(), (x,), quantize_norms={"softmax"})
    assert [op for _, op, _ in p.qat_report.fp32] == ["RMSNorm"]
    with torch.no_grad():
        want = p(x).numpy()
    np.testing.assert_allclose(_onnx_run(qat.export(p), x.numpy()), want, rtol=1e-5, atol=1e-5)


def test_an_op_the_exporter_cannot_write_gets_a_qat_error():
    class _Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            return self.fc(nn.functional.rms_norm(x, (16,)))

    p = qat.prepare(_Functional().eval(), (torch.randn(2, 16),))
    with pytest.raises(qat.QatError, match="aten::rms_norm.*plainer PyTorch ops"):
        qat.export(p)

"""An activation plus a float constant tensor (attention's mask, as exporters leave it:
``quantize(dequantize(x) + C)``) on the DSA as ``AddConst``: the constant on an int8 grid
of its own, clamped to where it can still move the output (so -1e4 and float32-min masks are
exact; an -inf mask is refused by calibration today, which rejects non-finite
intermediates). Against TVM's llvm build of the same QDQ graph: within one output step, exactly
equal on the masked positions."""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import dsa_tvm  # noqa: E402
from dsa_tvm.models.quantize import output_quant_steps  # noqa: E402
from dsa_tvm.quant.api import quantize_onnx  # noqa: E402


class _Masked(torch.nn.Module):
    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(16, 24), torch.nn.Linear(24, 8)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) + self.mask)


def _compile_both(mask: torch.Tensor):
    import onnx

    net = _Masked(mask).eval()
    buf = io.BytesIO()
    torch.onnx.export(net, (torch.randn(1, 12, 16),), buf, opset_version=17, dynamo=False,
                      input_names=["input"])
    fp32 = onnx.load_from_string(buf.getvalue())
    rng = np.random.default_rng(1)
    feeds = [{"input": rng.standard_normal((1, 12, 16)).astype(np.float32)} for _ in range(4)]
    qm = quantize_onnx(fp32, feeds, show_progress=False)
    mod = qm.to_relax()
    cfg = dsa_tvm.load_config("default").replace(cpu_gmacs=0.01)
    dsa = tvm.compile(mod, target=dsa_tvm.target(cfg))
    llvm = tvm.compile(mod, target="llvm")
    return qm, dsa, llvm, feeds[0]["input"]


def _run(ex, x):
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


@pytest.mark.parametrize("fill", [-1e4, -3.0e38], ids=["-1e4", "finfo.min"])
def test_mask_add_runs_on_the_dsa_within_one_step(fill):
    mask = torch.triu(torch.full((12, 24), fill), 1)
    qm, dsa, llvm, x = _compile_both(mask)
    rep = dsa_tvm.compile_report(dsa)
    kinds = {ly.split(":")[-1] for d in rep.regions if d.target == "dsa" for ly in d.layers}
    assert "add_const" in kinds, str(rep)
    assert sum(d.target == "dsa" for d in rep.regions) == 1, str(rep)
    got, want = _run(dsa, x), _run(llvm, x)
    (step,) = [float(v) for v in output_quant_steps(qm.model).values()]
    assert np.abs(got - want).max() <= step * (1 + 1e-3)


def test_non_broadcasting_constant_stays_on_the_cpu():
    """A constant that does not broadcast to the activation never reaches the layer IR
    (TVM would not build the graph either); a constant of the activation's own shape
    does."""
    mask = torch.randn(1, 12, 24)
    _, dsa, llvm, x = _compile_both(mask)
    np.testing.assert_allclose(_run(dsa, x), _run(llvm, x), atol=0.5)

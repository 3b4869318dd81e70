"""Activation chains through the quantizer: a PyTorch block with SiLU, hardswish,
sigmoid-times-x, hardsigmoid and GELU between convs is planned int8 (one QDQ pair per
chain end), compiles to ONE DSA region with every activation a table, and runs
bit-exact against TVM's llvm build of the same quantized model; what stays FP32 is
listed with the reason."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import dsa_tvm  # noqa: E402
from dsa_tvm.quant import quantize_onnx  # noqa: E402


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.c3 = torch.nn.Conv2d(16, 24, 1)
        self.dw = torch.nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.c4 = torch.nn.Conv2d(24, 16, 1)

    def forward(self, x):
        x = torch.nn.functional.silu(self.c1(x))
        x = torch.nn.functional.hardswish(self.c2(x))
        y = self.c3(x)
        y = torch.sigmoid(y) * y
        y = torch.nn.functional.hardsigmoid(self.dw(y)) * 2.0
        return self.c4(torch.nn.functional.gelu(y))


def _export(m, shape) -> onnx.ModelProto:
    buf = io.BytesIO()
    torch.onnx.export(m.eval(), torch.randn(*shape), buf, input_names=["x"], opset_version=17,
                      dynamo=False)
    return onnx.load_from_string(buf.getvalue())


def test_block_is_one_region_of_tables_bit_exact():
    torch.manual_seed(0)
    shape = (1, 3, 16, 16)
    model = _export(_Block(), shape)
    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(6)]
    qm = quantize_onnx(model, calib)
    assert "FP32: Sigmoid" not in qm.summary() and "FP32: HardSwish" not in qm.summary()
    mod = qm.to_relax()
    x = tvm.runtime.tensor(calib[0]["x"])
    want = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](x).numpy()
    ex = tvm.compile(mod, target="dsa")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](x).numpy()
    np.testing.assert_array_equal(got, want)
    rep = dsa_tvm.compile_report(ex)
    dsa = [r for r in rep.regions if r.target == "dsa"]
    assert len(rep.regions) == 1 and len(dsa) == 1, str(rep)
    kinds = [type(ly).__name__ for ly in dsa[0].region.layers]
    assert kinds.count("Table") == 4 and kinds.count("Conv2d") == 5, kinds


def test_chain_on_fp32_tensor_is_listed_with_its_reason():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(3, 3, 3, padding=1)

        def forward(self, x):
            # a sigmoid of an FP32 tensor (softmax has no int8 form); a tanh nothing int8 reads
            return torch.sigmoid(torch.softmax(x, 1)) + self.c(x).tanh()

    shape = (1, 3, 8, 8)
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
    qm = quantize_onnx(_export(Net(), shape), calib)
    s = qm.summary()
    assert "FP32: Sigmoid" in s and "FP32 tensor" in s, s
    assert "FP32: Tanh" in s and "no int8 op reads" in s, s


def test_relax_path_plans_the_chains_as_tables():
    from tvm.relax.frontend.onnx import from_onnx

    from dsa_tvm.quant.relax_quantize import quantize_relax

    torch.manual_seed(0)
    shape = (1, 3, 16, 16)
    mod = from_onnx(_export(_Block(), shape), keep_params_in_input=False)
    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
    qmod, plan = quantize_relax(mod, calib)
    kinds = [c.kind for c in plan.chains]
    assert kinds.count("table") == 4 and "mul" not in kinds, kinds
    assert not plan.fp32, plan.fp32  # every activation op is part of a table chain
    x = tvm.runtime.tensor(calib[0]["x"])
    want = relax.VirtualMachine(tvm.compile(qmod, target="llvm"), tvm.cpu())["main"](x).numpy()
    ex = tvm.compile(qmod, target="dsa")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](x).numpy()
    np.testing.assert_array_equal(got, want)
    rep = dsa_tvm.compile_report(ex)
    assert [r.target for r in rep.regions] == ["dsa"], str(rep)


def _conv_then(tail: str):
    """conv + ReLU -> x / 2 -> erf [-> conv]: the product feeds a table op (after the ReLU
    the conv absorbs no division); with the second conv the chain ends int8 (a table),
    without it nothing int8 reads the erf."""
    from tvm.script import relax as R

    w = np.random.default_rng(0).standard_normal((4, 4, 1, 1)).astype(np.float32)

    @R.function
    def with_conv(x: R.Tensor((1, 4, 4, 4), "float32")):
        with R.dataflow():
            a = R.nn.relu(R.nn.conv2d(x, R.const(w)))
            b = R.divide(a, R.const(2.0, "float32"))
            e = R.erf(b)
            y = R.nn.conv2d(e, R.const(w))
            R.output(y)
        return y

    @R.function
    def alone(x: R.Tensor((1, 4, 4, 4), "float32")):
        with R.dataflow():
            a = R.nn.relu(R.nn.conv2d(x, R.const(w)))
            b = R.divide(a, R.const(2.0, "float32"))
            e = R.erf(b)
            R.output(e)
        return e

    return with_conv if tail == "conv" else alone


def test_relax_plan_gives_a_scalar_product_to_its_table_or_keeps_it_a_mul():
    from dsa_tvm.quant.relax_plan import make_plan

    table = make_plan(_conv_then("conv"))
    kinds = [c.kind for c in table.chains]
    assert kinds.count("table") == 1 and "mul" not in kinds, kinds
    (t,) = [c for c in table.chains if c.kind == "table"]
    assert [str(m.name) for m in t.members] == ["b"], t.members  # the division is the table's
    # no int8 op reads the erf: no table forms, so the division is a product chain again
    mul = make_plan(_conv_then("alone"))
    kinds = [c.kind for c in mul.chains]
    assert "mul" in kinds and "table" not in kinds, kinds

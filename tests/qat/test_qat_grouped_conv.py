"""Per-group weight grids on pointwise convolutions (``prepare(..., weight_group=G)``): a
1x1 conv with stride 1 and no padding is a dense over the image's pixels, so its weights
take the grouped dense's grid (a scale and an offset per G input channels) and the DSA
runs it on the image itself (``relay_passes.kinds.grouped_conv``). The exported model on
the DSA gives the prepared module's codes bit for bit; the grid's rounding gets PTQ's
bias correction; any other convolution stays per channel, and a float conv on a grid
that the DSA cannot take as a dense stays on the CPU, named."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from torch import nn
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm import qat
from dsa_tvm.layers.group_grid import group_grid
from dsa_tvm.qat.layers import WeightedLayer

from .test_qat_grouped import on_dsa

ACTS = {"relu": nn.ReLU(), "relu6": nn.ReLU6(), "none": nn.Identity()}


class Pointwise(nn.Module):
    """conv 3x3 + BN + ReLU, a pointwise conv (the expand), a depthwise conv, a pointwise
    conv (the project): a MobileNet block's layers."""

    def __init__(self, c: int, h: int, n: int, bias: bool, act: str) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c)
        self.expand = nn.Conv2d(c, h, 1, bias=bias)
        self.act = ACTS[act]
        self.dw = nn.Conv2d(h, h, 3, padding=1, groups=h)
        self.project = nn.Conv2d(h, n, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.stem(x)))
        return self.project(self.dw(self.act(self.expand(y))))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.sampled_from([16, 32, 48]), h=st.sampled_from([16, 32, 64]), n=st.integers(1, 40),
       hw=st.tuples(st.integers(1, 9), st.integers(1, 9)), group=st.sampled_from([16, 32]),
       bits=st.sampled_from([4, 8]), bias=st.booleans(), act=st.sampled_from(sorted(ACTS)),
       seed=st.integers(0, 1000))
def test_pointwise_convs_on_the_dsa_equal_the_prepared_module(c, h, n, hw, group, bits, bias,
                                                             act, seed) -> None:
    torch.manual_seed(seed)
    net = Pointwise(c, h, n, bias, act).eval()
    x = torch.randn(3, 3, *hw) * 2
    p = qat.prepare(net, (x[:1],), [(x,)], bits=bits, weight_group=group)
    groups = {m.name: m.group for m in p.modules() if isinstance(m, WeightedLayer)}
    fits = {"expand": c % group == 0 and c >= group, "project": h % group == 0 and h >= group}
    assert groups == {"stem": 0, "dw": 0, **{k: group if v else 0 for k, v in fits.items()}}
    with torch.no_grad():
        want = p(x[:1]).numpy()
    got, kinds = on_dsa(qat.export(p), x[:1].numpy())
    np.testing.assert_array_equal(got, want)
    assert kinds.count("GroupedDense") == sum(fits.values())
    assert "Dense" not in kinds                  # no layout change around them either


def test_training_and_bias_correction_keep_it_exact() -> None:
    """The grid's rounding shifts the output's mean: the correction takes most of that
    shift away on the calibration data; straight-through gradients move the grids; the
    trained module stays exact on the DSA."""
    torch.manual_seed(0)
    net = Pointwise(32, 64, 16, True, "relu6").eval()
    data = [(torch.randn(4, 3, 6, 6) + 0.5,) for _ in range(3)]
    shifts = {}
    for corr in (False, True):
        p = qat.prepare(net, (data[0][0][:1],), data, bits=4, weight_group=32,
                        bias_correction=corr)
        layer = next(m for m in p.modules() if isinstance(m, WeightedLayer)
                     and m.name == "project")
        assert layer.group == 32 and (layer.bias_shift is not None) == corr
        with torch.no_grad():
            err = torch.cat([p(*b) - net(*b) for b in data])
        shifts[corr] = float(err.mean(dim=(0, 2, 3)).abs().mean())
    assert shifts[True] < 0.5 * shifts[False], shifts
    before = layer.weight.detach().clone()
    opt = torch.optim.Adam([m.weight for m in p.modules() if isinstance(m, WeightedLayer)],
                           lr=3e-3)
    for step in range(4):
        x = data[step % 3][0]
        loss = ((p(x) - net(x).detach()) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert layer.weight.grad is not None and not torch.equal(before, layer.weight.detach())
    x = data[1][0][:1]
    with torch.no_grad():
        want = p(x).numpy()
    got, kinds = on_dsa(qat.export(p), x.numpy())
    np.testing.assert_array_equal(got, want)
    assert kinds.count("GroupedDense") == 2


def test_other_convolutions_stay_per_channel() -> None:
    """Strided, padded and grouped 1x1 convs and larger kernels are no dense over the
    pixels: per channel, whatever weight_group says."""
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(16, 32, 1, stride=2)
            self.b = nn.Conv2d(32, 32, 1, padding=1)
            self.c = nn.Conv2d(32, 32, 1, groups=2)
            self.d = nn.Conv2d(32, 16, 3)
            self.e = nn.Conv2d(16, 16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.e(self.d(self.c(self.b(self.a(x)))))

    x = torch.randn(2, 16, 12, 12)
    p = qat.prepare(Mixed().eval(), (x[:1],), [(x,)], bits=4, weight_group=16)
    groups = {m.name: m.group for m in p.modules() if isinstance(m, WeightedLayer)}
    assert groups.pop("c", 0) == 0     # groups=2: not mirrored, or per channel
    assert groups == {"a": 0, "b": 0, "d": 0, "e": 16}


def _float_conv_model(stride: int, pad: int, on_grid: bool) -> onnx.ModelProto:
    """Q -> DQ -> Conv(float 1x1 weight) -> Q -> DQ, the form the QAT export writes."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.1, (8, 32))
    w = group_grid(w, 16).values() if on_grid else w
    inits = [numpy_helper.from_array(w.reshape(8, 32, 1, 1).astype(np.float32), "W"),
             numpy_helper.from_array(np.float32(0.05), "s"),
             numpy_helper.from_array(np.int8(0), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("Conv", ["xd", "W"], ["c"], strides=[stride] * 2, pads=[pad] * 4),
             helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 32, 6, 6])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("stride, pad, on_grid, why", [
    (1, 0, True, None), (2, 0, True, "pointwise"), (1, 1, True, "pointwise"),
    (1, 0, False, "grid")])
def test_what_the_dsa_cannot_take_as_a_dense_stays_on_the_cpu(stride, pad, on_grid, why):
    """A strided or padded float 1x1 conv, or one whose weight is on no grid, compiles:
    its conv runs on the CPU (numbers equal to TVM's CPU build) and the report names the
    broken constraint."""
    model = _float_conv_model(stride, pad, on_grid)
    x = np.random.default_rng(1).normal(0, 1, (1, 32, 6, 6)).astype(np.float32)
    got, kinds = on_dsa(model, x)
    report = dsa_tvm.last_compile_report()
    ex = tvm.compile(from_onnx(model, keep_params_in_input=False), target="llvm")
    want = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    if why is None:
        assert kinds == ["GroupedDense"]
        assert np.abs(got - want).max() <= 0.05 + 1e-6   # one code: the DSA rounds once
    else:
        assert "GroupedDense" not in kinds
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        assert why in str(report), str(report)

"""The norm stream on int16 grids in QAT (``prepare(..., quantize_norms=True,
wide_norms=True)``): int16 LayerNorms and adds, a dense reading int16 rows as byte planes,
PTQ's outlier splits around them; the exported model on the DSA equals the prepared
module bit for bit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import dsa_tvm
from dsa_tvm import qat
from dsa_tvm.layers.reference import join_planes_shifted, stacked_byte_planes
from dsa_tvm.qat import exact
from dsa_tvm.qat.layers import AddLayer, Grid, WeightedLayer
from relay_passes.kinds.dense_planes import plane_lo_shift

from .test_qat_attention import _NormBlock, _run


def _dsa_kinds() -> list[str]:
    return [type(ly).__name__ for r in dsa_tvm.last_compile_report().regions
            if r.target == "dsa" for ly in r.region.layers]


def _train(p, net, x, steps: int = 3) -> None:
    opt = torch.optim.Adam(p.parameters(), lr=1e-3)
    for _ in range(steps):
        loss = (p(x) - net(x).detach()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _int16_tensors(model: onnx.ModelProto) -> int:
    """QuantizeLinear nodes writing int16 codes."""
    int16 = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT16}
    return sum(1 for n in model.graph.node
               if n.op_type == "QuantizeLinear" and n.input[2] in int16)


def test_wide_norm_stream_on_the_dsa_equals_the_prepared_module_bit_for_bit():
    torch.manual_seed(2)
    net = _NormBlock().eval()
    with torch.no_grad():   # ln1's largest output positive, so it meets the planes' ceiling
        net.ln1.bias[3] = 5.0
    x = torch.randn(8, 5, 24)
    p = qat.prepare(net, (x,), [(x,)], quantize_norms=True, wide_norms=True)
    # both norms' inputs and outputs, and the add's two inputs (fc2's output, ln1's output)
    assert p.qat_report.wide == ["ln1 input", "ln1 output", "ln2 input", "ln2 output",
                                 "add input 0"], p.qat_report.wide
    assert [g.bits for g in qat.layers.grids(p)] == [8, 16, 16, 16, 16, 16]
    assert all(g.zero_point == 0 for g in qat.layers.grids(p) if g.wide)
    # before training, on the calibration batch: fc2's int16 input reaches code 32767,
    # where the byte planes' hi plane saturates (32767 counts as 32639)
    with torch.no_grad():
        assert p.qat_ln1(p.qat_fc1(p.qat_x_quant(x))).max() / p.qat_ln1.out.scale >= 32640
        want = p(x).numpy()
    np.testing.assert_array_equal(_run(qat.export(p), x.numpy()), want)
    _train(p, net, x)
    model = qat.export(p)
    assert model.opset_import[0].version == 21 and _int16_tensors(model) == 5
    with torch.no_grad():
        want = p(x).numpy()
    np.testing.assert_array_equal(_run(model, x.numpy()), want)
    kinds = _dsa_kinds()
    assert kinds.count("LayerNorm") == 2 and "BytePlanes" in kinds and "Add" in kinds, kinds
    with torch.no_grad():
        cos = torch.nn.functional.cosine_similarity(p(x), net(x), dim=-1).min()
    assert cos > 0.99, cos


class _OutlierBlock(nn.Module):
    """A post-norm FFN block whose stream has a gain outlier (feature 5) and whose FFN has
    an outlier channel (7): PTQ splits both around the int16 stream."""

    def __init__(self, d: int = 24, inner: int = 48, relu_out: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, inner), nn.Linear(inner, d)
        self.relu_out = relu_out
        with torch.no_grad():
            self.ln1.weight[5] = 25.0
            self.fc1.weight[7] *= 20

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(self.inp(x))
        y = self.fc2(nn.functional.gelu(self.fc1(h)))
        return self.ln2((torch.relu(y) if self.relu_out else y) + h)


def test_outlier_splits_around_the_stream_are_ptqs_and_stay_bit_exact():
    torch.manual_seed(0)
    net = _OutlierBlock().eval()
    x = torch.randn(16, 6, 24)
    p = qat.prepare(net, (x[:1],), [(x,)], quantize_norms=True, wide_norms=True,
                    split_outliers=True)
    rep = p.qat_report
    assert rep.side_inputs == {"fc1": [5], "fc2": [7]} and rep.side_paths == {"fc1": [7]}
    # fc1 reads the stream with feature 5 zeroed on an int8 grid of its own; fc2, split,
    # writes int8 and its FP32 sum is requantized onto the stream's int16 grid
    assert not p.qat_fc1.inputs[0].wide and p.qat_fc1.inputs[0].mask[5] == 0
    assert not p.qat_fc2.out.wide
    (add,) = [m for m in p.modules() if isinstance(m, AddLayer)]
    assert all(g.wide for g in add.inputs)
    _train(p, net, x)
    model = qat.export(p, example_inputs=(x[:4],))
    with torch.no_grad():
        want = p(x[:4]).numpy()
    np.testing.assert_array_equal(_run(model, x[:4].numpy()), want)
    with torch.no_grad():
        cos = torch.nn.functional.cosine_similarity(p(x), net(x), dim=-1).min()
    assert cos > 0.99, cos


def test_a_fused_activation_keeps_its_grid_int8_and_the_mixed_add_stays_exact():
    torch.manual_seed(1)
    net = _OutlierBlock(relu_out=True).eval()
    x = torch.randn(8, 6, 24)
    p = qat.prepare(net, (x[:1],), [(x,)], quantize_norms=True, wide_norms=True)
    assert p.qat_report.narrow == [("add input 0", "written by WeightedLayer fc2: only a "
                                    "linear layer, an add or a norm without a fused "
                                    "activation writes int16 codes")]
    (add,) = [m for m in p.modules() if isinstance(m, AddLayer)]
    assert [g.wide for g in add.inputs] == [False, True] and add.out.wide
    assert "int8, not int16: add input 0" in p.qat_report.summary()
    model = qat.export(p, example_inputs=(x[:2],))
    with torch.no_grad():
        want = p(x[:2]).numpy()
    np.testing.assert_array_equal(_run(model, x[:2].numpy()), want)


def test_wide_norms_needs_integer_layer_norms():
    x = torch.randn(2, 4, 24)
    for norms in (False, {"softmax"}):
        with pytest.raises(qat.QatError, match="wide_norms.*pass quantize_norms=True"):
            qat.prepare(_NormBlock().eval(), (x,), quantize_norms=norms, wide_norms=True)


def test_wide_norms_without_a_layer_norm_says_so():
    x = torch.randn(2, 4, 24)
    p = qat.prepare(nn.Sequential(nn.Linear(24, 8)).eval(), (x,), quantize_norms=True,
                    wide_norms=True)
    assert "int8, not int16: the norm stream: no integer norm" in p.qat_report.summary()
    assert qat.export(p).opset_import[0].version == 17   # nothing int16 to write


def test_an_int16_grid_refuses_a_fused_clamp():
    g = Grid()
    g.widen()
    assert g.qrange == (-32768, 32767) and g.bounds(None) == (-32768, 32767)
    with pytest.raises(qat.QatError, match="wide REQUANT clamps to int16 only"):
        g.bounds((0.0, 6.0))


def test_grouped_layers_reading_the_stream_go_back_to_per_channel_weights():
    torch.manual_seed(0)
    net = _NormBlock(d=32).eval()
    x = torch.randn(4, 5, 32)
    p = qat.prepare(net, (x,), bits=4, weight_group=16, quantize_norms=True, wide_norms=True)
    layers = {m.name: m for m in p.modules() if isinstance(m, WeightedLayer)}
    assert layers["fc1"].group == 16 and layers["fc2"].group == 0   # fc2 reads ln1's int16


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), k=st.integers(1, 40), n=st.integers(1, 9),
       seed=st.integers(0, 2 ** 31 - 1), big=st.booleans())
def test_plane_product_is_the_compilers_byte_plane_dense(rows, k, n, seed, big):
    """``exact.plane_product`` (QAT's forward) against the compiler's reference: the
    stacked byte planes' int8 product joined by ``join_planes_shifted``, over int16 codes
    with both ends (-32768, and 32640+ where the hi plane saturates)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-32768, 32768, (rows, k))
    x[0, 0], x[-1, -1] = -32768, 32767
    wmax = 127 if big else 7   # int8 and int4 weight codes
    w = rng.integers(-wmax, wmax + 1, (n, k))
    shift = plane_lo_shift(w, np.zeros(1))
    got = exact.plane_product(lambda a, b: torch.nn.functional.linear(a, b),
                              torch.from_numpy(x.astype(np.float32)),
                              torch.from_numpy(w.astype(np.float32)), k, wmax, shift)
    planes = stacked_byte_planes(x.astype(np.int16)).astype(np.int64)
    want = join_planes_shifted(planes @ w.T.astype(np.int64), shift)
    np.testing.assert_array_equal(got, want)


def test_plane_product_with_a_lo_shift():
    """A reduction long enough that the exact join would leave int32: the lo plane's sums
    are shifted, as the DSA joins them."""
    k = 1200
    x = np.full((2, k), 32000)
    x[1] = -32768
    w = np.full((3, k), 127)
    shift = plane_lo_shift(w, np.zeros(1))
    assert shift > 0
    got = exact.plane_product(lambda a, b: torch.nn.functional.linear(a, b),
                              torch.from_numpy(x.astype(np.float32)),
                              torch.from_numpy(w.astype(np.float32)), k, 127, shift)
    planes = stacked_byte_planes(x.astype(np.int16)).astype(np.int64)
    np.testing.assert_array_equal(got, join_planes_shifted(planes @ w.T.astype(np.int64),
                                                           shift))


class _PostNormAttention(nn.Module):
    """One post-norm attention block: projections, Q @ K^T, softmax, P @ V, output
    projection, residual add, LayerNorm."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.ln0, self.ln1 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln0(x)
        s = torch.matmul(self.q(h), self.k(h).transpose(-1, -2))
        return self.ln1(self.o(torch.matmul(torch.softmax(s, dim=-1), self.v(h))) + h)


def test_an_onnx_models_attention_and_norms_are_mirrored_from_onnx2torch(tmp_path):
    """An exported ONNX model through onnx2torch: its MatMul of two activations, Transpose,
    Softmax and LayerNormalization become the integer layers, the stream int16, and the
    export runs on the DSA as the prepared module computes it."""
    import io

    torch.manual_seed(3)
    net = _PostNormAttention().eval()
    x = torch.randn(6, 5, 16)
    buf = io.BytesIO()
    torch.onnx.export(net, (x[:1],), buf, input_names=["x"], opset_version=17, dynamo=False)
    p = qat.prepare(onnx.load_from_string(buf.getvalue()), (x[:1],), [(x,)],
                    quantize_norms=True, wide_norms=True)
    kinds = [k for _, k in p.qat_report.layers]
    assert kinds.count("batch_matmul") == 2 and kinds.count("softmax") == 1 and \
        kinds.count("layer_norm") == 2, p.qat_report.summary()
    assert len(p.qat_report.wide) == 5 and not p.qat_report.narrow, p.qat_report.summary()
    with torch.no_grad():
        want = p(x[:1]).numpy()
    np.testing.assert_array_equal(_run(qat.export(p), x[:1].numpy()), want)
    assert {"Softmax", "BatchMatmul", "BytePlanes"} <= set(_dsa_kinds())

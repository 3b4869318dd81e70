"""Dense (MatMul with constant weights) on activations of rank 2 to 5, bit-exact against
TVM's own llvm build of the same QDQ graph.

A channels-last Linear on ``(N, H, W, C)`` (ConvNeXt) used to be read as NCHW: the
DSA summed over H and printed "all layers supported". Here every scale is a power of
two and every centred activation is even while every bias is odd, so the float QDQ
arithmetic of the llvm build is exact and never meets a rounding tie: the DSA's
integer requantization must then agree with it bit for bit.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.hw.config import load_config
from dsa_tvm.runtime import take_launches

from .. import qdq_models as qm

FAST_LLVM = {"kind": "llvm", "opt-level": 0}
X_ZP = -3


def _dense_graph(path, shape: tuple[int, ...], n: int, relu: bool, residual: bool,
                 seed: int) -> tuple[str, np.ndarray]:
    """x -> QDQ -> MatMul(w) + bias [-> Relu] -> QDQ [-> + itself -> QDQ]; returns the
    file and a float input whose int8 image has even ``q - zero_point``."""
    g = qm.QDQGraph(seed)
    rng, k = g.rng, shape[-1]
    xs, y_scale = 2.0 ** -4, 2.0 ** -3
    ws = 2.0 ** -rng.integers(5, 9, n)          # per output channel, requant 2^-6 .. 2^-9
    x = g.qdq("x", xs, X_ZP)
    w = g.weight(rng.integers(-127, 128, (k, n)), ws.astype(np.float32), axis=1)
    b = g.bias(2 * rng.integers(-3000, 3000, n) + 1, (ws * xs).astype(np.float32))
    y = g.op("Add", [g.op("MatMul", [x, w]), b])
    if relu:
        y = g.op("Relu", [y])
    y = g.qdq(y, y_scale, 5)
    if residual:  # an element-wise layer on the 4-D tensor, in the same region
        y = g.qdq(g.op("Add", [y, y]), 2 * y_scale, -7)
    out_shape = shape[:-1] + (n,)
    p = g.save(path / f"dense_{len(shape)}d_{seed}.onnx", {"x": shape}, y, out_shape)
    q = X_ZP + 2 * rng.integers(-62, 65, shape)
    return p, (xs * (q - X_ZP)).astype(np.float32)


def _run(ex, x: np.ndarray) -> np.ndarray:
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _always_offload(preset: str):
    """The preset with a host so slow that every region that compiles goes to the DSA."""
    return load_config(preset).replace(cpu_gmacs=1e-6, launch_overhead_us=0.0)


def _check(tmp_path, shape, n, relu, residual, seed, preset="default") -> None:
    path, x = _dense_graph(tmp_path, shape, n, relu, residual, seed)
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    want = _run(tvm.compile(mod, target=tvm.target.Target(FAST_LLVM)), x)
    take_launches()
    ex = dsa_tvm.compile(mod, _always_offload(preset))
    rep = dsa_tvm.last_compile_report()
    assert [d.target for d in rep.regions] == ["dsa"], str(rep)
    got = _run(ex, x)
    assert take_launches(), "nothing ran on the DSA"
    np.testing.assert_array_equal(got, want, err_msg=str(rep))


@st.composite
def _shapes(draw) -> tuple[int, ...]:
    """An activation of rank 2 to 5: leading dimensions, then K."""
    rank = draw(st.integers(2, 5))
    lead = draw(st.lists(st.integers(1, 5), min_size=rank - 1, max_size=rank - 1))
    return tuple(lead) + (draw(st.integers(1, 40)),)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=_shapes(), n=st.integers(1, 40), relu=st.booleans(), residual=st.booleans(),
       seed=st.integers(0, 2**16))
def test_dense_any_rank_matches_llvm(tmp_path, shape, n, relu, residual, seed):
    _check(tmp_path, shape, n, relu, residual, seed)


@pytest.mark.parametrize("shape", [(1, 4, 4, 24), (2, 3, 5, 17), (2, 3, 2, 2, 20), (1, 12, 24)])
def test_channels_last_linear_matches_llvm(tmp_path, shape):
    """The issue's case in small: Linear over the last axis of a 4-D (and 3-D, 5-D) tensor."""
    _check(tmp_path, shape, 40, relu=False, residual=len(shape) == 4, seed=len(shape))


def test_dense_4d_view_is_rows():
    """The layer the partitioner hands over reads (N, H, W, C) as N*H*W rows of C."""
    from dsa_tvm.layers import ir as L
    from dsa_tvm.lowering.region import lowering_supports

    x = L.QTensor("x", (1, 4, 4, 24), 0.1, 0)
    y = L.QTensor("y", (1, 4, 4, 8), 0.1, 0)
    ly = L.Dense("d", x, y, np.ones((8, 24), np.int8), np.zeros(8, np.int32),
                 L.Requant(np.array([1 << 30], np.int32), np.array([31], np.int32), 0))
    why = lowering_supports(ly, load_config("default"))
    assert why is not None and "NCHW" in why, why


def test_dense_over_the_w_axis_of_a_conv_output_stays_on_the_cpu(tmp_path):
    """conv (NCHW image) -> MatMul over W of its output: one tensor, two DSA layouts. The
    region runs on the CPU with the reason, and the output is the llvm build's."""
    g = qm.QDQGraph(5)
    rng = g.rng
    x = g.qdq("x", 2.0 ** -4, X_ZP)
    ws = np.full(6, 2.0 ** -7)
    c = g.op("Conv", [x, g.weight(rng.integers(-127, 128, (6, 4, 3, 3)), ws.astype(np.float32)),
                      g.bias(rng.integers(-99, 99, 6), (ws * 2.0 ** -4).astype(np.float32))],
             pads=[1, 1, 1, 1])
    c = g.qdq(c, 2.0 ** -3, 0)
    w = g.weight(rng.integers(-127, 128, (8, 5)), np.full(5, 2.0 ** -6, np.float32), axis=1)
    y = g.qdq(g.op("MatMul", [c, w]), 2.0 ** -2, 1)
    path = g.save(tmp_path / "conv_then_w_dense.onnx", {"x": (1, 4, 8, 8)}, y, (1, 6, 8, 5))
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    xin = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = _run(tvm.compile(mod, target=tvm.target.Target(FAST_LLVM)), xin)
    ex = dsa_tvm.compile(mod, _always_offload("default"))
    rep = dsa_tvm.last_compile_report()
    assert [d.target for d in rep.regions] == ["cpu"] or not rep.regions, str(rep)
    assert "one DSA layout cannot serve both" in str(rep), str(rep)
    np.testing.assert_array_equal(_run(ex, xin), want)


def test_convnext_block_quantized_by_us_matches_fp32(tmp_path):
    """The issue's network in small: stem, depthwise 7x7, channels-last LayerNorm and two
    Linears (GELU between), residual. Quantized by dsa_tvm.quant, every conv and Linear on
    the DSA, the output cosine vs FP32 onnxruntime (0.85 when the Linears summed over H)."""
    torch = pytest.importorskip("torch")
    import onnxruntime as ort

    from dsa_tvm.quant import quantize_onnx

    class Block(torch.nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.dw = torch.nn.Conv2d(c, c, 7, padding=3, groups=c)
            self.ln = torch.nn.LayerNorm(c)
            self.up, self.down = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)

        def forward(self, x):
            y = self.ln(self.dw(x).permute(0, 2, 3, 1))
            return x + self.down(torch.nn.functional.gelu(self.up(y))).permute(0, 3, 1, 2)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 4, stride=4), Block(32)).eval()
    path = tmp_path / "convnext_block.onnx"
    torch.onnx.export(net, torch.randn(1, 3, 32, 32), str(path), opset_version=17, dynamo=False,
                      input_names=["x"])
    calib = [np.random.default_rng(i).standard_normal((1, 3, 32, 32)).astype(np.float32)
             for i in range(4)]
    q = quantize_onnx(str(path), calib, preprocess="raw", show_progress=False)
    ex = dsa_tvm.compile(q.to_relax(), _always_offload("default"))
    rep = dsa_tvm.last_compile_report()
    kinds = [type(ly).__name__ for d in rep.regions if d.target == "dsa" for ly in d.region.layers]
    assert kinds.count("Dense") == 2 and kinds.count("Conv2d") == 2, str(rep)
    take_launches()
    got = _run(ex, calib[0])
    assert not dsa_tvm.last_run_report().violations
    want = ort.InferenceSession(str(path)).run(None, {"x": calib[0]})[0]
    cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos > 0.99, cos


def _head_net(tmp_path, pool: bool, seed: int, c: int, n: int):
    """Conv -> [GlobalAveragePool] -> Flatten -> Gemm (a classifier head), QDQ by ORT."""
    rng = np.random.default_rng(seed)
    nodes = [qm.node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             qm.node("Relu", ["c"], ["r"])]
    feat = "r"
    if pool:
        nodes.append(qm.node("GlobalAveragePool", ["r"], ["p"]))
        feat = "p"
    nodes += [qm.node("Flatten", [feat], ["f"]), qm.node("Gemm", ["f", "G", "B"], ["y"], transB=1)]
    k = c if pool else c * 2 * 2
    model = qm.make_model(nodes, {"W": qm.rand(rng, c, 3, 3, 3), "G": qm.rand(rng, n, k),
                                  "B": qm.rand(rng, n)}, {"x": (1, 3, 2, 2)}, {"y": None})
    return qm.quantize(model, tmp_path, seed=seed, name=f"head_{pool}_{seed}")


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), c=st.sampled_from([5, 16, 40]), n=st.integers(1, 20))
def test_flatten_of_pooled_pixels_stays_in_the_region(tmp_path, seed, c, n):
    """(N, C, 1, 1) -> (N, C) is a view (same blocked bytes): pool and head in one region,
    bit-exact against llvm."""
    mod = from_onnx(onnx.load(_head_net(tmp_path, True, seed, c, n)), keep_params_in_input=False)
    x = np.random.default_rng(seed).standard_normal((1, 3, 2, 2)).astype(np.float32)
    want = _run(tvm.compile(mod, target=tvm.target.Target(FAST_LLVM)), x)
    take_launches()
    ex = dsa_tvm.compile(mod, _always_offload("default"))
    rep = dsa_tvm.last_compile_report()
    assert [d.target for d in rep.regions] == ["dsa"], str(rep)
    kinds = [type(ly).__name__ for ly in rep.regions[0].region.layers]
    assert kinds == ["Conv2d", "GlobalAvgPool", "Dense"], kinds
    assert not [c.op for c in rep.partition.cpu_ops if c.op == "relax.reshape"], str(rep)
    np.testing.assert_array_equal(_run(ex, x), want)
    assert take_launches()


def test_flatten_of_an_image_is_not_a_view(tmp_path):
    """(N, C, 2, 2) -> (N, 4C) reorders bytes: the reshape stays on the CPU (between two
    regions), the answer stays llvm's."""
    mod = from_onnx(onnx.load(_head_net(tmp_path, False, 0, 8, 6)), keep_params_in_input=False)
    x = np.random.default_rng(1).standard_normal((1, 3, 2, 2)).astype(np.float32)
    want = _run(tvm.compile(mod, target=tvm.target.Target(FAST_LLVM)), x)
    ex = dsa_tvm.compile(mod, _always_offload("default"))
    rep = dsa_tvm.last_compile_report()
    assert [d.target for d in rep.regions] == ["dsa", "dsa"], str(rep)
    assert [c.op for c in rep.partition.cpu_ops if c.op == "relax.reshape"], str(rep)
    np.testing.assert_array_equal(_run(ex, x), want)

"""A YOLO-ish neck (conv -> nearest upsample -> concat with a skip -> conv) and a UNet-ish
skip concat, quantized by dsa_tvm's quantizer (one scale over Concat/Resize), compile to
ONE DSA region and give the bits of TVM's llvm build of the same QDQ graph."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

import dsa_tvm  # noqa: E402
from dsa_tvm.runtime import take_launches  # noqa: E402

from ..qdq_models import make_model, node, rand  # noqa: E402


def neck(unet: bool, mode: str = "nearest", c: int = 32, hw: int = 16, seed: int = 0
         ) -> onnx.ModelProto:
    """conv1 (skip) -> [maxpool | stride-2 conv] -> conv2 -> Resize x2 -> Concat -> conv."""
    rng = np.random.default_rng(seed)
    inits = {"W1": rand(rng, c, 3, 3, 3), "W2": rand(rng, c, c, 3, 3, scale=0.2),
             "W3": rand(rng, 8, 2 * c, 3, 3, scale=0.2),
             "scales": np.array([1, 1, 2, 2], np.float32)}
    down = ([node("MaxPool", ["r1"], ["d"], kernel_shape=[2, 2], strides=[2, 2]),
             node("Conv", ["d", "W2"], ["c2"], pads=[1] * 4)] if unet else
            [node("Conv", ["r1", "W2"], ["c2"], pads=[1] * 4, strides=[2, 2])])
    nodes = [node("Conv", ["x", "W1"], ["c1"], pads=[1] * 4), node("Relu", ["c1"], ["r1"]),
             *down, node("Relu", ["c2"], ["r2"]),
             node("Resize", ["r2", "", "scales"], ["up"], mode=mode),
             node("Concat", ["r1", "up"] if unet else ["up", "r1"], ["cat"], axis=1),
             node("Conv", ["cat", "W3"], ["y"], pads=[1] * 4)]
    return make_model(nodes, inits, {"x": (1, 3, hw, hw)}, {"y": None})


def _run(ex, x: np.ndarray) -> np.ndarray:
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def _qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    return dsa_tvm.quant.quantize_onnx(model, calib, show_progress=False).model


@pytest.mark.parametrize("unet", [False, True])
def test_neck_is_one_region_and_bit_exact(unet):
    q = _qdq(neck(unet))
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("QuantizeLinear") >= 5, ops
    ex = dsa_tvm.compile(from_onnx(q, keep_params_in_input=False), "default")
    rep = dsa_tvm.last_compile_report()
    kinds = [ly.split()[0] for r in rep.partition.regions for ly in r.layers]
    assert len(rep.partition.regions) == 1, str(rep.partition)
    assert {"Concat", "Resize"} <= set(kinds), kinds
    assert [d.target for d in rep.regions] == ["dsa"]
    take_launches()
    x = np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)
    got = _run(ex, x)
    assert len(take_launches()) == 1
    want = _run(tvm.compile(from_onnx(q, keep_params_in_input=False), target="llvm"), x)
    np.testing.assert_array_equal(got, want)


def test_bilinear_resize_stays_on_cpu_with_a_reason():
    q = _qdq(neck(False, mode="linear"))
    dsa_tvm.compile(from_onnx(q, keep_params_in_input=False), "default")
    part = dsa_tvm.last_compile_report().partition
    assert not any("Resize" in ly for r in part.regions for ly in r.layers)
    assert any(c.op == "relax.image.resize2d" for c in part.cpu_ops), str(part)


def _qparams_of(q: onnx.ModelProto) -> dict[str, tuple[float, int]]:
    """tensor -> (scale, zero point) of the QuantizeLinear that produces its int8 form."""
    init = {i.name: onnx.numpy_helper.to_array(i) for i in q.graph.initializer}
    return {n.input[0].removesuffix("/fp32"): (float(init[n.input[1]]), int(init[n.input[2]]))
            for n in q.graph.node if n.op_type == "QuantizeLinear"}


def test_quantizer_shares_one_scale_over_resize_and_concat():
    qp = _qparams_of(_qdq(neck(False)))
    assert qp["r2"] == qp["up"] == qp["r1"] == qp["cat"], qp
    lin = _qparams_of(_qdq(neck(False, mode="linear")))
    assert "up" not in lin  # interpolation stays FP32 (no int8 step of its own)

"""QAT from an ONNX model: onnx2torch's module is the FP32 teacher (equal to onnxruntime),
``prepare`` mirrors it as it mirrors a torch module, and the DSA compiled from the export
computes the prepared module's integers bit for bit."""

from __future__ import annotations

import importlib.util
import io
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from dsa_tvm import qat
from dsa_tvm.cli import main
from dsa_tvm.qat.from_onnx import INSTALL, convert

from .nets import run_on_dsa, tiny_net
from .test_prepare_export import _finetune_on
from .test_qat_cli import _folder

# as the README's test command installs it (pip install --no-deps onnx2torch==1.5.15); like
# the other --no-deps packages, a machine without it skips what needs it
needs_onnx2torch = pytest.mark.skipif(importlib.util.find_spec("onnx2torch") is None,
                                      reason="onnx2torch is not installed")

def _exported(net: torch.nn.Module, shape=(1, 3, 16, 16)) -> onnx.ModelProto:
    """``net`` as torch.onnx.export writes it (batch norms folded, static batch 1)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(shape),), buf, input_names=["x"], opset_version=17,
                          dynamo=False)
    return onnx.load_from_string(buf.getvalue())


def _helper_net(hidden: bool = False) -> onnx.ModelProto:
    """A graph written with onnx.helper, in the forms onnx2torch keeps as its own modules:
    an unfolded BatchNormalization, a Clip that is no ReLU6 (OnnxClip), a residual Add,
    GlobalAveragePool, a Reshape to a constant shape, MatMul + Add of constants.
    ``hidden``: the forms that hide a layer from onnx2torch or from ``graph.py``: the
    second convolution's weight in a ``Constant`` node, the first one's pads asymmetric
    (onnx2torch's ``Sequential(pad, conv)``)."""
    rng = np.random.default_rng(0)

    def const(name, a):
        return numpy_helper.from_array(np.asarray(a, np.float32), name)

    c = 8
    inits = [const("w1", rng.normal(0, 0.3, (c, 3, 3, 3))), const("b1", rng.normal(0, 0.1, c)),
             const("g", rng.uniform(0.5, 1.5, c)), const("beta", rng.normal(0, 0.1, c)),
             const("mu", rng.normal(0, 0.2, c)), const("var", rng.uniform(0.5, 2, c)),
             const("w2", rng.normal(0, 0.2, (c, c, 1, 1))), const("lo", -0.5), const("hi", 3.0),
             const("wm", rng.normal(0, 0.3, (c, 5))), const("bm", rng.normal(0, 0.1, 5)),
             numpy_helper.from_array(np.array([1, c], np.int64), "shape")]
    pads = [0, 0, 1, 1] if hidden else [1, 1, 1, 1]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=pads),
             helper.make_node("BatchNormalization", ["c1", "g", "beta", "mu", "var"], ["bn"]),
             helper.make_node("Clip", ["bn", "lo", "hi"], ["a1"]),
             helper.make_node("Conv", ["a1", "w2"], ["c2"]),
             helper.make_node("Add", ["a1", "c2"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["gap"]),
             helper.make_node("Reshape", ["gap", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "wm"], ["mm"]),
             helper.make_node("Add", ["mm", "bm"], ["y"])]
    if hidden:
        w2 = inits.pop(6)
        nodes.insert(0, helper.make_node("Constant", [], ["w2"], value=w2))
    graph = helper.make_graph(nodes, "helper_net",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


@needs_onnx2torch
@pytest.mark.parametrize("which", ["exported", "helper", "hidden"])
def test_the_converted_fp32_module_equals_onnxruntime(which):
    model = _exported(tiny_net()) if which == "exported" else _helper_net(which == "hidden")
    side = 16 if which == "exported" else 12
    gm = convert(model)
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        x = torch.randn(1, 3, side, side, generator=g) * 2
        with torch.no_grad():
            got = gm(x).numpy()
        np.testing.assert_allclose(got, _ort(model, x.numpy()), rtol=1e-5, atol=1e-5)


@needs_onnx2torch
@pytest.mark.parametrize("bits", [8, 4])
def test_an_exported_onnx_model_on_the_dsa_equals_the_prepared_module(bits):
    net = tiny_net()
    model = _exported(net)
    g = torch.Generator().manual_seed(1)
    cal = [(torch.randn(4, 3, 16, 16, generator=g),) for _ in range(2)]
    x = torch.randn(1, 3, 16, 16, generator=g)
    p = qat.prepare(model, (x,), cal, bits=bits, learn_scales=True)
    torch_path = qat.prepare(net, (x,), cal, bits=bits)
    assert [k for _, k in p.qat_report.layers] == [k for _, k in torch_path.qat_report.layers]
    assert not p.qat_report.fp32
    _finetune_on(p, convert(model), (3, 16, 16), steps=4)
    exported = qat.export(p)
    assert [i.name for i in exported.graph.input] == ["x"]
    xs = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(7)) * 2
    with torch.no_grad():
        want = p(xs).numpy()
    np.testing.assert_array_equal(run_on_dsa(exported, xs.numpy()), want)


@needs_onnx2torch
@pytest.mark.parametrize("hidden", [False, True])
def test_onnx2torch_modules_are_mirrored_bit_for_bit(tmp_path, hidden):
    """BatchNormalization folded, OnnxClip fused, the ONNX Add an integer add,
    GlobalAveragePool, Reshape moved, MatMul + bias a linear layer; from a path.
    ``hidden``: a Constant-node weight and asymmetric pads (folded into the conv)."""
    model = _helper_net(hidden)
    onnx.save(model, str(tmp_path / "h.onnx"))
    g = torch.Generator().manual_seed(2)
    cal = [(torch.randn(4, 3, 12, 12, generator=g),)]
    x = torch.randn(1, 3, 12, 12, generator=g)
    p = qat.prepare(tmp_path / "h.onnx", (x,), cal)
    rep = p.qat_report
    assert sorted(k for _, k in rep.layers) == ["add", "conv2d", "conv2d", "global_avg_pool",
                                                "linear"], rep.summary()
    # the batch norm and the Clip (and the asymmetric pad)
    assert not rep.fp32 and len(rep.folded) == 2 + hidden, rep.summary()
    with torch.no_grad():
        want = p(x).numpy()
    np.testing.assert_array_equal(run_on_dsa(qat.export(p), x.numpy()), want)


class _DynamicBatch(torch.nn.Module):
    """TinyNet with its flatten written ``reshape(x.shape[0], -1)``: exported with a dynamic
    batch, that is ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``."""

    def __init__(self) -> None:
        super().__init__()
        self.n = tiny_net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.n
        y = n.down(n.pad(torch.relu(n.b1(n.c1(x)))))
        y = y + n.pw(torch.nn.functional.relu6(n.b2(n.dw(y))))
        return n.fc(n.pool(y).reshape(x.shape[0], -1))


@needs_onnx2torch
def test_a_dynamic_batch_model_calibrates_on_batches_with_its_shape_arithmetic_unreported():
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_DynamicBatch().eval(), (torch.zeros(1, 3, 16, 16),), buf,
                          input_names=["x"], opset_version=17, dynamo=False,
                          dynamic_axes={"x": {0: "n"}})
    model = onnx.load_from_string(buf.getvalue())
    assert "Shape" in [n.op_type for n in model.graph.node]
    x = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    p = qat.prepare(model, (x[:1],), [(x[:4],)])
    assert len(p.qat_report.layers) == 7 and not p.qat_report.fp32, p.qat_report.summary()
    with torch.no_grad():
        want = p(x[4:]).numpy()
    np.testing.assert_array_equal(run_on_dsa(qat.export(p), x[4:].numpy()), want)


def _with_op(op: str, inputs: int = 1, **attrs) -> onnx.ModelProto:
    names = ["x"] + [f"i{k}" for k in range(1, inputs)]
    inits = [numpy_helper.from_array(np.zeros(1, np.float32), n) for n in names[1:]]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node(op, ["r"] + names[1:], ["y"], **attrs)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@needs_onnx2torch
def test_an_op_onnx2torch_cannot_convert_is_named():
    with pytest.raises(qat.QatError, match="no converter for Hardmax .*replace Hardmax"):
        qat.prepare(_with_op("Hardmax"), (torch.zeros(1, 4),))


@needs_onnx2torch
def test_a_batch_baked_into_a_constant_is_named_with_the_fix():
    w = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 4, 16], np.int64), "s")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Reshape", ["c", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 4, 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], [w, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(qat.QatError, match=r"does not run on calibration batches of shape "
                                           r"\[\(3, 3, 4, 4\)\].*dynamic batch"):
        qat.prepare(model, (torch.zeros(1, 3, 4, 4),), [(torch.zeros(3, 3, 4, 4),)])


def test_hostile_onnx_input(tmp_path, monkeypatch):
    x = torch.zeros(1, 4)
    (tmp_path / "notes.onnx").write_text("not a model")
    with pytest.raises(qat.QatError, match="is not an ONNX model"):
        qat.prepare(tmp_path / "notes.onnx", (x,))
    good = _exported(tiny_net()).SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(good[: len(good) // 3])
    with pytest.raises(qat.QatError, match="is not an ONNX model"):
        qat.prepare(str(tmp_path / "cut.onnx"), (x,))
    with pytest.raises(qat.QatError, match="is not a file"):
        qat.prepare(tmp_path / "missing.onnx", (x,))
    with pytest.raises(qat.QatError, match="torch.nn.Module, an onnx.ModelProto or an .onnx"):
        qat.prepare(12, (x,))
    monkeypatch.setitem(sys.modules, "onnx2torch", None)   # as if not installed
    with pytest.raises(qat.QatError, match="not installed") as e:
        convert(_exported(tiny_net()))
    assert INSTALL in str(e.value) and "--no-deps" in INSTALL


@needs_onnx2torch
def test_torchvision_ops_are_named_when_torchvision_does_not_load():
    """The shim: NonMaxSuppression has no converter without torchvision, and says so."""
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed; the shim is not used")
    model = _with_op("NonMaxSuppression", 1)
    with pytest.raises(qat.QatError, match="converts NonMaxSuppression with torchvision"):
        convert(model)
    assert type(sys.modules["onnx2torch.node_converters.nms"]).__name__ == "module"
    assert not hasattr(sys.modules["onnx2torch.node_converters.nms"], "torchvision")


@needs_onnx2torch
def test_qat_cli_takes_an_onnx_model(tmp_path, capsys):
    onnx.save(_exported(tiny_net()), str(tmp_path / "tiny.onnx"))
    out = tmp_path / "q.onnx"
    rc = main(["qat", str(tmp_path / "tiny.onnx"), "--data", str(_folder(tmp_path)), "--steps", "2",
               "--lr", "1e-4", "--quiet", "--out", str(out)])   # --size from the model: 16
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "integer layers: 7" in cap.out and "training: 2 steps" in cap.out, cap.out
    assert [i.name for i in onnx.load(str(out)).graph.input] == ["x"]
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage")
    assert main(["qat", str(tmp_path / "bad.onnx"), "--data", str(tmp_path)]) == 2
    assert "is not an ONNX model" in capsys.readouterr().err


@needs_onnx2torch
def test_efficientnet_lite0_onnx_prepares_as_the_torch_module_and_runs_bit_exact():
    """The exported ONNX model gets the torch path's 60 integer layers, its FP32 module
    equals onnxruntime, and the DSA computes the prepared module's integers."""
    from dsa_tvm.models.pretrained import efficientnet_lite0_path, random_crops

    path = efficientnet_lite0_path()
    gm = convert(path)
    crops = [torch.from_numpy(c) for c in random_crops(5, seed=3)]
    with torch.no_grad():
        ref = gm(crops[4]).numpy()
    np.testing.assert_allclose(ref, _ort(onnx.load(str(path)), crops[4].numpy()), rtol=1e-5,
                               atol=1e-4)
    p = qat.prepare(gm, (crops[0],), [(torch.cat(crops[:4]),)], bits=8)
    rep = p.qat_report
    kinds = {k: sum(1 for _, j in rep.layers if j == k) for _, k in rep.layers}
    assert kinds == {"conv2d": 49, "add": 9, "global_avg_pool": 1, "linear": 1}
    assert not rep.fp32
    with torch.no_grad():
        want = p(crops[4]).numpy()
    got = run_on_dsa(qat.export(p), crops[4].numpy())
    np.testing.assert_array_equal(got, want)
    cos = float(np.dot(got.ravel(), ref.ravel()) / np.linalg.norm(got) / np.linalg.norm(ref))
    assert cos > 0.99

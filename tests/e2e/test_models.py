"""The bundled test/demo models: ONNX validity, onnxruntime runs, QDQ accuracy, TVM import.

Everything runs at tiny sizes. TVM builds use ``llvm`` at LLVM opt-level 0, exported to
a shared library and loaded: the numbers are bit-identical to a plain ``target="llvm"``
build (checked on small_cnn), but that one's ``VirtualMachine(ex, ...)`` JIT-compiles every
kernel at full optimization when the VM is created (~8 s for a QDQ ResNet-50), while the
opt-level-0 object file builds and links in ~2 s.
"""

from __future__ import annotations

import functools
import os
import tempfile

import numpy as np
import onnx
import pytest

tvm = pytest.importorskip("tvm")
pytest.importorskip("onnxruntime")

from tvm import relax  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

from dsa_tvm import models  # noqa: E402
from dsa_tvm.models import (  # noqa: E402
    calibration_data,
    cosine,
    get_model,
    output_quant_steps,
    run_onnxruntime,
)

SPECS: dict[str, tuple[str, dict]] = {
    "small_cnn": ("small_cnn", {}),
    "resnet18": ("resnet18", dict(input_size=32, width=16, num_classes=100)),
    "resnet50": ("resnet50", dict(input_size=32, width=8, num_classes=100)),
    "mobilenet_v2": ("mobilenet_v2", dict(input_size=32, width_mult=0.25, num_classes=100)),
    "transformer_encoder": ("transformer_encoder", dict(seq_len=16, hidden=64, heads=4, ffn=256)),
    # the other spellings: BatchNormalization nodes, and GELU as com.microsoft.Gelu
    "resnet18_bn": ("resnet18", dict(input_size=32, width=16, num_classes=100, batchnorm=True)),
    "transformer_gelu_op": ("transformer_encoder", dict(seq_len=16, hidden=64, heads=4, ffn=256,
                                                        gelu="contrib")),
}
BASE = [k for k in SPECS if k in models.BUILDERS]
N_EVAL = 3
FAST_LLVM = {"kind": "llvm", "opt-level": 0}

# the distinct Relax ops each FP32 / QDQ model imports into (the partitioner's input)
CNN_OPS = {"relax.add", "relax.matmul", "relax.mean", "relax.nn.conv2d", "relax.permute_dims",
           "relax.reshape"}
CLIP_OPS = {"relax.call_tir", "relax.isnan", "relax.where"}    # Clip -> topi maximum/minimum
TRANSFORMER_OPS = {"relax.add", "relax.matmul", "relax.multiply", "relax.nn.layer_norm",
                   "relax.nn.softmax", "relax.permute_dims", "relax.reshape"}
QDQ = {"relax.quantize", "relax.dequantize"}
FP32_OPS = {
    "small_cnn": CNN_OPS | CLIP_OPS | {"relax.nn.relu", "relax.nn.max_pool2d"},
    "resnet18": CNN_OPS | {"relax.nn.relu", "relax.nn.max_pool2d"},
    "resnet50": CNN_OPS | {"relax.nn.relu", "relax.nn.max_pool2d"},
    "mobilenet_v2": CNN_OPS | CLIP_OPS,
    "transformer_encoder": TRANSFORMER_OPS | {"relax.divide", "relax.erf"},
    "resnet18_bn": CNN_OPS | {"relax.nn.relu", "relax.nn.max_pool2d", "relax.nn.batch_norm"},
    "transformer_gelu_op": TRANSFORMER_OPS | {"relax.nn.gelu"},
}
# onnxruntime's quantizer folds Relu and Clip(0, 6) into the output quantization range
QDQ_OPS = {
    "small_cnn": CNN_OPS | QDQ | {"relax.nn.max_pool2d"},
    "resnet18": CNN_OPS | QDQ | {"relax.nn.max_pool2d"},
    "resnet50": CNN_OPS | QDQ | {"relax.nn.max_pool2d"},
    "mobilenet_v2": CNN_OPS | QDQ,
    "transformer_encoder": TRANSFORMER_OPS | QDQ | {"relax.divide", "relax.erf"},
    "transformer_gelu_op": TRANSFORMER_OPS | QDQ | {"relax.nn.gelu"},
}


@pytest.fixture(scope="module", autouse=True)
def _model_cache(tmp_path_factory):
    """Generated models go to a fresh cache directory, never the repo or ~/.cache."""
    old = os.environ.get("DSA_TVM_CACHE")
    os.environ["DSA_TVM_CACHE"] = str(tmp_path_factory.mktemp("models"))
    yield
    _case.cache_clear()
    _tvm_outputs.cache_clear()
    if old is None:
        del os.environ["DSA_TVM_CACHE"]
    else:
        os.environ["DSA_TVM_CACHE"] = old


@functools.cache
def _case(key: str) -> dict:
    name, kw = SPECS[key]
    fp32 = get_model(name, quantized=False, **kw)
    qdq = get_model(name, quantized=True, **kw)
    feeds = calibration_data(fp32, N_EVAL, seed=99)
    return {
        "fp32": fp32, "qdq": qdq, "feeds": feeds,
        "ort_fp32": [run_onnxruntime(fp32, f)[0] for f in feeds],
        # QDQ semantics op by op (what a float QDQ simulation computes) ...
        "ort_qdq": [run_onnxruntime(qdq, f, optimize=False)[0] for f in feeds],
        # ... and onnxruntime's default session (fused int8 kernels)
        "ort_qdq_fused": [run_onnxruntime(qdq, f)[0] for f in feeds],
    }


def relax_ops(mod: tvm.IRModule) -> set[str]:
    """Names of the Relax operators called in the module's Relax functions."""
    ops: set[str] = set()

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
            ops.add(e.op.name)

    for _, f in mod.functions.items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return ops


@functools.cache
def _tvm_outputs(key: str, which: str, fast: bool = True) -> tuple[list[np.ndarray], frozenset[str]]:
    case = _case(key)
    mod = from_onnx(case[which])
    if fast:
        ex = tvm.compile(mod, target=tvm.target.Target(FAST_LLVM))
        with tempfile.TemporaryDirectory() as tmp:
            ex.export_library(os.path.join(tmp, "model.so"))
            vm = relax.VirtualMachine(tvm.runtime.load_module(os.path.join(tmp, "model.so")), tvm.cpu())
    else:
        vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    outs = [vm["main"](*[tvm.runtime.tensor(v) for v in f.values()]).numpy() for f in case["feeds"]]
    return outs, frozenset(relax_ops(mod))


def _steps_off(key: str, got: list[np.ndarray], ref_key: str) -> np.ndarray:
    case = _case(key)
    (step,) = output_quant_steps(case["qdq"]).values()
    assert step is not None and step > 0
    return np.abs(np.stack(got) - np.stack(case[ref_key])) / step


# ----------------------------------------------------------------------------- ONNX + ORT

@pytest.mark.parametrize("key", list(SPECS))
def test_onnx_checker_opset_and_shapes(key):
    m = _case(key)["fp32"]
    onnx.checker.check_model(m, full_check=True)
    assert m.ir_version == 8
    assert {o.domain: o.version for o in m.opset_import}[""] == 17
    assert len(m.graph.input) == 1 and len(m.graph.output) == 1
    out = _case(key)["ort_fp32"][0]
    want = [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    assert list(out.shape) == want


@pytest.mark.parametrize("key", list(SPECS))
def test_fp32_runs_with_order_one_outputs(key):
    outs = np.stack(_case(key)["ort_fp32"])
    assert np.isfinite(outs).all()
    assert 0.05 < outs.std() < 20
    assert not np.allclose(outs[0], outs[1])  # the output depends on the input


@pytest.mark.parametrize("key", list(SPECS))
def test_qdq_close_to_fp32(key):
    case = _case(key)
    ops = {n.op_type for n in case["qdq"].graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert not ops & {"Relu", "Clip"}, "activations are folded into the quantization ranges"
    for f32, q in zip(case["ort_fp32"], case["ort_qdq_fused"]):
        assert cosine(f32, q) > 0.95
    for f32, q in zip(case["ort_fp32"], case["ort_qdq"]):
        assert cosine(f32, q) > 0.95


def test_qdq_weights_are_per_channel_int8():
    q = _case("resnet18")["qdq"]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in q.graph.initializer}
    conv_weights = [n.input[1] for n in q.graph.node if n.op_type == "Conv"]
    producers = {o: n for n in q.graph.node for o in n.output}
    for w in conv_weights:
        dq = producers[w]
        assert dq.op_type == "DequantizeLinear"
        data, scale = inits[dq.input[0]], inits[dq.input[1]]
        assert data.dtype == np.int8 and scale.shape == (data.shape[0],)


# ----------------------------------------------------------------------------- TVM

@pytest.mark.parametrize("key", list(SPECS))
def test_tvm_fp32_matches_onnxruntime(key):
    got, ops = _tvm_outputs(key, "fp32")
    assert set(ops) == FP32_OPS[key]
    for g, want in zip(got, _case(key)["ort_fp32"]):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("key", [k for k in SPECS if k != "resnet18_bn"])   # its fp32 build covers BN
def test_tvm_qdq_within_one_step_of_onnxruntime(key):
    got, ops = _tvm_outputs(key, "qdq")
    assert set(ops) == QDQ_OPS[key]
    off = _steps_off(key, got, "ort_qdq")
    within = float((off <= 1.0 + 1e-3).mean())
    assert within > 0.99, f"{key}: only {within:.4f} of outputs within one step (max {off.max():.1f})"
    # onnxruntime's default session runs fused int8 kernels that saturate (u8s8 on AVX2
    # without VNNI), so it is *not* a reference; it must still be close in cosine
    for g, fused in zip(got, _case(key)["ort_qdq_fused"]):
        assert cosine(g, fused) > 0.95


def test_plain_llvm_target_builds_the_demo_model():
    for which in ("fp32", "qdq"):
        fast, _ = _tvm_outputs("small_cnn", which)
        plain, _ = _tvm_outputs("small_cnn", which, False)   # tvm.compile(mod, target="llvm")
        for a, b in zip(fast, plain):
            np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- builders, zoo

def test_builders_are_deterministic_and_seeded():
    a = models.resnet18(input_size=32, width=8, num_classes=10)
    b = models.resnet18(input_size=32, width=8, num_classes=10)
    c = models.resnet18(input_size=32, width=8, num_classes=10, seed=1)
    assert a.SerializeToString() == b.SerializeToString()
    assert a.SerializeToString() != c.SerializeToString()
    f1 = calibration_data(a, 2, seed=3)
    f2 = calibration_data(a, 2, seed=3)
    assert all(np.array_equal(x["input"], y["input"]) for x, y in zip(f1, f2))
    assert not np.array_equal(f1[0]["input"], f1[1]["input"])


def test_batchnorm_nodes_compute_the_folded_function():
    folded, bn = _case("resnet18")["ort_fp32"], _case("resnet18_bn")["ort_fp32"]
    assert any(n.op_type == "BatchNormalization" for n in _case("resnet18_bn")["fp32"].graph.node)
    for a, b in zip(folded, bn):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(a).max())


def test_gelu_op_and_erf_subgraph_agree():
    for a, b in zip(_case("transformer_encoder")["ort_fp32"], _case("transformer_gelu_op")["ort_fp32"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_calibration_inputs_look_like_their_domain():
    img = calibration_data(_case("small_cnn")["fp32"], 2, seed=0)[0]["input"]
    assert img.shape == (1, 3, 32, 32) and img.dtype == np.float32
    assert -2.5 < img.min() and img.max() < 2.8          # ImageNet-normalized [0, 1] pixels
    tok = calibration_data(_case("transformer_encoder")["fp32"], 1, seed=0)[0]["x"]
    assert tok.shape == (1, 16, 64)
    np.testing.assert_allclose(tok.mean(-1), 0, atol=1e-5)   # layer-normalized embeddings
    np.testing.assert_allclose(tok.std(-1), 1, atol=1e-3)


def test_zoo_cache_is_keyed_by_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("DSA_TVM_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path
    p1 = models.get_model_path("small_cnn", quantized=False, input_size=16)
    p2 = models.get_model_path("small_cnn", quantized=False, input_size=16)
    p3 = models.get_model_path("small_cnn", quantized=False, input_size=24)
    assert p1 == p2 != p3 and p1.parent == tmp_path and p1.exists()
    mtime = p1.stat().st_mtime_ns
    models.get_model("small_cnn", quantized=False, input_size=16)
    assert p1.stat().st_mtime_ns == mtime                 # served from the cache
    q = models.get_model_path("small_cnn", input_size=16)
    assert q != p1 and q.name.endswith("-qdq.onnx")
    assert set(models.list_models()) == set(BASE)
    with pytest.raises(KeyError):
        models.get_model("vgg16")
    with pytest.raises(TypeError):
        models.get_model("small_cnn", depth=3)


def test_full_size_parameter_and_mac_counts():
    # the reference architectures: ResNet-18 11.69 M params / 1.82 GMACs,
    # MobileNetV2 3.5 M / 0.30 GMACs (batch norm folded into the conv biases)
    r18 = models.summary(models.resnet18())
    assert round(r18["params"] / 1e6, 2) == 11.68 and round(r18["macs"] / 1e9, 2) == 1.81
    mb2 = models.summary(models.mobilenet_v2())
    assert round(mb2["params"] / 1e6, 2) == 3.49 and round(mb2["macs"] / 1e6) == 301

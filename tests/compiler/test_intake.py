"""Model intake (``dsa_tvm.load_onnx``): models written the way other exporters write them
(opset 11, shape arithmetic, dynamic batch) quantized and compiled in one call; the
simplified graph checked against onnxruntime; bad input named (truncated file, an opset
the converter cannot reach, a shape for no input, a missing initializer, an open dimension)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm import IntakeError, load_onnx
from dsa_tvm.frontend import fp32_check
from dsa_tvm.frontend.intake import parse_shape_args
from dsa_tvm.models import run_onnxruntime
from dsa_tvm.quant import prepare, quantize_onnx
from dsa_tvm.runtime import take_launches


def exporter_style(seed: int = 0, c: int = 8, hw: tuple[int, int] = (8, 8), opset: int = 11,
                   batch: str | int = "N") -> onnx.ModelProto:
    """Conv -> Relu -> Reshape(r, Concat(Slice(Shape(r), 0, 1), [-1]) via Identity) -> MatMul + Add,
    dynamic batch: the flatten other exporters write (``x.view(x.size(0), -1)``), at opset 11."""
    rng = np.random.default_rng(seed)
    h, w = hw
    inits = {"W": rng.normal(0, 0.3, (c, 3, 3, 3)), "B": rng.normal(0, 0.1, c),
             "Wf": rng.normal(0, 0.1, (c * h * w, 10)), "Bf": rng.normal(0, 0.1, 10)}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()]
    inits += [numpy_helper.from_array(np.array([v], np.int64), k)
              for k, v in (("zero", 0), ("one", 1), ("minus_one", -1))]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1] * 4, name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["shape"], name="shape"),
             helper.make_node("Slice", ["shape", "zero", "one"], ["n"], name="slice"),
             helper.make_node("Concat", ["n", "minus_one"], ["new_shape"], axis=0, name="concat"),
             helper.make_node("Identity", ["new_shape"], ["new_shape2"], name="identity"),
             helper.make_node("Reshape", ["r", "new_shape2"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "Wf"], ["mm"], name="fc"),
             helper.make_node("Add", ["mm", "Bf"], ["y"], name="fc_bias")]
    g = helper.make_graph(nodes, "exporter_style",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 6
    onnx.checker.check_model(m)
    return m


def _feeds(shape, n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(n)]


SHAPES = {"x": (1, 3, 8, 8)}


@pytest.fixture(scope="module")
def exported() -> onnx.ModelProto:
    return exporter_style()


# ----------------------------------------------------------------------------- the whole path


def test_tvm_cannot_import_the_exported_graph(exported):
    """The problem intake exists for (if TVM learns to read it, this documents the change)."""
    with pytest.raises(Exception, match="ShapeExpr|Shape"):
        from_onnx(exported, keep_params_in_input=False)


def test_intake_upgrades_fixes_simplifies_and_says_so(exported):
    taken = load_onnx(exported, shapes=SHAPES)
    ops = [n.op_type for n in taken.model.graph.node]
    assert not {"Shape", "Slice", "Concat", "Identity"} & set(ops), ops
    assert taken.input_shapes == SHAPES
    assert next(o.version for o in taken.model.opset_import if o.domain == "") == 13
    text = str(taken)
    assert "opset 11 upgraded to 13" in text and "'x' (N, 3, 8, 8) -> (1, 3, 8, 8)" in text
    assert "onnxslim" in text and "Shape x1" in text and "tolerance 0.0001" in text
    from_onnx(taken.model, keep_params_in_input=False)  # imports now
    kept = load_onnx(exported, shapes=SHAPES, simplify=False)  # upgraded and fixed, not simplified
    assert "Shape" in {n.op_type for n in kept.model.graph.node} and "onnxslim" not in str(kept)
    assert "outputs checked" in kept.notes[-1]
    # independent of intake's own check: another seed, onnxruntime op by op
    f = _feeds(SHAPES["x"], 1, seed=7)[0]
    np.testing.assert_allclose(run_onnxruntime(taken.model, f, optimize=False)[0],
                               run_onnxruntime(exported, f, optimize=False)[0], rtol=1e-5, atol=1e-5)


def test_exporter_style_model_quantized_and_compiled_for_the_dsa_in_one_call(exported, capsys):
    """opset 11 + Shape->Slice->Concat->Reshape + dynamic batch: one ``dsa_tvm.compile`` call
    (intake, int8 quantization, import, DSA compile); the conv and the dense run on the DSA
    and the output is within one step of the QDQ graph run op by op on onnxruntime."""
    cfg = dsa_tvm.load_config("default").replace(cpu_gmacs=0.01)
    calib = _feeds(SHAPES["x"], 4)
    ex = dsa_tvm.compile(exported, cfg, shapes=SHAPES, calibration_data=calib)
    said = capsys.readouterr().err
    assert "intake: opset 11 upgraded to 13" in said and "intake: onnxslim" in said
    assert "quantized 2 weighted layers" in said
    rep = dsa_tvm.last_compile_report()
    assert rep.regions and all(d.target == "dsa" for d in rep.regions), str(rep)
    assert not [op for op in rep.partition.cpu_ops if op.macs], str(rep)
    qm = quantize_onnx(exported, calib, shapes=SHAPES, show_progress=False)  # the same, for the reference
    x = _feeds(SHAPES["x"], 1, seed=3)[0]
    take_launches()
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x["x"]))
    assert take_launches()
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    ref = run_onnxruntime(qm.model, x, optimize=False)[0]
    step = float(numpy_helper.to_array(next(i for i in qm.model.graph.initializer if i.name == "y/scale")))
    assert np.abs(got - ref).max() <= step * (1 + 1e-3)


def test_quantize_onnx_accepts_opset_11():
    """Refused before intake (``per-channel QDQ needs opset >= 13``)."""
    qm = quantize_onnx(exporter_style(batch=1), _feeds(SHAPES["x"], 2), show_progress=False)
    assert set(qm.quantized_layers) == {"conv", "fc"}
    assert any("opset 11 upgraded to 13" in n for n in qm.intake)
    assert "intake: opset 11 upgraded" in qm.summary()
    assert next(o.version for o in qm.model.opset_import if o.domain == "") >= 13


def test_dsa_tvm_quantize_takes_shapes(exported):
    mod = dsa_tvm.quantize(exported, _feeds(SHAPES["x"], 2), shapes=SHAPES, show_progress=False)
    assert isinstance(mod, tvm.IRModule)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(1, 3), h=st.integers(3, 9), w=st.integers(3, 9), seed=st.integers(0, 99),
       opset=st.sampled_from([10, 11, 12, 13, 17]))
def test_intake_keeps_the_outputs_for_any_fixed_shape(batch, h, w, seed, opset):
    m = exporter_style(seed=seed, c=4, hw=(h, w), batch="N", opset=opset)
    # the exporter baked H and W into the dense layer; only the batch is open
    taken = load_onnx(m, shapes={"x": (batch, 3, h, w)})
    f = {"x": np.random.default_rng(seed + 1).normal(0, 2, (batch, 3, h, w)).astype(np.float32)}
    np.testing.assert_allclose(run_onnxruntime(taken.model, f, optimize=False)[0],
                               run_onnxruntime(m, f, optimize=False)[0], rtol=1e-5, atol=1e-5)


def test_shape_computed_pad_folds_into_the_conv():
    """What quant/simplify.py did by hand, now onnxslim's: a TF-'same' Pad whose pads come
    from a shape subgraph folds into the strided conv's own pads (one DSA layer)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "base")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i2"], ["h"], axis=0),
             helper.make_node("Constant", [], ["i2"], value=numpy_helper.from_array(np.array(2, np.int64))),
             helper.make_node("Mul", ["h", "zero"], ["hz"]),
             helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))),
             helper.make_node("Add", ["base", "hz"], ["pads"]),
             helper.make_node("Pad", ["x", "pads"], ["p"], mode="constant"),
             helper.make_node("Conv", ["p", "W"], ["y"], strides=[2, 2], name="conv")]
    nodes = [nodes[2], nodes[4], nodes[0], nodes[1], nodes[3], nodes[5], nodes[6], nodes[7]]
    g = helper.make_graph(nodes, "same_pad", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", 1, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    folded, _ = prepare(m)
    assert [n.op_type for n in folded.graph.node] == ["Conv"]
    conv = folded.graph.node[0]
    assert list(next(a for a in conv.attribute if a.name == "pads").ints) == [0, 0, 1, 1]
    f = _feeds((1, 3, 8, 8), 1, seed=2)[0]
    np.testing.assert_allclose(run_onnxruntime(folded, f, optimize=False)[0],
                               run_onnxruntime(m, f, optimize=False)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter, as users have it
def test_two_successive_chunks_import_after_intake(tmp_path):
    """Issue 11: two ``chunk`` ops export a Shape/Gather chain TVM's importer cannot read."""
    torch = pytest.importorskip("torch")

    class TwoChunks(torch.nn.Module):
        def forward(self, x):
            a, b = x.chunk(2, dim=1)
            c, d = a.chunk(2, dim=1)
            return torch.relu(c) + d, b

    path = tmp_path / "chunks.onnx"
    torch.onnx.export(TwoChunks(), (torch.randn(1, 8, 4, 4),), str(path), opset_version=13,
                      input_names=["x"], dynamic_axes={"x": {0: "N"}}, dynamo=False)
    with pytest.raises(Exception, match="shape_of expects a tensor input"):
        from_onnx(onnx.load(str(path)), keep_params_in_input=False)
    taken = load_onnx(path, shapes={"x": (1, 8, 4, 4)})
    mod = from_onnx(taken.model, keep_params_in_input=False)
    x = np.random.default_rng(0).normal(0, 1, (1, 8, 4, 4)).astype(np.float32)
    ex = tvm.compile(mod, target="llvm")
    outs = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    ref = run_onnxruntime(onnx.load(str(path)), {"x": x}, optimize=False)
    for got, want in zip(outs, ref):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


# ----------------------------------------------------------------------------- the FP32 check


def test_a_simplification_that_changes_the_outputs_is_refused(exported, monkeypatch):
    """The check is real: a simplifier that perturbs one weight is caught and named."""
    import onnxslim

    real = onnxslim.slim

    def wrong(model, **kw):
        out = real(model, **kw)
        w = next(i for i in out.graph.initializer if i.name == "W")
        w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 1.01, "W"))
        return out

    monkeypatch.setattr(onnxslim, "slim", wrong)
    with pytest.raises(IntakeError, match=r"output 'y' differs by .* against the model as given"):
        load_onnx(exported, shapes=SHAPES)


def test_unchanged_model_is_accepted_without_a_check():
    m = exporter_style(opset=13, batch=1)
    taken = load_onnx(load_onnx(m).model)  # the second pass finds nothing to do
    assert taken.notes == ["accepted as given (opset >= 13, static shapes, nothing to simplify)"]


def test_compare_rules():
    a = [np.array([1.0, 2.0], np.float32), np.array([3, 4])]
    assert fp32_check.compare(a, [a[0] + 1e-5, a[1]], ["y", "i"])[1] is None
    assert "differs by" in fp32_check.compare(a, [a[0] + 1e-2, a[1]], ["y", "i"])[1]
    assert "differs in 1 of 2" in fp32_check.compare(a, [a[0], a[1] + [0, 1]], ["y", "i"])[1]
    assert "shape" in fp32_check.compare(a, [a[0][:1], a[1]], ["y", "i"])[1]


# ----------------------------------------------------------------------------- QOperator models


def test_qoperator_models_go_through_to_qdq_first():
    """A QOperator model (QLinearConv, uint8 activations) is rewritten into QDQ before
    simplification and its notes kept (the rewrite's exactness against onnxruntime is
    tests/compiler/test_qoperator.py's)."""
    from .qop_models import one_op

    case = one_op("QLinearConv", "u8")
    taken = load_onnx(case.model)
    ops = {n.op_type for n in taken.model.graph.node}
    assert "QLinearConv" not in ops and {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    assert any("QLinearConv" in n for n in taken.notes), taken.notes
    assert taken.notes[-1].startswith("nothing else changed"), taken.notes


# ----------------------------------------------------------------------------- bad input


def test_truncated_file_is_named(tmp_path, exported):
    data = exporter_style(c=32, hw=(16, 16)).SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(IntakeError, match=r"cut\.onnx.*(truncated|missing)"):
        load_onnx(path)
    path.write_bytes(b"")
    with pytest.raises(IntakeError, match=r"cut\.onnx: holds no graph \(0 bytes\)"):
        load_onnx(path)
    with pytest.raises(FileNotFoundError, match="nope.onnx"):
        load_onnx(tmp_path / "nope.onnx")


def test_opset_the_converter_cannot_reach_is_named():
    g = helper.make_graph([helper.make_node("Split", ["x"], ["a", "b"], axis=0)], "old",
                          [helper.make_tensor_value_info("x", 1, [4])],
                          [helper.make_tensor_value_info(n, 1, [2]) for n in "ab"])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 1)])
    m.ir_version = 3
    with pytest.raises(IntakeError, match=r"opset 1 cannot be upgraded to 13 .*Split.*export the model"):
        load_onnx(m)


def test_shape_naming_no_input_is_named(exported):
    with pytest.raises(IntakeError, match=r"shapes names 'image', which is not an input .*inputs: x"):
        load_onnx(exported, shapes={"image": (1, 3, 8, 8)})
    with pytest.raises(IntakeError, match="rank 3"):
        load_onnx(exported, shapes={"x": (1, 3, 8)})
    with pytest.raises(IntakeError, match="dimension 1 is fixed to 3"):
        load_onnx(exported, shapes={"x": (1, 4, 8, 8)})


def test_open_dimension_is_named_with_the_fix(exported):
    with pytest.raises(IntakeError, match=r"input 'x' \(N, 3, 8, 8\) has dynamic dimension 0;.*"
                                          r"shapes=\{'x': \(1, 3, 8, 8\)\} or --shape x=1x3x8x8$"):
        load_onnx(exported)
    with pytest.raises(IntakeError, match=r"dimensions 0, 2, 3;.*\(1, 3, d2, d3\).*x=1x3xd2xd3 \(d2, d3: "):
        load_onnx(_open_hw())


def _open_hw() -> onnx.ModelProto:
    m = exporter_style()
    for i in (2, 3):
        m.graph.input[0].type.tensor_type.shape.dim[i].dim_param = "HW"[i - 2]
    return m


def test_missing_initializer_names_node_and_tensor():
    """Used to end in TVM's ``KeyError: 'x_zero_point'``."""
    g = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero_point"], ["q"],
                                            name="quant_x"),
                           helper.make_node("DequantizeLinear", ["q", "x_scale", "x_zero_point"], ["y"])],
                          "broken", [helper.make_tensor_value_info("x", 1, [1, 4])],
                          [helper.make_tensor_value_info("y", 1, [1, 4])],
                          [numpy_helper.from_array(np.array(0.1, np.float32), "x_scale")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(IntakeError, match=r"node 'quant_x' \(QuantizeLinear\) reads tensor 'x_zero_point'"):
        load_onnx(m)


def test_shape_arguments_parse():
    assert parse_shape_args(["x=1x3x48x320", "ids:0=2X7"]) == {"x": (1, 3, 48, 320), "ids:0": (2, 7)}
    for bad in ("x", "=1x2", "x=1xx2", "x=0x3"):
        with pytest.raises(IntakeError, match="shape"):
            parse_shape_args([bad])


# ----------------------------------------------------------------------------- command line


def test_cli_quantize_with_shape(tmp_path, exported, capsys):
    from dsa_tvm.cli import main

    src = tmp_path / "exported.onnx"
    onnx.save(exported, str(src))
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(src), "--calib", "synthetic:2", "--shape", "x=1x3x8x8", "-o", str(out),
                 "--quiet"]) == 0
    said = capsys.readouterr().out
    assert "intake: opset 11 upgraded to 13" in said and "intake: fixed input shapes" in said
    assert onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    assert main(["quantize", str(src), "--calib", "synthetic:2", "--shape", "y=1x10"]) == 2
    assert "shapes names 'y'" in capsys.readouterr().err
    assert main(["run", str(src)]) == 2
    assert "--shape x=1x3x8x8" in capsys.readouterr().err


def test_cli_run_with_shape(tmp_path, exported, capsys):
    """``dsa-tvm run`` on the exported FP32 file: intake's notes printed, outputs agree with
    onnxruntime on the model as exported."""
    from dsa_tvm.cli import main

    src = tmp_path / "exported.onnx"
    onnx.save(exported, str(src))
    assert main(["run", str(src), "--shape", "x=1x3x8x8"]) == 0
    said = capsys.readouterr().out
    assert "intake: opset 11 upgraded to 13" in said and "intake: onnxslim" in said
    diff = float(said.split("max |diff| ")[-1].split(",")[0])
    assert diff < 1e-4


# ----------------------------------------------------------------------------- shipped OCR models


def _ocr_models():
    """PP-OCR's detector, recognizer and direction classifier as RapidOCR ships them (opset 12,
    12, 11; dynamic batch and image size), from the installed wheel (``pip install --no-deps
    rapidocr-onnxruntime==1.4.4``; its package is not imported, only its model files read)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapidocr-onnxruntime (the shipped PP-OCR models) is not installed")
    return Path(spec.submodule_search_locations[0]) / "models"


OCR = {"ch_PP-OCRv4_det_infer.onnx": (1, 3, 64, 64), "ch_PP-OCRv4_rec_infer.onnx": (1, 3, 48, 320),
       "ch_ppocr_mobile_v2.0_cls_infer.onnx": (1, 3, 48, 192)}


@pytest.mark.parametrize("name", sorted(OCR))
def test_shipped_ocr_models_import_after_intake(name):
    path = _ocr_models() / name
    with pytest.raises(Exception):  # noqa: B017 - each fails differently inside TVM's importer
        from_onnx(onnx.load(str(path)), keep_params_in_input=False)
    with pytest.raises(IntakeError, match="has dynamic dimensions 0, 2, 3"):
        load_onnx(path)
    taken = load_onnx(path, shapes={"x": OCR[name]})
    assert "outputs checked against the model as given" in str(taken)
    from_onnx(taken.model, keep_params_in_input=False)


def test_shipped_ocr_classifier_quantizes():
    """The opset-11 direction classifier: refused before intake (per-channel QDQ needs opset 13)."""
    path = _ocr_models() / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    shape = OCR[path.name]
    qm = quantize_onnx(path, _feeds(shape, 2), shapes={"x": shape}, show_progress=False)
    assert len(qm.quantized_layers) > 50 and "opset 11 upgraded to 13" in qm.summary()
    f = _feeds(shape, 1, seed=9)[0]
    q, ref = run_onnxruntime(qm.model, f, optimize=False)[0], run_onnxruntime(qm.fp32, f, optimize=False)[0]
    assert np.abs(q - ref).max() < 0.1  # two-class softmax: int8 stays close to FP32

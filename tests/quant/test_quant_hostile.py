"""The quantizer fed what a new user might feed it (issue 11, findings 3 and 8):
NaN/Inf, empty, mistyped, misshapen, all-zero, tiny and huge calibration data, arguments
out of range, unreadable images. Each gets a clear error naming the cause, or is handled
correctly (checked against the FP32 model run by onnxruntime and the QDQ model run op by op).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.cli import main
from dsa_tvm.models import run_onnxruntime
from dsa_tvm.quant import quantize_onnx
from dsa_tvm.quant.accuracy import mixed_precision
from dsa_tvm.quant.data import DegenerateDataWarning, NonFiniteDataWarning, as_feeds
from dsa_tvm.quant.metrics import cosine

from ..qdq_models import make_model, node, rand

SHAPE = (1, 3, 8, 8)
Q = {"show_progress": False}


def conv_net(tail: str | None = None, seed: int = 0) -> onnx.ModelProto:
    """x -> Conv(bias) -> Relu -> Conv(bias) [-> tail op] -> out."""
    rng = np.random.default_rng(seed)
    inits = {"W1": rand(rng, 8, 3, 3, 3), "B1": rand(rng, 8), "W2": rand(rng, 4, 8, 3, 3, scale=0.3),
             "B2": rand(rng, 4)}
    nodes = [node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1] * 4, name="conv1"),
             node("Relu", ["c1"], ["r1"], name="relu1"),
             node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1] * 4, name="conv2")]
    last = "c2"
    if tail:
        nodes.append(node(tail, ["c2"], ["t"], name=f"my_{tail.lower()}"))
        last = "t"
    nodes.append(node("Identity", [last], ["out"], name="identity"))
    return make_model(nodes, inits, {"x": SHAPE}, {"out": None})


def feeds(n: int = 6, scale: float = 1.0, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal(SHAPE) * scale).astype(np.float32)} for _ in range(n)]


def inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def int8_vs_fp32(qm, data) -> float:
    """Mean output cosine of the QDQ model (op by op) against the FP32 model."""
    return float(np.mean([cosine(run_onnxruntime(qm.fp32, f)[0],
                                 run_onnxruntime(qm.model, f, optimize=False)[0]) for f in data]))


def same_model(a: onnx.ModelProto, b: onnx.ModelProto) -> None:
    ia, ib = inits(a), inits(b)
    assert ia.keys() == ib.keys()
    for k in ia:
        np.testing.assert_array_equal(ia[k], ib[k], err_msg=k)


# ----------------------------------------------------------------------------- NaN / Inf


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_batch_is_skipped_loudly(bad):
    """One NaN used to turn every int32 bias into -2**31 (output cosine -0.088); Inf
    crashed with 'cannot convert float NaN to integer'. Now the batch is left out with a
    warning, and the model is exactly the one calibrated on the clean batches."""
    m, data = conv_net(), feeds(6)
    dirty = [dict(f) for f in data]
    dirty[2]["x"] = dirty[2]["x"].copy()
    dirty[2]["x"][0, 1, 3, 4] = bad
    with pytest.warns(NonFiniteDataWarning, match=r"skipped 1 of 6 batches .*batch 2"):
        qm = quantize_onnx(m, dirty, **Q)
    clean = quantize_onnx(m, data[:2] + data[3:], **Q)
    same_model(qm.model, clean.model)
    b = inits(qm.model)["conv1/B_int32"]
    assert np.abs(b.astype(np.int64)).max() < 2 ** 30
    assert int8_vs_fp32(qm, data) > 0.99


def test_only_non_finite_batches_is_an_error():
    data = feeds(3)
    for f in data:
        f["x"][0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"every batch \(3\) has NaN or Inf"):
        quantize_onnx(conv_net(), data, **Q)


def test_relax_path_skips_the_non_finite_batch_too():
    import tvm
    from tvm import relax

    m, data = conv_net(), feeds(5)
    dirty = [dict(f) for f in data] + [{"x": np.full(SHAPE, np.nan, np.float32)}]
    mod = from_onnx(m, keep_params_in_input=False)
    with pytest.warns(NonFiniteDataWarning, match="skipped 1 of 6"):
        qmod = dsa_tvm.quantize(mod, dirty, show_progress=False, verbose=False)
    ref = dsa_tvm.quantize(mod, data, show_progress=False, verbose=False)
    x = feeds(1, seed=9)[0]["x"]

    def run(mo):
        return relax.VirtualMachine(tvm.compile(mo, target="llvm"), tvm.cpu())["main"](
            tvm.runtime.tensor(x)).numpy()

    got = run(qmod)
    np.testing.assert_array_equal(got, run(ref))
    assert cosine(run_onnxruntime(m, {"x": x})[0], got) > 0.99


def test_values_past_float32_inside_the_model_name_the_tensor():
    """Finite inputs whose convolution overflows float32: an error naming the tensor,
    not NaN scales."""
    data = feeds(2, scale=3e37)
    with pytest.raises(ValueError, match=r"tensor '.*' is (Inf|NaN) on batch 0.*too large"):
        quantize_onnx(conv_net(), data, **Q)


def test_cli_nan_calibration_batch_warns_and_reports_a_real_cosine(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(conv_net(), src)
    arr = np.stack([f["x"] for f in feeds(4)])
    arr[1, 0, 0, 0, 0] = np.nan
    np.savez(tmp_path / "cal.npz", x=arr)
    with pytest.warns(NonFiniteDataWarning):
        rc = main(["quantize", str(src), "--calib", str(tmp_path / "cal.npz"), "-o",
                   str(tmp_path / "q.onnx"), "--quiet"])
    assert rc == 0
    rep = json.loads((tmp_path / "q.report.json").read_text())
    assert rep["output_cosine"]["out"] is not None and rep["output_cosine"]["out"] > 0.99


def test_cli_nan_output_is_an_error_not_exit_0(tmp_path, capsys):
    """A model whose FP32 output is NaN on the evaluation data (Sqrt of negatives): the
    report would say 'output_cosine: null'; the command fails and says why."""
    src = tmp_path / "m.onnx"
    onnx.save(conv_net("Sqrt"), src)
    np.savez(tmp_path / "cal.npz", x=np.stack([f["x"] for f in feeds(3)]))
    rc = main(["quantize", str(src), "--calib", str(tmp_path / "cal.npz"), "-o",
               str(tmp_path / "q.onnx"), "--quiet"])
    assert rc == 1
    assert "output cosine of out is not a number" in capsys.readouterr().err


# ----------------------------------------------------------------------------- arguments


def test_keep_fp32_of_a_missing_node_names_the_closest():
    with pytest.raises(ValueError, match=r"no node named 'conv_2'.*closest: conv2"):
        quantize_onnx(conv_net(), feeds(2), keep_fp32=["conv_2"], **Q)
    qm = quantize_onnx(conv_net(), feeds(2), **Q)
    with pytest.raises(ValueError, match=r"no node named 'conv3'"):
        qm.requantize(["conv3"])
    assert "conv2: kept in FP32 on request" in qm.requantize(["conv2"]).summary()


def test_relax_keep_fp32_of_a_missing_binding_is_an_error():
    mod = from_onnx(conv_net(), keep_params_in_input=False)
    with pytest.raises(ValueError, match=r"keep_fp32: no conv2d/matmul/add/pool binding named "
                                         r"'nope'"):
        dsa_tvm.quantize(mod, feeds(2), keep_fp32=["nope"], show_progress=False)


@pytest.mark.parametrize("n", [-1, 0, 1.5, True])
def test_num_batches_must_be_positive(n):
    with pytest.raises(ValueError, match=rf"num_batches must be a positive integer.*got {n!r}"):
        quantize_onnx(conv_net(), feeds(2), num_batches=n, **Q)
    mod = from_onnx(conv_net(), keep_params_in_input=False)
    with pytest.raises(ValueError, match="num_batches"):
        dsa_tvm.quantize(mod, feeds(2), num_batches=n, show_progress=False)


@pytest.mark.parametrize("target,max_fp32,match", [(2.0, 3, r"target cosine must be in \(0, 1\]"),
                                                   (0.9, -1, "max_fp32 .* positive integer, got -1")])
def test_mixed_precision_arguments_are_checked(target, max_fp32, match):
    qm = quantize_onnx(conv_net(), feeds(2), **Q)
    with pytest.raises(ValueError, match=match):
        mixed_precision(qm, feeds(2), target, max_fp32, show_progress=False)


@pytest.mark.parametrize("args,match", [
    (["--max-fp32", "-1"], r"argument --max-fp32: must be a positive integer, got '-1'"),
    (["--target-cosine", "2"], r"argument --target-cosine: must be in \(0, 1\]"),
    (["--num-batches", "-1"], r"argument --num-batches: must be a positive integer"),
    (["--percentile", "0"], r"argument --percentile: must be in \(0, 100\]"),
    (["--preprocess", "imagenett"], r"argument --preprocess: invalid choice: 'imagenett'"),
])
def test_cli_rejects_bad_arguments_up_front(tmp_path, capsys, args, match):
    with pytest.raises(SystemExit) as e:
        main(["quantize", str(tmp_path / "m.onnx"), "--calib", "synthetic:2", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "dsa-tvm quantize: error:" in err
    import re

    assert re.search(match, err), err


def test_preprocess_and_percentile_checked_in_the_api():
    with pytest.raises(ValueError, match="unknown preprocess 'bgr'.*imagenet"):
        quantize_onnx(conv_net(), feeds(2), preprocess="bgr", **Q)
    with pytest.raises(ValueError, match=r"percentile must be in \(0, 100\], got 150"):
        quantize_onnx(conv_net(), feeds(2), method="percentile", percentile=150, **Q)


# ----------------------------------------------------------------------------- the CLI's files


def _cli(tmp_path, *args) -> int:
    src = tmp_path / "m.onnx"
    if not src.exists():
        onnx.save(conv_net(), src)
    return main(["quantize", str(src), "-o", str(tmp_path / "q.onnx"), "--quiet", *args])


def _images(folder, n=2):
    from PIL import Image

    folder.mkdir()
    for i in range(n):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (12, 12, 3), np.uint8)).save(
            folder / f"img{i}.png")
    return folder


def test_cli_fake_jpeg_names_the_file(tmp_path, capsys):
    cal = _images(tmp_path / "cal")
    (cal / "zz_fake.jpg").write_bytes(b"this is not a jpeg")
    assert _cli(tmp_path, "--calib", str(cal)) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsa-tvm quantize: error: image '") and "zz_fake.jpg" in err
    assert "Traceback" not in err


def test_cli_truncated_png_names_the_file(tmp_path, capsys):
    cal = _images(tmp_path / "cal")
    data = (cal / "img1.png").read_bytes()
    (cal / "img1.png").write_bytes(data[: len(data) // 2])
    assert _cli(tmp_path, "--calib", str(cal)) == 2
    assert "img1.png" in capsys.readouterr().err


def test_cli_eval_data_of_the_wrong_shape_fails_before_calibrating(tmp_path, capsys):
    np.savez(tmp_path / "cal.npz", x=np.stack([f["x"] for f in feeds(3)]))
    np.savez(tmp_path / "ev.npz", x=np.zeros((2, 5, 5), np.float32))
    assert _cli(tmp_path, "--calib", str(tmp_path / "cal.npz"), "--eval", str(tmp_path / "ev.npz")) == 2
    cap = capsys.readouterr()
    assert "error: evaluation data: array of shape (2, 5, 5) does not fit" in cap.err
    assert "quantized" not in cap.out and not (tmp_path / "q.onnx").exists()


def test_cli_missing_model_and_bad_synthetic_count(tmp_path, capsys):
    assert main(["quantize", str(tmp_path / "none.onnx"), "--calib", "synthetic:2"]) == 2
    assert "model '" in capsys.readouterr().err
    (tmp_path / "bad.onnx").write_bytes(b"\x00garbage")
    assert main(["quantize", str(tmp_path / "bad.onnx"), "--calib", "synthetic:2"]) == 2
    assert "cannot be read as ONNX" in capsys.readouterr().err
    assert _cli(tmp_path, "--calib", "synthetic:x") == 2
    assert "synthetic:N needs a positive integer" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the summary


def test_summary_lists_every_fp32_op_with_its_reason():
    qm = quantize_onnx(conv_net("Sigmoid"), feeds(3), **Q)
    s = qm.summary()
    assert "FP32: Sigmoid x1 (my_sigmoid): no int8 op reads" in s
    assert "removed Identity x1" in s     # intake's onnxslim pass dropped it, and says so
    qm = qm.requantize(["conv2"])
    assert "FP32: conv2: kept in FP32 on request" in qm.summary()


# ----------------------------------------------------------------------------- hostile data


def test_empty_data_is_an_error(tmp_path):
    shapes = {"x": SHAPE}
    with pytest.raises(ValueError, match="calibration data is empty"):
        as_feeds([], shapes)
    with pytest.raises(ValueError, match="calibration data is empty"):
        as_feeds(np.zeros((0, 3, 8, 8), np.float32), shapes)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no images"):
        as_feeds(tmp_path / "empty", shapes)


def test_wrong_dtype_and_shape_name_the_batch():
    shapes = {"x": SHAPE}
    with pytest.raises(ValueError, match=r"input 'x' of batch 0 has dtype <U1"):
        as_feeds([np.full(SHAPE, "a")], shapes)
    with pytest.raises(ValueError, match=r"input 'x' of batch 1 has shape \(1, 3, 4, 4\); the model "
                                         r"input is \(1, 3, 8, 8\)"):
        as_feeds([np.zeros(SHAPE), np.zeros((1, 3, 4, 4))], shapes)
    with pytest.raises(ValueError, match="batch 0 lacks input 'x'"):
        as_feeds([{"y": np.zeros(SHAPE)}], shapes)
    f = as_feeds([np.ones(SHAPE, np.int64)], shapes)   # integers are numbers: cast
    assert f[0]["x"].dtype == np.float32


def test_all_zero_calibration_warns_and_stays_close():
    with pytest.warns(DegenerateDataWarning, match="input 'x' is all zero"):
        qm = quantize_onnx(conv_net(), feeds(3, scale=0.0), **Q)
    z = {"x": np.zeros(SHAPE, np.float32)}   # on its own data: the FP32 output, up to rounding
    fp32, q = run_onnxruntime(qm.fp32, z)[0], run_onnxruntime(qm.model, z, optimize=False)[0]
    assert cosine(fp32, q) > 0.999


def test_tiny_calibration_warns():
    with pytest.warns(DegenerateDataWarning, match=r"peaks at .*e-30, below the smallest"):
        qm = quantize_onnx(conv_net(), feeds(3, scale=1e-30), **Q)
    assert int8_vs_fp32(qm, feeds(2, scale=1e-30, seed=5)) > 0.99


@settings(max_examples=12, deadline=None)
@given(st.integers(-30, 30), st.integers(0, 1000))
def test_any_magnitude_quantizes_to_a_sane_model(exponent, seed):
    """Inputs from 1e-30 to 1e30: finite positive scales, int32 biases well inside their
    range, and the int8 model close to the FP32 one on data of the same magnitude."""
    scale = 10.0 ** exponent
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateDataWarning)
        qm = quantize_onnx(conv_net(seed=seed % 3), feeds(3, scale, seed), **Q)
    ini = inits(qm.model)
    for k, v in ini.items():
        if k.endswith("scale"):
            assert np.all(np.isfinite(v)) and np.all(v > 0), k
        if k.endswith("B_int32"):
            assert np.abs(v.astype(np.int64)).max() < 2 ** 30, k
    assert int8_vs_fp32(qm, feeds(2, scale, seed + 1)) > 0.98


def test_relax_path_lists_every_fp32_op_with_its_reason(capsys):
    """The Relax path (dsa_tvm.quantize on an FP32 IRModule) names each op it leaves in
    FP32, not only a count: the tail Sigmoid, and a conv kept on request."""
    from dsa_tvm.quant.relax_quantize import quantize_relax

    mod = from_onnx(conv_net("Sigmoid"), keep_params_in_input=False)
    dsa_tvm.quantize(mod, feeds(3), show_progress=False)
    err = capsys.readouterr().err
    assert "FP32: relax.sigmoid x1" in err and "no int8 form on the DSA" in err, err
    _, plan = quantize_relax(mod, feeds(3))
    assert [op for op, _ in plan.fp32] == ["relax.sigmoid"], plan.fp32
    keep = next(c.anchor.name for c in plan.chains if c.kind == "conv2d")
    _, plan = quantize_relax(mod, feeds(3), keep_fp32=frozenset({keep}))
    assert [keep] in [names for (op, why), names in plan.fp32.items()
                      if op == "relax.nn.conv2d" and why == "kept in FP32 on request"], plan.fp32

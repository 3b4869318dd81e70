"""tvm.compile(mod, target="dsa") end to end: offload, CPU fallback, bit-exactness, deploy."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.runtime import take_launches
from tir_schedules.kinds import run_region

from .. import qdq_models as Q


def _ort_reference(path, x: np.ndarray) -> np.ndarray:
    """onnxruntime running the QDQ graph as written (its optimized int8 kernels saturate)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), so)
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _run(ex, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def _output_step(path) -> float:
    """The output quantization step (scale of the last DequantizeLinear)."""
    m = onnx.load(path)
    last = [n for n in m.graph.node if n.op_type == "DequantizeLinear"][-1]
    init = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
    return float(init[last.input[1]])


def _input(path, seed=1) -> np.ndarray:
    m = onnx.load(path)
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def conv_model(tmp_path_factory):
    return Q.conv_net(tmp_path_factory.mktemp("conv"), cin=16, cout=48, hw=24)


def test_conv_offloads_and_matches_onnxruntime(conv_model):
    mod = from_onnx(onnx.load(conv_model), keep_params_in_input=False)
    ex = tvm.compile(mod, target="dsa")
    rep = dsa_tvm.last_compile_report()
    assert [d.target for d in rep.regions] == ["dsa"]
    assert rep.regions[0].dsa_us < rep.regions[0].cpu_us
    take_launches()
    x = _input(conv_model)
    got, ref = _run(ex, x), _ort_reference(conv_model, x)
    step = _output_step(conv_model)
    diff = np.abs(got - ref) / step
    assert diff.max() <= 1.0 + 1e-3, f"more than one quantization step off: {diff.max()}"
    frac = float((diff > 0.5).mean())
    print(f"fraction of outputs differing from onnxruntime by one step: {frac:.4f}")
    assert frac < 0.05


def test_dsa_output_is_bit_exact_against_integer_reference(conv_model):
    mod = from_onnx(onnx.load(conv_model), keep_params_in_input=False)
    ex = tvm.compile(mod, target="dsa")
    region = dsa_tvm.last_compile_report().regions[0].region
    take_launches()
    _run(ex, _input(conv_model, seed=5))
    (launch,) = take_launches()
    want = run_region(region, launch.inputs)
    for name, got in launch.outputs.items():
        np.testing.assert_array_equal(got, want[name])


def test_llvm_target_is_untouched(conv_model):
    mod = from_onnx(onnx.load(conv_model), keep_params_in_input=False)
    before = len(take_launches())
    ex = tvm.compile(mod, target="llvm")
    x = _input(conv_model)
    np.testing.assert_allclose(_run(ex, x), _ort_reference(conv_model, x), atol=1e-5)
    assert len(take_launches()) == 0 and before >= 0


def test_dense_and_strided_conv(tmp_path):
    for path in (Q.dense_net(tmp_path, m=32, k=100, n=70),
                 Q.conv_net(tmp_path, cin=3, cout=20, hw=20, k=7, stride=2, pad=3)):
        mod = from_onnx(onnx.load(path), keep_params_in_input=False)
        ex = dsa_tvm.compile(mod, "edge")
        x = _input(path)
        diff = np.abs(_run(ex, x) - _ort_reference(path, x)) / _output_step(path)
        assert diff.max() <= 1.0 + 1e-3


def test_unsupported_op_falls_back_without_breaking(tmp_path):
    path = Q.single_op_net(tmp_path, "Softmax", axis=1)
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    ex = tvm.compile(mod, target="dsa")
    rep = dsa_tvm.last_compile_report()
    assert any("softmax" in op.reason for op in rep.partition.cpu_ops)
    x = _input(path)
    np.testing.assert_allclose(_run(ex, x), _ort_reference(path, x), atol=_output_step(path))


def test_run_report(conv_model, tmp_path):
    mod = from_onnx(onnx.load(conv_model), keep_params_in_input=False)
    ex = tvm.compile(mod, target="dsa")
    take_launches()
    _run(ex, _input(conv_model))
    rep = dsa_tvm.last_run_report()
    (row,) = [r for r in rep.rows if r.target == "DSA"]
    assert row.op == "Conv2d" and row.macs == 16 * 48 * 24 * 24 * 9
    assert 0 < row.utilization <= 1 and row.cycles > row.macs / 256
    assert row.dram_read > 0 and row.dram_written == 48 * 24 * 24
    assert rep.dsa_mac_share == 1.0 and rep.total_cycles >= row.cycles
    assert "Conv2d" in str(rep) and '"layers"' in rep.to_json()
    trace = rep.write_trace(tmp_path / "model.json")
    assert trace.stat().st_size > 100


def test_export_library_runs_in_a_fresh_process(conv_model, tmp_path):
    mod = from_onnx(onnx.load(conv_model), keep_params_in_input=False)
    ex = tvm.compile(mod, target="dsa")
    lib = tmp_path / "model.so"
    ex.export_library(str(lib))
    x = _input(conv_model)
    np.save(tmp_path / "x.npy", x)
    want = _run(ex, x)
    script = textwrap.dedent(f"""
        import numpy as np, tvm
        from tvm import relax
        import dsa_tvm
        lib = tvm.runtime.load_module({str(lib)!r})
        vm = relax.VirtualMachine(lib, tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(np.load({str(tmp_path / 'x.npy')!r})))
        np.save({str(tmp_path / 'y.npy')!r}, out.numpy())
        print(len(dsa_tvm.runtime.take_launches()))
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().endswith("1")      # the region ran on the simulator there
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)

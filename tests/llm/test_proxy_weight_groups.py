"""``benchmarks/llm_qdq_proxy.py --weight-groups``: weights rounded per group of input rows.

The proxy's per-group numbers (docs/llm.md) stand on two helpers: the rounding itself
(with a group minimum it must reproduce a GGUF Q4_1 lattice exactly, partial last group
included) and the graph rewrite (every MatMul reading a dequantized constant must then
compute with the FP32 weight so rounded, checked in onnxruntime against numpy).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def proxy():
    import sys

    sys.path.insert(0, str(BENCH))     # the proxy imports its sibling bench_llm
    try:
        spec = importlib.util.spec_from_file_location("llm_qdq_proxy", BENCH / "llm_qdq_proxy.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


def q4_1(rng, rows: int, cols: int, group: int) -> np.ndarray:
    """Weights on a Q4_1 lattice: per group of input rows and column, ``d * q + min`` with
    q in 0..15 and both ends taken."""
    out = np.empty((rows, cols), np.float32)
    for a in range(0, rows, group):
        n = min(group, rows - a)
        q = rng.integers(0, 16, (n, cols))
        q[0], q[-1] = 0, 15
        out[a:a + n] = q * rng.uniform(0.01, 0.1, cols) + rng.uniform(-1, 0, cols)
    return out


def test_group_minimum_reproduces_a_q4_1_lattice_partial_group_included(proxy):
    w = q4_1(np.random.default_rng(0), 40, 6, 32)       # groups of 32 and 8 rows
    np.testing.assert_allclose(proxy.group_quantized(w, 32, 4, True), w, atol=1e-6)
    assert np.abs(proxy.group_quantized(w, 64, 4, True) - w).max() > 1e-3   # other groups


@pytest.mark.parametrize("bits", [4, 8])
def test_symmetric_groups_stay_on_their_grid_and_finer_groups_err_less(proxy, bits):
    w = np.random.default_rng(1).standard_normal((96, 5)).astype(np.float32)
    w[3, 0] = 40.0                                      # an outlier widens one group only
    qmax = 2 ** (bits - 1) - 1
    errs = []
    for group in (16, 32, 96):
        got = proxy.group_quantized(w, group, bits, False)
        for a in range(0, 96, group):
            d = np.abs(w[a:a + group]).max(0) / qmax
            codes = got[a:a + group] / d
            np.testing.assert_allclose(codes, np.round(codes), atol=1e-4)
            assert np.abs(codes).max() <= qmax + 1e-4
        errs.append(np.abs(got - w).mean())
    assert errs[0] < errs[1] < errs[2]


def test_a_group_of_no_rows_is_refused(proxy):
    with pytest.raises(ValueError, match="at least one input row"):
        proxy.group_quantized(np.ones((4, 2), np.float32), 0, 4, False)


def test_grouped_weights_rewrites_the_matmul_to_the_rounded_fp32_weight(proxy):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((40, 6)).astype(np.float32)
    x = rng.standard_normal((3, 40)).astype(np.float32)
    codes = np.clip(np.round(w / (np.abs(w).max(0) / 127)), -127, 127).astype(np.int8)

    def graph(weight_nodes, inits, weight):
        g = helper.make_graph(
            [*weight_nodes, helper.make_node("MatMul", ["x", weight], ["y"], name="mm")], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 40])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 6])], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])

    fp32 = graph([], [numpy_helper.from_array(w, "w")], "w")
    qdq = graph([helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=1)],
                [numpy_helper.from_array(codes, "wq"),
                 numpy_helper.from_array((np.abs(w).max(0) / 127).astype(np.float32), "ws"),
                 numpy_helper.from_array(np.zeros(6, np.int8), "wz")], "wd")
    out = proxy.grouped_weights(qdq, fp32, 32, 4, False)
    assert not [n for n in out.graph.node if n.op_type == "DequantizeLinear"]   # dead, dropped
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    y = ort.InferenceSession(out.SerializeToString(), so).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x @ proxy.group_quantized(w, 32, 4, False), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(SystemExit, match="no MatMul"):
        proxy.grouped_weights(fp32, fp32, 32, 4, False)

"""Weight-only int4 models as onnxruntime ships them (``com.microsoft.MatMulNBits``, blocked
``DequantizeLinear`` over INT4/UINT4), which TVM 0.27 cannot import: intake unpacks them
(``frontend/weight_only.py``), checked against onnxruntime running the model as given
(graph optimizations off); quantized, the weights keep their grid and run on the DSA as
grouped dense layers, bit-exact against onnxruntime on the QDQ model. Hand-packed nodes
cover what the quantizer does not write (2 and 8 bits, a bias, g_idx, float zero points,
3-D inputs); bad nodes are named."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm import IntakeError, load_onnx
from dsa_tvm.frontend.weight_only import has_weight_only
from dsa_tvm.models import run_onnxruntime
from dsa_tvm.quant import quantize_onnx


def mlp(k: int = 64, h: int = 96, n: int = 40, seed: int = 0, opset: int = 21) -> onnx.ModelProto:
    """x[4, k] -> MatMul + Add -> Relu -> MatMul: the float model a weight-only quantizer takes."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(v.astype(np.float32), name) for name, v in (
        ("w1", rng.normal(0, 0.1, (k, h))), ("b1", rng.normal(0, 0.1, h)),
        ("w2", rng.normal(0, 0.1, (h, n))))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], name="fc1_bias"),
             helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
             helper.make_node("MatMul", ["r1", "w2"], ["y"], name="fc2")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def ort_weight_only(model: onnx.ModelProto, qdq: bool, symmetric: bool, block: int = 32
                    ) -> onnx.ModelProto:
    """onnxruntime's own weight-only int4 quantizer (MatMulNBits, or its QDQ form)."""
    from onnxruntime.quantization import matmul_nbits_quantizer as mq
    from onnxruntime.quantization.quant_utils import QuantFormat

    cfg = mq.DefaultWeightOnlyQuantConfig(
        block_size=block, is_symmetric=symmetric, op_types_to_quantize=("MatMul",),
        quant_format=QuantFormat.QDQ if qdq else QuantFormat.QOperator)
    q = mq.MatMulNBitsQuantizer(model, algo_config=cfg)
    q.process()
    return q.model.model


def feed(k: int = 64, rows: tuple[int, ...] = (4,), seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(0, 1, rows + (k,)).astype(np.float32)}


def ort_run(model: onnx.ModelProto, x: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime, graph optimizations off: the reference."""
    return run_onnxruntime(model, x, optimize=False)


def run_vm(ex, x: np.ndarray) -> np.ndarray:
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


# ----------------------------------------------------------------------------- onnxruntime's quantizer
@pytest.mark.parametrize("qdq", [False, True], ids=["MatMulNBits", "QDQ"])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_onnxruntime_weight_only_imports_and_runs_on_the_dsa(qdq: bool, symmetric: bool) -> None:
    shipped = ort_weight_only(mlp(), qdq, symmetric)
    assert has_weight_only(shipped)
    with pytest.raises((tvm.error.OpNotImplemented, tvm.error.InternalError)):
        from_onnx(shipped, keep_params_in_input=False)   # what intake fixes: TVM reads neither
    taken = load_onnx(shipped)
    assert not has_weight_only(taken.model)
    assert any("on the same grid" in n for n in taken.notes), taken.notes
    x = feed()
    ref = ort_run(shipped, x)[0]
    # the CPU build of the unpacked model computes what onnxruntime computes on the shipped one
    cpu = run_vm(tvm.compile(dsa_tvm.api._import_onnx(taken, None, None, {}, False),
                             target="llvm"), x["x"])
    np.testing.assert_allclose(cpu, ref, rtol=1e-5, atol=1e-5)
    # quantized: both MatMuls keep the shipped grid and run as grouped dense layers
    cal = [feed(seed=s) for s in range(4)]
    qm = quantize_onnx(shipped, cal, show_progress=False)
    assert len(qm.kept_grids) == 2, qm.summary()
    assert "kept 2 MatMul weights on their own per-group grid" in qm.summary()
    ex = dsa_tvm.compile(qm.to_relax(), "default")
    report = str(dsa_tvm.last_compile_report())
    assert report.count("GroupedDense") == 2, report
    np.testing.assert_array_equal(run_vm(ex, x["x"]), ort_run(qm.model, x)[0])


def test_keep_grids_false_rounds_per_channel() -> None:
    shipped = ort_weight_only(mlp(), qdq=False, symmetric=False)
    qm = quantize_onnx(shipped, [feed(seed=s) for s in range(2)], show_progress=False,
                       keep_grids=False)
    assert qm.kept_grids == []
    dsa_tvm.compile(qm.to_relax(), "default")
    assert "GroupedDense" not in str(dsa_tvm.last_compile_report())


# ----------------------------------------------------------------------------- hand-packed nodes
def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """[rows, count] codes -> bytes, ``8 // bits`` a byte, lowest bits first (MatMulNBits')."""
    per = 8 // bits
    rows, count = codes.shape
    pad = np.zeros((rows, -(-count // per) * per), np.uint8)
    pad[:, :count] = codes
    pad = pad.reshape(rows, -1, per).astype(np.uint16)
    return sum(pad[..., i] << (bits * i) for i in range(per)).astype(np.uint8)


def nbits_model(k: int, n: int, bits: int, block: int, rows: tuple[int, ...], *, zp: str = "packed",
                bias: bool = False, g_idx: bool = False, seed: int = 0) -> onnx.ModelProto:
    """One MatMulNBits node over random codes (``zp``: "packed", "float" or "none")."""
    rng = np.random.default_rng(seed)
    blocks = -(-k // block)
    codes = rng.integers(0, 1 << bits, (n, blocks * block))
    inits = [numpy_helper.from_array(pack(codes, bits).reshape(n, blocks, -1), "B"),
             numpy_helper.from_array(rng.uniform(0.01, 0.1, (n, blocks)).astype(np.float32), "S")]
    inputs = ["x", "B", "S"]
    if zp == "packed":
        inits.append(numpy_helper.from_array(pack(rng.integers(0, 1 << bits, (n, blocks)), bits)
                                             .reshape(-1), "Z"))
    elif zp == "float":
        inits.append(numpy_helper.from_array(rng.uniform(0, 1 << bits, (n, blocks))
                                             .astype(np.float32), "Z"))
    inputs.append("Z" if zp != "none" else "")
    if g_idx:
        inits.append(numpy_helper.from_array(rng.permutation(np.arange(k) // block)
                                             .astype(np.int32), "G"))
    inputs.append("G" if g_idx else "")
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(0, 1, n).astype(np.float32), "bias"))
        inputs.append("bias")
    while inputs[-1] == "":
        inputs.pop()
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", name="mm",
                            K=k, N=n, bits=bits, block_size=block)
    g = helper.make_graph([node], "nbits",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(rows) + [k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(rows) + [n])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                               helper.make_opsetid("com.microsoft", 1)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(16, 160), n=st.integers(1, 48), bits=st.sampled_from([2, 4, 8]),
       block=st.sampled_from([16, 32, 64, 128]), zp=st.sampled_from(["packed", "float", "none"]),
       bias=st.booleans(), rows=st.sampled_from([(1,), (3,), (2, 5), (1, 2, 3)]))
def test_hand_packed_matmul_nbits_unpacks_to_what_onnxruntime_computes(
        k: int, n: int, bits: int, block: int, zp: str, bias: bool, rows: tuple[int, ...]) -> None:
    assume(not (bits == 8 and zp == "float"))   # onnxruntime's CPU kernel refuses that pair
    model = nbits_model(k, n, bits, block, rows, zp=zp, bias=bias)
    taken = load_onnx(model)          # intake's own check: onnxruntime, shipped vs unpacked
    assert [x.op_type for x in taken.model.graph.node if x.op_type == "MatMulNBits"] == []
    x = feed(k, rows, seed=k + n)
    np.testing.assert_allclose(ort_run(taken.model, x)[0], ort_run(model, x)[0],
                               rtol=1e-5, atol=1e-5)


def test_g_idx_is_named() -> None:
    with pytest.raises(IntakeError, match="'mm' has a g_idx.*desc_act=False"):
        load_onnx(nbits_model(64, 24, 4, 16, (3,), g_idx=True))


def test_four_bit_codes_without_blocks_are_widened() -> None:
    """A per-channel int4 DequantizeLinear keeps its codes (as int8: TVM reads those)."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("W4", TensorProto.INT4, (16, 8), rng.integers(-8, 8, 128).tolist())
    s = numpy_helper.from_array(rng.uniform(0.01, 0.1, 8).astype(np.float32), "S")
    nodes = [helper.make_node("DequantizeLinear", ["W4", "S"], ["W"], axis=1, name="dq"),
             helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    g = helper.make_graph(nodes, "dq4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w, s])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    taken = load_onnx(model)
    dq = next(x for x in taken.model.graph.node if x.op_type == "DequantizeLinear")
    codes = next(t for t in taken.model.graph.initializer if t.name == dq.input[0])
    assert codes.data_type == TensorProto.INT8
    x = feed(16, (2,))
    ex = dsa_tvm.compile(taken.model, "default", verbose=False)
    np.testing.assert_allclose(run_vm(ex, x["x"]), ort_run(model, x)[0], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- bad input
def test_computed_codes_are_named() -> None:
    model = nbits_model(32, 8, 4, 32, (1,))
    b = model.graph.initializer[0]
    model.graph.node.insert(0, helper.make_node("Identity", ["B0"], ["B"], name="make_b"))
    b.name = "B0"
    with pytest.raises(IntakeError, match="'mm'.*computed, not a constant"):
        load_onnx(model)


@pytest.mark.parametrize("attrs, match", [({"bits": 3}, "bits=3"), ({"block_size": 24}, "block_size=24"),
                                          ({"N": 9}, "weight bytes"), ({"K": 0}, "K=0, N=8")])
def test_inconsistent_nodes_are_named(attrs: dict, match: str) -> None:
    model = nbits_model(32, 8, 4, 32, (1,))
    node = model.graph.node[0]
    for a in node.attribute:
        if a.name in attrs:
            a.i = attrs[a.name]
    with pytest.raises(IntakeError, match=f"MatMulNBits 'mm'.*{match}"):
        load_onnx(model)


def test_cli_keeps_the_grids_unless_told(tmp_path, capsys) -> None:
    from dsa_tvm.cli import main

    src = tmp_path / "mlp_int4.onnx"
    onnx.save(ort_weight_only(mlp(), qdq=False, symmetric=True), str(src))
    np.savez(tmp_path / "cal.npz", x=np.random.default_rng(0).normal(0, 1, (2, 4, 64)).astype(np.float32))
    args = ["quantize", str(src), "--calib", str(tmp_path / "cal.npz"), "--preprocess", "raw"]
    assert main(args + ["-o", str(tmp_path / "kept.onnx")]) == 0
    assert "kept 2 MatMul weights on their own per-group grid" in capsys.readouterr().out
    assert main(args + ["--no-keep-grids", "-o", str(tmp_path / "int8.onnx")]) == 0
    assert "MatMul weights on their own per-group grid" not in capsys.readouterr().out
    ops = [n.op_type for n in onnx.load(str(tmp_path / "int8.onnx")).graph.node]
    assert ops.count("DequantizeLinear") >= 2 + 3   # weights and activations


@pytest.mark.parametrize("scales, match", [(np.ones((16, 3), np.float32), "48 scales, 32 expected"),
                                           (np.full((16, 2), np.nan, np.float32), "NaN or infinite")])
def test_bad_scales_are_named(scales: np.ndarray, match: str) -> None:
    model = nbits_model(64, 16, 4, 32, (2,))
    next(t for t in model.graph.initializer if t.name == "S").CopyFrom(
        numpy_helper.from_array(scales, "S"))
    with pytest.raises(IntakeError, match=f"MatMulNBits 'mm'.*{match}"):
        load_onnx(model)


def test_blocked_dequantize_with_a_wrong_scale_shape_is_named() -> None:
    shipped = ort_weight_only(mlp(), qdq=True, symmetric=True)
    dq = next(n for n in shipped.graph.node if n.op_type == "DequantizeLinear")
    scale = next(t for t in shipped.graph.initializer if t.name == dq.input[1])
    scale.CopyFrom(numpy_helper.from_array(np.ones((3, 96), np.float32), scale.name))
    with pytest.raises(IntakeError, match=r"DequantizeLinear .*scale \(3, 96\).*\(2, 96\) expected"):
        load_onnx(shipped)


def embedding_model(vocab: int = 100, dim: int = 64, out: int = 32) -> onnx.ModelProto:
    """Gather (a token embedding) -> MatMul: what an LLM's first layer reads."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 1, (vocab, dim)).astype(np.float32), "emb"),
             numpy_helper.from_array(rng.normal(0, 0.1, (dim, out)).astype(np.float32), "w")]
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"], name="gather"),
             helper.make_node("MatMul", ["e", "w"], ["y"], name="mm")]
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, out])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_int4_embedding_table_imports(symmetric: bool) -> None:
    """onnxruntime's quantizer with Gather included writes GatherBlockQuantized (UINT4 /
    INT4 tables): intake folds the table and the CPU build computes what onnxruntime does."""
    from onnxruntime.quantization import matmul_nbits_quantizer as mq

    cfg = mq.DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=symmetric,
                                          op_types_to_quantize=("MatMul", "Gather"),
                                          quant_axes=(("MatMul", 0), ("Gather", 1)))
    q = mq.MatMulNBitsQuantizer(embedding_model(), algo_config=cfg)
    q.process()
    shipped = q.model.model
    assert "GatherBlockQuantized" in [n.op_type for n in shipped.graph.node]
    taken = load_onnx(shipped)
    assert not has_weight_only(taken.model)
    ids = {"ids": np.array([[3, 99, 0, 42, 7]], np.int64)}
    ex = tvm.compile(from_onnx(taken.model, keep_params_in_input=False), target="llvm")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(ids["ids"])).numpy()
    np.testing.assert_allclose(got, ort_run(shipped, ids)[0], rtol=1e-5, atol=1e-5)


def test_packed_embedding_table_is_named() -> None:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(0, 255, (10, 8)).astype(np.uint8), "T"),
             numpy_helper.from_array(np.ones((10, 1), np.float32), "S")]
    node = helper.make_node("GatherBlockQuantized", ["T", "ids", "S"], ["e"], domain="com.microsoft",
                            name="gbq", block_size=16, gather_axis=0, quantize_axis=1)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 16])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                                helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(IntakeError, match="GatherBlockQuantized 'gbq'.*INT4 / UINT4.*packed"):
        load_onnx(model)

"""The quantizer plans products of activations and broadcasting adds int8 (issue 13.2),
and a squeeze-excite block from PyTorch lands on the DSA in one region (issue 13.4):
``benchmarks/bench_se.py`` measured, bit-exact against the integer reference and
within one output step of llvm and onnxruntime (optimizations off)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from dsa_tvm.frontend.onnx_graph import Graph
from dsa_tvm.quant.plan import fp32_reasons, make_plan

from .. import qdq_models as qm

pytest.importorskip("tvm")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_se.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_se", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _conv(name: str, cin: int, cout: int, x: str, out: str, inits: dict) -> list:
    rng = np.random.default_rng(len(inits))
    inits[f"{name}_w"] = rng.standard_normal((cout, cin, 1, 1)).astype(np.float32)
    return [qm.node("Conv", [x, f"{name}_w"], [out], name=name)]


def _graph(extra: list, inits: dict) -> Graph:
    """x -> conv -> relu (a) ; op(a, b) -> conv: ``b`` an activation or a constant."""
    import onnx

    nodes = _conv("c1", 4, 8, "x", "a0", inits) + [qm.node("Relu", ["a0"], ["a"], name="r1")]
    nodes += extra
    nodes += _conv("c3", 8, 8, "m", "y", inits)
    model = qm.make_model(nodes, inits, {"x": (1, 4, 6, 6)}, {"y": (1, 8, 6, 6)})
    model = onnx.shape_inference.infer_shapes(model)
    return Graph(model)


def test_plan_mul_of_two_activations_and_broadcast_add():
    """SE: x * gate[N, C, 1, 1] (gate from a global ReduceMean and a conv) and a broadcasting
    add: both int8 followers, the ReduceMean too."""
    inits: dict = {"axes": np.array([2, 3], np.int64)}
    extra = [qm.node("ReduceMean", ["a"], ["p"], name="mean", keepdims=1, axes=[2, 3])]
    extra += _conv("c2", 8, 8, "p", "gate", inits)
    extra += [qm.node("Mul", ["a", "gate"], ["m0"], name="mul"),
              qm.node("Add", ["m0", "gate"], ["m"], name="badd")]
    p = make_plan(_graph(extra, inits))
    names = {f.name for f in p.followers}
    assert {"mul", "badd", "mean"} <= names, names
    assert not fp32_reasons(_graph(extra, inits), p)


def test_plan_layer_scale_and_division_by_a_constant():
    inits: dict = {"ls": np.linspace(-1, 1, 8).astype(np.float32).reshape(1, 8, 1, 1),
                   "six": np.array(6, np.float32)}
    extra = [qm.node("Mul", ["a", "ls"], ["s"], name="scale"),
             qm.node("Div", ["s", "six"], ["m"], name="div")]
    g = _graph(extra, inits)
    p = make_plan(g)
    assert {"scale", "div"} <= {f.name for f in p.followers}


def test_plan_lists_products_it_cannot_run_int8():
    """A constant varying over pixels, a product broadcasting over the channels, a division
    by an activation: FP32 with the reason."""
    inits: dict = {"pix": np.ones((1, 1, 6, 6), np.float32)}
    extra = [qm.node("Mul", ["a", "pix"], ["s"], name="by_pixel"),
             qm.node("ReduceMean", ["a"], ["cm"], name="chan_mean", keepdims=1, axes=[1]),
             qm.node("Mul", ["s", "cm"], ["t"], name="by_channel_mean"),
             qm.node("Div", ["t", "a"], ["m"], name="div_act")]
    g = _graph(extra, inits)
    p = make_plan(g)
    why = fp32_reasons(g, p)
    assert "varies along more than the channel axis" in why["by_pixel"][1], why
    assert "broadcasts over the channels" in why["by_channel_mean"][1], why
    assert "divides by an activation" in why["div_act"][1], why


@pytest.mark.parametrize("gate", ["relu", "clip6"])
def test_se_block_in_one_region(tmp_path, gate):
    """torch SE -> ONNX -> quantize -> compile for the DSA (a host slow enough that the
    small model offloads; ``bench_se.py`` compiles the larger one with target="dsa"):
    one region holds the global pool, both 1x1 convs, the gate and the multiply;
    bit-exact against the integer reference, within one step of llvm and onnxruntime."""
    pytest.importorskip("torch")
    from dsa_tvm.hw.config import load_config

    slow_host = load_config("default").replace(cpu_gmacs=1e-6, launch_overhead_us=0.0)
    r = _bench().measure(gate, tmp_path, c=16, size=12, batch=2, target=slow_host)
    assert r["dsa_regions"] == 1 and r["launches"] == 1, r
    assert r["layers"].count("Mul") == 1 and "GlobalAvgPool" in r["layers"], r
    assert not [op for op in r["cpu_ops"] if "multiply" in op or "mean" in op], r
    assert r["bit_exact"], r
    assert not r["violations"], r
    assert r["max_steps_llvm"] <= 1 and r["max_steps_ort"] <= 1, r


@pytest.mark.parametrize("gate", ["relu", "clip6"])
def test_se_block_through_the_relax_quantizer(tmp_path, gate):
    """The same SE block as an FP32 Relax module through ``dsa_tvm.quantize``: the product,
    the division by 6 and the global mean planned int8; one region, bit-exact, within one
    step of llvm; x * sigmoid(x) (sigmoid on the CPU) is left FP32 with its reason."""
    pytest.importorskip("torch")
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    import dsa_tvm
    from dsa_tvm.hw.config import load_config
    from dsa_tvm.runtime import take_launches
    from tir_schedules.kinds import run_region

    path = _bench().se_model(tmp_path / "se.onnx", gate, 16, 12, 2)
    mod = from_onnx(onnx.load(str(path)), keep_params_in_input=False)
    calib = [np.random.default_rng(i).standard_normal((2, 3, 12, 12)).astype(np.float32)
             for i in range(4)]
    qmod = dsa_tvm.quantize(mod, calib)
    ex = dsa_tvm.compile(qmod, load_config("default").replace(cpu_gmacs=1e-6,
                                                              launch_overhead_us=0.0))
    rep = dsa_tvm.last_compile_report()
    assert [d.target for d in rep.regions] == ["dsa"], str(rep)
    layers = [type(ly).__name__ for ly in rep.regions[0].region.layers]
    assert "Mul" in layers and "GlobalAvgPool" in layers, layers
    take_launches()
    x = calib[1]
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    (la,) = take_launches()
    want = run_region(rep.regions[0].region, la.inputs)
    for name, arr in la.outputs.items():
        np.testing.assert_array_equal(arr, want[name])
    ref = relax.VirtualMachine(tvm.compile(qmod, target="llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(x)).numpy()
    step = float(np.min(np.diff(np.unique(ref))))
    assert np.abs(got - ref).max() <= step * 1.01


def test_relax_plan_leaves_a_product_with_a_cpu_operand_fp32():
    from tvm.script import relax as R

    from dsa_tvm.quant.relax_plan import make_plan

    @R.function
    def main(x: R.Tensor((1, 8, 4, 4), "float32")):
        with R.dataflow():
            s = R.sigmoid(x)
            y = R.multiply(x, s)
            R.output(y)
        return y

    plan = make_plan(main)
    assert not [c for c in plan.chains if c.kind == "mul"]
    ops = plan.fp32_ops(main)
    assert any(op == "relax.multiply" and "operand is FP32" in why for op, why in ops), ops


def _se_gate(gate: str):
    """conv + ReLU -> global mean -> conv -> gate -> x * gate -> conv, the gate written as
    torch.export leaves it: hardsigmoid as two clips of ``x + 3`` (at 0, at 6) over 6, or
    a sigmoid."""
    from tvm.script import ir as I
    from tvm.script import relax as R
    from tvm.script import tirx as T

    rng = np.random.default_rng(0)
    w1, w2, w3 = (rng.standard_normal(s).astype(np.float32) * 0.5
                  for s in [(8, 4, 1, 1), (8, 8, 1, 1), (8, 8, 1, 1)])

    @I.ir_module
    class Hard:
        @R.function
        def main(x: R.Tensor((1, 4, 6, 6), "float32")):
            with R.dataflow():
                a = R.nn.relu(R.nn.conv2d(x, R.const(w1)))
                g = R.nn.conv2d(R.mean(a, axis=[2, 3], keepdims=True), R.const(w2))
                h0 = R.clip(R.add(g, R.const(3.0, "float32")), 0, T.float64("inf"))
                h = R.clip(h0, T.float64("-inf"), 6)
                s = R.divide(h, R.const(6.0, "float32"))
                y = R.nn.conv2d(R.multiply(a, s), R.const(w3))
                R.output(y)
            return y

    @I.ir_module
    class Sig:
        @R.function
        def main(x: R.Tensor((1, 4, 6, 6), "float32")):
            with R.dataflow():
                a = R.nn.relu(R.nn.conv2d(x, R.const(w1)))
                g = R.nn.conv2d(R.mean(a, axis=[2, 3], keepdims=True), R.const(w2))
                y = R.nn.conv2d(R.multiply(a, R.sigmoid(g)), R.const(w3))
                R.output(y)
            return y

    return Hard if gate == "hardsigmoid" else Sig


@pytest.mark.parametrize("gate", ["hardsigmoid", "sigmoid"])
def test_relax_se_gate_is_a_table_and_the_product_int8(gate):
    """An SE gate that is a table of a conv's output (hardsigmoid as torch.export writes
    it, sigmoid) makes the product int8: the gate a table chain, x * gate a mul chain, no
    op left FP32; the block compiles to one DSA region equal to llvm's build within one
    output step (MobileNetV3 / EfficientNet from PyTorch: 18% -> 100% of MACs on the DSA)."""
    import tvm
    from tvm import relax

    import dsa_tvm
    from dsa_tvm.hw.config import load_config
    from dsa_tvm.quant.relax_plan import make_plan
    from dsa_tvm.quant.relax_quantize import prepare_fp32, quantize_relax

    mod = _se_gate(gate)
    func = prepare_fp32(mod)["main"]
    plan = make_plan(func)
    kinds = [c.kind for c in plan.chains]
    assert kinds.count("mul") == 1 and kinds.count("table") == 1, kinds
    (table,) = [c for c in plan.chains if c.kind == "table"]
    (conv,) = [c for c in plan.chains if c.kind == "conv2d" and c.output.same_as(table.inputs[0])]
    assert not plan.fp32_ops(func)
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((1, 4, 6, 6)).astype(np.float32)} for _ in range(4)]
    qmod, _ = quantize_relax(mod, calib)
    ex = dsa_tvm.compile(qmod, load_config("default").replace(cpu_gmacs=1e-6,
                                                              launch_overhead_us=0.0))
    assert [d.target for d in dsa_tvm.compile_report(ex).regions] == ["dsa"]
    x = tvm.runtime.tensor(calib[0]["x"])
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](x).numpy()
    want = relax.VirtualMachine(tvm.compile(qmod, target="llvm"), tvm.cpu())["main"](x).numpy()
    step = float(np.min(np.diff(np.unique(want))))
    assert np.abs(got - want).max() <= step * 1.01

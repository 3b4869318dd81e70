"""Rotary chains in the FP32 graph (``dsa_tvm.quant.rope_plan``): found in either operand
order, refused when the rotated term reads another tensor or an intermediate has another
reader; a planned chain is int8 at both ends with its interior FP32."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from dsa_tvm.frontend.onnx_graph import Graph
from dsa_tvm.quant.plan import make_plan
from dsa_tvm.quant.rope_plan import rope_chain, rope_chains

P, D = 6, 8


def _graph(swap_add: bool = False, swap_mul: bool = False, other_x: bool = False,
           leak: bool = False):
    """x (from a MatMul, so it is int8) -> rotary chain -> y -> MatMul."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in (
        ("w", rng.standard_normal((D, D))), ("cos", rng.uniform(-1, 1, (P, D))),
        ("sin", rng.uniform(-1, 1, (P, D))))]
    inits += [numpy_helper.from_array(np.array([v], np.int64), n)
              for n, v in (("h", D // 2), ("d", D), ("z", 0), ("ax", -1))]
    nodes = [helper.make_node("MatMul", ["x0", "w"], ["x"], name="mm"),
             helper.make_node("MatMul", ["x0", "w"], ["x2"], name="mm2"),
             helper.make_node("Slice", ["x2" if other_x else "x", "h", "d", "ax"], ["hi"],
                              name="slice_hi"),
             helper.make_node("Slice", ["x", "z", "h", "ax"], ["lo"], name="slice_lo"),
             helper.make_node("Neg", ["hi"], ["nhi"], name="neg"),
             helper.make_node("Concat", ["nhi", "lo"], ["rot"], name="cat", axis=-1),
             helper.make_node("Mul", ["x", "cos"] if not swap_mul else ["cos", "x"], ["a"],
                              name="mul_cos"),
             helper.make_node("Mul", ["rot", "sin"], ["b"], name="mul_sin"),
             helper.make_node("Add", ["a", "b"] if not swap_add else ["b", "a"], ["y"],
                              name="rope"),
             helper.make_node("MatMul", ["y", "w"], ["out"], name="after")]  # an int8 reader
    outs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, (1, 2, P, D))]
    if leak:
        outs.append(helper.make_tensor_value_info("rot", TensorProto.FLOAT, (1, 2, P, D)))
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("x0", TensorProto.FLOAT, (1, 2, P, D))],
                          outs, inits)
    return Graph(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("swap_add", [False, True])
@pytest.mark.parametrize("swap_mul", [False, True])
def test_chain_found_in_either_order(swap_add, swap_mul):
    g = _graph(swap_add, swap_mul)
    (add,) = [n for n in g.model.graph.node if n.name == "rope"]
    x, inner = rope_chain(g, add)
    assert x == "x"
    assert sorted(inner) == sorted(["mul_cos", "mul_sin", "cat", "neg", "slice_lo", "slice_hi"])


@pytest.mark.parametrize("case", ["other_x", "leak"])
def test_not_a_chain(case):
    g = _graph(other_x=case == "other_x", leak=case == "leak")
    assert rope_chains(g) == {}


def test_planned_int8_at_both_ends_interior_fp32():
    g = _graph()
    p = make_plan(g)
    (f,) = [f for f in p.followers if f.name == "rope"]
    assert f.inputs == ["x"] and f.output == "y"
    assert {"mul_cos", "mul_sin", "cat", "neg", "slice_lo", "slice_hi"} <= p.interior
    assert {"x", "y"} <= p.tensors and not {"rot", "a", "b", "hi", "lo"} & p.tensors


@pytest.mark.parametrize("kept", ["rope", "mul_sin", "cat"])
def test_a_chain_with_a_node_kept_fp32_is_not_planned(kept):
    """``keep_fp32`` naming the chain's add or any op inside it keeps the whole chain
    FP32: no rotary follower and its interior not int8 (its output ``y`` keeps a grid as
    the next MatMul's input, which the MatMul quantizes itself)."""
    g = _graph()
    p = make_plan(g, {kept})
    assert not [f for f in p.followers if f.name == "rope"]
    assert not {"mul_cos", "mul_sin", "cat", "neg", "slice_lo", "slice_hi"} & p.interior

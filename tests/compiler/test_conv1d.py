"""Conv1d (ONNX Conv with 1-D kernels) quantized per channel and run on the DSA as a
conv2d of height 1: every launch bit-exact against the integer reference
(``run_region``), the network within one output step of TVM's llvm build of the same
quantized module, over strides, pads, dilations, groups (depthwise included), bias
and fused activations. Groups the conv2d path does not take stay on the CPU, saying why."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

import tvm  # noqa: E402
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tvm import relax  # noqa: E402

import dsa_tvm  # noqa: E402
from dsa_tvm.quant import quantize_onnx  # noqa: E402
from dsa_tvm.runtime import take_launches  # noqa: E402
from tir_schedules.kinds import run_region  # noqa: E402

from ..qdq_models import make_model, node, rand  # noqa: E402
from .qop_harness import SLOW_HOST_GMACS  # noqa: E402


def conv1d_net(cin: int, cout: int, length: int, k: int, stride: int, pads: tuple[int, int],
               dilation: int, groups: int, bias: bool, act: str | None, seed: int = 0):
    """Conv1d -> act -> Conv1d 1x1 (so the first conv's output is an interior int8 tensor)."""
    rng = np.random.default_rng(seed)
    inits = {"W": rand(rng, cout, cin // groups, k, scale=0.5), "W2": rand(rng, 4, cout, 1)}
    if bias:
        inits["B"] = rand(rng, cout)
    nodes = [node("Conv", ["x", "W"] + (["B"] if bias else []), ["c"], kernel_shape=[k],
                  strides=[stride], pads=[pads[0], pads[1]], dilations=[dilation], group=groups,
                  name="conv")]
    mid = "c"
    if act == "relu":
        nodes.append(node("Relu", ["c"], ["a"], name="act"))
        mid = "a"
    elif act == "clip":
        nodes += [node("Clip", ["c", "lo", "hi"], ["a"], name="act")]
        inits |= {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
        mid = "a"
    nodes.append(node("Conv", [mid, "W2"], ["y"], kernel_shape=[1], name="head"))
    return make_model(nodes, inits, {"x": (1, cin, length)}, {"y": None})


def _compile(model, seed: int = 0):
    rng = np.random.default_rng(seed)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(4)]
    qm = quantize_onnx(model, feeds, show_progress=False)
    # a slow host and free launches: every region is worth offloading, whatever its size
    cfg = dsa_tvm.load_config("default").replace(cpu_gmacs=SLOW_HOST_GMACS, launch_overhead_us=0.0)
    ex = tvm.compile(qm.to_relax(), target=dsa_tvm.target(cfg))
    return qm, ex, dsa_tvm.compile_report(ex), feeds[0]


def _check_against_references(qm, ex, rep, feed) -> None:
    take_launches()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(feed["x"])).numpy()
    launches = take_launches()
    regions = {d.name: d.region for d in rep.regions}
    for la in launches:
        want = run_region(regions[la.program.name], la.inputs)
        for name, arr in la.outputs.items():
            np.testing.assert_array_equal(arr, want[name])
    ref_ex = tvm.compile(qm.to_relax(), target="llvm")
    ref = relax.VirtualMachine(ref_ex, tvm.cpu())["main"](tvm.runtime.tensor(feed["x"])).numpy()
    inits = {i.name: i for i in qm.model.graph.initializer}
    step = float(np.frombuffer(inits["y/scale"].raw_data, np.float32)[0]) \
        if "y/scale" in inits else float(np.abs(ref).max() / 64)
    assert np.abs(got - ref).max() <= step * (1 + 1e-3)


def _conv_layers(rep) -> list:
    return [ly for d in rep.regions if d.target == "dsa" for ly in d.region.layers
            if "conv1d" in ly.name]


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(cin=st.sampled_from([3, 8, 16]), cout=st.sampled_from([4, 8, 16]),
       length=st.integers(6, 40), k=st.integers(1, 5), stride=st.integers(1, 3),
       pads=st.tuples(st.integers(0, 3), st.integers(0, 3)), dilation=st.integers(1, 3),
       depthwise=st.booleans(), bias=st.booleans(), act=st.sampled_from([None, "relu", "clip"]))
def test_conv1d_runs_on_dsa_bit_exact(cin, cout, length, k, stride, pads, dilation, depthwise,
                                      bias, act):
    if depthwise:
        cout = cin
    assume((length + sum(pads) - dilation * (k - 1) - 1) // stride + 1 >= 1)
    model = conv1d_net(cin, cout, length, k, stride, pads, dilation, cin if depthwise else 1,
                       bias, act)
    qm, ex, rep, feed = _compile(model)
    convs = _conv_layers(rep)
    assert len(convs) == 2, str(rep)
    first = convs[0]
    assert first.input.shape[2] == 1 and first.strides == (1, stride), str(rep)
    assert first.dilation == (1, dilation) and first.padding == (0, pads[0], 0, pads[1])
    assert first.groups == (cin if depthwise else 1)
    assert not [op for op in rep.partition.cpu_ops if op.macs], str(rep)
    _check_against_references(qm, ex, rep, feed)


def test_conv1d_residual_add_stays_in_the_region():
    """conv1d -> conv1d -> add(residual) -> relu -> conv1d: one region, the add included."""
    rng = np.random.default_rng(1)
    inits = {"W1": rand(rng, 8, 4, 3, scale=0.5), "W2": rand(rng, 8, 8, 3, scale=0.3),
             "W3": rand(rng, 4, 8, 1)}
    nodes = [node("Conv", ["x", "W1"], ["c1"], kernel_shape=[3], pads=[1, 1], name="c1"),
             node("Relu", ["c1"], ["r1"], name="r1"),
             node("Conv", ["r1", "W2"], ["c2"], kernel_shape=[3], pads=[1, 1], name="c2"),
             node("Add", ["c2", "r1"], ["s"], name="add"),
             node("Relu", ["s"], ["r2"], name="r2"),
             node("Conv", ["r2", "W3"], ["y"], kernel_shape=[1], name="head")]
    qm, ex, rep, feed = _compile(make_model(nodes, inits, {"x": (1, 4, 24)}, {"y": None}))
    dsa = [d for d in rep.regions if d.target == "dsa"]
    assert len(dsa) == 1 and len(dsa[0].region.layers) == 4, str(rep)
    _check_against_references(qm, ex, rep, feed)


def test_conv1d_channel_concat_is_a_channel_concat():
    """Two conv1d branches concatenated on axis 1 of their (N, C, W) outputs: the concat
    takes the convs' height-1 image view (channels), not the rows view of a 3-D concat on
    its second-to-last axis (a KV cache's), and the model stays bit-exact."""
    rng = np.random.default_rng(2)
    inits = {"W1": rand(rng, 16, 4, 3, scale=0.5), "W2": rand(rng, 8, 4, 1, scale=0.5),
             "W3": rand(rng, 4, 24, 1)}
    nodes = [node("Conv", ["x", "W1"], ["c1"], kernel_shape=[3], pads=[1, 1], name="c1"),
             node("Conv", ["x", "W2"], ["c2"], kernel_shape=[1], name="c2"),
             node("Concat", ["c1", "c2"], ["cat"], axis=1, name="cat"),
             node("Conv", ["cat", "W3"], ["y"], kernel_shape=[1], name="head")]
    qm, ex, rep, feed = _compile(make_model(nodes, inits, {"x": (1, 4, 20)}, {"y": None}))
    cats = [ly for d in rep.regions if d.target == "dsa" for ly in d.region.layers
            if type(ly).__name__ == "Concat"]
    assert cats and all(len(c.output.shape) == 4 and c.axis == 1 for c in cats), str(rep)
    _check_against_references(qm, ex, rep, feed)


def test_grouped_conv1d_falls_back_with_a_reason():
    """groups = 2 (neither 1 nor depthwise) stays on the CPU with the groups constraint named."""
    model = conv1d_net(8, 8, 16, 3, 1, (1, 1), 1, 2, True, "relu")
    qm, ex, rep, feed = _compile(model)
    cpu = [op for op in rep.partition.cpu_ops if op.op == "relax.nn.conv1d"]
    assert cpu and "groups" in cpu[0].reason, str(rep)
    _check_against_references(qm, ex, rep, feed)

"""1-D MaxPool/AveragePool (ONNX pools with 1-D kernels) on the DSA as the 2-D pools of
height 1: the pool joins the conv1d region around it, every launch is bit-exact against
the integer reference (``run_region``) and the network within one output step of TVM's
llvm build of the same quantized module, over windows, strides, pads and lengths. Pools
the 2-D path does not take (ceil_mode, dilation, a border-dependent average) stay on the
CPU with the constraint named."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dsa_tvm.layers.ir import Pool2d  # noqa: E402

from ..qdq_models import make_model, node, rand  # noqa: E402
from .test_conv1d import _check_against_references, _compile  # noqa: E402


def pool1d_net(op: str, cin: int, length: int, k: int, stride: int, pads: tuple[int, int],
               seed: int = 0, **attrs):
    """Conv1d -> Relu -> pool1d -> Conv1d 1x1: the pool reads and feeds interior int8 tensors."""
    rng = np.random.default_rng(seed)
    inits = {"W": rand(rng, cin, 3, 3, scale=0.5), "W2": rand(rng, 4, cin, 1)}
    nodes = [node("Conv", ["x", "W"], ["c"], kernel_shape=[3], pads=[1, 1], name="conv"),
             node("Relu", ["c"], ["a"], name="act"),
             node(op, ["a"], ["p"], kernel_shape=[k], strides=[stride], pads=list(pads),
                  name="pool", **attrs),
             node("Conv", ["p", "W2"], ["y"], kernel_shape=[1], name="head")]
    return make_model(nodes, inits, {"x": (1, 3, length)}, {"y": None})


def _pools(rep) -> list[Pool2d]:
    return [ly for d in rep.regions if d.target == "dsa" for ly in d.region.layers
            if isinstance(ly, Pool2d)]


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(op=st.sampled_from(["MaxPool", "AveragePool"]), cin=st.sampled_from([4, 16, 20]),
       length=st.integers(4, 40), k=st.integers(1, 5), stride=st.integers(1, 3),
       pads=st.tuples(st.integers(0, 2), st.integers(0, 2)))
def test_pool1d_joins_the_conv1d_region_bit_exact(op, cin, length, k, stride, pads):
    assume(max(pads) < k)  # ONNX: a pad at most the window minus one
    assume((length + sum(pads) - k) // stride + 1 >= 1)
    attrs = {"count_include_pad": 1} if op == "AveragePool" else {}
    qm, ex, rep, feed = _compile(pool1d_net(op, cin, length, k, stride, pads, **attrs))
    pools = _pools(rep)
    assert len(pools) == 1, str(rep)
    p = pools[0]
    assert p.kind == {"MaxPool": "max", "AveragePool": "avg"}[op], str(rep)
    assert p.kernel == (1, k) and p.strides == (1, stride), str(rep)
    assert p.padding == (0, pads[0], 0, pads[1]) and p.input.shape[2] == 1
    dsa = [d for d in rep.regions if d.target == "dsa"]
    assert len(dsa) == 1 and len(dsa[0].region.layers) == 3, str(rep)
    _check_against_references(qm, ex, rep, feed)


@pytest.mark.parametrize("attrs,constraint", [
    ({"ceil_mode": 1}, "attrs"),
    ({"dilations": [2]}, "attrs"),
])
def test_unsupported_max_pool1d_falls_back_with_a_reason(attrs, constraint):
    qm, ex, rep, feed = _compile(pool1d_net("MaxPool", 8, 17, 3, 2, (0, 0), **attrs))
    cpu = [op for op in rep.partition.cpu_ops if op.op == "relax.nn.max_pool1d"]
    assert cpu and constraint in cpu[0].reason, str(rep)
    _check_against_references(qm, ex, rep, feed)


def test_padded_avg_pool1d_without_pad_count_falls_back():
    """count_include_pad=0 with padding: the divisor varies at the borders."""
    qm, ex, rep, feed = _compile(pool1d_net("AveragePool", 8, 16, 3, 1, (1, 1)))
    cpu = [op for op in rep.partition.cpu_ops if op.op == "relax.nn.avg_pool1d"]
    assert cpu and "count" in cpu[0].reason, str(rep)
    _check_against_references(qm, ex, rep, feed)

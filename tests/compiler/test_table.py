"""Activation chains as DSA tables, bit-exact against TVM's llvm build of the same QDQ model.

Every activation of ``table_models.ACTS`` (sigmoid, SiLU with and without its inner Q/DQ,
hardswish as ops and as ONNX HardSwish, hardsigmoid, GELU erf and tanh, leaky ReLU,
tanh, exp, log, 1/sqrt) on all 256 input codes, then hypothesis over the scales and zero
points (tiny scales, saturating ranges, exp overflowing to inf, log's NaN); a table chain
after a conv stays in the conv's region; without the table unit the chain stays on the
CPU, exact, with the reason.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("tvm")

import tvm  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

import dsa_tvm  # noqa: E402
from relay_passes.canonicalize import prepare  # noqa: E402
from relay_passes.table_chains import find_chains  # noqa: E402
from tests.qdq_models import QDQGraph  # noqa: E402

from .table_models import ACTS, act_model, all_acts_model, every_code  # noqa: E402

#: a host so slow that every region is offloaded (the tests are about values, not choice)
FAST_DSA = dict(cpu_gmacs=1e-6, launch_overhead_us=0.0)


def _run(path, target, x: np.ndarray):
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    ex = tvm.compile(mod, target=target)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    outs = [out] if hasattr(out, "numpy") else list(out)
    return [o.numpy() for o in outs], ex


def _both(path, x, cfg):
    want, _ = _run(path, "llvm", x)
    got, ex = _run(path, dsa_tvm.target(cfg), x)
    return want, got, dsa_tvm.compile_report(ex)


def _table_layers(rep) -> int:
    return sum(1 for r in rep.regions if r.region is not None and r.target == "dsa"
               for ly in r.region.layers if type(ly).__name__ == "Table")


@pytest.mark.parametrize("s_in,z_in", [(0.05, 3), (1.0, -7)])  # 1.0: exp -> inf, log NaN
def test_every_activation_every_code(tmp_path, s_in, z_in):
    outs = {a: (0.03 if a not in ("exp", "log") else 0.5, -20) for a in ACTS}
    path = all_acts_model(tmp_path, s_in, z_in, outs)
    x = every_code(s_in, z_in)
    cfg = dsa_tvm.load_config("default").replace(**FAST_DSA)
    want, got, rep = _both(path, x, cfg)
    for act, w, g in zip(outs, want, got):
        np.testing.assert_array_equal(g, w, err_msg=act)
    # chains with equal tables become one expression (and one layer) once rewritten
    assert _table_layers(rep) == len({w.tobytes() for w in want}), str(rep)
    assert not [c for c in rep.partition.cpu_ops if c.op != "relax.quantize"
                and c.op != "relax.dequantize"], str(rep.partition)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(act=st.sampled_from(sorted(ACTS)),
       s_in=st.floats(-6, 0.7).map(lambda e: float(10 ** e)), z_in=st.integers(-128, 127),
       s_out=st.floats(-6, 1).map(lambda e: float(10 ** e)), z_out=st.integers(-128, 127))
def test_scales_and_zero_points(tmp_path_factory, act, s_in, z_in, s_out, z_out):
    path = act_model(tmp_path_factory.mktemp("t"), act, s_in, z_in, s_out, z_out)
    x = every_code(s_in, z_in)
    cfg = dsa_tvm.load_config("default").replace(**FAST_DSA)
    want, got, rep = _both(path, x, cfg)
    np.testing.assert_array_equal(got[0], want[0])
    assert _table_layers(rep) == 1, str(rep)


def _conv_act_conv(tmp_path, act: str):
    g = QDQGraph(1)
    rng = g.rng
    x = g.qdq("x", 0.05, 0)
    cur = x
    for i, (cin, cout) in enumerate([(3, 8), (8, 8)]):
        ws = rng.uniform(0.005, 0.02, cout).astype(np.float32)
        w = g.weight(rng.integers(-127, 128, (cout, cin, 3, 3)), ws)
        b = g.bias(rng.integers(-500, 500, cout), ws * (0.05 if i == 0 else 0.04))
        c = g.qdq(g.op("Conv", [cur, w, b], pads=[1, 1, 1, 1]), 0.04, -5)
        cur = g.qdq(ACTS[act](g, c), 0.04, -20) if i == 0 else c
    return g.save(tmp_path / f"conv_{act}_conv.onnx", {"x": (1, 3, 8, 8)}, cur, (1, 8, 8, 8))


@pytest.mark.parametrize("act", ["silu", "silu_qdq", "hardswish"])
def test_table_after_conv_stays_in_the_region(tmp_path, act):
    path = _conv_act_conv(tmp_path, act)
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    cfg = dsa_tvm.load_config("default").replace(**FAST_DSA)
    want, got, rep = _both(path, x, cfg)
    np.testing.assert_array_equal(got[0], want[0])
    offloaded = [r for r in rep.regions if r.target == "dsa"]
    assert len(offloaded) == 1, str(rep)
    kinds = [type(ly).__name__ for ly in offloaded[0].region.layers]
    assert kinds == ["Conv2d", "Table", "Conv2d"], kinds


def test_no_table_unit_keeps_the_chain_on_the_cpu(tmp_path):
    path = act_model(tmp_path, "silu", 0.05, 3, 0.03, -20)
    x = every_code(0.05, 3)
    cfg = dsa_tvm.load_config("default").replace(table_unit=0, **FAST_DSA)
    want, got, rep = _both(path, x, cfg)
    np.testing.assert_array_equal(got[0], want[0])
    assert _table_layers(rep) == 0
    assert any("activation table unit" in c.reason for c in rep.partition.cpu_ops), \
        str(rep.partition)


def test_plain_relu_and_clip_chains_are_not_tables(tmp_path):
    g = QDQGraph(0)
    x = g.qdq("x", 0.05, 0)
    r = g.qdq(g.op("Relu", [x]), 0.05, -128)
    c = g.qdq(g.op("Clip", [r, g.const(np.array(0, np.float32)),
                            g.const(np.array(6, np.float32))]), 0.05, -128)
    path = g.save(tmp_path / "relu_clip.onnx", {"x": (1, 4, 4, 4)}, c, (1, 4, 4, 4))
    mod = prepare(from_onnx(onnx.load(path), keep_params_in_input=False))
    assert find_chains(mod["main"]) == []
    assert "relax.take" not in mod["main"].script()


def test_scale_outside_float32_range_is_left_alone_with_a_reason(tmp_path):
    path = act_model(tmp_path, "sigmoid", 1e-39, 0, 0.03, -20)
    cfg = dsa_tvm.load_config("default").replace(**FAST_DSA)
    want, got, rep = _both(path, every_code(1e-39, 0), cfg)
    np.testing.assert_array_equal(got[0], want[0])
    assert _table_layers(rep) == 0
    assert any("not a DSA table" in n for n in rep.partition.notes), rep.partition.notes


@pytest.mark.parametrize("preset", ["edge", "default", "large"])
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_table_layer_lowers_bit_exact(preset, data):
    """A hand-made Table layer alone and after a conv: the simulator against the integer
    reference (``run_region``) on every preset's block size and scratchpads."""
    from dsa_tvm.layers import ir as L

    from .test_lowering import CFGS, channels, check, conv, qt, region

    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = qt(rng, "x", (1, channels(draw, cfg), draw(st.integers(1, 6)), draw(st.integers(1, 6))))
    tab = rng.integers(-128, 128, 256).astype(np.int8)
    check(region([x], [L.Table("t", x, qt(rng, "y", x.shape), tab)]), cfg, rng)
    c = conv(rng, x, channels(draw, cfg), 3, 1, 1)
    t = L.Table("t2", c.output, qt(rng, "y2", c.output.shape), tab)
    check(region([x], [c, t]), cfg, rng)

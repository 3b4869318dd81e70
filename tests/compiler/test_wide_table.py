"""Element-wise functions of int16 tensors (``WideTable``): the fit, the room, the front end.

An int16 chain ``quantize16(f(dequantize16(x)))`` is interpolated from two 256-entry
tables (``dsa_tvm.layers.wide_table``). Checked: the integer reference within the fit's
stated error of the exact codes on all 65,536 inputs (hypothesis over functions and
scales); the simulator bit-exact against the reference on every preset; whole QDQ models
compiled for the DSA against TVM's llvm build of the same chain, within the reported
error; a chain too curved for 256 segments stays on the CPU, saying why.
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
from dsa_tvm.layers import ir as L  # noqa: E402
from dsa_tvm.layers import wide_table as wt  # noqa: E402
from tests.qdq_models import make_model, node  # noqa: E402

from .test_lowering import CFGS, check, region  # noqa: E402

FAST_DSA = dict(cpu_gmacs=1e-6, launch_overhead_us=0.0)

FUNCS = {
    "silu": lambda v: v / (1 + np.exp(-v)),
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "tanh": np.tanh,
    "gelu": lambda v: 0.5 * v * (1 + np.tanh(0.7978846 * (v + 0.044715 * v ** 3))),
    "exp": np.exp,
}


def exact_codes(fn, s_in: float, s_out: float) -> np.ndarray:
    with np.errstate(over="ignore"):
        real = fn(wt.all_codes() * s_in)
    return np.clip(np.round(real / s_out), -32768, 32767)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(fn=st.sampled_from(sorted(FUNCS)), span=st.floats(1e-3, 40.0),
       out_span=st.floats(0.5, 4.0), seed=st.integers(0, 2**16))
def test_reference_is_within_the_fit_error_on_every_code(fn, span, out_span, seed):
    """The fit's stated error is the true largest distance from the exact codes, the output
    is int16 and saturates like the exact codes; any hand-made table stays within int32."""
    s_in = span / 32767
    top = float(np.max(np.abs(FUNCS[fn](np.array([-span, span, 0.0])))))
    s_out = max(top, 1e-6) * out_span / 32767   # out_span < 1 saturates the output
    codes = exact_codes(FUNCS[fn], s_in, s_out)
    f = wt.fit(codes)
    got = wt.interpolate(wt.all_codes(), f.base, f.slope, f.frac)
    assert got.dtype == np.int16
    assert int(np.max(np.abs(got.astype(np.int64) - codes))) == f.error
    if fn in ("silu", "sigmoid", "tanh", "gelu") and span <= 8:  # curvature x span^2 small
        assert f.error <= wt.MAX_ERROR_CODES
    rng = np.random.default_rng(seed)    # random tables: the int32 wrap is the reference's
    base = rng.integers(-2**31, 2**31, 256, dtype=np.int64).astype(np.int32)
    out = wt.interpolate(wt.all_codes(), base, base[::-1], int(rng.integers(0, 31)))
    assert out.min() >= -32768 and out.max() <= 32767


def test_split_covers_every_code_once():
    hi, lo = wt.split(wt.all_codes())
    assert hi.min() == -128 and hi.max() == wt.TOP
    assert np.array_equal(256 * hi + lo, wt.all_codes())
    assert lo.min() == -128 and lo[hi < wt.TOP].max() == 127 and lo.max() == 255


@pytest.mark.parametrize("codes", [np.zeros(100), np.full(65536, np.nan)])
def test_fit_refuses_wrong_codes(codes):
    with pytest.raises(ValueError, match="65536 codes|finite"):
        wt.fit(codes)


@pytest.mark.parametrize("preset", ["edge", "default", "large"])
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_wide_table_lowers_bit_exact(preset, data):
    """The simulator against the integer reference, ranks 2-4, every preset's block size."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rank = draw(st.integers(2, 4))
    shape = tuple(draw(st.integers(1, 40 if d == rank - 1 else 4)) for d in range(rank))
    f = wt.fit(exact_codes(FUNCS[draw(st.sampled_from(sorted(FUNCS)))], 8 / 32767, 1e-3))
    x = L.QTensor("x", shape, 8 / 32767, 0, "int16")
    y = L.QTensor("y", shape, 1e-3, 0, "int16")
    xs = {"x": rng.integers(-32768, 32768, shape).astype(np.int16)}
    ends = xs["x"].reshape(-1)
    ends[0], ends[-1] = -32768, 32767             # both ends of the code range
    check(region([x], [L.WideTable("w", x, y, f.base, f.slope, f.frac, f.error)]), cfg, rng,
          xs=xs)


# ----------------------------------------------------------------------------- whole models
def _int16_qdq(nodes, inits, x: str, scale: float, tag: str) -> str:
    inits[f"s_{tag}"] = np.array(scale, np.float32)
    inits[f"z_{tag}"] = np.array(0, np.int16)
    nodes.append(node("QuantizeLinear", [x, f"s_{tag}", f"z_{tag}"], [f"q_{tag}"]))
    nodes.append(node("DequantizeLinear", [f"q_{tag}", f"s_{tag}", f"z_{tag}"], [f"dq_{tag}"]))
    return f"dq_{tag}"


def silu16_model(path, s_in: float, s_out: float, shape, fn: str = "silu") -> str:
    """x -> QDQ int16 -> SiLU as x * sigmoid(x) (the sigmoid with its own int16 QDQ, as
    the LLM's quantizer leaves it) or exp -> QDQ int16."""
    nodes, inits = [], {}
    x = _int16_qdq(nodes, inits, "x", s_in, "x")
    if fn == "silu":
        nodes.append(node("Sigmoid", [x], ["sig"]))
        s = _int16_qdq(nodes, inits, "sig", 1 / 32767, "sig")
        nodes.append(node("Mul", [x, s], ["act"]))
    else:
        nodes.append(node("Exp", [x], ["act"]))
    y = _int16_qdq(nodes, inits, "act", s_out, "y")
    nodes.append(node("Identity", [y], ["out"]))
    out = path / f"{fn}16.onnx"
    onnx.save(make_model(nodes, inits, {"x": shape}, {"out": shape}), out)
    return str(out)


def _run(path: str, target, x: np.ndarray):
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    ex = tvm.compile(mod, target=target)
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy(), ex


def _wide_layers(rep) -> list:
    return [ly for r in rep.regions if r.region is not None and r.target == "dsa"
            for ly in r.region.layers if isinstance(ly, L.WideTable)]


def test_int16_silu_model_on_the_dsa_within_the_reported_error(tmp_path):
    """Every int16 input code through an LLM-style SiLU: the DSA (one WideTable layer)
    within the layer's stated error of TVM's llvm build of the chain, and the error
    small (a few codes of 32,767)."""
    s_in, s_out = 30 / 32767, 30 / 32767
    x = (wt.all_codes() * s_in).astype(np.float32).reshape(1, 256, 256)
    path = silu16_model(tmp_path, s_in, s_out, x.shape)
    cfg = dsa_tvm.load_config("default").replace(**FAST_DSA)
    want, _ = _run(path, "llvm", x)
    got, ex = _run(path, dsa_tvm.target(cfg), x)
    layers = _wide_layers(dsa_tvm.compile_report(ex))
    assert len(layers) == 1 and layers[0].error <= 8
    err = np.abs(np.round(got / s_out) - np.round(want / s_out))
    assert err.max() == layers[0].error
    assert "within" in str(dsa_tvm.compile_report(ex))


def test_too_curved_a_function_stays_on_the_cpu_with_the_reason(tmp_path):
    """exp over [-40, 40] on a grid that holds its top: most segments are flat zero, the
    last ones far from a line; the chain runs on the CPU and the report says how far."""
    s_in, s_out = 40 / 32767, float(np.exp(40.0)) / 32767
    x = np.linspace(-40, 40, 512, dtype=np.float32).reshape(1, 2, 256)
    path = silu16_model(tmp_path, s_in, s_out, x.shape, fn="exp")
    cfg = dsa_tvm.load_config("default").replace(**FAST_DSA)
    want, _ = _run(path, "llvm", x)
    got, ex = _run(path, dsa_tvm.target(cfg), x)
    rep = dsa_tvm.compile_report(ex)
    assert not _wide_layers(rep)
    np.testing.assert_array_equal(got, want)
    assert "too curved for 256 segments" in str(rep)

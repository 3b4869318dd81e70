"""W4A8 end to end: ``quantize(..., weight_bits=4)`` makes int4 weight codes, the compiler
stores them two a byte on a part with ``dram.int4_weights`` and loads them with WGT4.

The same model compiled for the part without the unpacker (int8 weight tiles) is the
oracle: outputs identical, every launch bit-exact against the integer reference, half
the weight bytes read, and the layer table's bounds (the physics checks) halved with them.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax

import dsa_tvm
from dsa_tvm.hw.config import load_config, with_overrides
from dsa_tvm.isa.program import INT4
from dsa_tvm.quant.api import quantize_onnx
from dsa_tvm.runtime import take_launches
from dsa_tvm.target import target
from tir_schedules.kinds import run_region

from .. import qdq_models as Q

INT4_HW = load_config("default")
INT8_HW = with_overrides(INT4_HW, ["dram.int4_weights=false"])


def _fp32_net() -> onnx.ModelProto:
    """conv 3x3 -> relu -> conv 1x1 -> global pool -> dense: every anchor kind but matmul."""
    rng = np.random.default_rng(0)
    inits = {"W1": Q.rand(rng, 32, 8, 3, 3), "B1": Q.rand(rng, 32),
             "W2": Q.rand(rng, 48, 32, 1, 1), "B2": Q.rand(rng, 48),
             "W3": Q.rand(rng, 48, 40), "B3": Q.rand(rng, 40)}
    nodes = [Q.node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1] * 4),
             Q.node("Relu", ["c1"], ["r1"]),
             Q.node("Conv", ["r1", "W2", "B2"], ["c2"]),
             Q.node("GlobalAveragePool", ["c2"], ["g"]),
             Q.node("Flatten", ["g"], ["f"]),
             Q.node("Gemm", ["f", "W3", "B3"], ["out"])]
    return Q.make_model(nodes, inits, {"x": (1, 8, 12, 12)}, {"out": None})


def _calibration() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.standard_normal((1, 8, 12, 12)).astype(np.float32) for _ in range(4)]


@pytest.fixture(scope="module")
def w4():
    return quantize_onnx(_fp32_net(), _calibration(), show_progress=False, weight_bits=4)


def _compile(qm, hw):
    ex = tvm.compile(qm.to_relax(), target=target(hw))
    return ex, dsa_tvm.last_compile_report()


def _run(ex, x):
    take_launches()
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return (out if hasattr(out, "numpy") else out[0]).numpy(), take_launches()


def test_weight_codes_are_per_channel_int4(w4):
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in w4.model.graph.initializer}
    codes = [v for k, v in inits.items() if k.endswith("/W_int8")]
    assert len(codes) == 3
    for c in codes:
        assert c.min() >= -7 and c.max() <= 7
        per_channel = np.abs(c.reshape(c.shape[0], -1) if c.ndim == 4 else c.T).max(axis=1)
        assert (per_channel == 7).all()   # every channel uses its full int4 range
    assert "int4 weights" in w4.summary()


def test_w4a8_on_the_int4_part_equals_the_int8_tiles_and_reads_half(w4):
    x = _calibration()[0]
    ex4, rep4 = _compile(w4, INT4_HW)
    ex8, rep8 = _compile(w4, INT8_HW)
    (r4,), (r8,) = rep4.regions, rep8.regions
    assert r4.target == r8.target == "dsa"
    assert "3 layer(s) read int4 weights" in str(rep4) and "int4" not in str(rep8)
    packed = [r for r in r4.program.regions if r.dtype == INT4]
    assert len(packed) == 3 and all(r.kind == "const" for r in packed)
    assert not [r for r in r8.program.regions if r.dtype == INT4]
    assert r4.program.dram_size < r8.program.dram_size
    y4, (launch4,) = _run(ex4, x)
    y8, (launch8,) = _run(ex8, x)
    np.testing.assert_array_equal(y4, y8)
    want = run_region(r4.region, launch4.inputs)
    for name, got in launch4.outputs.items():   # the integer reference, bit for bit
        np.testing.assert_array_equal(got, want[name])
    c4, c8 = launch4.result.counters, launch8.result.counters
    assert c4["dram_read_bytes.inp"] == c8["dram_read_bytes.inp"]
    assert 2 * c4["dram_read_bytes.wgt"] == c8["dram_read_bytes.wgt"]
    for l4, l8 in zip(r4.program.meta["layers"], r8.program.meta["layers"]):
        if l8["weight_bytes"]:
            assert l4["int4_weights"] and l4["weight_bytes"] == (l8["weight_bytes"] + 1) // 2
            assert l8["min_read_bytes"] - l4["min_read_bytes"] == l8["weight_bytes"] // 2


def test_physics_bounds_hold_for_int4_layers(w4):
    """No layer reads fewer DRAM bytes than its (halved) compulsory reads, or takes fewer
    cycles than its compute bound."""
    from dsa_tvm.report import build_report

    ex, rep = _compile(w4, INT4_HW)
    _, launches = _run(ex, _calibration()[1])
    rows = [r for r in build_report(launches, rep).rows if r.target == "DSA"]
    assert rows and any(r.macs for r in rows)
    for r in rows:
        assert r.check == "", (r.name, r.check)     # layers.checks found nothing impossible
        assert r.dram_read >= r.min_read, r.name


def test_int8_weights_are_never_packed():
    q8 = quantize_onnx(_fp32_net(), _calibration(), show_progress=False)
    _, rep = _compile(q8, INT4_HW)
    assert not [r for r in rep.regions[0].program.regions if r.dtype == INT4]


def test_bad_weight_bits_are_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"weight_bits must be one of \(4, 8\), got 3"):
        quantize_onnx(_fp32_net(), _calibration(), show_progress=False, weight_bits=3)


def test_a_cim_part_keeps_int8_weights_for_its_crossbars(w4):
    """A CIM part programs constant weights into crossbars; packing them would hide them
    from the crossbar mapping, so a part with both keeps them int8 (and analog)."""
    cim = with_overrides(load_config("cim-pcm"), ["dram.int4_weights=true"])
    _, rep = _compile(w4, cim)
    assert not [r for r in rep.regions[0].program.regions if r.dtype == INT4]

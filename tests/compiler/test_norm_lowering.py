"""The norm room lowered: Softmax / LayerNorm / RMSNorm layers compiled into DSA programs
(NORM on the [norm] units), bit-exact against the room's integer reference on every
preset, alone and after a dense layer; the room's estimate equals the simulated cycles
of the layer alone; cycles and DRAM bytes never below their bounds; QDQ models quantized
with ``quantize_norms`` run their norms on the DSA in one region with the matmuls around
them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsa_tvm.layers import intnorm as inn
from dsa_tvm.layers import ir as L
from dsa_tvm.lowering.region import compile_region, lowering_supports
from tir_schedules.kinds.norm import estimate_norm_cycles, norm_cycles

from .test_lowering import CFGS, check, dense, qt, region

NORM_CFGS = {k: v.replace(norm_units=2) for k, v in CFGS.items()}


def _norm(kind: str, x: L.QTensor, rng, name: str = "nrm"):
    n = x.shape[-1]
    if kind == "softmax":
        return L.Softmax(name, x, L.QTensor(f"{name}_y", x.shape, 1 / 256, -128),
                         inn.softmax_params(x.scale, 1 / 256, -128))
    center = kind == "layernorm"
    zp = int(rng.integers(-10, 10))
    p = inn.norm_params(n, x.scale, 1e-5, rng.normal(1, 0.3, n),
                        rng.normal(0, 0.2, n) if center else None, 0.03, zp, center)
    return (L.LayerNorm if center else L.RMSNorm)(name, x, L.QTensor(f"{name}_y", x.shape,
                                                                     0.03, zp), p)


_kinds = st.sampled_from(["softmax", "layernorm", "rmsnorm"])


@pytest.mark.parametrize("preset", list(NORM_CFGS))
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_norm_layer_lowers_bit_exact(preset, data):
    """Alone (ranks 1..3, rows not a multiple of anything) and after a dense layer."""
    cfg, draw = NORM_CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(_kinds)
    n = draw(st.integers(1, 300))
    lead = draw(st.sampled_from([(), (draw(st.integers(1, 40)),),
                                 (draw(st.integers(1, 3)), draw(st.integers(1, 9)))]))
    x = qt(rng, "x", (*lead, n))
    ly = _norm(kind, x, rng)
    res = check(region([x], [ly]), cfg, rng)
    prog = compile_region(region([x], [ly]), cfg)
    plan = prog.plans[0]
    # the estimate is the timing model on the room's own instructions
    assert res.counters["cycles"] == estimate_norm_cycles(cfg, plan.shape, plan.knobs)
    # physics: the units' own cycles, every code in and out once
    assert res.counters["cycles"] >= norm_cycles(cfg, ly)
    codes = int(np.prod(x.shape))
    assert res.counters["dram_read_bytes"] >= codes
    assert res.counters["dram_write_bytes"] >= codes
    assert res.counters["cycles"] >= 2 * codes / cfg.bandwidth_bytes_per_cycle
    # after a matmul, in one program
    d = dense(rng, qt(rng, "x2", (max(1, int(np.prod(lead))), draw(st.integers(1, 40)))), n)
    check(region([d.input], [d, _norm(kind, d.output, rng, "n2")]), cfg, rng)


@pytest.mark.parametrize("kind", ["softmax", "layernorm", "rmsnorm"])
def test_tiles_double_buffer_and_big_rows(kind):
    """Many rows (several tiles, both staging halves) and a row longer than the default
    accumulator holds twice with its parameters, on the smallest preset."""
    cfg = NORM_CFGS["edge"]
    rng = np.random.default_rng(3)
    x = qt(rng, "x", (300, 33))
    res = check(region([x], [_norm(kind, x, rng)]), cfg, rng)
    assert res.counters["instr.norm"] > 2
    long = qt(rng, "xl", (3, 700))
    check(region([long], [_norm(kind, long, rng)]), cfg, rng)


def test_refusals_name_the_cause():
    rng = np.random.default_rng(0)
    x = qt(rng, "x", (4, 24))
    ly = _norm("softmax", x, rng)
    assert "no [norm] units" in lowering_supports(ly, CFGS["default"].replace(norm_units=0))
    assert lowering_supports(ly, NORM_CFGS["default"]) is None
    img = _norm("layernorm", qt(rng, "x4", (1, 2, 3, 24)), rng)
    assert "NCHW image" in lowering_supports(img, NORM_CFGS["default"])
    cfg = NORM_CFGS["edge"]
    huge = _norm("rmsnorm", qt(rng, "xh", (1, inn.MAX_ROW)), rng)
    why = lowering_supports(huge, cfg)
    assert why is not None and "accumulator" in why

"""2:4-pruned models end to end: the compiler finds N:M weight regions by their values,
stores them compressed on a part with ``array.sparsity``, loads them with WGTS and runs
their GEMMs sparse; the report says which layers.

The same model on the dense part is the oracle: outputs identical, every launch
bit-exact against the integer reference, 160/256 of the weight bytes read, fewer cycles,
and no layer faster than its kept MACs at the array's rate (the physics checks).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax

import dsa_tvm
from dsa_tvm.hw.config import load_config, with_overrides
from dsa_tvm.isa.instructions import Buffer, Gemm, Load
from dsa_tvm.quant.api import quantize_onnx
from dsa_tvm.report import build_report, issued_macs
from dsa_tvm.runtime import take_launches
from dsa_tvm.target import target
from tir_schedules.kinds import run_region

from .. import qdq_models as Q

DENSE = load_config("default")
SPARSE = with_overrides(DENSE, ["array.sparsity=2:4"])


def prune_2_4(w: np.ndarray, axis: int = 1) -> np.ndarray:
    """Keep the 2 largest |w| of every aligned 4 along ``axis`` (the input channels)."""
    t = np.moveaxis(w, axis, -1).copy()
    g = t.reshape(t.shape[:-1] + (t.shape[-1] // 4, 4))
    np.put_along_axis(g, np.argsort(np.abs(g), axis=-1)[..., :2], 0, axis=-1)
    return np.moveaxis(g.reshape(t.shape), -1, axis)


def _net(pruned: bool) -> onnx.ModelProto:
    """conv 3x3 (pruned) -> relu -> depthwise 3x3 -> conv 1x1 (dense) -> pool -> dense
    (pruned): sparse and dense weights in one region."""
    rng = np.random.default_rng(0)
    p = prune_2_4 if pruned else (lambda w, axis=1: w)
    inits = {"W1": p(Q.rand(rng, 32, 32, 3, 3)), "B1": Q.rand(rng, 32),
             "WD": Q.rand(rng, 32, 1, 3, 3), "BD": Q.rand(rng, 32),
             "W2": Q.rand(rng, 48, 32, 1, 1), "B2": Q.rand(rng, 48),
             "W3": p(Q.rand(rng, 40, 48)).T.copy(), "B3": Q.rand(rng, 40)}
    nodes = [Q.node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1] * 4),
             Q.node("Relu", ["c1"], ["r1"]),
             Q.node("Conv", ["r1", "WD", "BD"], ["d"], pads=[1] * 4, group=32),
             Q.node("Conv", ["d", "W2", "B2"], ["c2"]),
             Q.node("GlobalAveragePool", ["c2"], ["g"]),
             Q.node("Flatten", ["g"], ["f"]),
             Q.node("Gemm", ["f", "W3", "B3"], ["out"])]
    return Q.make_model(nodes, inits, {"x": (1, 32, 12, 12)}, {"out": None})


def _calibration() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.standard_normal((1, 32, 12, 12)).astype(np.float32) for _ in range(4)]


@pytest.fixture(scope="module")
def pruned():
    return quantize_onnx(_net(True), _calibration(), show_progress=False)


def _compile(qm, hw):
    ex = tvm.compile(qm.to_relax(), target=target(hw))
    return ex, dsa_tvm.last_compile_report()


def _run(ex, x):
    take_launches()
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return (out if hasattr(out, "numpy") else out[0]).numpy(), take_launches()


def test_pruned_model_on_the_sparse_part_equals_dense_and_is_faster(pruned):
    x = _calibration()[0]
    exs, reps = _compile(pruned, SPARSE)
    exd, repd = _compile(pruned, DENSE)
    (rs,), (rd,) = reps.regions, repd.regions
    assert rs.target == rd.target == "dsa"
    layers = {ly["name"]: ly for ly in rs.program.meta["layers"]}
    sparse = sorted(n for n, ly in layers.items() if ly.get("sparsity") == "2:4")
    # the pruned conv and dense; the 1x1 conv is dense, the depthwise on the vector unit
    assert sparse == ["dsa_region0.0:conv2d", "dsa_region0.4:dense_flat"], sparse
    assert "2 layer(s) run 2:4 sparse on the array" in str(reps)
    assert "sparse" not in str(repd)
    ys, (ls,) = _run(exs, x)
    yd, (ld,) = _run(exd, x)
    np.testing.assert_array_equal(ys, yd)
    want = run_region(rs.region, ls.inputs)
    for name, got in ls.outputs.items():   # the integer reference, bit for bit
        np.testing.assert_array_equal(got, want[name])
    cs, cd = ls.result.counters, ld.result.counters
    assert cs["cycles"] < 0.8 * cd["cycles"]
    assert cs["dram_read_bytes.inp"] == cd["dram_read_bytes.inp"]
    assert cs["dram_read_bytes.wgt"] < cd["dram_read_bytes.wgt"]
    for ls_, ld_ in zip(rs.program.meta["layers"], rd.program.meta["layers"]):
        if ls_.get("sparsity"):
            # kept values and their indices: 160 of every 256 bytes
            assert ls_["weight_bytes"] == -(-ld_["weight_bytes"] * 160 // 256), ls_["name"]
        else:
            assert ls_["weight_bytes"] == ld_["weight_bytes"], ls_["name"]


def test_only_sparse_layers_load_wgts_and_their_gemms_are_sparse(pruned):
    _, rep = _compile(pruned, SPARSE)
    prog = rep.regions[0].program
    for ly in prog.meta["layers"]:
        span = prog.instructions[ly["first"]:ly["last"] + 1]
        gemms = [i for i in span if isinstance(i, Gemm)]
        loads = {i.buffer for i in span if isinstance(i, Load)}
        if ly.get("sparsity"):
            assert gemms and all(g.sparse for g in gemms)
            assert Buffer.WGTS in loads and Buffer.WGT not in loads
        else:
            assert not any(g.sparse for g in gemms) and Buffer.WGTS not in loads


def test_physics_bounds_hold_for_sparse_layers(pruned):
    """No layer takes fewer cycles than its kept MACs at the array's rate, or reads fewer
    DRAM bytes than its (compressed) weights."""
    ex, rep = _compile(pruned, SPARSE)
    _, launches = _run(ex, _calibration()[1])
    rows = [r for r in build_report(launches, rep).rows if r.target == "DSA"]
    assert rows and any(r.macs for r in rows)
    for r in rows:
        assert r.check == "", (r.name, r.check)
        assert r.dram_read >= r.min_read and r.cycles >= r.bound, r.name
    # the array's utilization counts the MACs it did: at most 100% (the sweep's column)
    total = build_report(launches, rep).total_cycles
    assert sum(issued_macs(r) for r in rows) <= total * SPARSE.peak_macs_per_cycle
    # the per-layer CSV names the sparse layers
    assert sorted(r.name for r in rows if r.sparsity == "2:4") == [
        "dsa_region0.0:conv2d", "dsa_region0.4:dense_flat"]


def test_dense_model_on_the_sparse_part_runs_the_dense_program():
    """Nothing pruned: no region compressed, no GEMM sparse, the same cycles."""
    q = quantize_onnx(_net(False), _calibration(), show_progress=False)
    exs, reps = _compile(q, SPARSE)
    exd, _ = _compile(q, DENSE)
    prog = reps.regions[0].program
    sparse = [ly["name"] for ly in prog.meta["layers"] if ly.get("sparsity")]
    assert sparse == []
    assert not [r for r in prog.regions if r.dtype.startswith("sparse")]
    ys, (ls,) = _run(exs, _calibration()[2])
    yd, (ld,) = _run(exd, _calibration()[2])
    np.testing.assert_array_equal(ys, yd)


def test_w4a8_pruned_weights_on_a_sparse_int4_part():
    """A part with both unpackers: sparse regions are compressed, the others int4."""
    q4 = quantize_onnx(_net(True), _calibration(), show_progress=False, weight_bits=4)
    both = with_overrides(SPARSE, ["dram.int4_weights=true"])
    exb, repb = _compile(q4, both)
    exd, _ = _compile(q4, DENSE)
    dtypes = {r.dtype for r in repb.regions[0].program.regions if r.kind == "const"}
    assert "sparse2:4" in dtypes and "int4" in dtypes
    yb, _ = _run(exb, _calibration()[3])
    yd, _ = _run(exd, _calibration()[3])
    np.testing.assert_array_equal(yb, yd)

"""The run report's self-check (``dsa_tvm.layers.checks``), the MAC share over CPU ops, and
the note an FP32 model gets.

No DSA layer may take fewer cycles than its MACs need at the array's peak rate, nor
move fewer DRAM bytes than its inputs, weights and outputs once: the check is asserted
here on every layer kind and on the bundled networks, on every preset, and shown to
catch the 4-D Linear that once summed over H (2,077 cycles for 36,864 cycles of MACs).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.hw.config import load_config, preset_names
from dsa_tvm.layers import ir as L
from dsa_tvm.layers.checks import compute_bound, violations
from dsa_tvm.layers.host_pack import pack_region_input
from dsa_tvm.lowering.region import compile_region
from dsa_tvm.models import calibration_data, get_model, run_onnxruntime
from dsa_tvm.report import build_report
from dsa_tvm.runtime import Launch, take_launches
from dsa_tvm.sim.simulator import Simulator
from tir_schedules.kinds import layer_bounds

from .. import qdq_models as qm
from .test_lowering import (
    add,
    batch_matmul,
    bias_add,
    conv,
    dense,
    depthwise_engine,
    gap,
    pool,
    qt,
    region,
    rescale,
)

PRESETS = preset_names()


def _always_offload(preset: str):
    return load_config(preset).replace(cpu_gmacs=1e-6, launch_overhead_us=0.0)


# ----------------------------------------------------------------------------- the check
def test_check_flags_the_4d_linear_of_issue_11():
    """Linear(96 -> 384) on (1, 16, 16, 96) read as NCHW: 2,077 cycles, 11,008 B read."""
    peak = load_config("default").peak_macs_per_cycle
    macs = 16 * 16 * 96 * 384
    x = L.QTensor("x", (256, 96), 0.1, 0)
    ly = L.Dense("d", x, L.QTensor("y", (256, 384), 0.1, 0), np.zeros((384, 96), np.int8),
                 np.zeros(384, np.int32), L.Requant(np.array([1]), np.array([0]), 0))
    rd, wr = layer_bounds(ly)
    assert (rd, wr) == (256 * 96 + 384 * 96, 256 * 384)
    assert compute_bound(macs, peak) == 36_864
    bad = violations(macs, 2_077, 11_008, 6_144, rd, wr, peak)
    assert len(bad) == 3 and "compute bound 36,864" in bad[0], bad
    assert violations(macs, 45_260, 238_080, 98_304, rd, wr, peak) == []


def test_strided_window_bound_counts_only_read_pixels():
    """A 1x1 conv of stride 2 needs one input pixel in four, a 3x3 of stride 2 all of them."""
    rng = np.random.default_rng(0)
    x = qt(rng, "x", (1, 8, 8, 8))
    one = conv(rng, x, 4, 1, 2, 0)
    assert layer_bounds(one) == (8 * 4 * 4 + 4 * 8, 4 * 4 * 4)
    three = conv(rng, x, 4, 3, 2, 1)
    assert layer_bounds(three)[0] == 8 * 8 * 8 + 4 * 8 * 9
    mp = pool(rng, x, "max", 2, 3, 0)  # windows at 0-1, 3-4, 6-7: rows 2 and 5 never read
    assert layer_bounds(mp) == (8 * 6 * 6, 8 * 3 * 3)


def _run_region(reg: L.Region, cfg, rng) -> object:
    prog = compile_region(reg, cfg).program
    xs = {t.name: rng.integers(-128, 128, t.shape, dtype=np.int8) for t in reg.inputs}
    feeds = {}
    for k, v in xs.items():
        feeds.update(pack_region_input(k, v, prog.meta["io"][k], cfg.block_in, cfg.block_out))
    res = Simulator(cfg).run(prog, feeds)
    return build_report([Launch(prog, res, xs, {})])


def _layer_regions(rng, cfg) -> list[L.Region]:
    b = cfg.block_out
    x = qt(rng, "x", (1, b + 3, 9, 9))
    m = qt(rng, "m", (20, 2 * b + 5))
    a3, b3 = qt(rng, "a", (2, 12, b + 1)), qt(rng, "b", (2, b + 1, 10))
    c1 = conv(rng, x, 2 * b, 3, 1, 1)
    c2 = conv(rng, c1.output, b, 1, 2, 0, "c2")
    mp = pool(rng, c2.output, "max", 3, 2, 1)
    return [
        region([x], [c1, c2, mp, gap(rng, mp.output, True)]),
        region([x], [pool(rng, x, "avg", 3, 1, 1)]),
        region([m], [dense(rng, m, b + 7)]),
        region([a3, b3], [batch_matmul(rng, a3, b3)]),
        region([x], [(bx := bias_add(rng, x)), (rs := rescale(rng, bx.output)),
                     add(rng, rs.output, bx.output)]),
    ]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_layer_kind_within_its_bounds(preset):
    cfg, rng = load_config(preset), np.random.default_rng(3)
    regions = _layer_regions(rng, cfg)
    for engine in ("vector", "array"):
        with depthwise_engine(engine):
            x = qt(rng, f"dw_{engine}", (1, 2 * cfg.block_out + 1, 10, 10))
            regions.append(region([x], [conv(rng, x, 0, 3, 2, 1, depthwise=True)]))
    for reg in regions:
        rep = _run_region(reg, cfg, rng)
        assert len(rep.rows) == len(reg.layers)
        assert not rep.violations, "\n" + str(rep)


# ----------------------------------------------------------------------------- networks
NETWORKS = {
    "small_cnn": dict(input_size=16, width=8, num_classes=10),
    "mobilenet_v2": dict(input_size=32, width_mult=0.25, num_classes=10),
    "transformer_encoder": dict(seq_len=8, hidden=32, heads=2, ffn=64),
    "resnet18": dict(input_size=32, width=16, num_classes=100),
}


@pytest.fixture(scope="module")
def networks():
    return {name: get_model(name, **kw) for name, kw in NETWORKS.items()}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", list(NETWORKS))
def test_bundled_networks_within_bounds(networks, name, preset):
    """Every bundled network kind (CNN, ResNet, MobileNetV2, transformer) on every preset."""
    model = networks[name]
    ex = tvm.compile(from_onnx(model, keep_params_in_input=False),
                     target=dsa_tvm.target(_always_offload(preset)))
    (x,) = calibration_data(model, n=1, seed=2)[0].values()
    take_launches()
    relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the check's warning fails the test
        rep = dsa_tvm.last_run_report()
    assert rep.regions and any(r.target == "DSA" for r in rep.rows), str(rep)
    assert not rep.violations, "\n" + str(rep)


# ----------------------------------------------------------------------------- MAC share
@pytest.mark.parametrize("dilation", [2, 1])
def test_mac_share_counts_conv_transpose(tmp_path, dilation):
    """conv -> ConvTranspose2d -> conv: a dilated transposed conv stays on the CPU and its
    MACs count (they used to be left out, and the share read 100%); an undilated one runs
    on the DSA and counts its own MACs there, not the zero products of its array."""
    rng = np.random.default_rng(0)
    inits = {"W1": qm.rand(rng, 16, 8, 3, 3), "Wt": qm.rand(rng, 16, 8, 2, 2),
             "W3": qm.rand(rng, 8, 8, 3, 3)}
    nodes = [qm.node("Conv", ["x", "W1"], ["a"], pads=[1, 1, 1, 1]),
             qm.node("ConvTranspose", ["a", "Wt"], ["b"], strides=[2, 2],
                     dilations=[dilation, dilation]),
             qm.node("Conv", ["b", "W3"], ["y"], pads=[1, 1, 1, 1])]
    path = qm.quantize(qm.make_model(nodes, inits, {"x": (1, 8, 8, 8)}, {"y": None}), tmp_path,
                       name="convt")
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    ex = dsa_tvm.compile(mod, _always_offload("default"))
    take_launches()
    relax.VirtualMachine(ex, tvm.cpu())["main"](
        tvm.runtime.tensor(rng.standard_normal((1, 8, 8, 8)).astype(np.float32)))
    rep = dsa_tvm.last_run_report()
    side = 7 * 2 + dilation + 1             # (H - 1) * stride + dilation * (k - 1) + 1
    conv1 = 16 * 8 * 8 * (8 * 3 * 3)        # outputs x taps
    convt = 16 * 8 * 8 * (8 * 2 * 2)        # each input pixel feeds 8 channels x 2x2 taps
    conv3 = 8 * side * side * (8 * 3 * 3)
    if dilation == 1:
        assert not [r for r in rep.rows if r.target == "CPU" and r.macs], str(rep)
        assert rep.dsa_mac_share == 1.0
        assert sum(r.macs for r in rep.rows if r.target == "DSA") == conv1 + convt + conv3
        assert not rep.violations, "\n" + str(rep)
        return
    rows = {r.op: r for r in rep.rows if r.target == "CPU"}
    assert rows["nn.conv2d_transpose"].macs == convt, str(rep)
    assert "dilation" in rows["nn.conv2d_transpose"].why, str(rep)
    assert rep.dsa_mac_share == pytest.approx((conv1 + conv3) / (conv1 + convt + conv3))
    assert f"{(conv1 + conv3) / (conv1 + convt + conv3):.1%} of MACs on the DSA" in str(rep)


def test_op_macs_of_other_mac_ops():
    """conv1d, conv3d, einsum and matmul on a CPU-only float graph: MACs by hand."""
    from tvm.relax.op import einsum, matmul
    from tvm.relax.op.nn import conv1d, conv3d

    from relay_passes.partition import _op_macs

    def var(name, shape):
        return relax.Var(name, relax.TensorType(shape, "float32")) \
            if hasattr(relax, "TensorType") else relax.Var(name, relax.TensorStructInfo(shape))

    bb = relax.BlockBuilder()
    x1, w1 = var("x1", (1, 4, 10)), var("w1", (6, 2, 3))
    x3, w3 = var("x3", (1, 2, 4, 4, 4)), var("w3", (3, 2, 3, 3, 3))
    a, b = var("a", (2, 5, 7)), var("b", (2, 7, 3))
    with bb.function("main", [x1, w1, x3, w3, a, b]):
        c1 = bb.emit(conv1d(x1, w1, groups=2))
        c3 = bb.emit(conv3d(x3, w3, padding=1))
        e = bb.emit(einsum((a, b), "bik,bkj->bij"))
        m = bb.emit(matmul(a, b))
        bb.emit_func_output(relax.Tuple([c1, c3, e, m]))
    v2v = relax.analysis.get_var2val(bb.get()["main"])
    got = sorted(_op_macs(v) for v in v2v.values() if isinstance(v, relax.Call))
    assert got == sorted([6 * 8 * 2 * 3, 3 * 64 * 2 * 27, 2 * 5 * 7 * 3, 2 * 5 * 3 * 7])


# ----------------------------------------------------------------------------- FP32 model
def test_fp32_model_says_it_is_not_quantized():
    rng = np.random.default_rng(0)
    model = qm.make_model([qm.node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])],
                          {"W": qm.rand(rng, 8, 4, 3, 3)}, {"x": (1, 4, 8, 8)}, {"y": None})
    mod = from_onnx(model, keep_params_in_input=False)
    with pytest.warns(UserWarning, match="not quantized.*dsa-tvm quantize"):
        tvm.compile(mod, target="dsa")
    text = str(dsa_tvm.last_compile_report())
    assert "NOTE: the model is not quantized" in text and "dsa_tvm.quantize" in text, text
    (op,) = dsa_tvm.last_compile_report().partition.cpu_ops
    assert "on float data (not quantized" in op.reason, op.reason


def test_qdq_model_has_no_fp32_note(tmp_path):
    mod = from_onnx(onnx.load(qm.conv_net(tmp_path)), keep_params_in_input=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        tvm.compile(mod, target="dsa")
    assert not dsa_tvm.last_compile_report().partition.notes


# ----------------------------------------------------------------------------- ONNX names
def test_cpu_ops_name_their_onnx_node(tmp_path):
    """A HardSwish is one Table layer; left on the CPU (hardware without an activation table
    unit) its lookup and index ops each still name the ONNX node."""
    rng = np.random.default_rng(0)
    nodes = [qm.node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="/stem/Conv"),
             qm.node("HardSwish", ["c"], ["h"], name="/stem/HardSwish"),
             qm.node("Conv", ["h", "W2"], ["y"], pads=[1, 1, 1, 1], name="/body/Conv")]
    model = qm.make_model(nodes, {"W": qm.rand(rng, 8, 4, 3, 3), "W2": qm.rand(rng, 8, 8, 3, 3)},
                          {"x": (1, 4, 8, 8)}, {"y": None})
    path = qm.quantize(model, tmp_path, name="hardswish")
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    plain = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    want = run_onnxruntime(onnx.load(path), {"x": x}, optimize=False)[0]
    np.testing.assert_allclose(plain["main"](tvm.runtime.tensor(x)).numpy(), want, atol=1e-5)
    tvm.compile(mod, target="dsa")
    layers = [type(ly).__name__ for r in dsa_tvm.last_compile_report().regions
              for ly in r.region.layers]
    assert layers == ["Conv2d", "Table", "Conv2d"], layers
    tvm.compile(mod, target=dsa_tvm.target(load_config("default").replace(table_unit=0)))
    rep = dsa_tvm.last_compile_report().partition
    hs = {c.op for c in rep.cpu_ops if c.onnx_node == "/stem/HardSwish"}
    assert {"relax.take", "relax.divide", "relax.round", "relax.add"} <= hs, str(rep)
    assert "relax.take (ONNX /stem/HardSwish)" in str(rep)

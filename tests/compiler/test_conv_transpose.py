"""ConvTranspose2d (ONNX ConvTranspose) quantized per channel (axis 1) and run on the DSA as
zero insertion (a Dilate layer: DMA into a zero-point buffer) + a stride-1 conv with the
flipped kernel, inside its region: every launch bit-exact against the integer reference
(``run_region``), the network within one output step of TVM's llvm build of the same
quantized module (float ties, DESIGN.md), over strides, kernels, pads, output pads,
channels off the block and odd sizes. The layer reports its own (useful) MACs and no
fewer cycles than their bound. Variants the DSA does not take stay on the CPU, saying why."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

import tvm  # noqa: E402
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tvm import relax  # noqa: E402

import dsa_tvm  # noqa: E402
from dsa_tvm.layers.checks import compute_bound  # noqa: E402
from dsa_tvm.layers.ir import Conv2d, Dilate, Interleave  # noqa: E402
from dsa_tvm.quant import quantize_onnx  # noqa: E402
from dsa_tvm.report import build_report  # noqa: E402
from dsa_tvm.runtime import take_launches  # noqa: E402
from tir_schedules.kinds import run_region  # noqa: E402

from ..qdq_models import make_model, node, rand  # noqa: E402
from .qop_harness import SLOW_HOST_GMACS  # noqa: E402


def convt_net(cin: int, cout: int, hw: tuple[int, int], k: int, stride: int,
              pads: tuple[int, int, int, int], out_pad: tuple[int, int], bias: bool,
              act: str | None, dilation: int = 1, groups: int = 1, seed: int = 0):
    """ConvTranspose -> act -> Conv 1x1 (so the transposed conv's output is interior)."""
    rng = np.random.default_rng(seed)
    inits = {"W": rand(rng, cin, cout // groups, k, k, scale=0.5), "W2": rand(rng, 4, cout, 1, 1)}
    if bias:
        inits["B"] = rand(rng, cout)
    nodes = [node("ConvTranspose", ["x", "W"] + (["B"] if bias else []), ["c"],
                  kernel_shape=[k, k], strides=[stride, stride], pads=list(pads),
                  output_padding=list(out_pad), dilations=[dilation, dilation], group=groups,
                  name="convt")]
    mid = "c"
    if act == "relu":
        nodes.append(node("Relu", ["c"], ["a"], name="act"))
        mid = "a"
    elif act == "clip":
        nodes.append(node("Clip", ["c", "lo", "hi"], ["a"], name="act"))
        inits |= {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
        mid = "a"
    nodes.append(node("Conv", [mid, "W2"], ["y"], kernel_shape=[1, 1], name="head"))
    return make_model(nodes, inits, {"x": (1, cin, *hw)}, {"y": None})


def _compile(model, seed: int = 0):
    rng = np.random.default_rng(seed)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(4)]
    qm = quantize_onnx(model, feeds, show_progress=False)
    # a slow host and free launches: every region is worth offloading, whatever its size
    cfg = dsa_tvm.load_config("default").replace(cpu_gmacs=SLOW_HOST_GMACS, launch_overhead_us=0.0)
    ex = tvm.compile(qm.to_relax(), target=dsa_tvm.target(cfg))
    return qm, ex, dsa_tvm.compile_report(ex), feeds[0]


def _run_and_check(qm, ex, rep, feed):
    """Every launch exact against run_region, the output within one step of llvm; the
    run report of the launch."""
    take_launches()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(feed["x"])).numpy()
    launches = take_launches()
    assert launches
    run = build_report(launches)
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
    return run


def _layers(rep) -> list:
    return [ly for d in rep.regions if d.target == "dsa" for ly in d.region.layers]


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(cin=st.sampled_from([3, 8, 20]), cout=st.sampled_from([5, 16, 18]),
       hw=st.tuples(st.integers(1, 9), st.integers(1, 9)), k=st.integers(1, 4),
       stride=st.integers(1, 3), data=st.data(), bias=st.booleans(),
       act=st.sampled_from([None, "relu", "clip"]))
def test_conv_transpose_runs_on_dsa_bit_exact(cin, cout, hw, k, stride, data, bias, act):
    pads = data.draw(st.tuples(*[st.integers(0, k - 1)] * 4), label="pads")
    out_pad = data.draw(st.tuples(*[st.integers(0, stride - 1)] * 2), label="output_padding")
    oh, ow = ((hw[i] - 1) * stride + k - pads[i] - pads[i + 2] + out_pad[i] for i in (0, 1))
    assume(oh >= 1 and ow >= 1)
    qm, ex, rep, feed = _compile(convt_net(cin, cout, hw, k, stride, pads, out_pad, bias, act))
    layers = _layers(rep)
    assert not [op for op in rep.partition.cpu_ops if op.macs], str(rep)
    useful = cin * hw[0] * hw[1] * cout * k * k
    dsa_macs = sum(r.macs for r in rep.regions if r.target == "dsa")
    assert dsa_macs == useful + 4 * cout * oh * ow, str(rep)  # + the 1x1 head
    peak = dsa_tvm.load_config("default").peak_macs_per_cycle
    if k == stride > 1 and not any(pads) and not any(out_pad):  # phases: 1x1 convs, woven
        weave = [ly for ly in layers if isinstance(ly, Interleave)]
        assert len(weave) == 1 and weave[0].output.shape == (1, cout, oh, ow), str(rep)
        phases = [ly for ly in layers if ly.output.name in {t.name for t in weave[0].inputs}]
        assert len(phases) == k * k and all(p.weight.shape[2:] == (1, 1) for p in phases)
        assert not [ly for ly in layers if isinstance(ly, Dilate)]
        run = _run_and_check(qm, ex, rep, feed)
        rows = [r for r in run.rows if r.name in {p.name for p in phases}]
        assert sum(r.macs for r in rows) == useful
        assert all(r.cycles >= compute_bound(r.macs, peak) for r in rows)
        return
    convt = [ly for ly in layers if isinstance(ly, Conv2d) and ly.useful_macs is not None]
    assert len(convt) == 1, str(rep)
    c = convt[0]
    assert c.output.shape == (1, cout, oh, ow) and c.strides == (1, 1)
    assert c.useful_macs == useful
    assert c.padding == (k - 1 - pads[0], k - 1 - pads[1], k - 1 - pads[2] + out_pad[0],
                         k - 1 - pads[3] + out_pad[1])
    dil = [ly for ly in layers if isinstance(ly, Dilate)]
    assert len(dil) == (stride > 1) and all(d.output.name == c.input.name for d in dil)
    run = _run_and_check(qm, ex, rep, feed)
    row = next(r for r in run.rows if r.name == c.name)
    assert row.macs == c.useful_macs
    assert row.cycles >= compute_bound(c.useful_macs, peak)


@pytest.mark.parametrize("cin, cout, hw, s", [(32, 16, (8, 8), 2), (20, 5, (3, 5), 3),
                                              (8, 18, (1, 4), 2)])
def test_kernel_equal_to_stride_runs_as_phases(cin, cout, hw, s):
    """A UNet's up-sampling (kernel = stride, no pads): s*s 1x1 convs and an Interleave,
    no Dilate; exact, and the convs do only the transposed conv's own MACs."""
    qm, ex, rep, feed = _compile(convt_net(cin, cout, hw, s, s, (0,) * 4, (0, 0), True, "relu"))
    layers = _layers(rep)
    assert [type(ly).__name__ for ly in layers] == ["Conv2d"] * (s * s) + ["Interleave", "Conv2d"]
    assert sum(ly.macs for ly in layers[:-2]) == cin * hw[0] * hw[1] * cout * s * s
    assert all(ly.array_macs == ly.macs for ly in layers if isinstance(ly, Conv2d))
    _run_and_check(qm, ex, rep, feed)


def test_conv_transpose_weight_is_flipped_and_swapped():
    """The conv the kind makes, run by the integer reference on the zero-inserted input,
    equals a direct numpy transposed conv of the int8 values (independent of the kind)."""
    from relay_passes.kinds.conv2d_transpose import conv_weight

    rng = np.random.default_rng(3)
    cin, cout, k, s, p = 3, 2, 3, 2, 1
    x = rng.integers(-5, 5, (cin, 4, 5))
    w = rng.integers(-5, 5, (cin, cout, k, k))
    h, wd = x.shape[1:]
    full = np.zeros((cout, (h - 1) * s + k, (wd - 1) * s + k), np.int64)
    for i in range(h):
        for j in range(wd):
            full[:, i * s:i * s + k, j * s:j * s + k] += np.einsum("c,cokl->okl", x[:, i, j], w)
    want = full[:, p:full.shape[1] - p, p:full.shape[2] - p]
    z = np.zeros((cin, (h - 1) * s + 1, (wd - 1) * s + 1), np.int64)
    z[:, ::s, ::s] = x
    z = np.pad(z, ((0, 0), (k - 1 - p,) * 2, (k - 1 - p,) * 2))
    cw = conv_weight(w)
    got = np.zeros_like(want)
    for a in range(want.shape[1]):
        for b in range(want.shape[2]):
            got[:, a, b] = np.einsum("ckl,ockl->o", z[:, a:a + k, b:b + k], cw)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("what, kw, reason", [
    ("dilation", dict(dilation=2), "dilation"),
    ("padding past kernel-1", dict(pads=(2, 2, 2, 2), k=2, stride=3), "padding"),
])
def test_unsupported_conv_transpose_falls_back_with_a_reason(what, kw, reason):
    args = dict(cin=8, cout=8, hw=(5, 5), k=3, stride=2, pads=(1, 1, 1, 1), out_pad=(0, 0),
                bias=True, act="relu") | kw
    qm, ex, rep, feed = _compile(convt_net(**args))
    cpu = [op for op in rep.partition.cpu_ops if op.op == "relax.nn.conv2d_transpose"]
    assert cpu and reason in cpu[0].reason, str(rep)
    assert cpu[0].macs > 0
    _run_and_check(qm, ex, rep, feed)


def test_grouped_conv_transpose_stays_fp32_with_a_reason():
    model = convt_net(8, 8, (5, 5), 3, 2, (1, 1, 1, 1), (0, 0), True, "relu", groups=2)
    rng = np.random.default_rng(0)
    qm = quantize_onnx(model, [{"x": rng.normal(0, 1, (1, 8, 5, 5)).astype(np.float32)}],
                       show_progress=False)
    assert "grouped ConvTranspose" in qm.plan.kept_fp32.get("convt", ""), qm.plan.kept_fp32


@pytest.mark.parametrize("preset", ["default", "edge", "large"])
@pytest.mark.parametrize("c, hw, factor, zp", [
    (3, (5, 7), (2, 2), -7), (40, (4, 3), (3, 2), 0), (130, (3, 5), (2, 3), 11),
    (16, (6, 1), (3, 1), -128), (20, (1, 4), (1, 2), 127)])
def test_dilate_room_alone_bit_exact(preset, c, hw, factor, zp):
    """The zero insertion by itself through compile_region and the simulator (hazard
    checks on), on every preset: input pixels at every factor-th place, the zero point
    everywhere else (channels across several blocks, partial last blocks)."""
    from dsa_tvm.isa.program import Program
    from dsa_tvm.layers.host_pack import pack_region_input
    from dsa_tvm.layers.ir import QTensor, Region
    from dsa_tvm.layers.layouts import unpack_activation
    from dsa_tvm.lowering.region import compile_region
    from dsa_tvm.sim.simulator import Simulator

    cfg = dsa_tvm.load_config(preset)
    (h, w), (sh, sw) = hw, factor
    xt = QTensor("x", (1, c, h, w), 0.1, zp)
    yt = QTensor("y", (1, c, (h - 1) * sh + 1, (w - 1) * sw + 1), 0.1, zp)
    reg = Region("r", [xt], [yt], [Dilate("zi", xt, yt, factor)])
    x = np.random.default_rng(c).integers(-128, 128, xt.shape, dtype=np.int8)
    prog = compile_region(reg, cfg).program
    prog = Program.from_bytes(prog.to_bytes(cfg), cfg)
    res = Simulator(cfg).run(prog, pack_region_input("x", x, prog.meta["io"]["x"],
                                                     cfg.block_in, cfg.block_out))
    got = unpack_activation(res.outputs["y"], yt.shape)
    want = np.full(yt.shape, zp, np.int8)
    for i in range(h):
        for j in range(w):
            want[:, :, i * sh, j * sw] = x[:, :, i, j]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run_region(reg, {"x": x})["y"], want)


@pytest.mark.parametrize("preset", ["default", "edge", "large"])
@pytest.mark.parametrize("c, hw, factor", [(3, (5, 7), (2, 2)), (130, (3, 2), (3, 2)),
                                           (16, (4, 1), (1, 3))])
def test_interleave_room_alone_bit_exact(preset, c, hw, factor):
    """The weave by itself through compile_region and the simulator, on every preset."""
    from dsa_tvm.isa.program import Program
    from dsa_tvm.layers.host_pack import pack_region_input
    from dsa_tvm.layers.ir import QTensor, Region
    from dsa_tvm.layers.layouts import unpack_activation
    from dsa_tvm.lowering.region import compile_region
    from dsa_tvm.sim.simulator import Simulator

    cfg = dsa_tvm.load_config(preset)
    (h, w), (sh, sw) = hw, factor
    xs = tuple(QTensor(f"p{i}", (1, c, h, w), 0.1, 3) for i in range(sh * sw))
    yt = QTensor("y", (1, c, h * sh, w * sw), 0.1, 3)
    reg = Region("r", list(xs), [yt], [Interleave("weave", xs, yt, factor)])
    rng = np.random.default_rng(c)
    ins = {t.name: rng.integers(-128, 128, t.shape, dtype=np.int8) for t in xs}
    prog = compile_region(reg, cfg).program
    prog = Program.from_bytes(prog.to_bytes(cfg), cfg)
    feeds = {}
    for t in xs:
        feeds |= pack_region_input(t.name, ins[t.name], prog.meta["io"][t.name], cfg.block_in,
                                   cfg.block_out)
    got = unpack_activation(Simulator(cfg).run(prog, feeds).outputs["y"], yt.shape)
    want = np.empty(yt.shape, np.int8)
    for i in range(h * sh):
        for j in range(w * sw):
            want[:, :, i, j] = ins[f"p{(i % sh) * sw + j % sw}"][:, :, i // sh, j // sw]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run_region(reg, ins)["y"], want)

"""End to end on small versions of the bundled networks: ResNet-18, MobileNetV2, a
transformer encoder block.

Each model is built, compiled and run once per module (fixtures); the tests check
that every DSA launch is bit-exact against the integer reference
(``tir_schedules.kinds.run_region``) on the inputs it recorded, that the final output
is within one quantization step of onnxruntime running the same QDQ graph
(``optimize=False``; the fraction of elements that differ at all is printed), and
where the MACs ran (the compile report says why everything else stayed on the CPU).

Small models can lose to the host in the offload cost model, so the compiles here
use a host with a low ``cpu_gmacs``: the point is the codegen, not the cost model,
which has its own test at the end (a tiny region stays on the CPU, with its reason).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.models import calibration_data, get_model, output_quant_steps, run_onnxruntime
from dsa_tvm.runtime import take_launches
from tir_schedules.kinds import run_region

#: a host slow enough that every region of these small networks is worth offloading
SLOW_HOST_GMACS = 0.01


@dataclass
class Compiled:
    name: str
    hw: str
    report: object               # CompileReport
    launches: list               # runtime.Launch of one run
    got: np.ndarray
    ref: np.ndarray
    step: float
    model: object = None


def _compile_and_run(model, hw: str, name: str, seed: int = 11) -> Compiled:
    cfg = dsa_tvm.load_config(hw).replace(cpu_gmacs=SLOW_HOST_GMACS)
    mod = from_onnx(model, keep_params_in_input=False)
    ex = tvm.compile(mod, target=dsa_tvm.target(cfg))
    report = dsa_tvm.last_compile_report()
    feed = calibration_data(model, n=1, seed=seed)[0]
    take_launches()
    vm = relax.VirtualMachine(ex, tvm.cpu())
    (in_name, x), = feed.items()
    out = vm["main"](tvm.runtime.tensor(x))
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    launches = take_launches()
    ref = run_onnxruntime(model, feed, optimize=False)[0]
    (step,) = output_quant_steps(model).values()
    assert step is not None, "the graph output is not a dequantized tensor"
    return Compiled(name, hw, report, launches, got, ref, step, model)


@pytest.fixture(scope="module")
def resnet18():
    return get_model("resnet18", input_size=32, width=16, num_classes=100)


@pytest.fixture(scope="module")
def mobilenet_v2():
    return get_model("mobilenet_v2", input_size=32, width_mult=0.25, num_classes=100)


@pytest.fixture(scope="module")
def encoder():
    return get_model("transformer_encoder", seq_len=16, hidden=64, heads=2, ffn=128)


@pytest.fixture(scope="module")
def resnet18_default(resnet18):
    return _compile_and_run(resnet18, "default", "resnet18")


@pytest.fixture(scope="module")
def resnet18_edge(resnet18):
    return _compile_and_run(resnet18, "edge", "resnet18")


@pytest.fixture(scope="module")
def mobilenet_default(mobilenet_v2):
    return _compile_and_run(mobilenet_v2, "default", "mobilenet_v2")


@pytest.fixture(scope="module")
def encoder_default(encoder):
    return _compile_and_run(encoder, "default", "transformer_encoder")


NETS = ["resnet18_default", "resnet18_edge", "mobilenet_default", "encoder_default"]


def _mac_shares(report) -> tuple[float, int, int]:
    """(share of MACs on the DSA, MACs on the DSA, total MACs) from the compile report."""
    dsa = sum(d.macs for d in report.regions if d.target == "dsa")
    cpu = sum(d.macs for d in report.regions if d.target != "dsa")
    cpu += sum(op.macs for op in report.partition.cpu_ops)
    total = dsa + cpu
    return (dsa / total if total else 0.0), dsa, total


@pytest.mark.parametrize("net", NETS)
def test_every_launch_is_bit_exact(net, request):
    c: Compiled = request.getfixturevalue(net)
    regions = {d.name: d.region for d in c.report.regions if d.target == "dsa"}
    assert c.launches, f"{c.name}: nothing ran on the DSA"
    assert len(c.launches) == len(regions)
    for launch in c.launches:
        want = run_region(regions[launch.program.name], launch.inputs)
        assert set(want) >= set(launch.outputs)
        for name, got in launch.outputs.items():
            np.testing.assert_array_equal(got, want[name],
                                          err_msg=f"{c.name}/{c.hw}: {launch.program.name}:{name}")


@pytest.mark.parametrize("net", NETS)
def test_output_within_one_step_of_onnxruntime(net, request):
    c: Compiled = request.getfixturevalue(net)
    assert c.got.shape == c.ref.shape
    assert np.ptp(c.ref) > 10 * c.step, "a degenerate (near-constant) output proves nothing"
    diff = np.abs(c.got.astype(np.float64) - c.ref) / c.step
    frac = float((diff > 0.5).mean())
    print(f"{c.name} on '{c.hw}': {frac:.4f} of {diff.size} outputs differ from onnxruntime "
          f"(max {diff.max():.2f} steps)")
    # integer softmax / LayerNorm on the [norm] units replace onnxruntime's float ones:
    # their bound (isa.intnorm: one step each, compounding through the block) is 2 steps
    bound = 2.0 if _norms_on_dsa(c.report) else 1.0
    assert diff.max() <= bound + 1e-3, f"{c.name}: {diff.max():.3f} quantization steps off"
    assert frac < 0.25


@pytest.mark.parametrize("net", ["resnet18_default", "resnet18_edge", "mobilenet_default"])
def test_cnn_macs_on_the_dsa(net, request):
    c: Compiled = request.getfixturevalue(net)
    share, dsa, total = _mac_shares(c.report)
    print(f"{c.name} on '{c.hw}': {share:.2%} of {total:,} MACs on the DSA")
    assert share >= 0.95, str(c.report)
    assert all(d.target == "dsa" for d in c.report.regions), str(c.report)
    ran = sum(int(ly["macs"]) for la in c.launches for ly in la.program.meta["layers"])
    assert ran == dsa


def test_mobilenet_depthwise_relu6_on_the_dsa(mobilenet_default):
    layers = [ly for d in mobilenet_default.report.regions if d.target == "dsa"
              for ly in d.region.layers]
    dw = [ly for ly in layers if getattr(ly, "depthwise", False)]
    assert len(dw) >= 3
    # onnxruntime's quantizer folds relu6 (Clip 0..6) into the output range: the depthwise
    # layers requantize into [0, 6] (zero point -128, at most 6 / 255 per step)
    assert not any(n.op_type == "Clip" for n in mobilenet_default.model.graph.node)
    for ly in dw:
        assert ly.requant.zero_point == -128, ly.name
        assert float(np.max(ly.output.scale)) * 255 <= 6.0 * (1 + 1e-6), ly.name


def test_encoder_matmuls_on_dsa_rest_on_cpu_with_reasons(encoder_default):
    rep = encoder_default.report
    share, dsa, total = _mac_shares(rep)
    print(f"transformer_encoder: {share:.2%} of {total:,} MACs on the DSA")
    ops = [type(ly).__name__ for d in rep.regions if d.target == "dsa" for ly in d.region.layers]
    # q, k, v, out, ffn.up, ffn.down: 16 tokens x (4 * 64 * 64 + 2 * 64 * 128)
    assert ops.count("Dense") == 6, str(rep)
    # attention: Q @ K^T and P @ V over 2 heads, operands packed by the host
    assert ops.count("BatchMatmul") == 2, str(rep)
    # the projection biases onnxruntime leaves as separate Adds, and GELU's "+ 1"
    assert ops.count("BiasAdd") == 7, str(rep)
    cpu = rep.partition.cpu_ops
    assert not [op for op in cpu if op.op in ("relax.add", "relax.matmul")], str(rep)
    assert dsa == total == 16 * (4 * 64 * 64 + 2 * 64 * 128) + 2 * 2 * 16 * 16 * 32
    # the [norm] unit runs both LayerNorms; the softmax is on the DSA or kept on the CPU
    # by the cost model, with its reason
    assert ops.count("LayerNorm") == 2, str(rep)
    soft = [d for d in rep.regions if d.region is not None
            and any(type(ly).__name__ == "Softmax" for ly in d.region.layers)]
    assert len(soft) == 1 and (soft[0].target == "dsa" or soft[0].reason), str(rep)
    # GELU's erf chain is a function of one int8 tensor: an activation table on the DSA
    assert "Table" in ops and not [op for op in cpu if "erf" in op.op], str(rep)


def _norms_on_dsa(rep) -> bool:
    return any(type(ly).__name__ in ("Softmax", "LayerNorm", "RMSNorm")
               for d in rep.regions if d.target == "dsa" and d.region is not None
               for ly in d.region.layers)


def test_cost_model_keeps_a_tiny_region_on_the_cpu():
    model = get_model("small_cnn", input_size=8, width=4, num_classes=4)
    cfg = dsa_tvm.load_config("default").replace(cpu_gmacs=1000.0)
    tvm.compile(from_onnx(model, keep_params_in_input=False), target=dsa_tvm.target(cfg))
    rep = dsa_tvm.last_compile_report()
    assert rep.regions and all(d.target == "cpu" for d in rep.regions), str(rep)
    for d in rep.regions:
        if d.dsa_us is not None:
            assert d.reason == "the CPU is estimated faster"
            assert d.dsa_us > d.cpu_us  # the DSA time includes the launch overhead
    slow = [d for d in rep.regions if d.reason == "the CPU is estimated faster"]
    assert slow and all(d.dsa_us is not None and d.cpu_us is not None for d in slow), str(rep)
    assert "the CPU is estimated faster" in str(rep)

"""QDQ models with Softmax / LayerNormalization / RMSNorm, quantized with ``quantize_norms``
and compiled for a DSA with [norm] units: the norms run on the DSA in one region with the
matmuls around them, every launch bit-exact against the room's integer reference
(``run_region``), and the output close to FP32. Without units they stay on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import dsa_tvm  # noqa: E402
from dsa_tvm.models.graph import GraphBuilder  # noqa: E402
from dsa_tvm.models.transformer import transformer_encoder  # noqa: E402
from dsa_tvm.quant.api import quantize_onnx  # noqa: E402
from dsa_tvm.runtime import take_launches  # noqa: E402
from tir_schedules.kinds import run_region  # noqa: E402

#: a host so slow that every region is offloaded (the tests are about values, not choice)
FAST_DSA = dict(cpu_gmacs=1e-6, launch_overhead_us=0.0)
T, D = 10, 40


def _model(kind: str):
    """x (1, T, D) -> Linear -> <kind> -> Linear -> y, the norm as exporters write it."""
    g = GraphBuilder(kind, 0)
    rng = np.random.default_rng(1)
    h = g.linear("x", D, D, "l1")
    if kind == "softmax":
        h = g.op("Softmax", [h], axis=-1)
    elif kind == "layernorm":
        h = g.op("LayerNormalization", [h, g.const("g", rng.uniform(0.5, 1.5, D)),
                                        g.const("b", rng.normal(0, 0.2, D))], axis=-1,
                 epsilon=1e-5)
    else:
        ms = g.op("ReduceMean", [g.op("Pow", [h, g.const("two", np.array(2.0))])], axes=[-1],
                  keepdims=1)
        rt = g.op("Sqrt", [g.op("Add", [ms, g.const("eps", np.array(1e-5))])])
        h = g.op("Mul", [g.op("Div", [h, rt]), g.const("w", rng.uniform(0.5, 1.5, D))])
    y = g.linear(h, D, D, "l2")
    return g.build([("x", (1, T, D))], [(y, (1, T, D))], "tokens")


def _compile_run(model, cfg, feeds, wide_norms: bool = False):
    qm = quantize_onnx(model, feeds, show_progress=False, quantize_norms=True,
                       wide_norms=wide_norms)
    ex = tvm.compile(qm.to_relax(), target=dsa_tvm.target(cfg))
    crep = dsa_tvm.compile_report(ex)
    take_launches()
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(feeds[0]["x"]))
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    return got, take_launches(), crep


def _exact(launches, crep) -> None:
    regions = {d.name: d.region for d in crep.regions if d.target == "dsa"}
    for launch in launches:
        want = run_region(regions[launch.program.name], launch.inputs)
        for k, v in launch.outputs.items():
            np.testing.assert_array_equal(v, want[k], err_msg=f"{launch.program.name}:{k}")


def _feeds(shape, n=4):
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(n)]


def _layer_types(crep) -> list[list[str]]:
    return [[type(ly).__name__ for ly in d.region.layers] for d in crep.regions
            if d.target == "dsa" and d.region is not None]


@pytest.mark.parametrize("kind,layer", [("softmax", "Softmax"), ("layernorm", "LayerNorm"),
                                        ("rmsnorm", "RMSNorm")])
def test_norm_between_matmuls_in_one_region(kind, layer):
    cfg = dsa_tvm.load_config("default").replace(norm_units=1, **FAST_DSA)
    feeds = _feeds((1, T, D))
    got, launches, crep = _compile_run(_model(kind), cfg, feeds)
    assert _layer_types(crep) == [["Dense", layer, "Dense"]], str(crep.partition)
    assert len(launches) == 1
    _exact(launches, crep)
    none = cfg.replace(norm_units=0)
    _, launches, crep = _compile_run(_model(kind), none, feeds)
    assert not any(layer in types for types in _layer_types(crep))
    assert any("no [norm] units" in c.reason for c in crep.partition.cpu_ops), str(crep.partition)


@pytest.mark.parametrize("wide_norms", [False, True])
def test_encoder_block_norms_and_softmax_on_the_dsa(wide_norms):
    """A BERT encoder block: both LayerNorms and the softmax on the DSA, every launch exact
    against the integer reference, the output within the integer kernels' error of FP32;
    with ``wide_norms`` the norms read and write int16 (their stream's grids)."""
    from dsa_tvm.models.quantize import run_onnxruntime

    model = transformer_encoder(seq_len=8, hidden=32, heads=2, ffn=64)
    feeds = _feeds((1, 8, 32))
    cfg = dsa_tvm.load_config("default").replace(norm_units=1, **FAST_DSA)
    got, launches, crep = _compile_run(model, cfg, feeds, wide_norms)
    norms = [ly for d in crep.regions if d.target == "dsa" and d.region is not None
             for ly in d.region.layers if type(ly).__name__ == "LayerNorm"]
    assert len(norms) == 2, str(crep.partition)
    assert {(ly.input.dtype, ly.output.dtype) for ly in norms} == (
        {("int16", "int16")} if wide_norms else {("int8", "int8")})
    types = [t for r in _layer_types(crep) for t in r]
    assert types.count("Softmax") == 1, str(crep.partition)
    _exact(launches, crep)
    ref = run_onnxruntime(model, feeds[0], optimize=False)[0]
    cos = float((got * ref).sum() / np.sqrt((got * got).sum() * (ref * ref).sum()))
    assert cos > 0.97

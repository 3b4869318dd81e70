"""Codegen of every layer kind through the real TIR path, bit-exact against the reference.

Each test builds a :class:`Region` by hand (random int8 data, random requantize
parameters from ``semantics.quantize_multiplier``), compiles it with
``compile_region`` (TE compute -> schedule -> TIR walker -> program), runs the
program on the simulator and compares every output with
``tir_schedules.kinds.run_region``, which must agree bit for bit. Shapes are
small and drawn by hypothesis; every test runs on the three bundled presets
(``edge`` 8x8 array with a 512-row accumulator, ``default`` 16x16, ``large``
32x32), whose block sizes and scratchpads change the tiling.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("tvm")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dsa_tvm.hw.config import HardwareConfig, load_config  # noqa: E402
from dsa_tvm.isa import semantics as sem  # noqa: E402
from dsa_tvm.layers import ir as L  # noqa: E402
from dsa_tvm.layers.host_pack import pack_region_input  # noqa: E402
from dsa_tvm.layers.layouts import unpack_activation  # noqa: E402
from dsa_tvm.lowering.region import compile_region, lowering_supports  # noqa: E402
from dsa_tvm.sim.simulator import Simulator  # noqa: E402
from tir_schedules.kinds import (
    recipe,  # noqa: E402
    run_region,  # noqa: E402
)
from tir_schedules.options import options  # noqa: E402

PRESETS = ("edge", "default", "large")
CFGS = {name: load_config(name) for name in PRESETS}
FEW = settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))


# ----------------------------------------------------------------------------- builders
def qt(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> L.QTensor:
    return L.QTensor(name, tuple(shape), 0.05, int(rng.integers(-128, 128)))


def requant(rng: np.random.Generator, channels: int, scale: float,
            per_channel: bool | None = None) -> L.Requant:
    """Multipliers around ``scale`` (the 1/spread of the accumulator, so outputs neither
    all saturate nor all round to the zero point); clip none, ReLU or ReLU6-like."""
    if per_channel is None:
        per_channel = bool(rng.integers(2))
    n = channels if per_channel else 1
    pairs = [sem.quantize_multiplier(float(f)) for f in scale * rng.uniform(0.25, 4, n)]
    zp = int(rng.integers(-128, 128))
    clip = [(-128, 127), (zp, 127), (zp, min(127, zp + int(rng.integers(1, 100))))][
        int(rng.integers(3))]
    return L.Requant(np.array([p[0] for p in pairs], np.int32),
                     np.array([p[1] for p in pairs], np.int32), zp, clip)


def conv(rng, x: L.QTensor, cout: int, k: int, stride: int, pad: int, name: str = "conv",
         depthwise: bool = False, dilation: int = 1) -> L.Conv2d:
    n, c, h, w = x.shape
    oh = (h + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    ow = (w + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    cout = c if depthwise else cout
    wgt = rng.integers(-128, 128, (cout, 1 if depthwise else c, k, k), dtype=np.int8)
    spread = 74 * 74 * math.sqrt(wgt[0].size)  # std of a sum of int8 x int8 products
    return L.Conv2d(name, x, qt(rng, f"{name}_y", (n, cout, oh, ow)), wgt,
                    rng.integers(-50000, 50000, cout).astype(np.int32), (stride, stride),
                    (pad, pad, pad, pad), (dilation, dilation), c if depthwise else 1,
                    requant(rng, cout, 40 / spread))


def dense(rng, x: L.QTensor, n_out: int, name: str = "dense") -> L.Dense:
    k = x.shape[-1]
    wgt = rng.integers(-128, 128, (n_out, k), dtype=np.int8)
    return L.Dense(name, x, qt(rng, f"{name}_y", x.shape[:-1] + (n_out,)), wgt,
                   rng.integers(-50000, 50000, n_out).astype(np.int32),
                   requant(rng, n_out, 40 / (74 * 74 * math.sqrt(k))))


def batch_matmul(rng, a: L.QTensor, b: L.QTensor, name: str = "bmm") -> L.BatchMatmul:
    k = a.shape[-1]
    return L.BatchMatmul(name, a, b, qt(rng, f"{name}_y", a.shape[:-1] + b.shape[-1:]),
                         requant(rng, 1, 40 / (74 * 74 * math.sqrt(k)), per_channel=False))


def pool(rng, x: L.QTensor, kind: str, k: int, stride: int, pad: int,
         name: str = "pool") -> L.Pool2d:
    n, c, h, w = x.shape
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    scale = 0.5 / (k * k) if kind == "avg" else 0.5
    return L.Pool2d(name, kind, x, qt(rng, f"{name}_y", (n, c, oh, ow)), (k, k),
                    (stride, stride), (pad, pad, pad, pad), requant(rng, c, scale))


def gap(rng, x: L.QTensor, flat: bool, name: str = "gap") -> L.GlobalAvgPool:
    n, c, h, w = x.shape
    return L.GlobalAvgPool(name, x, qt(rng, f"{name}_y", (n, c) if flat else (n, c, 1, 1)),
                           requant(rng, c, 0.5 / (h * w)))


def add(rng, a: L.QTensor, b: L.QTensor, name: str = "add") -> L.Add:
    """Rescale factors as ``relay_passes.kinds.add`` derives them (2**21 range, shared shift)."""
    ra, rb = rng.uniform(0.2, 2, 2)
    shift = 20 - math.floor(math.log2(max(ra, rb)))
    rq = L.Requant(np.array([1], np.int32), np.array([shift], np.int32),
                   int(rng.integers(-128, 128)), (-128, 127))
    return L.Add(name, a, b, qt(rng, f"{name}_y", a.shape), int(round(ra * 2 ** shift)),
                 int(round(rb * 2 ** shift)), rq)


def bias_add(rng, x: L.QTensor, name: str = "bias_add") -> L.BiasAdd:
    """A per-channel constant addend at the shared shift, as ``relay_passes.kinds.add`` builds it."""
    c = x.shape[1] if len(x.shape) == 4 else x.shape[-1]
    ra, rb = rng.uniform(0.2, 2, 2)
    shift = 20 - math.floor(math.log2(max(ra, rb)))
    rq = L.Requant(np.array([1], np.int32), np.array([shift], np.int32),
                   int(rng.integers(-128, 128)), (-128, 127))
    bias = rng.integers(-255, 256, c) * int(round(rb * 2 ** shift))
    return L.BiasAdd(name, x, qt(rng, f"{name}_y", x.shape), int(round(ra * 2 ** shift)),
                     bias.astype(np.int32), rq)


def rescale(rng, x: L.QTensor, name: str = "rescale") -> L.Rescale:
    c = x.shape[1] if len(x.shape) == 4 else x.shape[-1]
    return L.Rescale(name, x, qt(rng, f"{name}_y", x.shape), requant(rng, c, 1.0))


def region(inputs: list[L.QTensor], layers: list[L.Layer],
           outputs: list[L.QTensor] | None = None) -> L.Region:
    return L.Region("r", inputs, outputs or [layers[-1].output], layers)


def check(reg: L.Region, cfg: HardwareConfig, rng: np.random.Generator, choose_knobs=None,
          xs: dict[str, np.ndarray] | None = None):
    """Compile, simulate, compare every output with the reference; the simulator result.
    ``xs``: the inputs (default: random int8 codes)."""
    if xs is None:
        xs = {t.name: rng.integers(-128, 128, t.shape, dtype=np.int8) for t in reg.inputs}
    want = run_region(reg, xs)
    prog = compile_region(reg, cfg, choose_knobs).program
    feeds = {}
    for k, v in xs.items():
        feeds.update(pack_region_input(k, v, prog.meta["io"][k], cfg.block_in, cfg.block_out))
    res = Simulator(cfg).run(prog, feeds)
    for t in reg.outputs:
        got = unpack_activation(res.outputs[t.name], t.shape)
        bad = np.argwhere(got != want[t.name])
        assert not len(bad), (f"{cfg.name}: {t.name} differs at {len(bad)} of {got.size} "
                              f"points, first {tuple(bad[0])}: {got[tuple(bad[0])]} != "
                              f"{want[t.name][tuple(bad[0])]}")
    return res


def channels(draw, cfg: HardwareConfig) -> int:
    """1 .. 2.5 blocks: partial blocks and several channel tiles on every preset."""
    return draw(st.integers(1, 5 * cfg.block_out // 2))


# ----------------------------------------------------------------------------- one layer
@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_conv2d(preset, data):
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    k, stride = draw(st.sampled_from([(1, 1), (3, 1), (3, 2)]))
    x = qt(rng, "x", (draw(st.integers(1, 2)), channels(draw, cfg), draw(st.integers(3, 8)),
                      draw(st.integers(3, 8))))
    ly = conv(rng, x, channels(draw, cfg), k, stride, draw(st.integers(0, k // 2)))
    check(region([x], [ly]), cfg, rng)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_dense(preset, data):
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = qt(rng, "x", (draw(st.integers(1, 6)), draw(st.integers(1, 3 * cfg.block_in))))
    check(region([x], [dense(rng, x, channels(draw, cfg))]), cfg, rng)


def depthwise_engine(engine: str):
    """Run depthwise convs on one engine for a while (the ``depthwise_engine`` option)."""
    return options(depthwise_engine=engine)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_batch_matmul(preset, data):
    """Two activations (attention): the host packs b into weight tiles and the zero-point
    terms."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bt, m = draw(st.integers(1, 4)), draw(st.integers(1, 20))
    k, n = channels(draw, cfg), channels(draw, cfg)
    a, b = qt(rng, "a", (bt, m, k)), qt(rng, "b", (bt, k, n))
    check(region([a, b], [batch_matmul(rng, a, b)]), cfg, rng)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("engine", ["vector", "array"])
@FEW
@given(data=st.data())
def test_depthwise(preset, engine, data):
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    k, dil = draw(st.sampled_from([(3, 1), (3, 2), (5, 1)]))
    span = dil * (k - 1) + 1
    x = qt(rng, "x", (draw(st.integers(1, 2)), channels(draw, cfg), draw(st.integers(span, 9)),
                      draw(st.integers(span, 9))))
    ly = conv(rng, x, 0, k, draw(st.sampled_from([1, 2])), draw(st.integers(0, k // 2)),
              depthwise=True, dilation=dil)
    with depthwise_engine(engine):
        check(region([x], [ly]), cfg, rng)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("kind", ["max", "avg"])
@FEW
@given(data=st.data())
def test_pool2d(preset, kind, data):
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    k = draw(st.sampled_from([2, 3]))
    x = qt(rng, "x", (draw(st.integers(1, 2)), channels(draw, cfg), draw(st.integers(k, 9)),
                      draw(st.integers(k, 9))))
    ly = pool(rng, x, kind, k, draw(st.sampled_from([1, 2])), draw(st.integers(0, k // 2)))
    check(region([x], [ly]), cfg, rng)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_global_avg_pool(preset, data):
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = qt(rng, "x", (draw(st.integers(1, 3)), channels(draw, cfg), draw(st.integers(1, 9)),
                      draw(st.integers(1, 9))))
    check(region([x], [gap(rng, x, draw(st.booleans()))]), cfg, rng)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_add_and_rescale(preset, data):
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    c = channels(draw, cfg)
    shape = draw(st.sampled_from([(draw(st.integers(1, 2)), c, draw(st.integers(1, 7)),
                                   draw(st.integers(1, 7))), (draw(st.integers(1, 9)), c)]))
    a, b = qt(rng, "a", shape), qt(rng, "b", shape)
    ly = add(rng, a, b)
    rs = rescale(rng, ly.output)
    check(region([a, b], [ly, rs], [ly.output, rs.output]), cfg, rng)
    check(region([a], [add(rng, a, a)]), cfg, rng)  # both operands one tensor
    check(region([a], [bias_add(rng, a)]), cfg, rng)


# ----------------------------------------------------------------------------- any schedule
def _vector_regions(rng, cfg: HardwareConfig) -> list[L.Region]:
    b = cfg.block_out
    x = qt(rng, "x", (2, 3 * b - 1, 6, 5))
    return [region([x], [conv(rng, x, 0, 3, 1, 1, depthwise=True)]),
            region([x], [pool(rng, x, "max", 3, 2, 1)]),
            region([x], [gap(rng, x, True)]),
            region([x], [rescale(rng, x)]),
            region([x], [bias_add(rng, x)])]


@pytest.mark.parametrize("preset", PRESETS)
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_vector_layers_any_knobs(preset, data):
    """Every schedule the knobs allow is exact, not only the default one: tiles narrower
    than the image in channels (one LOAD per input row, border rows folded into the pad
    fields), single and double buffering, reductions split over several input tiles;
    depthwise on either engine."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    reg = draw(st.sampled_from(_vector_regions(rng, cfg)))
    with depthwise_engine(draw(st.sampled_from(["vector", "array"]))):
        r = recipe(reg.layers[0], cfg, consts=False)
        knobs = draw(st.sampled_from(r.kind.candidates(cfg, r.shape)))
        check(reg, cfg, rng, lambda c, s: knobs)


def test_wide_border_becomes_fill_rows():
    """A 7x7 depthwise window with a 3-pixel border on a 100-pixel-wide image, one channel
    block per tile: 3 x 106 border rows exceed the 8-bit LOAD pad fields, so they are
    written by ALU MOVs and the real rows by one LOAD each."""
    from dsa_tvm.isa.instructions import Alu, AluOp
    from tir_schedules.kinds.window import WindowKnobs

    cfg, rng = CFGS["default"], np.random.default_rng(7)
    x = qt(rng, "x", (1, 2 * cfg.block_out, 4, 100))
    reg = region([x], [conv(rng, x, 0, 7, 1, 3, depthwise=True)])
    with depthwise_engine("vector"):
        res = check(reg, cfg, rng, lambda c, s: WindowKnobs(1, 100, 1, True))
    movs = [i for i in res.program.instructions if isinstance(i, Alu) and i.op == AluOp.MOV]
    assert any(m.loops[-1].extent >= 3 * 106 for m in movs)


# ----------------------------------------------------------------------------- regions
@pytest.mark.parametrize("preset", PRESETS)
def test_mixed_region(preset):
    """conv -> depthwise -> conv (inverted residual) + add with the input, then max and
    average pooling, global pooling to (N, C) and a dense layer on the pooled rows."""
    cfg, rng = CFGS[preset], np.random.default_rng(11)
    c = cfg.block_out + 3
    x = qt(rng, "x", (2, c, 8, 8))
    expand = conv(rng, x, 2 * c, 1, 1, 0, "expand")
    dw = conv(rng, expand.output, 0, 3, 1, 1, "dw", depthwise=True)
    project = conv(rng, dw.output, c, 1, 1, 0, "project")
    res = add(rng, project.output, x, "res")
    mp = pool(rng, res.output, "max", 3, 2, 1, "maxpool")
    ap = pool(rng, mp.output, "avg", 2, 1, 0, "avgpool")
    g = gap(rng, ap.output, True, "gap")
    fc = dense(rng, g.output, 10, "fc")
    reg = region([x], [expand, dw, project, res, mp, ap, g, fc], [res.output, fc.output])
    check(reg, cfg, rng)


@pytest.mark.parametrize("preset", PRESETS)
def test_strided_depthwise_chain(preset):
    """Stride-2 depthwise with ReLU6-style clip into a rescale and a residual of two
    layer outputs (a tensor read by two later layers)."""
    cfg, rng = CFGS[preset], np.random.default_rng(5)
    x = qt(rng, "x", (1, 2 * cfg.block_out, 9, 9))
    d1 = conv(rng, x, 0, 3, 2, 1, "dw1", depthwise=True)
    d2 = conv(rng, d1.output, 0, 3, 1, 1, "dw2", depthwise=True)
    rs = rescale(rng, d1.output, "rs")
    s = add(rng, d2.output, rs.output, "sum")
    check(region([x], [d1, d2, rs, s]), cfg, rng)


# ----------------------------------------------------------------------------- support
def test_lowering_supports_reasons():
    cfg, rng = CFGS["default"], np.random.default_rng(0)
    x = qt(rng, "x", (1, 32, 8, 8))
    assert lowering_supports(conv(rng, x, 16, 3, 1, 1), cfg) is None
    assert lowering_supports(conv(rng, x, 0, 3, 2, 1, depthwise=True), cfg) is None
    grouped = conv(rng, x, 16, 3, 1, 1)
    grouped = L.Conv2d("g", x, grouped.output, grouped.weight[:, :16], grouped.bias,
                       (1, 1), (1, 1, 1, 1), (1, 1), 2, grouped.requant)
    assert "grouped conv2d" in lowering_supports(grouped, cfg)
    a, b = qt(rng, "a", (2, 4, 8)), qt(rng, "b", (2, 8, 4))
    bmm = L.BatchMatmul("bmm", a, b, qt(rng, "y", (2, 4, 4)), requant(rng, 1, 1e-3))
    assert lowering_supports(bmm, cfg) is None
    bad = L.BatchMatmul("bmm", a, qt(rng, "b", (3, 8, 4)), bmm.output, bmm.requant)
    assert "(B, M, K) x (B, K, N)" in lowering_supports(bad, cfg)
    big = qt(rng, "big", (1, 8, 30, 30))  # one 23x23 window: 529 rows > edge's 512
    assert "ACC" in lowering_supports(pool(rng, big, "max", 23, 1, 0), CFGS["edge"])
    assert lowering_supports(add(rng, x, qt(rng, "b", (1, 32, 4, 16))), cfg) is not None


def test_partition_keeps_unlowerable_layers_alone(tmp_path):
    """A max pool whose smallest tile overflows the edge part's accumulator stays on the
    CPU with that reason; the conv before it is still offloaded."""
    pytest.importorskip("onnxruntime")
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    from relay_passes.partition import partition_for_dsa

    from .. import qdq_models as qm

    path = qm.single_op_net(tmp_path, "MaxPool", shape=(1, 8, 30, 30), kernel_shape=[23, 23])
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    _, report = partition_for_dsa(mod, CFGS["edge"])
    assert [ly.split()[0] for r in report.regions for ly in r.layers] == ["Conv2d"]
    reasons = [c.reason for c in report.cpu_ops if c.op == "relax.nn.max_pool2d"]
    assert len(reasons) == 1 and "accumulator" in reasons[0], reasons


def test_batch_matmuls_get_regions_of_their_own(tmp_path):
    """Attention: the dense layers merge into "dsa" regions; each batch matmul is a region
    of its own (the host packs its operands), even where a dense layer produces one."""
    pytest.importorskip("onnxruntime")
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    from relay_passes.partition import partition_for_dsa

    from .. import qdq_models as qm

    mod = from_onnx(onnx.load(qm.attention_net(tmp_path)), keep_params_in_input=False)
    _, report = partition_for_dsa(mod, CFGS["default"])
    kinds = [[ly.split()[0] for ly in r.layers] for r in report.regions]
    assert sum(k.count("Dense") for k in kinds) == 3, kinds
    assert sorted(k for k in kinds if "BatchMatmul" in k) == [["BatchMatmul"]] * 2, kinds
    assert not [c for c in report.cpu_ops if c.op == "relax.matmul"]

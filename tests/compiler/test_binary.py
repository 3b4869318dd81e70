"""Two-input element-wise layers (issue 13.2): the product of two activations and the
broadcasting add, on the DSA.

Two checks, as for the other layers: the DSA program against the integer reference
(``run_region``) bit for bit, over shapes of rank 3 to 5, broadcast patterns, tiny
scales and saturation on all presets; and the QDQ graph compiled for the DSA against
TVM's own llvm build of it. The llvm build computes ``dq(a) * dq(b) / s_y`` in float32
and rounds half to even, the DSA rounds the exact integer product half up: the two may
differ by one step, and only where the exact value is within float32 error of a
rounding tie, which the test checks point by point.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.isa import semantics as sem
from dsa_tvm.layers import ir as L
from dsa_tvm.layers.layouts import broadcast_dims
from dsa_tvm.runtime import take_launches
from tir_schedules.kinds import recipe, room_of, run_region

from .. import qdq_models as qm
from .test_dense_ranks import FAST_LLVM, _always_offload
from .test_lowering import CFGS, PRESETS, check, qt, region

FEW = settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))


# ----------------------------------------------------------------------------- shapes
@st.composite
def broadcast_pair(draw, cfg=None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(full shape, operand shape): rank 3-5, the operand per channel ([N, C, 1, 1]),
    per image or per pixel run, or full; left-trimmed sometimes (numpy rules)."""
    rank = draw(st.integers(3, 5))
    c = draw(st.integers(1, 40))
    ch = 1 if rank == 4 else rank - 1
    dims = [draw(st.integers(1, 4)) for _ in range(rank)]
    dims[ch] = c
    pix = [i for i in range(rank) if i != ch]
    cut = draw(st.integers(0, len(pix)))
    outer_full = draw(st.booleans())
    b = list(dims)
    for k, i in enumerate(pix):
        if (k < cut) != outer_full:
            b[i] = 1
    if rank != 4 and b[0] == 1 and draw(st.booleans()):
        b = b[1:]  # numpy broadcasting pads on the left (4-D is NCHW: same rank only)
    return tuple(dims), tuple(b)


def _requant(rng, factor: float, zp: int, clip=(-128, 127)) -> L.Requant:
    m, s = sem.quantize_multiplier(factor)
    return L.Requant(np.array([m], np.int32), np.array([s], np.int32), zp, clip)


# ----------------------------------------------------------------------------- layers
@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_mul_matches_reference(preset, data):
    """Mul of two activations, the second broadcasting or not; factors from tiny (all
    outputs at the zero point) to saturating, zero points 0 or not (ops dropped)."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ashape, bshape = draw(broadcast_pair())
    if isinstance(broadcast_dims(ashape, bshape), str):
        return
    za, zb = (draw(st.sampled_from([0, int(rng.integers(-128, 128))])) for _ in range(2))
    a, b = L.QTensor("a", ashape, 0.05, za), L.QTensor("b", bshape, 0.05, zb)
    factor = draw(st.sampled_from([1e-12, 2.0 ** -14, 1 / 4000, 0.01, 3.0]))
    clip = draw(st.sampled_from([(-128, 127), (0, 127), (-20, 30)]))
    ly = L.Mul("mul", a, b, qt(rng, "y", ashape), _requant(rng, factor, int(rng.integers(-128, 128)),
                                                           clip))
    check(region([a, b], [ly]), cfg, rng)
    sq = L.Mul("square", a, a, qt(rng, "y2", ashape), ly.requant)  # x * x: one tensor twice
    check(region([a], [sq]), cfg, rng)


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_int16_operands_match_reference(preset, data):
    """A product reading int16 codes (ACC16 loads: an LLM's ``silu(gate) * up`` on int16
    grids), either operand or both, broadcasting or not, into int16 or int8; codes from
    both ends of int16 (products near 2**30) and factors from tiny to saturating."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ashape, bshape = draw(broadcast_pair())
    if isinstance(broadcast_dims(ashape, bshape), str):
        return
    da, db = draw(st.sampled_from([("int16", "int16"), ("int16", "int8"), ("int8", "int16")]))
    a = L.QTensor("a", ashape, 1e-3, 0, da)
    b = L.QTensor("b", bshape, 1e-3, 0 if db == "int16" else int(rng.integers(-128, 128)), db)
    wide = draw(st.booleans())
    factor = draw(st.sampled_from([1e-12, 2.0 ** -20, 1e-4, 3.0]))
    y = L.QTensor("y", ashape, 0.05, 0, "int16") if wide else qt(rng, "y", ashape)
    clip = L.WIDE_CLIP if wide else (-128, 127)
    ly = L.Mul("mul", a, b, y, _requant(rng, factor, 0 if wide else y.zero_point, clip))

    def codes(t: L.QTensor) -> np.ndarray:
        lim = 1 << (15 if t.dtype == "int16" else 7)
        out = rng.integers(-lim, lim, t.shape).astype(t.dtype)
        out.reshape(-1)[0] = -lim                     # the most negative code
        return out

    check(region([a, b], [ly]), cfg, rng, xs={"a": codes(a), "b": codes(b)})


@pytest.mark.parametrize("preset", PRESETS)
@FEW
@given(data=st.data())
def test_broadcast_add_matches_reference(preset, data):
    """Add of an activation and one broadcasting per channel, chained into a Mul of the
    result with the same gate (one region), any schedule the knobs allow."""
    cfg, draw = CFGS[preset], data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ashape, bshape = draw(broadcast_pair())
    if ashape == bshape or isinstance(broadcast_dims(ashape, bshape), str):
        return
    a, b = qt(rng, "a", ashape), qt(rng, "b", bshape)
    ra, rb = rng.uniform(0.2, 2, 2)
    shift = 20 - int(np.floor(np.log2(max(ra, rb))))
    add = L.Add("add", a, b, qt(rng, "s", ashape), int(round(ra * 2 ** shift)),
                int(round(rb * 2 ** shift)), L.Requant(np.array([1], np.int32),
                                                       np.array([shift], np.int32), 3))
    assert room_of(add).name == "binary"
    mul = L.Mul("mul", add.output, b, qt(rng, "y", ashape), _requant(rng, 1 / 3000, -5))
    r = recipe(mul, cfg, consts=False)
    knobs = draw(st.sampled_from(r.kind.candidates(cfg, r.shape)))
    check(region([a, b], [add, mul], [add.output, mul.output]), cfg, rng,
          lambda c, s: knobs if s == r.shape else None)


def test_broadcast_reads_the_gate_once_per_tile():
    """The gate [N, C, 1, 1] is not repeated: DRAM reads are the two inputs' own bytes
    (plus the output-stage table), not twice the image."""
    cfg, rng = CFGS["default"], np.random.default_rng(1)
    a, b = qt(rng, "a", (2, 32, 8, 8)), qt(rng, "b", (2, 32, 1, 1))
    ly = L.Mul("mul", a, b, qt(rng, "y", a.shape), _requant(rng, 1e-3, 0))
    res = check(region([a, b], [ly]), cfg, rng)
    c = res.counters
    image = 2 * 32 * 64
    read = c["dram_read_bytes"]
    assert image <= read < image + 2 * 2 * 32 * 8 + 3 * 4 * 32 * 2, c


def test_same_shape_adds_stay_in_the_eltwise_room():
    """Residual adds keep their room (their programs do not change)."""
    a, b = L.QTensor("a", (1, 8, 4, 4), 0.1, 0), L.QTensor("b", (1, 8, 4, 4), 0.1, 0)
    rq = L.Requant(np.array([1], np.int32), np.array([20], np.int32), 0)
    assert room_of(L.Add("add", a, b, a, 1 << 20, 1 << 20, rq)).name == "eltwise"


@pytest.mark.parametrize("a,b,why", [
    ((1, 8, 4, 4), (1, 1, 4, 4), "channels"),
    ((2, 8, 4, 4), (1, 8, 4, 1), "alternating"),
    ((1, 8, 4), (2, 8, 4), "broadcast"),
])
def test_unsupported_broadcasts_say_why(a, b, why):
    assert why in broadcast_dims(a, b)


# ----------------------------------------------------------------------------- vs llvm
def _graph(path, ashape, bshape, op: str, scales, zps, act: str | None, seed: int):
    """x -> QDQ, g -> QDQ -> op(x, g) [-> Relu] -> QDQ (the DSA's pattern)."""
    g = qm.QDQGraph(seed)
    (sa, sb, sy), (za, zb, zy) = scales, zps
    y = g.op(op, [g.qdq("x", sa, za), g.qdq("g", sb, zb)])
    if act == "relu":
        y = g.op("Relu", [y])
    y = g.qdq(y, sy, zy)
    return g.save(path / f"{op}_{seed}.onnx", {"x": ashape, "g": bshape}, y, ashape)


def _run(ex, *xs) -> np.ndarray:
    return relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(x) for x in xs]).numpy()


def _near_tie(v: np.ndarray) -> np.ndarray:
    """Where an exact value is within float32 error of a rounding tie."""
    frac = v - np.floor(v)
    return np.abs(frac - 0.5) <= 1e-5 * np.maximum(1, np.abs(v))


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=broadcast_pair(), op=st.sampled_from(["Mul", "Add"]),
       act=st.sampled_from([None, "relu"]), tiny=st.booleans(), seed=st.integers(0, 2**16))
def test_qdq_graph_matches_llvm(tmp_path, pair, op, act, tiny, seed):
    """Mul / broadcasting Add of two QDQ activations through the whole front end: one
    region on the DSA, within one step of llvm and different only at rounding ties."""
    ashape, bshape = pair
    if isinstance(broadcast_dims(ashape, bshape), str):
        return
    rng = np.random.default_rng(seed)
    sa, sb = rng.uniform(0.005, 0.1, 2)
    sy = sa * sb * (rng.uniform(2, 40) if not tiny else rng.uniform(3000, 20000))
    if op == "Add":
        sy = max(sa, sb) * (rng.uniform(0.3, 3) if not tiny else 60)
    za, zb, zy = (int(v) for v in rng.integers(-100, 100, 3))
    path = _graph(tmp_path, ashape, bshape, op, (sa, sb, sy), (za, zb, zy), act, seed)
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    qa = rng.integers(-128, 128, ashape)
    qb = rng.integers(-128, 128, bshape)
    x = (np.float32(sa) * (qa - za)).astype(np.float32)  # exact grid points: no input ties
    gt = (np.float32(sb) * (qb - zb)).astype(np.float32)
    want = _run(tvm.compile(mod, target=tvm.target.Target(FAST_LLVM)), x, gt)
    take_launches()
    ex = dsa_tvm.compile(mod, _always_offload("default"))
    rep = dsa_tvm.last_compile_report()
    assert [d.target for d in rep.regions] == ["dsa"], str(rep)
    got = _run(ex, x, gt)
    launches = take_launches()
    assert launches, "nothing ran on the DSA"
    reg = rep.regions[0].region
    for la in launches:
        for name, arr in la.outputs.items():
            np.testing.assert_array_equal(arr, run_region(reg, la.inputs)[name])
    steps = np.rint((got - want) / np.float32(sy))
    assert np.abs(steps).max() <= 1, str(rep)
    a64, b64 = (qa - za).astype(np.float64), (qb - zb).astype(np.float64)
    if op == "Mul":
        exact = a64 * b64 * (np.float32(sa) * np.float64(np.float32(sb))) / np.float32(sy)
    else:
        exact = (a64 * np.float32(sa) + b64 * np.float32(sb)) / np.float32(sy)
    exact = exact + zy
    off = np.argwhere(steps != 0)
    inside = (exact > -128.5) & (exact < 127.5)
    assert _near_tie(exact)[tuple(off.T)][inside[tuple(off.T)]].all(), (
        f"{len(off)} outputs differ away from a tie")


def test_rounding_ties_differ_by_one_step_from_llvm(tmp_path):
    """Power-of-two scales with factor 1/2: every odd product is an exact tie. The DSA
    rounds it half up (as every DSA layer requantizes), llvm half to even: they differ
    by exactly one step at the ties whose floor is even, and nowhere else."""
    shape = (1, 16, 4, 4)
    path = _graph(tmp_path, shape, (1, 16, 1, 1), "Mul", (2.0 ** -4, 2.0 ** -4, 2.0 ** -7),
                  (0, 0, 0), None, 0)
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    rng = np.random.default_rng(0)
    qa, qb = rng.integers(-11, 12, shape), rng.integers(-11, 12, (1, 16, 1, 1))
    x, gt = (np.float32(2.0 ** -4) * qa).astype(np.float32), (np.float32(2.0 ** -4) * qb).astype(
        np.float32)
    want = _run(tvm.compile(mod, target=tvm.target.Target(FAST_LLVM)), x, gt)
    got = _run(dsa_tvm.compile(mod, _always_offload("default")), x, gt)
    steps = np.rint((got - want) / 2.0 ** -7)
    prod = qa * qb
    tie_up = (prod % 2 == 1) & ((prod // 2) % 2 == 0)  # x.5 with an even floor: llvm rounds down
    np.testing.assert_array_equal(steps, tie_up.astype(np.float64))
    assert tie_up.sum() > 10


def test_layer_scale_matches_llvm(tmp_path):
    """x * per-channel constant (negative and zero entries): a Rescale with signed
    per-channel multipliers; x / 6 (a scalar, so a function of one int8 tensor's codes):
    the activation table. Both on the DSA, within one step of llvm."""
    g = qm.QDQGraph(3)
    c = 12
    scale = np.linspace(-2, 2, c).astype(np.float32)
    scale[3] = 0.0
    y = g.op("Mul", [g.qdq("x", 0.04, 7), g.const(scale.reshape(1, c, 1, 1))])
    y = g.qdq(y, 0.05, -3)
    y = g.qdq(g.op("Div", [y, g.const(np.array(6, np.float32))]), 0.01, 2)
    path = g.save(tmp_path / "layer_scale.onnx", {"x": (2, c, 5, 3)}, y, (2, c, 5, 3))
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    x = (0.04 * (np.random.default_rng(0).integers(-128, 128, (2, c, 5, 3)) - 7)).astype(np.float32)
    want = _run(tvm.compile(mod, target=tvm.target.Target(FAST_LLVM)), x)
    ex = dsa_tvm.compile(mod, _always_offload("default"))
    rep = dsa_tvm.last_compile_report()
    kinds = [type(ly).__name__ for d in rep.regions if d.target == "dsa" for ly in d.region.layers]
    assert kinds == ["Rescale", "Table"], str(rep)
    got = _run(ex, x)
    assert np.abs(got - want).max() <= 0.01 * 1.01, str(rep)
    assert (got != want).mean() < 0.05


def test_channel_broadcast_of_an_activation_stays_on_the_cpu(tmp_path):
    """[N, 1, H, W] * [N, C, H, W] would spread one lane over all: CPU, with the reason,
    and llvm's answer."""
    path = _graph(tmp_path, (1, 8, 4, 4), (1, 1, 4, 4), "Mul", (0.05, 0.05, 0.01), (0, 0, 0),
                  None, 1)
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    rng = np.random.default_rng(0)
    x, gt = (rng.standard_normal(s).astype(np.float32) for s in ((1, 8, 4, 4), (1, 1, 4, 4)))
    ex = dsa_tvm.compile(mod, _always_offload("default"))
    rep = str(dsa_tvm.last_compile_report())
    assert "broadcasts over the channels" in rep, rep
    np.testing.assert_array_equal(_run(ex, x, gt),
                                  _run(tvm.compile(mod, target=tvm.target.Target(FAST_LLVM)), x, gt))


def test_silu_product_with_its_own_qdq(tmp_path):
    """SiLU as a quantizer keeping x and sigmoid(x) as separate QDQ tensors: the whole
    chain is a function of x's codes, so one activation table on the DSA (the product
    kind takes it where the operands are different tensors), within one step of llvm."""
    g = qm.QDQGraph(4)
    x = g.qdq("x", 0.03, -5)
    s = g.qdq(g.op("Sigmoid", [x]), 1 / 256, -128)
    y = g.qdq(g.op("Mul", [x, s]), 0.025, -10)
    path = g.save(tmp_path / "silu.onnx", {"x": (1, 24, 6, 6)}, y, (1, 24, 6, 6))
    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    xin = (0.03 * (np.random.default_rng(2).integers(-128, 128, (1, 24, 6, 6)) + 5)).astype(
        np.float32)
    want = _run(tvm.compile(mod, target=tvm.target.Target(FAST_LLVM)), xin)
    ex = dsa_tvm.compile(mod, _always_offload("default"))
    rep = dsa_tvm.last_compile_report()
    kinds = [type(ly).__name__ for d in rep.regions if d.target == "dsa" for ly in d.region.layers]
    assert kinds == ["Table"], str(rep)
    got = _run(ex, xin)
    assert np.abs(got - want).max() <= 0.025 * 1.01
    assert (got != want).mean() < 0.05

"""Channel slices (ONNX Slice on axis 1, C2f's split) as DMA copies inside a region: the
slice joins the convs around it, every launch is bit-exact against the integer reference
(``run_region``) and the network within one output step of TVM's llvm build of the same
quantized module, over channel counts and block-aligned offsets (the last piece partial
when it ends at the last channel) and spatial sizes. Unaligned ranges, other axes and
strides stay on the CPU with the constraint named; the room's DRAM bytes respect the
compulsory ones."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dsa_tvm  # noqa: E402
from dsa_tvm.layers.ir import QTensor, Slice  # noqa: E402
from tir_schedules.kinds import movement  # noqa: E402

from ..qdq_models import make_model, node, rand  # noqa: E402
from .test_conv1d import _check_against_references, _compile  # noqa: E402

BLOCK = dsa_tvm.load_config("default").block_out


def slice_net(c: int, hw: tuple[int, int], begin: int, end: int, axis: int = 1,
              step: int = 1, seed: int = 0):
    """Conv 3x3 -> Relu -> Slice -> Conv 1x1: the slice reads and feeds interior int8 tensors."""
    rng = np.random.default_rng(seed)
    kept = len(range(begin, end, step)) if axis == 1 else c
    inits = {"W": rand(rng, c, 3, 3, 3, scale=0.5), "W2": rand(rng, 4, kept, 1, 1),
             "st": np.array([begin], np.int64), "en": np.array([end], np.int64),
             "ax": np.array([axis], np.int64), "sp": np.array([step], np.int64)}
    nodes = [node("Conv", ["x", "W"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv"),
             node("Relu", ["c"], ["a"], name="act"),
             node("Slice", ["a", "st", "en", "ax", "sp"], ["s"], name="slice"),
             node("Conv", ["s", "W2"], ["y"], kernel_shape=[1, 1], name="head")]
    return make_model(nodes, inits, {"x": (1, 3, *hw)}, {"y": None})


def _slices(rep) -> list[Slice]:
    return [ly for d in rep.regions if d.target == "dsa" for ly in d.region.layers
            if isinstance(ly, Slice)]


@st.composite
def _aligned(draw):
    c = draw(st.integers(BLOCK + 1, 3 * BLOCK + 5))
    begin = BLOCK * draw(st.integers(0, (c - 1) // BLOCK))
    ends = [e for e in range(begin + BLOCK, c, BLOCK)] + [c]
    ends = [e for e in ends if (begin, e) != (0, c)]  # the whole tensor is no slice
    return c, begin, draw(st.sampled_from(ends))


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(cbe=_aligned(), hw=st.tuples(st.integers(1, 9), st.integers(1, 9)))
def test_channel_slice_joins_the_region_bit_exact(cbe, hw):
    c, begin, end = cbe
    qm, ex, rep, feed = _compile(slice_net(c, hw, begin, end))
    sl = _slices(rep)
    assert len(sl) == 1 and sl[0].begin == begin and sl[0].output.shape[1] == end - begin
    dsa = [d for d in rep.regions if d.target == "dsa"]
    assert len(dsa) == 1 and len(dsa[0].region.layers) == 3, str(rep)
    _check_against_references(qm, ex, rep, feed)


@pytest.mark.parametrize("begin,end,axis,step,why", [
    (3, 2 * BLOCK, 1, 1, "blocks"),            # unaligned begin
    (0, BLOCK + 3, 1, 1, "blocks"),            # unaligned end short of the last channel
    (0, 2 * BLOCK, 1, 2, "stride"),            # strided channels
    (1, 4, 2, 1, "axes"),                      # a row slice
])
def test_unsupported_slices_fall_back_with_a_reason(begin, end, axis, step, why):
    qm, ex, rep, feed = _compile(slice_net(2 * BLOCK + 4, (6, 6), begin, end, axis, step))
    cpu = [op for op in rep.partition.cpu_ops if op.op == "relax.strided_slice"]
    assert cpu and why in cpu[0].reason, str(rep)
    _check_against_references(qm, ex, rep, feed)


def test_slice_room_moves_at_least_the_compulsory_bytes():
    """Physics: the room's cycles cover the kept channels in and out at the bandwidth."""
    cfg = dsa_tvm.load_config("default")
    x = QTensor("x", (1, 3 * BLOCK, 5, 7), 0.1, 0)
    y = QTensor("y", (1, BLOCK, 5, 7), 0.1, 0)
    rec = movement.slice_recipe(Slice("s", x, y, BLOCK), cfg, False)
    k = movement.default_move_knobs(cfg, rec.shape)
    read, write = movement.KIND.bounds(Slice("s", x, y, BLOCK))
    assert read == write == BLOCK * 35
    cycles = movement.estimate_move_cycles(cfg, rec.shape, k)
    assert cycles >= (read + write) / cfg.bandwidth_bytes_per_cycle



def test_c2f_split_stays_one_region():
    """YOLOv8's C2f: conv -> split in halves -> conv on one half + residual add ->
    concat(halves, add) -> conv, with block-aligned halves: one DSA region, one launch."""
    rng = np.random.default_rng(3)
    h = BLOCK
    inits = {"W1": rand(rng, 2 * h, 3, 1, 1), "W2": rand(rng, h, h, 3, 3, scale=0.3),
             "W3": rand(rng, 4, 3 * h, 1, 1), "ax": np.array([1], np.int64),
             "b0": np.array([0], np.int64), "b1": np.array([h], np.int64),
             "b2": np.array([2 * h], np.int64)}
    nodes = [node("Conv", ["x", "W1"], ["c1"], kernel_shape=[1, 1], name="cv1"),
             node("Relu", ["c1"], ["t"], name="r1"),
             node("Slice", ["t", "b0", "b1", "ax"], ["p0"], name="s0"),
             node("Slice", ["t", "b1", "b2", "ax"], ["p1"], name="s1"),
             node("Conv", ["p1", "W2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                  name="blk"),
             node("Relu", ["c2"], ["r2"], name="r2"),
             node("Add", ["p1", "r2"], ["p2"], name="res"),
             node("Concat", ["p0", "p1", "p2"], ["cat"], axis=1, name="cat"),
             node("Conv", ["cat", "W3"], ["y"], kernel_shape=[1, 1], name="cv2")]
    qm, ex, rep, feed = _compile(make_model(nodes, inits, {"x": (1, 3, 6, 5)}, {"y": None}))
    dsa = [d for d in rep.regions if d.target == "dsa"]
    assert len(dsa) == 1 and len(_slices(rep)) == 2, str(rep)
    assert {op.op for op in rep.partition.cpu_ops} <= {"relax.quantize", "relax.dequantize"}, \
        str(rep)
    _check_against_references(qm, ex, rep, feed)


def rows_slice_net(lead: tuple[int, ...], t: int, d: int, begin: int, end: int, n: int = 8,
                   step: int = 1, seed: int = 0):
    """x (*lead, t, d) -> MatMul -> Slice rows [begin, end) of axis -2 -> MatMul: an LLM's
    last token between its final projection and its logits, or a window of a sequence."""
    rng = np.random.default_rng(seed)
    rank = len(lead) + 2
    inits = {"W0": rand(rng, d, d), "W": rand(rng, d, n), "st": np.array([begin], np.int64),
             "en": np.array([end], np.int64), "ax": np.array([rank - 2], np.int64),
             "sp": np.array([step], np.int64)}
    nodes = [node("MatMul", ["x", "W0"], ["h"], name="proj"),
             node("Slice", ["h", "st", "en", "ax", "sp"], ["s"], name="last"),
             node("MatMul", ["s", "W"], ["y"], name="head")]
    return make_model(nodes, inits, {"x": (*lead, t, d)}, {"y": None})


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(lead=st.sampled_from([(), (1,), (3,), (1, 2, 2)]), t=st.integers(2, 40),
       d=st.integers(1, 40), data=st.data())
def test_rows_slice_joins_the_region_bit_exact(lead, t, d, data):
    begin = data.draw(st.integers(0, t - 1))
    end = data.draw(st.integers(begin + 1, t))
    if (begin, end) == (0, t):
        end -= 1
        if end == begin:
            return
    qm, ex, rep, feed = _compile(rows_slice_net(lead, t, d, begin, end))
    sl = _slices(rep)
    assert len(sl) == 1 and sl[0].axis == 1 and sl[0].begin == begin, str(rep)
    assert sl[0].output.shape[1] == end - begin
    assert len([d for d in rep.regions if d.target == "dsa"]) == 1, str(rep)   # one launch
    _check_against_references(qm, ex, rep, feed)


def test_a_strided_rows_slice_falls_back_with_a_reason():
    qm, ex, rep, feed = _compile(rows_slice_net((1,), 12, 16, 0, 12, step=2))
    cpu = [op for op in rep.partition.cpu_ops if op.op == "relax.strided_slice"]
    assert cpu and "second-to-last axis, step 1" in cpu[0].reason, str(rep)
    _check_against_references(qm, ex, rep, feed)

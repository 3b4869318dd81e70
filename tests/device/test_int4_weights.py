"""int4 weight tiles (``Buffer.WGT4``, ``dram.int4_weights``): packing, the LOAD that
unpacks them, the container that carries them, and the rules around them.

The reference machine reads the nibbles with Python integers, independently of
``isa.semantics.unpack_int4``; the same GEMM with int8 tiles is the second oracle.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.hw.config import load_config, with_overrides
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import Buffer
from dsa_tvm.isa.program import INT4, Program
from dsa_tvm.isa.semantics import pack_int4, unpack_int4
from dsa_tvm.sim.errors import SimulationError
from dsa_tvm.sim.simulator import Simulator

from .harness import run_and_check
from .reference_machine import build_sequential

CFG = load_config("default")
NO_INT4 = with_overrides(CFG, ["dram.int4_weights=false"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-8, 7), max_size=67))
def test_pack_then_unpack_is_the_identity(codes):
    c = np.array(codes, dtype=np.int8)
    packed = pack_int4(c)
    assert packed.dtype == np.uint8 and packed.size == (c.size + 1) // 2
    np.testing.assert_array_equal(unpack_int4(packed)[:c.size], c)


def test_nibble_order_is_low_first_twos_complement():
    assert pack_int4(np.array([1, -1, -8, 7], np.int8)).tolist() == [0xF1, 0x78]


@pytest.mark.parametrize("bad", [8, -9, 127])
def test_codes_outside_int4_are_refused(bad):
    with pytest.raises(ValueError, match=r"int4 codes lie in \[-8, 7\]"):
        pack_int4(np.array([0, bad], np.int16))


def _gemm(cfg, x, w, packed: bool, x_stride: int = 1) -> Program:
    """out = x @ (the tiles of ``w`` chosen by the load).T, w stored int4 or int8."""
    b = ProgramBuilder(cfg, "gemm4" if packed else "gemm8")
    bo = cfg.block_out
    rx = b.region("x", "input", x.shape)
    rw = b.region("w", "const", w.shape, INT4 if packed else "int8", data=w)
    out = b.region("out", "output", (x.shape[0], bo), "int32")
    buf = Buffer.WGT4 if packed else Buffer.WGT
    ntiles = (w.shape[0] + x_stride - 1) // x_stride
    b.load(Buffer.INP, 0, b.addr(rx, Buffer.INP), 1, x.shape[0])
    b.load(buf, 0, b.addr(rw, buf), ntiles, 1, x_stride)   # every x_stride-th tile
    for t in range(ntiles):  # out += x @ tile_t.T
        b.gemm(0, 0, t, [(x.shape[0], 1, 1, 0)], reset=t == 0)
    b.store(Buffer.ACC, 0, b.addr(out, Buffer.ACC), 1, x.shape[0])
    return build_sequential(b)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 12), tiles=st.integers(1, 5), stride=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_wgt4_gemm_is_bit_exact_with_the_reference_and_the_int8_tiles(rows, tiles, stride,
                                                                      seed):
    """Saturating inputs (-128..127) against the extreme codes -8 and 7 included."""
    rng = np.random.default_rng(seed)
    bi, bo = CFG.block_in, CFG.block_out
    x = rng.integers(-128, 128, (rows, bi), dtype=np.int8)
    x[0] = -128
    w = rng.integers(-8, 8, (tiles * stride, bo, bi), dtype=np.int8)
    w[0, 0] = -8
    got, _ = run_and_check(CFG, _gemm(CFG, x, w, True, stride), {"x": x})   # vs the reference
    want, _ = run_and_check(CFG, _gemm(CFG, x, w, False, stride), {"x": x})
    np.testing.assert_array_equal(got.outputs["out"], want.outputs["out"])
    # half the weight bytes leave DRAM; the scratchpad receives the same int8 tiles
    assert 2 * got.counters["dram_read_bytes.wgt"] == want.counters["dram_read_bytes.wgt"]


def test_batched_run_shares_int4_tiles_like_int8_ones():
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (4, 6, CFG.block_in), dtype=np.int8)
    w = rng.integers(-8, 8, (2, CFG.block_out, CFG.block_in), dtype=np.int8)
    prog = _gemm(CFG, x[0], w, True)
    batch = Simulator(CFG).run_batch(prog, {"x": x}).outputs["out"]
    for k in range(4):
        single = Simulator(CFG).run(prog, {"x": x[k]}).outputs["out"]
        np.testing.assert_array_equal(batch[k], single)


def test_int4_region_survives_the_container():
    w = np.random.default_rng(0).integers(-8, 8, (3, CFG.block_out, CFG.block_in), np.int8)
    x = np.ones((2, CFG.block_in), np.int8)
    prog = _gemm(CFG, x, w, True)
    again = Program.from_bytes(prog.to_bytes(CFG), CFG)
    region = again.region("w")
    assert region.dtype == INT4 and region.nbytes == w.size // 2
    np.testing.assert_array_equal(unpack_int4(np.frombuffer(region.data, np.uint8)),
                                  w.reshape(-1))
    np.testing.assert_array_equal(Simulator(CFG).run(again, {"x": x}).outputs["out"],
                                  Simulator(CFG).run(prog, {"x": x}).outputs["out"])


def test_wgt4_load_on_a_part_without_the_unpacker_is_refused():
    w = np.zeros((1, CFG.block_out, CFG.block_in), np.int8)
    prog = _gemm(NO_INT4, np.zeros((1, CFG.block_in), np.int8), w, True)
    with pytest.raises(SimulationError, match=r"WGT4.*int4_weights = false"):
        Simulator(NO_INT4).run(prog, {"x": np.zeros((1, CFG.block_in), np.int8)})

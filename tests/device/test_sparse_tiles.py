"""Structured-sparse weight tiles (``array.sparsity``, ``Buffer.WGTS``, ``Gemm.sparse``):
the compressed format, the LOAD that expands it, the GEMM that skips the pruned half,
its cycles, and the rules around them.

The reference machine decodes compressed tiles with Python integers, independently of
``isa.sparse_tiles``; the same GEMM over dense int8 tiles is the second oracle.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.hw.config import ConfigError, load_config, with_overrides
from dsa_tvm.hw.dataflow import gemm_cycles
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import Buffer
from dsa_tvm.isa.program import Program, ProgramError, sparse_dtype
from dsa_tvm.isa.sparse_tiles import is_n_m, pack_n_m, unpack_n_m
from dsa_tvm.sim.errors import SimulationError
from dsa_tvm.sim.simulator import Simulator

from .harness import prune_n_m, run_and_check
from .reference_machine import build_sequential

DENSE = load_config("default")
SPARSE = with_overrides(DENSE, ["array.sparsity=2:4"])
PATTERNS = [(1, 2), (2, 4), (1, 4), (4, 8), (2, 8), (1, 16), (8, 16)]


@settings(max_examples=150, deadline=None)
@given(pattern=st.sampled_from(PATTERNS), tiles=st.integers(1, 4), rows=st.sampled_from([1, 4, 16]),
       groups=st.integers(1, 4), seed=st.integers(0, 2**16), zeros=st.floats(0, 1))
def test_pack_then_unpack_is_the_identity(pattern, tiles, rows, groups, seed, zeros):
    """Random N:M tiles, saturating codes and groups with fewer than N nonzeros included."""
    n, m = pattern
    rng = np.random.default_rng(seed)
    t = rng.choice(np.array([-128, -1, 1, 127], np.int8), (tiles, rows, groups * m))
    t[rng.random(t.shape) < zeros] = 0
    t = prune_n_m(t, n, m)
    assert is_n_m(t, n, m)
    raw = pack_n_m(t, n, m)
    kept = rows * groups * n
    assert raw.shape == (tiles, kept + -(-kept * (m.bit_length() - 1) // 8))
    np.testing.assert_array_equal(unpack_n_m(raw, rows, groups * m, n, m), t)


def test_known_bytes_values_then_little_endian_indices():
    """One row of two 2:4 groups: values [5, -3 | 0, 7] at columns [1, 3 | 0, 2]."""
    t = np.array([[[0, 5, 0, -3, 0, 0, 7, 0]]], np.int8)
    raw = pack_n_m(t, 2, 4)[0].tolist()
    # the empty slot of group 2 keeps its lowest zero column (0); indices 1,3,0,2 in
    # 2 bits each, the first in the low bits: 0b10_00_11_01
    assert raw == [5, 253, 0, 7, 0b10001101]


def test_tiles_that_break_the_pattern_are_refused():
    t = np.zeros((1, 16, 16), np.int8)
    t[0, 3, 4:7] = 1                  # three nonzeros in one group of four
    assert not is_n_m(t, 2, 4) and is_n_m(t, 3, 4)
    with pytest.raises(ValueError, match="not 2:4 sparse"):
        pack_n_m(t, 2, 4)


def _gemm(cfg, x, w, sparse: bool, reduce_levels: bool = True) -> Program:
    """out = sum over tiles of x_t @ w_t.T, the tiles stored compressed (WGTS, a sparse
    GEMM) or int8: one GEMM whose reduction level walks the tiles."""
    b = ProgramBuilder(cfg, "gemms" if sparse else "gemm8")
    bi, bo = cfg.block_in, cfg.block_out
    tiles, rows = w.shape[0], x.shape[0] // w.shape[0]
    rx = b.region("x", "input", x.shape)
    rw = b.region("w", "const", w.shape, sparse_dtype(*SPARSE.sparse_n_m) if sparse else "int8",
                  data=w)
    out = b.region("out", "output", (rows, bo), "int32")
    buf = Buffer.WGTS if sparse else Buffer.WGT
    b.load(Buffer.INP, 0, b.addr(rx, Buffer.INP), 1, x.shape[0])
    b.load(buf, 0, b.addr(rw, buf), 1, tiles)
    # rows outer (one accumulator row each), the tiles inner: R = tiles reduction points
    b.gemm(0, 0, 0, [(rows, 1, 1, 0), (tiles, 0, rows, 1)], reset=True, sparse=sparse)
    b.store(Buffer.ACC, 0, b.addr(out, Buffer.ACC), 1, rows)
    assert bi == w.shape[2]
    return build_sequential(b)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 12), tiles=st.integers(1, 7), seed=st.integers(0, 2**16))
def test_sparse_gemm_is_bit_exact_and_takes_half_the_reduction_cycles(rows, tiles, seed):
    rng = np.random.default_rng(seed)
    bi, bo = SPARSE.block_in, SPARSE.block_out
    x = rng.integers(-128, 128, (tiles * rows, bi), dtype=np.int8)
    x[0] = -128
    w = prune_n_m(rng.integers(-128, 128, (tiles, bo, bi), dtype=np.int8), 2, 4)
    w[0, 0, :4] = [-128, -128, 0, 0]
    got, _ = run_and_check(SPARSE, _gemm(SPARSE, x, w, True), {"x": x})   # vs the reference
    want, _ = run_and_check(DENSE, _gemm(DENSE, x, w, False), {"x": x})
    np.testing.assert_array_equal(got.outputs["out"], want.outputs["out"])
    g, d = got.counters, want.counters
    assert g["dram_read_bytes.wgt"] * 256 == d["dram_read_bytes.wgt"] * 160   # 160-byte tiles
    assert 2 * g["macs"] == d["macs"]   # the array issues the kept half of the MACs
    sparse_gemm = gemm_cycles(SPARSE, [(rows, 1, 1, 0), (tiles, 0, rows, 1)], sparse=True)
    dense_gemm = gemm_cycles(DENSE, [(rows, 1, 1, 0), (tiles, 0, rows, 1)])
    fill = DENSE.gemm_fill_drain_cycles
    assert dense_gemm - fill == rows * tiles
    assert sparse_gemm - fill == rows * -(-tiles // 2)   # two reduction points a cycle


@settings(max_examples=200, deadline=None)
@given(loops=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 2), st.integers(0, 3),
                                st.integers(0, 2)), min_size=1, max_size=4),
       flow=st.sampled_from(["matrix-vector", "output-stationary"]),
       pattern=st.sampled_from([(2, 4), (1, 4), (1, 2)]))
def test_sparse_cycles_never_beat_the_kept_macs_nor_exceed_dense(loops, flow, pattern):
    """Physics: a sparse GEMM issues at least its kept MACs at the array's rate, and never
    costs more than the same nest dense."""
    cfg = with_overrides(DENSE, [f"array.dataflow={flow}",
                                 f"array.sparsity={pattern[0]}:{pattern[1]}"])
    dense = with_overrides(DENSE, [f"array.dataflow={flow}"])
    points = int(np.prod([lp[0] for lp in loops]))
    sparse = gemm_cycles(cfg, loops, sparse=True)
    assert sparse >= points * pattern[0] / pattern[1]
    assert sparse <= gemm_cycles(dense, loops)


def test_sparse_region_survives_the_container():
    rng = np.random.default_rng(0)
    w = prune_n_m(rng.integers(-128, 128, (3, 16, 16), dtype=np.int8), 2, 4)
    x = rng.integers(-128, 128, (6, 16), dtype=np.int8)
    prog = _gemm(SPARSE, x, w, True)
    again = Program.from_bytes(prog.to_bytes(SPARSE), SPARSE)
    region = again.region("w")
    assert region.dtype == "sparse2:4" and region.nbytes == 3 * 160
    assert region.offset % 160 == 0
    np.testing.assert_array_equal(Simulator(SPARSE).run(again, {"x": x}).outputs["out"],
                                  Simulator(SPARSE).run(prog, {"x": x}).outputs["out"])


def test_sparse_program_on_a_dense_part_is_refused():
    """A program compiled for the sparse part is refused by its fingerprint already; one
    stamped for the dense part by hand is refused for what it does."""
    w = np.zeros((1, 16, 16), np.int8)
    x = np.zeros((1, 16), np.int8)
    prog = _gemm(SPARSE, x, w, True)
    with pytest.raises(ProgramError, match="another hardware config"):
        Simulator(DENSE).run(prog, {"x": x})
    prog.fingerprint = DENSE.fingerprint
    with pytest.raises(SimulationError, match=r"structured-sparse array.*'dense'"):
        Simulator(DENSE).run(prog, {"x": x})


def test_sparse_gemm_reading_a_dense_loaded_tile_is_refused():
    """The array needs the indices a WGTS load stores; a WGT-loaded tile has none."""
    w = np.zeros((2, 16, 16), np.int8)
    b = ProgramBuilder(SPARSE, "mixed")
    rx = b.region("x", "input", (4, 16))
    rw = b.region("w", "const", w.shape, data=w)
    out = b.region("out", "output", (2, 16), "int32")
    b.load(Buffer.INP, 0, b.addr(rx, Buffer.INP), 1, 4)
    b.load(Buffer.WGT, 0, b.addr(rw, Buffer.WGT), 1, 2)
    b.gemm(0, 0, 0, [(2, 1, 1, 0), (2, 0, 2, 1)], reset=True, sparse=True)
    b.store(Buffer.ACC, 0, b.addr(out, Buffer.ACC), 1, 2)
    with pytest.raises(SimulationError, match="GEMM sparse reads weight tile 0.*dense load"):
        Simulator(SPARSE).run(build_sequential(b), {"x": np.zeros((4, 16), np.int8)})


@pytest.mark.parametrize("overrides, why", [
    (["array.sparsity=3:4"], "1 <= N < M"),
    (["array.sparsity=2:32"], "M = 32 must divide array.block_in"),
    (["array.sparsity=2:4", "array.dataflow=weight-stationary"], "weight-stationary"),
    (["array.sparsity=two of four"], '"N:M"'),
])
def test_bad_sparsity_descriptions_say_why(overrides, why):
    with pytest.raises(ConfigError, match="array.sparsity") as e:
        with_overrides(DENSE, overrides)
    assert why in str(e.value)


def test_sparse_array_widens_only_the_default_ports():
    assert SPARSE.inp_port == 2 * DENSE.inp_port and SPARSE.wgt_port == 2 * 160
    explicit = with_overrides(DENSE, ["array.sparsity=2:4", "array.inp_port_bytes=16"])
    assert explicit.inp_port == 16


@pytest.mark.parametrize("shape", [(16,), (2, 16, 6)])
def test_a_container_with_a_malformed_sparse_region_is_refused(shape):
    """A hostile header: compressed tiles whose shape has no whole groups."""
    prog = _gemm(SPARSE, np.zeros((1, 16), np.int8), np.zeros((1, 16, 16), np.int8), True)
    prog.region("w").shape = shape
    with pytest.raises(ProgramError, match="compressed 2:4 tiles has shape"):
        prog.to_bytes(SPARSE)

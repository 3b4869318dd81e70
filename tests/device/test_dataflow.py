"""The array's dataflow and output stage (``[array] dataflow``, ``[output] stage``) against
an independent closed-form systolic model (SCALE-Sim's per-fold counts), port widths,
and the pipelined output stage's ordering with the store that follows it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.hw.config import ConfigError, load_config
from dsa_tvm.hw.dataflow import gemm_cycles
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import AluOp, Buffer

from .harness import run

DATAFLOWS = ("matrix-vector", "weight-stationary", "output-stationary")


def closed_form(flow: str, m: int, k: int, n: int, r: int, c: int) -> int:
    """Compute cycles of an (m x k) @ (k x n) GEMM on an r x c array, as SCALE-Sim counts
    a layer run alone: weight-stationary folds the (k, n) weights into r x c tiles and
    streams the m rows through each (T = m); output-stationary folds the (m, n) outputs
    into r x c tiles and streams k through each; matrix-vector is one r-wide input row
    times one r x c tile per cycle plus one fill and drain."""
    if flow == "weight-stationary":
        return math.ceil(k / r) * math.ceil(n / c) * (m + 2 * r + c - 2)
    if flow == "output-stationary":
        return math.ceil(m / r) * math.ceil(n / c) * (k + r + c - 2)
    return m * math.ceil(k / r) * math.ceil(n / c) + r + c


def _nest(flow: str, m: int, kb: int, nb: int) -> list[tuple[int, int, int, int]]:
    """A GEMM instruction's loop nest for the matmul, in the order that suits ``flow``
    (extent, acc, inp, wgt strides): rows innermost for weight-stationary."""
    rows = (m, nb, kb, 0)
    red = (kb, 0, 1, 1)
    cols = (nb, 1, 0, kb)
    return [cols, red, rows] if flow == "weight-stationary" else [rows, cols, red]


@settings(max_examples=60, deadline=None)
@given(flow=st.sampled_from(DATAFLOWS), preset=st.sampled_from(("edge", "default", "large")),
       m=st.integers(1, 300), kb=st.integers(1, 9), nb=st.integers(1, 9))
def test_gemm_cycles_match_the_closed_form(flow, preset, m, kb, nb):
    cfg = load_config(preset).replace(dataflow=flow)
    r, c = cfg.block_in, cfg.block_out
    got = gemm_cycles(cfg, _nest(flow, m, kb, nb))
    assert got == closed_form(flow, m, kb * r, nb * c, r, c)


def test_matrix_vector_is_todays_cost():
    cfg = load_config("default")
    loops = [(3, 16, 0, 0), (5, 1, 2, 7), (4, 0, 1, 1)]
    assert gemm_cycles(cfg, loops) == 60 + cfg.block_in + cfg.block_out


def test_weight_stationary_on_a_matrix_vector_order_pays_a_preload_per_point():
    # reduction innermost: the weight changes every point, every point is its own fold
    cfg = load_config("default").replace(dataflow="weight-stationary")
    r, c = cfg.block_in, cfg.block_out
    assert gemm_cycles(cfg, [(10, 1, 1, 0), (6, 0, 1, 1)]) == 60 * (1 + 2 * r + c - 2)


@pytest.mark.parametrize("t", [1, 8, 16, 40])
def test_weight_double_buffer_hides_the_preload_behind_long_folds(t):
    cfg = load_config("default").replace(dataflow="weight-stationary")
    db = cfg.replace(weight_double_buffer=True)
    r, c = cfg.block_in, cfg.block_out
    loops = [(5, 0, 1, 1), (t, 1, 1, 0)]
    assert gemm_cycles(cfg, loops) == 5 * (r + t + r + c - 2)
    assert gemm_cycles(db, loops) == r + 5 * (t + r + c - 2) + 4 * max(0, r - t)


def test_narrow_ports_are_charged():
    cfg = load_config("default")
    tile = cfg.block_in * cfg.block_out
    mv = cfg.replace(wgt_port_bytes=tile // 4)  # a new tile every point: 4 cycles each
    assert gemm_cycles(mv, [(10, 0, 1, 1)]) == 40 + cfg.block_in + cfg.block_out
    # the same tile every point: the narrow weight port is never the limit
    assert gemm_cycles(mv, [(10, 1, 1, 0)]) == 10 + cfg.block_in + cfg.block_out
    half_inp = cfg.replace(inp_port_bytes=cfg.block_in // 2)
    assert gemm_cycles(half_inp, [(10, 1, 1, 0)]) == 20 + cfg.block_in + cfg.block_out
    ws = cfg.replace(dataflow="weight-stationary", wgt_port_bytes=cfg.block_out // 2)
    r, c = cfg.block_in, cfg.block_out
    assert gemm_cycles(ws, [(3, 0, 1, 1), (50, 1, 1, 0)]) == 3 * (2 * r + 50 + r + c - 2)


def test_fields_are_checked_and_sweepable():
    cfg = load_config("default")
    for bad in ({"dataflow": "systolic"}, {"stage": "fast"}, {"weight_double_buffer": 1},
                {"wgt_port_bytes": -1}):
        with pytest.raises(ConfigError):
            cfg.replace(**bad)
    swept = {(f, s): cfg.replace(dataflow=f, stage=s).fingerprint
             for f in DATAFLOWS for s in ("shared", "pipelined")}
    assert len(set(swept.values())) == len(swept)   # each point is its own description
    # at their defaults the new fields leave the fingerprint (and programs) as before
    assert cfg.replace(dataflow="matrix-vector").fingerprint == cfg.fingerprint


def _requant_then_store(cfg, tiles: int):
    """GEMM, REQUANT, STORE per tile, ping-ponging two accumulator tiles."""
    b = ProgramBuilder(cfg, "stage")
    rows = 64
    out = b.region("out", "output", (tiles * rows * cfg.block_out,))
    for t in range(tiles):
        base = (t % 2) * rows
        b.gemm(base, 0, 0, [(rows, 1, 0, 0), (4, 0, 1, 1)], reset=True,
               pop_next=t >= 2)
        b.alu(AluOp.REQUANT, base, base, 2 * rows, [(rows, 1, 1, 0)], imm=0, push_next=True)
        b.store(Buffer.ACC8, base, b.addr(out, Buffer.ACC8) + t * rows, 1, rows, pop_prev=True,
                push_prev=t < tiles - 2)
    b.finish()
    return b.build()


def test_pipelined_output_stage_overlaps_and_keeps_the_store_behind():
    shared = load_config("default")
    piped = shared.replace(stage="pipelined")
    res = {n: run(c, _requant_then_store(c, 6), timing_only=True)
           for n, c in (("shared", shared), ("pipelined", piped))}
    assert res["pipelined"].cycles < res["shared"].cycles
    sched, prog = res["pipelined"].schedule, _requant_then_store(piped, 6)
    alu_cost = 64 * piped.alu_cycles_per_row + piped.alu_latency_cycles
    for i, ins in enumerate(prog.instructions):
        if ins.opcode.name == "ALU":
            assert sched.end[i] - sched.start[i] >= alu_cost   # the stage did the work
            assert sched.release[i] == sched.start[i] + 1       # the engine only issued it
            assert sched.start[i + 1] >= sched.end[i]           # its store waits for it
    assert res["pipelined"].schedule.stage_busy == 6 * alu_cost


def test_gemm_waits_for_the_stage_on_rows_it_still_reads():
    cfg = load_config("default").replace(stage="pipelined")
    b = ProgramBuilder(cfg, "hazard")
    b.region("out", "output", (64 * cfg.block_out,))
    b.gemm(0, 0, 0, [(32, 1, 0, 0)], reset=True)
    b.alu(AluOp.REQUANT, 0, 0, 100, [(32, 1, 1, 0)], imm=0)
    b.gemm(0, 0, 0, [(32, 1, 0, 0)], reset=True)     # overwrites the rows being requantized
    b.gemm(40, 0, 0, [(8, 1, 0, 0)], reset=True)     # other rows: may overlap
    b.finish()
    sched = run(cfg, b.build(), timing_only=True).schedule
    assert sched.start[2] >= sched.end[1]
    hz = load_config("default").replace(stage="pipelined")
    b = ProgramBuilder(hz, "free")
    b.gemm(0, 0, 0, [(32, 1, 0, 0)], reset=True)
    b.alu(AluOp.REQUANT, 0, 0, 100, [(32, 1, 1, 0)], imm=0)
    b.gemm(40, 0, 0, [(8, 1, 0, 0)], reset=True)
    b.finish()
    sched = run(hz, b.build(), timing_only=True).schedule
    assert sched.start[2] == sched.start[1] + 1


def test_with_overrides_reads_cli_assignments():
    from dsa_tvm.hw.config import with_overrides

    cfg = with_overrides(load_config("default"), ["array.dataflow=weight-stationary",
                                                  "array.weight_double_buffer=true",
                                                  "output.stage=pipelined", "block_in=32"])
    assert (cfg.dataflow, cfg.weight_double_buffer, cfg.stage, cfg.block_in) == (
        "weight-stationary", True, "pipelined", 32)
    for bad in (["array.nope=1"], ["dataflow"], ["array.dataflow=diagonal"]):
        with pytest.raises(ConfigError):
            with_overrides(load_config("default"), bad)


def test_cli_set_reaches_the_description(capsys):
    from dsa_tvm.cli import main

    assert main(["demo", "--set", "array.dataflow=output-stationary"]) == 0
    assert main(["demo", "--set", "array.dataflow=bogus"]) == 2
    assert "array.dataflow" in capsys.readouterr().err

"""``benchmarks/bench_sim.py`` keeps timing programs the compiler generates, exactly.

A small run (a 64^3 dense layer and two ResNet-50 conv rows): every row's output is
bit-identical to numpy and to the CPU reference, and on ``edge`` the layer the
compiler keeps on the CPU gets a row that says why instead of stopping the run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("tvm")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sim.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_sim", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_rows_are_exact(capsys):
    _bench().main(["--reps", "1", "--matmul-size", "64", "--layers", "s4.c1b,s3.c2/2"])
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.endswith(("  yes", "  NO"))]
    assert [ln.split()[0] for ln in rows] == ["matmul", "s3.c2/2", "s4.c1b", "ResNet-50"], rows
    assert all(ln.endswith("  yes") for ln in rows), rows


def test_bench_names_layers_left_on_the_cpu(capsys):
    _bench().main(["--preset", "edge", "--reps", "1", "--only", "conv",
                   "--layers", "s4.c2,s4.c1b"])
    out = capsys.readouterr().out
    assert "s4.c2" in out and "not lowered, stays on the CPU" in out and "scratchpad" in out
    assert "left out of the total (the compiler keeps them on the CPU): s4.c2" in out
    with pytest.raises(SystemExit):
        _bench().main(["--layers", "s9.c9"])

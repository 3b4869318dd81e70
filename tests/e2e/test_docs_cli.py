"""The generated references are current, and the command line does its job."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dsa_tvm.cli import main
from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.docgen import generate


def test_generated_docs_are_up_to_date():
    for path, text in generate().items():
        assert path.exists(), f"{path} missing: run `dsa-tvm docs`"
        assert path.read_text() == text, f"{path} is stale: run `dsa-tvm docs`"


def test_isa_reference_lists_every_field_with_its_width():
    from dsa_tvm.isa.formats import FORMATS

    text = generate()[next(p for p in generate() if p.name == "isa.md")]
    cfg = load_config("default")
    for fmt in FORMATS.values():
        for fd, _off, _width in fmt.widths(cfg):
            assert f"`{fd.name}`" in text
        assert f"| **total** | | {fmt.total_bits(load_config('edge'))} | " \
               f"{fmt.total_bits(cfg)} |" in text


def test_device_demo_runs_bit_exact(capsys, tmp_path):
    trace = tmp_path / "t.json"
    prog = tmp_path / "demo.dsa"
    assert main(["demo", "--trace", str(trace), "--save", str(prog)]) == 0
    out = capsys.readouterr().out
    assert "bit-exact against the numpy reference: yes" in out
    assert "cycles" in out and "dram_read_bytes" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)
    # the saved container disassembles and runs again, timing only
    assert main(["disasm", str(prog)]) == 0
    assert "GEMM" in capsys.readouterr().out
    assert main(["sim", str(prog), "--timing-only"]) == 0


@pytest.mark.parametrize("preset", ["edge", "large"])
def test_demo_on_other_presets(capsys, preset):
    assert main(["demo", "--hw", preset]) == 0
    assert "yes" in capsys.readouterr().out


def test_run_writes_outputs(tmp_path, capsys):
    prog = tmp_path / "demo.dsa"
    main(["demo", "--save", str(prog)])
    from dsa_tvm.demo import demo_program

    _, inputs, ref = demo_program(load_config("default"))
    np.savez(tmp_path / "in.npz", **inputs)
    assert main(["sim", str(prog), "--inputs", str(tmp_path / "in.npz"),
                 "--outputs", str(tmp_path / "out.npz")]) == 0
    assert np.array_equal(np.load(tmp_path / "out.npz")["out"], ref)


def test_cli_errors_are_clear(capsys, tmp_path):
    prog = tmp_path / "demo.dsa"
    main(["demo", "--save", str(prog)])
    capsys.readouterr()
    assert main(["sim", str(prog), "--hw", "edge"]) == 2
    assert "built for another hardware config" in capsys.readouterr().err
    assert main(["demo", "--hw", "nosuchpart"]) == 2
    assert "unknown hardware preset 'nosuchpart'" in capsys.readouterr().err

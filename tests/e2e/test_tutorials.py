"""The tutorials run as a user runs them (a fresh interpreter, in a scratch folder) and
print what they promise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"


def run_tutorial(name: str, *args: str, cwd: Path) -> str:
    proc = subprocess.run([sys.executable, str(TUTORIALS / name), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def test_compile_and_run_tutorial(tmp_path):
    out = run_tutorial("01_compile_and_run.py", cwd=tmp_path)
    assert "DSA run report" in out and (tmp_path / "tutorial1.trace.json").is_file()
    m = re.search(r"top-1 DSA: (\d+)\s+onnxruntime: (\d+)", out)
    assert m and m.group(1) == m.group(2)


def test_tuning_tutorial(tmp_path):
    out = run_tutorial("02_tune.py", "--trials", "4", "--work-dir", "tune", cwd=tmp_path)
    assert "DSA tuning for 'default'" in out
    _check_tuned(out, tmp_path)


def _check_tuned(out: str, tmp_path) -> None:
    """A tuning tutorial's verdict: tuned no slower, same outputs, the database written."""
    m = re.search(r"DSA cycles: default schedules ([\d,]+), tuned ([\d,]+)", out)
    assert m, out
    default, tuned = (int(g.replace(",", "")) for g in m.groups())
    assert 0 < tuned <= default
    assert "outputs identical: True" in out
    assert (tmp_path / "tune" / "database_tuning_record.json").is_file()


def test_pytorch_tutorial(tmp_path):
    """A PyTorch model with a residual block goes through from_pytorch, compiles whole onto the
    DSA, matches TVM's LLVM build within one output step and torch's FP32 output by cosine,
    and the roofline, the breakdown and the per-layer CSV are written."""
    out = run_tutorial("03_pytorch_model.py", cwd=tmp_path)
    assert "DSA run report" in out and re.search(r":add\s+Add\s+DSA", out), out  # the residual
    assert re.search(r"100\.0% of MACs on the DSA", out), out
    m = re.search(r"max \|DSA - LLVM int8\|: (\d+) output step", out)
    assert m and int(m.group(1)) <= 1, out
    m = re.search(r"cosine DSA vs torch FP32: ([\d.]+)", out)
    assert m and float(m.group(1)) >= 0.99, out
    assert re.search(r"compute-bound|memory-bound", out)
    folder = tmp_path / "pytorch_out"
    for name in ("roofline.png", "breakdown.png"):
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"pytorch_out/{name}" in out
    lines = (folder / "layers.csv").read_text().splitlines()
    assert lines[0].startswith("name,op,target") and len(lines) > 8


def test_design_space_tutorial(tmp_path):
    """The sweep prints its table and writes CSV, JSON and the Pareto plot; the picked design
    is on the front, is saved as a description that loads, and the model compiled for it
    runs in the cycles the sweep counted."""
    import dsa_tvm

    out = run_tutorial("04_design_space.py", cwd=tmp_path)
    assert "sweep of small_cnn over 9 runs" in out, out
    folder = tmp_path / "sweep_out"
    assert (folder / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((folder / "sweep.csv").read_text().splitlines()) == 10
    assert (folder / "sweep.json").is_file()
    m = re.search(r"picked: (array=\d+ dram\.bandwidth_bytes_per_cycle=\d+): ", out)
    assert m, out
    front = out.split("Pareto front of small_cnn", 1)[1].split("picked:", 1)[0]
    assert m.group(1) in front
    cfg = dsa_tvm.load_config(folder / "small_cnn_pick.toml")
    array, bandwidth = (int(v) for v in re.findall(r"=(\d+)", m.group(1)))
    assert (cfg.block_in, cfg.block_out, cfg.bandwidth_bytes_per_cycle) == (array, array, bandwidth)
    m = re.search(r"small_cnn on small_cnn_pick: ([\d,]+) DSA cycles.*the sweep counted ([\d,]+) cycles",
                  out)
    assert m and m.group(1) == m.group(2), out


def test_rpc_tuning_tutorial(tmp_path):
    """Tuning measures on two RPC servers behind a tracker, the tuned build is no slower and
    computes the same outputs, and every process the tutorial started is gone."""
    import psutil

    out = run_tutorial("05_rpc_tuning.py", "--trials", "4", "--work-dir", "tune", cwd=tmp_path)
    assert out.count("dsa-tvm RPC server on 127.0.0.1:") == 2, out
    assert "2 free server(s)" in out and "DSA tuning for 'default'" in out, out
    served = re.findall(r"server (\d) \(pid \d+\) measured (\d+) candidate", out)
    assert served and all(who in ("1", "2") for who, _ in served), out
    m = re.search(r"measurements over RPC: (\d+) on (\d) server", out)
    assert m and int(m.group(1)) == sum(int(n) for _, n in served) > 0, out
    _check_tuned(out, tmp_path)
    assert "processes left running: 0" in out, out
    here = str(tmp_path)
    left = [p.info for p in psutil.process_iter(["pid", "cmdline", "cwd"]) if p.info["cwd"] == here]
    assert not left, left


def test_llm_decode_tutorial(tmp_path):
    """The tiny decoder streams its tokens with cycles, a decode step's launches are
    bit-exact, W8A8 perplexity stays near FP32's, and every context bucket runs below the
    DRAM roofline, plotted."""
    out = run_tutorial("06_llm_decode.py", "--tokens", "4", "--out", "llm", cwd=tmp_path)
    assert out.count("after a decode step:") == 3, out
    assert "bit-exact against the integer reference: True" in out, out
    m = re.search(r"perplexity: FP32 ([\d.]+), W8A8 on the DSA ([\d.]+)", out)
    assert m and abs(float(m.group(2)) / float(m.group(1)) - 1) < 0.1, out
    fractions = [int(f) for f in re.findall(r"^\s+\d+\s+[\d,]+\s+[\d,.]+\s+[\d,.]+\s+(\d+)%",
                                            out, re.M)]
    assert len(fractions) == 2 and all(0 < f <= 100 for f in fractions), out
    assert (tmp_path / "llm" / "decode.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert re.search(r"W4G32 at context \d+: [\d,.]+ tokens/s .*perplexity [\d.]+$", out,
                     re.M), out



def test_analog_cim_tutorial(tmp_path):
    """Noiseless crossbars are the digital part bit for bit; seeds are chips; the study's
    mitigations undo a year of drift; the plot is written; the crossbars read no weights."""
    out = run_tutorial("07_analog_cim.py", "--out", "cim", cwd=tmp_path)
    assert "outputs equal to the digital part's: True; weight bytes read" in out, out
    assert "same seed, same outputs: True; another seed, other outputs: True" in out, out
    year = re.findall(r"^adc 8, noise 0, t 1y(, mitigated)?\s+([\d.]+)", out, re.M)
    assert len(year) == 2 and float(year[1][1]) > float(year[0][1]) + 0.1, out
    assert (tmp_path / "cim" / "cim_sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert re.search(r"CIM \(cim-pcm\).*\(weights\s+0\)", out), out

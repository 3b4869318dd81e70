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
    m = re.search(r"DSA cycles: default schedules ([\d,]+), tuned ([\d,]+)", out)
    assert m, out
    default, tuned = (int(g.replace(",", "")) for g in m.groups())
    assert 0 < tuned <= default
    assert "outputs identical: True" in out
    assert (tmp_path / "tune" / "database_tuning_record.json").is_file()

"""The command line given what a new user gives it: every mistake ends in exit code 2 and
one line ``dsa-tvm: error: <cause>; <fix>`` on stderr (130 for Ctrl-C), never a
traceback, a silent success or a wait of minutes.

Each case ran into a traceback, a wrong exit code or a silent no-op before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dsa_tvm.cli import main
from dsa_tvm.hw.config import load_config, presets_dir

from ..qdq_models import conv_net, make_model, node, quantize, rand

ROOT = Path(__file__).resolve().parents[2]


def one_error_line(capsys, argv: list[str], *needles: str, code: int = 2) -> str:
    """Run the CLI; the exit code, and stderr ending in one error line naming ``needles``."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("dsa-tvm: error: ") and "; " in line, err
    assert "unexpected" not in line, line
    for n in needles:
        assert n in line, line
    return line


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return conv_net(tmp_path_factory.mktemp("model"), cin=16, cout=32, hw=8)


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    prog = tmp_path_factory.mktemp("prog") / "prog.dsa"
    assert main(["demo", "--save", str(prog)]) == 0
    return prog


def truncated(path: Path, tmp_path: Path) -> Path:
    out = tmp_path / "truncated.onnx"
    data = path.read_bytes()
    out.write_bytes(data[: len(data) // 2])
    return out


# ----------------------------------------------------------------------------- --hw
def test_a_folder_named_like_a_preset_does_not_shadow_it(tmp_path, monkeypatch, capsys):
    """``--hw edge`` with a folder ``edge`` here read the folder (IsADirectoryError)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "edge").mkdir()
    assert load_config("edge") == load_config(presets_dir() / "edge.toml")
    assert main(["hw", "edge"]) == 0
    got = capsys.readouterr()
    assert got.out.startswith("edge: ") and "Traceback" not in got.err
    assert "dsa-tvm: warning: --hw edge is the bundled preset 'edge', not the folder" in got.err
    (tmp_path / "edge.toml").mkdir()   # a .toml path means the path, and a folder is an error
    one_error_line(capsys, ["hw", "edge.toml"], "'edge.toml' is a folder")
    one_error_line(capsys, ["demo", "--hw", str(tmp_path)], "a folder, not a hardware description")


# ----------------------------------------------------------------------------- files
def test_folders_where_files_belong(tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    one_error_line(capsys, ["run", str(d)], "is a folder")
    one_error_line(capsys, ["disasm", str(d)], "is a folder", "program container")
    one_error_line(capsys, ["sim", str(d)], "is a folder")


def test_sim_inputs_must_be_an_npz_of_named_arrays(program, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros(3))
    one_error_line(capsys, ["sim", str(program), "--inputs", str(tmp_path / "x.npy")],
                   "one unnamed array", ".npz")
    (tmp_path / "junk.npz").write_bytes(b"not numpy")
    one_error_line(capsys, ["sim", str(program), "--inputs", str(tmp_path / "junk.npz")],
                   "not a NumPy file")
    one_error_line(capsys, ["sim", str(program), "--inputs", str(tmp_path / "none.npz")],
                   "not found")


def test_sim_timing_only_with_outputs_is_refused(program, tmp_path, capsys):
    """It wrote nothing and exited 0."""
    out = tmp_path / "o.npz"
    one_error_line(capsys, ["sim", str(program), "--timing-only", "--outputs", str(out)],
                   "--timing-only", "--outputs")
    assert not out.exists()
    assert main(["sim", str(program), "--outputs", str(out)]) == 0 and out.is_file()


def test_truncated_onnx_to_run_and_tune(model, tmp_path, capsys):
    bad = truncated(model, tmp_path)
    one_error_line(capsys, ["run", str(bad)], "cannot be read as ONNX", "truncated")
    one_error_line(capsys, ["tune", str(bad), "--work-dir", str(tmp_path / "w")],
                   "cannot be read as ONNX")


def test_run_with_a_two_input_model(tmp_path, capsys):
    rng = np.random.default_rng(0)
    two = make_model([node("Conv", ["x", "W"], ["c"]), node("Add", ["c", "z"], ["y"])],
                     {"W": rand(rng, 4, 4, 1, 1)}, {"x": (1, 4, 6, 6), "z": (1, 4, 6, 6)},
                     {"y": None})
    path = quantize(two, tmp_path, name="two")
    one_error_line(capsys, ["run", str(path)], "has 2 inputs (x, z)", "feeds one")


# ----------------------------------------------------------------------------- tune arguments
@pytest.mark.parametrize("flag,value", [("--trials", "-3"), ("--trials", "0"),
                                        ("--workers", "-2"), ("--workers", "many")])
def test_tune_budgets_below_one_are_refused(model, tmp_path, capsys, flag, value):
    """``--trials -3`` and ``--workers -2`` were accepted (one trial, one worker)."""
    with pytest.raises(SystemExit) as e:
        main(["tune", str(model), "--work-dir", str(tmp_path / "w"), flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and "Traceback" not in err
    assert not (tmp_path / "w").exists()


def test_tune_work_dir_problems(model, tmp_path, capsys, monkeypatch):
    f = tmp_path / "afile"
    f.write_text("")
    one_error_line(capsys, ["tune", str(model), "--work-dir", str(f)], "is a file")
    one_error_line(capsys, ["tune", str(model), "--work-dir", str(f / "sub")],
                   "cannot write the tuning database")
    ro = tmp_path / "readonly"
    ro.mkdir()
    ro.chmod(0o555)
    if os.access(ro, os.W_OK):   # root writes anyway: the file system refuses it instead
        real_touch = Path.touch

        def refuse(self, *a, **k):
            if self.parent == ro:
                raise PermissionError(13, "Permission denied", str(self))
            return real_touch(self, *a, **k)

        monkeypatch.setattr(Path, "touch", refuse)
    one_error_line(capsys, ["tune", str(model), "--work-dir", str(ro)],
                   "cannot write the tuning database", "Permission denied")


def test_truncated_database_line_names_file_and_line(model, tmp_path, capsys):
    work = tmp_path / "w"
    work.mkdir()
    (work / "database_workload.json").write_text('["a", 1]\n')
    (work / "database_tuning_record.json").write_text('[0, {"ok": 1}]\n[0, [[["GetSBl\n')
    line = one_error_line(capsys, ["tune", str(model), "--work-dir", str(work)],
                          "database_tuning_record.json, line 2", "delete that line")
    assert str(work) in line


def test_rpc_address_and_missing_tracker_fail_fast(model, tmp_path, capsys):
    """``--rpc localhost`` was a ValueError traceback; ``--rpc 127.0.0.1:1`` retried for
    141 s and then "succeeded" with one trial."""
    one_error_line(capsys, ["tune", str(model), "--work-dir", str(tmp_path / "w"), "--rpc",
                            "localhost"], "not a tracker address", "HOST:PORT")
    t0 = time.monotonic()
    one_error_line(capsys, ["tune", str(model), "--work-dir", str(tmp_path / "w"), "--rpc",
                            "127.0.0.1:1"], "no RPC tracker answers at 127.0.0.1:1")
    assert time.monotonic() - t0 < 60   # the bug retried for 141 s (60: a loaded machine)
    assert not (tmp_path / "w").exists()


def test_rpc_tracker_without_servers_under_the_key(model, tmp_path, capsys):
    from tvm.rpc.tracker import Tracker

    from ..tuning.test_rpc_cli import _free_port_range

    base = _free_port_range(10)
    tracker = Tracker("127.0.0.1", port=base, port_end=base + 10, silent=True)
    try:
        t0 = time.monotonic()
        one_error_line(capsys, ["tune", str(model), "--work-dir", str(tmp_path / "w"), "--rpc",
                                f"127.0.0.1:{tracker.port}", "--rpc-key", "nokey"],
                       "no RPC server is registered", "under key 'nokey'")
        assert time.monotonic() - t0 < 60   # fails fast, not after the retries
    finally:
        tracker.terminate()


# ----------------------------------------------------------------------------- as a process
def _cli(*args: str, cwd: Path, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("DSA_TVM_TRACEBACK", None)
    return subprocess.Popen([sys.executable, "-m", "dsa_tvm.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_python_dash_m_prints_the_same_one_line_errors(model, tmp_path):
    """Run as ``python -m dsa_tvm.cli`` the CLI module is ``__main__``: a subcommand's error
    class must still be recognised (it was "unexpected CliError")."""
    p = _cli("tune", str(truncated(model, tmp_path)), "--work-dir", "w", cwd=tmp_path)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("dsa-tvm: error: ")
    assert "cannot be read as ONNX" in err and "unexpected" not in err


def test_ctrl_c_during_tune_exits_130_and_says_what_was_kept(tmp_path):
    """Ctrl-C while tuning ended in a bare xgboost RuntimeError traceback.

    The conv has 471 candidates, more than the 400 trials asked for: the search cannot
    finish before the signal (the module's 16 -> 32 conv has 96, which a fast machine
    searched in 6 s, ending with 0 before Ctrl-C arrived)."""
    model = conv_net(tmp_path, cin=32, cout=64, hw=16)
    work = tmp_path / "w"
    p = _cli("tune", str(model), "--trials", "400", "--workers", "1", "--work-dir", str(work),
             cwd=tmp_path)
    records = work / "database_tuning_record.json"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and p.poll() is None:   # the search has started
            if records.is_file() and len(records.read_text().splitlines()) > 1:
                break
            time.sleep(0.2)
        assert p.poll() is None, p.communicate()[1][-2000:]
        kept = len(records.read_text().splitlines())
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("dsa-tvm: error: interrupted; ") and str(records) in line
    n = int(line.split("interrupted; ")[1].split()[0])   # the work dir was new: all are new
    assert n >= kept and len(records.read_text().splitlines()) == n
    from dsa_tvm.tuning import open_database

    open_database(work)   # every line whole: the records are usable

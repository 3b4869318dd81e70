"""Tuning over TVM RPC (a tracker and two simulator servers) and the `dsa-tvm tune` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import dsa_tvm
from dsa_tvm.tuning import Task, TunedKnobs, open_database
from dsa_tvm.tuning.measure import DSABuilder, secs_to_cycles
from dsa_tvm.tuning.task import measure_knobs
from tir_schedules.kinds.conv2d import ConvShape

from .shapes import DEFAULT, conv_shape, sampled


# ----------------------------------------------------------------------------- RPC
def _free_port_range(span: int = 20) -> int:
    """The start of ``span`` consecutive ports nobody listens on (checked, best effort)."""
    import random
    import socket

    for _ in range(50):
        start = random.randrange(20000, 60000 - span)
        try:
            socks = []
            for p in range(start, start + span):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return start
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range on loopback")


def test_measurement_over_rpc_tracker_and_two_servers(tmp_path):
    """A tracker and two simulator servers on loopback (subprocesses running this
    worktree's code): both serve sessions, and the RPC runner's cycles equal local
    simulations of the same programs."""
    import os
    import subprocess
    import sys

    from tvm import rpc
    from tvm.rpc.tracker import Tracker
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from dsa_tvm.tuning.rpc import RPCSimRunner, measure_remote, wait_for_servers

    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    base = _free_port_range(60)
    tracker = Tracker("127.0.0.1", port=base, port_end=base + 20, silent=True)
    key = f"dsa-test-{os.getpid()}"
    servers = [subprocess.Popen(
        [sys.executable, "-m", "dsa_tvm.tuning.rpc", "serve", "--tracker",
         f"127.0.0.1:{tracker.port}", "--key", key, "--port", str(base + 20 + 20 * i),
         "--port-end", str(base + 40 + 20 * i)], cwd=root, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    try:
        wait_for_servers("127.0.0.1", tracker.port, key, 2, timeout=240)
        hw = json.dumps(DEFAULT.as_dict(), sort_keys=True)
        task = Task(DEFAULT, conv_shape(h=7, icb=2, ocb=2))
        knobs = task.candidates()[:4]
        progs = [task.program(k).to_bytes(DEFAULT) for k in knobs]
        conn = rpc.connect_tracker("127.0.0.1", tracker.port)
        s1 = conn.request(key, session_timeout=60)
        s2 = conn.request(key, session_timeout=60)   # the second server (the first is busy)
        pids = {measure_remote(s, progs[0], hw)["server"] for s in (s1, s2)}
        assert len(pids) == 2 and os.getpid() not in pids
        del s1, s2
        built = DSABuilder(str(tmp_path)).build(
            [BuilderInput(sampled(task, k).mod, dsa_tvm.target(DEFAULT)) for k in knobs])
        runner = RPCSimRunner("127.0.0.1", tracker.port, key, max_workers=2)
        futures = runner.run([RunnerInput(b.artifact_path, "cpu", []) for b in built])
        got = [f.result() for f in futures]
        assert all(g.error_msg is None for g in got), [g.error_msg for g in got]
        want = [measure_knobs(task, k) for k in knobs]
        assert [secs_to_cycles(DEFAULT, float(g.run_secs[0])) for g in got] == want
        assert set(runner.served) <= pids and sum(runner.served.values()) == len(knobs)
    finally:
        for p in servers:
            p.terminate()
        for p in servers:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        tracker.terminate()


# ----------------------------------------------------------------------------- CLI
def test_cli_tune_prints_the_table_and_fills_the_database(tmp_path, capsys):
    from dsa_tvm.cli import main

    from ..qdq_models import conv_net

    model = conv_net(tmp_path, cin=16, cout=32, hw=8)
    work = tmp_path / "work"
    assert main(["tune", str(model), "--trials", "4", "--work-dir", str(work)]) == 0
    out = capsys.readouterr()
    assert "default cyc" in out.out and "speedup" in out.out and "[1/" in out.err
    rows = [line for line in out.out.splitlines() if line.startswith("conv2d_")]
    assert len(rows) == 1
    default, best, trials = (rows[0].split()[i] for i in (2, 3, 5))
    assert int(best.replace(",", "")) <= int(default.replace(",", "")) and 2 <= int(trials) <= 4
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    tasks, _ = dsa_tvm.tuning.extract_tasks(
        from_onnx(onnx.load(str(model)), keep_params_in_input=False), DEFAULT)
    conv_task = next(t for t in tasks if isinstance(t.shape, ConvShape))
    knobs = TunedKnobs(open_database(work))(DEFAULT, conv_task.shape)
    assert measure_knobs(conv_task, knobs) == int(best.replace(",", ""))

"""Tutorial 5: tune over TVM RPC: a tracker, two simulator servers, measurements shared out.

Run it:  python tutorials/05_rpc_tuning.py [--trials 8] [--work-dir tune_rpc]

A team tunes on many machines the way TVM users know: one RPC tracker, any number of
servers registered with it under a device key, and the tuning process asking the tracker
for a free server for every measurement. On real machines that is

    python -m dsa_tvm.tuning.rpc tracker --port 9190                          # one machine
    python -m dsa_tvm.tuning.rpc serve --tracker HOST:9190 --key dsa          # each machine
    dsa-tvm tune model.onnx --trials 64 --work-dir tune --rpc HOST:9190 --rpc-key dsa

Here all of it runs on this machine, on loopback, as processes this script starts and
stops (also when something fails: ``try``/``finally``).

What happens:
1. the tracker and two servers start (each server is ``tvm.rpc.Server`` with one more
   function, ``dsa.tuning.measure``, that runs a DSA program on the bundled simulator,
   timing only, and returns its cycles; the program travels as the call's argument);
2. a small PyTorch model is imported and quantized (``dsa_tvm.from_pytorch``, as in
   tutorial 3);
3. ``dsa_tvm.tune(mod, ..., runner=rpc_runner(host, port, key))`` tunes its DSA tasks: the
   candidates are built here, and each one is measured on whichever server the tracker
   hands out (two at a time); the runner counts what each server measured;
4. the model is compiled without and with the tuning records and both builds run: the
   tuned one takes no more cycles and computes the same int8 outputs;
5. the servers and the tracker are stopped, and no process of theirs is left.
"""

import argparse
import contextlib
import os
import signal
import subprocess
import sys

import numpy as np
import psutil
import torch
import tvm
from torch import nn
from tvm import relax

import dsa_tvm
from dsa_tvm.tuning.rpc import probe_tracker, rpc_runner, wait_for_servers

ap = argparse.ArgumentParser()
ap.add_argument("--trials", type=int, default=8, help="measured candidates per task")
ap.add_argument("--work-dir", default="tune_rpc")
args = ap.parse_args()
HOST, KEY = "127.0.0.1", f"dsa-tutorial-{os.getpid()}"   # a key of our own: our servers only


def start(*argv: str) -> subprocess.Popen:
    """``python -m dsa_tvm.tuning.rpc ARGV`` in a process group of its own (so stopping it
    stops the processes it starts too); it prints one line once it listens."""
    return subprocess.Popen([sys.executable, "-m", "dsa_tvm.tuning.rpc", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)


def listening(proc: subprocess.Popen) -> str:
    """The line ``proc`` prints once it listens; an error if it ended instead."""
    line = proc.stdout.readline().strip()
    if not line:
        raise RuntimeError(f"'{' '.join(proc.args[1:])}' ended (exit code {proc.wait()}) before it "
                           f"listened; run it in a shell to see why")
    return line


def stop(procs: list[subprocess.Popen]) -> int:
    """Stop every process group started here; the number of their processes still alive."""
    tree = [psutil.Process(p.pid) for p in procs if p.poll() is None]
    tree += [c for p in list(tree) for c in p.children(recursive=True)]
    for p in procs:
        with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    _, alive = psutil.wait_procs(tree, timeout=10)
    for p in alive:
        p.kill()
    return len(psutil.wait_procs(alive, timeout=5)[1])


# 2. the model: two convs and a global average pool, so three tuning tasks (a real model has
#    one per distinct layer shape)
class Features(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1)


torch.manual_seed(0)
rng = np.random.default_rng(0)
calibration = [rng.normal(0, 1, (1, 16, 28, 28)).astype(np.float32) for _ in range(4)]
x = rng.normal(0, 1, (1, 16, 28, 28)).astype(np.float32)

procs: list[subprocess.Popen] = []
try:
    # 1. the tracker, then two servers registered with it under KEY (started together)
    procs.append(start("tracker", "--host", HOST, "--port", "9190", "--port-end", "9290"))
    line = listening(procs[0])                  # "RPC tracker on 127.0.0.1:9190"
    print(line)
    port = int(line.rpartition(":")[2])         # the first free port of the range
    procs += [start("serve", "--tracker", f"{HOST}:{port}", "--key", KEY, "--host", HOST,
                    "--port", "9300", "--port-end", "9400") for _ in range(2)]
    for server in procs[1:]:
        print(listening(server))
    wait_for_servers(HOST, port, KEY, count=2, timeout=120)
    queue = probe_tracker(HOST, port, KEY)   # what `dsa-tvm tune --rpc` asks before it starts
    print(f"tracker {HOST}:{port}: {queue.get('free', 0)} free server(s) under key '{KEY}'")

    mod = dsa_tvm.from_pytorch(Features().eval(), (torch.from_numpy(x),),
                               calibration_data=calibration, verbose=False, show_progress=False)

    # 3. tune: candidates built here, measured on the servers
    runner = rpc_runner(HOST, port, KEY, max_workers=2)
    report = dsa_tvm.tune(mod, work_dir=args.work_dir, trials=args.trials, runner=runner)
    print(report)
    servers = {p.pid: i for i, p in enumerate(procs[1:], 1)}
    measured = {}  # runner.served: measurements by the pid of the server process that made them
    for pid, n in runner.served.items():
        parent = psutil.Process(pid).ppid() if psutil.pid_exists(pid) else None
        measured[servers.get(pid) or servers.get(parent) or 0] = (pid, n)  # it, or its worker
    for who, (pid, n) in sorted(measured.items()):
        print(f"server {who} (pid {pid}) measured {n} candidate(s)")
    print(f"measurements over RPC: {sum(runner.served.values())} on {len(runner.served)} server(s)")

    # 4. default schedules against the tuned ones (the database in scope while compiling)
    def run(compiled) -> tuple[np.ndarray, int]:
        vm = relax.VirtualMachine(compiled, tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
        return out, dsa_tvm.run_report(vm).total_cycles

    default_out, default_cycles = run(tvm.compile(mod, target="dsa"))
    with dsa_tvm.tuned(args.work_dir):
        tuned_out, tuned_cycles = run(tvm.compile(mod, target="dsa"))
    print(f"DSA cycles: default schedules {default_cycles:,}, tuned {tuned_cycles:,} "
          f"(x{default_cycles / tuned_cycles:.3f})")
    print("outputs identical:", bool(np.array_equal(default_out, tuned_out)))
    gained = [r.task.name for r in report.results if r.best_cycles < r.default_cycles]
    print(f"{len(gained)} of {len(report.results)} task(s) found a faster schedule in "
          f"{args.trials} trials ({', '.join(gained) or 'none'}); the others' default schedule "
          f"was the best candidate measured (more trials search further)")
finally:
    # 5. stop the servers and the tracker, whatever happened above
    left = stop(procs)
    print(f"stopped the tracker and {len(procs) - 1} server(s); processes left running: {left}")

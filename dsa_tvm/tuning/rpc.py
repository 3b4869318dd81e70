"""Measure tuning candidates on TVM RPC servers that run the DSA simulator.

A team tunes on many machines the way TVM users know: one tracker, any number
of servers registered under a device key, the tuning process asking the
tracker for a free server per measurement::

    python -m dsa_tvm.tuning.rpc tracker --port 9190
    python -m dsa_tvm.tuning.rpc serve --tracker HOST:9190 --key dsa     # on each machine
    dsa-tvm tune model.onnx --trials 64 --work-dir tune --rpc HOST:9190 --rpc-key dsa

A server is ``tvm.rpc.Server`` with one more global function,
``dsa.tuning.measure(program_bytes, hardware_json)``, which runs the program on
the simulator (timing only) and returns its cycles; the program travels as the
call's argument, so nothing is uploaded or left behind. :class:`RPCSimRunner`
is the MetaSchedule runner that sends each artifact to a server, measurements
running concurrently (one thread and one session each).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerInput

MEASURE = "dsa.tuning.measure"


def register_measure() -> None:
    """Install ``dsa.tuning.measure`` in this process (a server's init callback)."""
    import tvm_ffi

    server = os.getpid()  # the server process; sessions run in processes forked from it

    def measure(program: bytes, hardware: str) -> str:
        from ..hw.config import config_from_dict
        from .measure import measure_bytes

        cfg = config_from_dict(json.loads(hardware), "<rpc measure>")
        cycles = measure_bytes(cfg, bytes(program))
        return json.dumps({"cycles": cycles, "server": server})

    tvm_ffi.register_global_func(MEASURE, measure, override=True)


def measure_remote(session, program: bytes, hardware_json: str) -> dict:
    """Cycles of a program measured by the server behind ``session`` (and its pid)."""
    return json.loads(str(session.get_function(MEASURE)(program, hardware_json)))


@derived_object
class RPCSimRunner(PyRunner):
    """Measure each artifact on a server the tracker hands out (see the module docstring).
    ``served`` counts measurements per server process id."""

    def __init__(self, host: str, port: int, key: str = "dsa", max_workers: int = 2,
                 session_timeout: float = 120.0):
        super().__init__()
        self.host, self.port, self.key = host, port, key
        self.session_timeout = session_timeout
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dsa-rpc")
        self.served: dict[int, int] = {}

    def _measure(self, artifact_path: str) -> float:
        from tvm import rpc

        from .measure import cycles_to_secs, read_artifact

        cfg, program = read_artifact(artifact_path)
        tracker = rpc.connect_tracker(self.host, self.port)
        try:
            session = tracker.request(self.key, priority=1, session_timeout=self.session_timeout)
        finally:
            tracker.close()
        got = measure_remote(session, program, json.dumps(cfg.as_dict(), sort_keys=True))
        del session  # ends the session: the server is free for the next request
        self.served[got["server"]] = self.served.get(got["server"], 0) + 1
        return cycles_to_secs(cfg, int(got["cycles"]))

    def run(self, runner_inputs: list[RunnerInput]) -> list:
        from .measure import SecondsFuture

        return [SecondsFuture(self.pool.submit(self._measure, inp.artifact_path),
                              "RPC measurement failed: ") for inp in runner_inputs]


def rpc_runner(host: str, port: int, key: str = "dsa", max_workers: int = 2) -> RPCSimRunner:
    return RPCSimRunner(host, port, key, max_workers)


class TrackerError(ConnectionError):
    """The tracker cannot be used for tuning; the message names the cause and the fix."""


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); TrackerError naming the expected form otherwise."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TrackerError(f"'{address}' is not a tracker address; give it as HOST:PORT, "
                           f"e.g. 127.0.0.1:9190")
    return host, int(port)


def probe_tracker(host: str, port: int, key: str, timeout: float = 5.0) -> dict:
    """The tracker's queue entry for ``key`` (free and pending servers), within ``timeout``
    seconds; TrackerError if nothing answers at ``host:port``, it is not a TVM RPC tracker,
    or no server is registered under ``key`` (each measurement would wait for one forever).

    ``rpc.connect_tracker`` retries for a minute and its requests block without limit;
    this is one connection with a deadline, asked once."""
    import socket
    import struct

    from tvm.rpc import base

    where = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise TrackerError(f"no RPC tracker answers at {where} ({e.strerror or e}); start one "
                           f"(python -m dsa_tvm.tuning.rpc tracker --port {port}) or fix "
                           f"--rpc") from None
    try:
        sock.settimeout(timeout)
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        magic = struct.unpack("<i", base.recvall(sock, 4))[0]
        if magic != base.RPC_TRACKER_MAGIC:
            raise TrackerError(f"{where} is not a TVM RPC tracker; give the tracker's "
                               f"HOST:PORT to --rpc")
        base.sendjson(sock, [base.TrackerCode.SUMMARY])
        code, summary = base.recvjson(sock)
    except (OSError, RuntimeError, ValueError, struct.error) as e:
        raise TrackerError(f"{where} did not answer as a TVM RPC tracker within {timeout:g} s "
                           f"({e}); give the tracker's HOST:PORT to --rpc") from None
    finally:
        sock.close()
    if code != base.TrackerCode.SUCCESS:
        raise TrackerError(f"the tracker at {where} refused its summary ({summary}); restart it")
    queue = summary.get("queue_info", {}).get(key, {})
    servers = [s for s in summary.get("server_info", []) if s.get("key") == f"server:{key}"]
    if not queue.get("free", 0) and not servers:
        keys = ", ".join(sorted(summary.get("queue_info", {}))) or "none"
        raise TrackerError(f"no RPC server is registered with the tracker at {where} under "
                           f"key '{key}' (keys there: {keys}); start one (python -m "
                           f"dsa_tvm.tuning.rpc serve --tracker {where} --key {key}) or fix "
                           f"--rpc-key")
    return queue


def wait_for_servers(host: str, port: int, key: str, count: int, timeout: float = 120.0) -> None:
    """Block until ``count`` servers with ``key`` are registered with the tracker."""
    from tvm import rpc

    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        try:
            summary = rpc.connect_tracker(host, port).summary()
            seen = summary.get("queue_info", {}).get(key, {}).get("free", 0)
            if seen >= count:
                return
        except (RuntimeError, OSError, ConnectionError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"only {seen} of {count} '{key}' servers registered with the tracker "
                       f"at {host}:{port} within {timeout:.0f} s")


# ----------------------------------------------------------------------------- processes
def serve(tracker: str, key: str, host: str = "127.0.0.1", port: int = 9091,
          port_end: int = 9199) -> None:
    """Run an RPC server that measures DSA programs, registered with ``tracker``."""
    from tvm import rpc

    t_host, _, t_port = tracker.rpartition(":")
    server = rpc.Server(host, port=port, port_end=port_end, tracker_addr=(t_host, int(t_port)),
                        key=key, silent=True, server_init_callback=register_measure)
    print(f"dsa-tvm RPC server on {host}:{server.port}, key '{key}', tracker {tracker}",
          flush=True)
    server.proc.join()


def run_tracker(host: str = "127.0.0.1", port: int = 9190, port_end: int = 9199) -> None:
    from tvm.rpc.tracker import Tracker

    tracker = Tracker(host, port=port, port_end=port_end, silent=True)
    print(f"RPC tracker on {host}:{tracker.port}", flush=True)
    tracker.proc.join()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dsa_tvm.tuning.rpc", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="an RPC server that runs the DSA simulator")
    s.add_argument("--tracker", required=True, help="HOST:PORT of the tracker")
    s.add_argument("--key", default="dsa")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=9091)
    s.add_argument("--port-end", type=int, default=9199)
    t = sub.add_parser("tracker", help="a TVM RPC tracker")
    t.add_argument("--host", default="127.0.0.1")
    t.add_argument("--port", type=int, default=9190)
    t.add_argument("--port-end", type=int, default=9199)
    a = p.parse_args(argv)
    if a.cmd == "serve":
        serve(a.tracker, a.key, a.host, a.port, a.port_end)
    else:
        run_tracker(a.host, a.port, a.port_end)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

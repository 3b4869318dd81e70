"""``dsa-tvm tune model.onnx --trials N --work-dir DIR``: tune a model's DSA tasks.

Everything that can be checked before tuning starts is checked first, so a bad
argument fails in a second with one line rather than after minutes of tuning:
the trial and worker counts, the RPC tracker (asked once, with a deadline, for
a server under the key), the work dir (a folder that can be written, its
database files readable), the model file. Ctrl-C ends the run with the records
measured so far kept in the database (exit 130).
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .cli_common import CliError, at_least_one, hw_spec, interrupted, read_model
from .flow import load_model
from .frontend.intake import add_shape_arg, parse_shape_args
from .tuning.api import tune
from .tuning.apply import RECORDS, open_database
from .tuning.rpc import parse_address, probe_tracker, rpc_runner


def cmd_tune(args: argparse.Namespace) -> int:
    runner = None
    if args.rpc:
        host, port = parse_address(args.rpc)
        probe_tracker(host, port, args.rpc_key)
        runner = rpc_runner(host, port, args.rpc_key)
    read_model(args.model)         # a clear error for a folder or a truncated file
    open_database(args.work_dir)   # a usable folder, its database readable
    model, _name = load_model(args.model, parse_shape_args(args.shape))
    mod = _import(model, args.model, CliError)
    records = Path(args.work_dir) / RECORDS
    before = _lines(records)
    with _interrupt_flag() as interrupted:
        try:
            report = tune(mod, work_dir=args.work_dir, trials=args.trials, hw=args.hw,
                          runner=runner, seed=args.seed, workers=args.workers)
        except BaseException:
            if not interrupted:   # Ctrl-C can surface as any error of the library it hit
                raise
            return _say_interrupted(records, _lines(records) - before)
    print(report)
    print(f"\ncompile with it: with dsa_tvm.tuned({str(Path(args.work_dir))!r}): "
          f"tvm.compile(mod, target=dsa_tvm.target({args.hw!r}))")
    return 0


def _import(model, name: str, error: type[Exception]):
    from tvm.relax.frontend.onnx import from_onnx

    try:
        return from_onnx(model, keep_params_in_input=False)
    except Exception as e:  # noqa: BLE001 - the importer's errors vary; one line names it
        first = (str(e).strip().splitlines() or [type(e).__name__])[-1][:160]
        raise error(f"TVM's ONNX importer cannot read '{name}' ({first}); simplify the model "
                    f"first (python -m onnxslim in.onnx out.onnx) or export it again") from None


def _lines(path: Path) -> int:
    return sum(1 for line in path.open() if line.strip()) if path.is_file() else 0


def _say_interrupted(records: Path, new: int) -> int:
    import sys


    print(f"dsa-tvm: error: interrupted; {new} new tuning record(s) measured before it are "
          f"kept in {records}; compile with them (dsa_tvm.tuned({str(records.parent)!r})) or run "
          f"the same command again to continue from them",
          file=sys.stderr)
    return interrupted()


@contextmanager
def _interrupt_flag() -> Iterator[list]:
    """Within: a Ctrl-C is remembered (the yielded list becomes non-empty) before it raises
    KeyboardInterrupt, so an interrupt that the XGBoost or TVM code it hit turns into
    another error is still known for what it was."""
    flag: list = []

    def on_sigint(signum, frame):
        flag.append(signum)
        signal.default_int_handler(signum, frame)

    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: leave signals alone
        yield flag
        return
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def add_parser(sub) -> None:
    """Register the ``tune`` subcommand on the CLI's subparsers."""
    t = sub.add_parser("tune", help="tune the DSA schedules of a model with MetaSchedule "
                                    "(measured on the simulator) into a database")
    t.add_argument("model", help="ONNX file (QDQ int8) or bundled model name")
    t.add_argument("--trials", type=at_least_one, default=64,
                   help="measured candidates per task (>= 1; 1 measures the default only)")
    t.add_argument("--work-dir", required=True, help="where the JSON database and logs go")
    t.add_argument("--hw", default="default", type=hw_spec, help="hardware preset or .toml file")
    t.add_argument("--seed", type=int, default=0,
                   help="the same seed, model and hardware repeat a run exactly (one worker)")
    t.add_argument("--workers", type=at_least_one, default=None,
                   help="processes that build and measure candidates (default: one per core)")
    t.add_argument("--rpc", metavar="HOST:PORT",
                   help="measure on the RPC servers registered with this tracker")
    t.add_argument("--rpc-key", default="dsa", help="device key the servers registered with")
    add_shape_arg(t)
    t.set_defaults(fn=cmd_tune)

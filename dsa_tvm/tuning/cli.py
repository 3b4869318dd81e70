"""``dsa-tvm tune model.onnx --trials N --work-dir DIR``: tune a model's DSA tasks."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_tune(args: argparse.Namespace) -> int:
    from tvm.relax.frontend.onnx import from_onnx

    from ..flow import load_model
    from ..frontend.intake import parse_shape_args
    from .api import tune

    runner = None
    if args.rpc:
        from .rpc import rpc_runner

        host, _, port = args.rpc.rpartition(":")
        runner = rpc_runner(host or "127.0.0.1", int(port), args.rpc_key)
    model, _name = load_model(args.model, parse_shape_args(args.shape))
    mod = from_onnx(model, keep_params_in_input=False)
    report = tune(mod, work_dir=args.work_dir, trials=args.trials, hw=args.hw, runner=runner,
                  seed=args.seed, workers=args.workers)
    print(report)
    print(f"\ncompile with it: with dsa_tvm.tuned({str(Path(args.work_dir))!r}): "
          f"tvm.compile(mod, target=dsa_tvm.target({args.hw!r}))")
    return 0


def add_parser(sub) -> None:
    """Register the ``tune`` subcommand on the CLI's subparsers."""
    t = sub.add_parser("tune", help="tune the DSA schedules of a model with MetaSchedule "
                                    "(measured on the simulator) into a database")
    t.add_argument("model", help="ONNX file (QDQ int8) or bundled model name")
    t.add_argument("--trials", type=int, default=64, help="measured candidates per task")
    t.add_argument("--work-dir", required=True, help="where the JSON database and logs go")
    t.add_argument("--hw", default="default", help="hardware preset or .toml file")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--workers", type=int, default=None,
                   help="processes that build and measure candidates (default: one per core)")
    t.add_argument("--rpc", metavar="HOST:PORT",
                   help="measure on the RPC servers registered with this tracker")
    t.add_argument("--rpc-key", default="dsa", help="device key the servers registered with")
    from ..frontend.intake import add_shape_arg

    add_shape_arg(t)
    t.set_defaults(fn=cmd_tune)

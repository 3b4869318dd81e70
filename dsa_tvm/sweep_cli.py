"""``dsa-tvm sweep MODEL... --set FIELD=V1,V2 ...``: a design-space sweep from the shell."""

from __future__ import annotations

import argparse
from pathlib import Path

from .cli_common import CliError, at_least_one, hw_spec


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep", help="compile and time models over a grid of hardware descriptions; CSV, JSON "
                      "and a Pareto plot (latency, area, energy)",
        description="Every combination of the --set values is one design point: each model "
                    "is compiled for it and its DSA regions simulated timing-only.")
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="bundled model name or QDQ int8 ONNX file")
    p.add_argument("--set", dest="axes", action="append", default=[], required=True,
                   metavar="FIELD=V1,V2,...",
                   help="one axis of the grid (repeatable), e.g. --set array=8,16,32 --set "
                        "dram.bandwidth_bytes_per_cycle=4,16,64 --set sram.wgt_kib=64,256")
    p.add_argument("--hw", default="default", type=hw_spec,
                   help="the base description the axes change (preset or .toml)")
    p.add_argument("--out", default="sweep_out", help="folder for sweep.csv, sweep.json and "
                                                      "pareto.png (made if missing)")
    p.add_argument("--workers", type=at_least_one, default=None,
                   help="processes (default: the cores, at most one per two points)")
    p.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="run the points on a Ray cluster (pip install 'dsa-tvm[ray]'; "
                        "'auto' or host:port)")
    p.add_argument("--search", choices=("grid", "optuna"), default="grid",
                   help="grid: every combination (default); optuna: --trials designs chosen "
                        "by Optuna's NSGA-II (latency and area), for spaces too large to grid")
    p.add_argument("--trials", type=at_least_one, default=None,
                   help="designs to evaluate with --search optuna")
    p.add_argument("--seed", type=int, default=0, help="the search's seed (--search optuna)")
    p.add_argument("--no-cache", action="store_true",
                   help="compile every point from scratch (the program cache is on by default)")
    p.add_argument("--no-plot", action="store_true", help="skip pareto.png")
    p.set_defaults(fn=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from .sweep import sweep

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out '{out}' is a file; give a folder (it is made if missing)")
    try:
        res = sweep(args.models, args.axes, args.hw, workers=args.workers,
                    cache=not args.no_cache, ray_address=args.ray, search=args.search,
                    trials=args.trials, seed=args.seed)
    except ValueError as e:
        raise CliError(str(e)) from None
    print(res)
    for what, path in res.write(out, plot=not args.no_plot).items():
        print(f"{what}: {path}")
    failed = [r for r in res.results if r.error]
    if failed and len(failed) == len(res.results):
        raise CliError(f"no design point compiled (first: {failed[0].point}: {failed[0].error})")
    return 0

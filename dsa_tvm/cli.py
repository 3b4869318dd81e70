"""`dsa-tvm` command line: run the demo, inspect hardware descriptions and programs."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from .frontend.intake import IntakeError, add_shape_arg, parse_shape_args
from .hw.config import ConfigError, load_config, preset_names
from .isa.disasm import disassemble
from .isa.encoding import IsaError
from .isa.program import ProgramError
from .sim.errors import SimulationError
from .sim.simulator import Simulator


def _hw_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hw", default="default",
                   help=f"hardware preset ({', '.join(preset_names())}) or a .toml file")


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import demo_program

    cfg = load_config(args.hw)
    print(cfg.summary())
    prog, inputs, ref = demo_program(cfg)
    sim = Simulator(cfg)
    t0 = time.perf_counter()
    res = sim.run(prog, inputs)
    wall = time.perf_counter() - t0
    exact = np.array_equal(res.outputs["out"], ref)
    print(f"program '{prog.name}': {len(prog.instructions)} instructions, "
          f"{prog.dram_size} bytes of DRAM")
    print(res.report())
    print(f"\noutput bit-exact against the numpy reference: {'yes' if exact else 'NO'}")
    print(f"simulated {res.cycles:,} cycles in {wall * 1e3:.1f} ms of wall time "
          f"({res.cycles / wall:.3g} simulated cycles per second)")
    if args.trace:
        print(f"trace: {res.write_trace(args.trace)} (open in https://ui.perfetto.dev)")
    if args.save:
        Path(args.save).write_bytes(prog.to_bytes(cfg))
        print(f"program: {args.save}")
    return 0 if exact else 1


def cmd_run_model(args: argparse.Namespace) -> int:
    """Compile a model for the DSA, run it on the simulator, print the reports."""
    from .flow import run_model

    shapes = parse_shape_args(args.shape)
    res = run_model(args.model, args.hw, seed=args.seed, shapes=shapes)
    print(res.compile_report)
    print()
    print(res.run_report)
    agree = res.agreement(res.output_step)
    print(f"\nagainst onnxruntime (same QDQ graph): max |diff| {agree['max_abs_diff']:.4g}"
          + (f" = {agree['max_steps']:.2f} quantization steps, "
             f"{agree['fraction_differing']:.2%} of outputs differ" if "max_steps" in agree
             else "") + f", cosine {agree['cosine']:.6f}")
    t = res.timings
    print(f"import {t['import_s']:.2f} s, compile {t['compile_s']:.2f} s, "
          f"run (simulated) {t['run_s']:.2f} s")
    if args.trace:
        print(f"trace: {res.run_report.write_trace(args.trace)} (open in https://ui.perfetto.dev)")
    if args.json:
        Path(args.json).write_text(res.run_report.to_json())
        print(f"report: {args.json}")
    return 0 if agree.get("max_steps", 0.0) <= 1.0 + 1e-6 else 1


def cmd_hw(args: argparse.Namespace) -> int:
    names = [args.preset] if args.preset else preset_names()
    for name in names:
        cfg = load_config(name)
        print(cfg.summary())
        print(f"  source {cfg.source}, fingerprint {cfg.fingerprint.hex()}")
        print(f"  depths inp/wgt/acc {cfg.inp_depth}/{cfg.wgt_depth}/{cfg.acc_depth} rows, "
              f"peak {cfg.peak_gops:g} GOPS")
    return 0


def cmd_disasm(args: argparse.Namespace) -> int:
    cfg = load_config(args.hw)
    prog = Simulator(cfg).load_program(Path(args.program).read_bytes())
    print(disassemble(prog, cfg, with_words=args.words))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    cfg = load_config(args.hw)
    sim = Simulator(cfg)
    prog = sim.load_program(Path(args.program).read_bytes())
    inputs = dict(np.load(args.inputs)) if args.inputs else {}
    if not inputs and not args.timing_only:
        inputs = {r.name: np.zeros(r.shape, r.dtype) for r in prog.regions_of("input")}
    res = sim.run(prog, inputs, timing_only=args.timing_only)
    print(res.report())
    if args.outputs and res.outputs:
        np.savez(args.outputs, **res.outputs)
        print(f"outputs: {args.outputs}")
    if args.trace:
        print(f"trace: {res.write_trace(args.trace)}")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from .isa.reference import main

    return main()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsa-tvm", description=__doc__)
    sub = p.add_subparsers(dest="cmd")
    d = sub.add_parser("demo", help="run the bundled demo program and print its counters")
    _hw_arg(d)
    d.add_argument("--trace", help="write a Perfetto/Chrome trace JSON here")
    d.add_argument("--save", help="write the program container here")
    d.set_defaults(fn=cmd_demo)
    m = sub.add_parser("run", help="compile a model (ONNX file or bundled name) for the DSA, "
                                   "run it on the simulator and print the per-layer report")
    m.add_argument("model", nargs="?", default="small_cnn")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--trace", help="write the whole model's Perfetto trace here")
    m.add_argument("--json", help="write the run report as JSON here")
    add_shape_arg(m)
    _hw_arg(m)
    m.set_defaults(fn=cmd_run_model)
    h = sub.add_parser("hw", help="show hardware presets or one description")
    h.add_argument("preset", nargs="?")
    h.set_defaults(fn=cmd_hw)
    s = sub.add_parser("disasm", help="print a program container as a listing")
    s.add_argument("program")
    s.add_argument("--words", action="store_true", help="show the encoded words too")
    _hw_arg(s)
    s.set_defaults(fn=cmd_disasm)
    r = sub.add_parser("sim", help="run a program container on the simulator")
    r.add_argument("program")
    r.add_argument("--inputs", help=".npz of input arrays by region name (default zeros)")
    r.add_argument("--outputs", help="write the outputs to this .npz")
    r.add_argument("--timing-only", action="store_true", help="skip the data work")
    r.add_argument("--trace", help="write a Perfetto/Chrome trace JSON here")
    _hw_arg(r)
    r.set_defaults(fn=cmd_run)
    from .tuning.cli import add_parser as add_tune_parser

    add_tune_parser(sub)
    g = sub.add_parser("docs", help="regenerate docs/isa.md and docs/hardware.md")
    g.set_defaults(fn=cmd_docs)
    from .quantize_cli import add_parser as add_quantize

    add_quantize(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["run", *argv]  # the main job: the bundled model, default preset unless --hw
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ConfigError, IsaError, ProgramError, SimulationError, FileNotFoundError, IntakeError) as e:
        print(f"dsa-tvm: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

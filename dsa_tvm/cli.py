"""`dsa-tvm` command line: run the demo, inspect hardware descriptions and programs."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from .cim_sweep_cli import add_parser as add_cim_sweep
from .cli_common import CliError, hw_spec, interrupted, read_model
from .demo import demo_program
from .eval_cli import add_parser as add_eval
from .flow import run_model
from .flow_pytorch import is_pytorch_program
from .frontend.intake import IntakeError, add_shape_arg, parse_shape_args
from .generate_cli import add_parser as add_generate
from .hw.config import ConfigError, load_config, preset_names, with_overrides
from .isa.disasm import disassemble
from .isa.docgen import main as write_docs
from .isa.encoding import IsaError
from .isa.program import ProgramError
from .qat_cli import add_parser as add_qat
from .quantize_cli import add_parser as add_quantize
from .sim.errors import SimulationError
from .sim.simulator import Simulator
from .sweep_cli import add_parser as add_sweep
from .tune_cli import add_parser as add_tune_parser
from .tuning.apply import DatabaseError
from .tuning.rpc import TrackerError


def model_inputs(model) -> list[str]:
    """Graph inputs that are fed at run time (not initializers)."""
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _read_program(path: str) -> bytes:
    p = Path(path)
    if p.is_dir():
        raise CliError(f"program '{path}' is a folder; pass a program container file "
                       f"(dsa-tvm demo --save prog.dsa writes one)")
    if not p.is_file():
        raise CliError(f"program file '{path}' not found; check the path")
    return p.read_bytes()


def _read_inputs(path: str, prog) -> dict[str, np.ndarray]:
    """Input arrays by region name from an ``.npz``; CliError for anything else."""
    names = ", ".join(r.name for r in prog.regions_of("input")) or "none"
    fix = f"pass an .npz of arrays named by input region ({names}), e.g. np.savez('in.npz', ...)"
    p = Path(path)
    if not p.is_file():
        raise CliError(f"inputs file '{path}' {'is a folder' if p.is_dir() else 'not found'}; "
                       f"{fix}")
    try:
        got = np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise CliError(f"'{path}' is not a NumPy file ({e}); {fix}") from None
    if not isinstance(got, np.lib.npyio.NpzFile):
        raise CliError(f"'{path}' holds one unnamed array; {fix}")
    try:
        return dict(got)
    except (ValueError, OSError, EOFError) as e:
        raise CliError(f"'{path}' is a damaged .npz ({e}); {fix}") from None


def _hw_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hw", default="default", type=hw_spec,
                   help=f"hardware preset ({', '.join(preset_names())}) or a .toml file")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one field of the hardware description (repeatable), e.g. "
                        "--set array.dataflow=weight-stationary --set output.stage=pipelined")


def cmd_demo(args: argparse.Namespace) -> int:
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


#: picture formats --plot and --breakdown write (matplotlib's Agg and vector canvases)
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse an output path that cannot be written before minutes of compiling, not after."""
    for opt in ("trace", "json", "csv", "plot", "breakdown"):
        path = getattr(args, opt, None)
        if not path:
            continue
        p = Path(path)
        if p.is_dir():
            raise CliError(f"--{opt} '{path}' is a folder; give a file name inside it")
        if not p.parent.is_dir():
            raise CliError(f"--{opt} '{path}': folder '{p.parent}' does not exist; create it "
                           f"or write somewhere that exists")
        if opt in ("plot", "breakdown") and p.suffix.lower() not in PLOT_SUFFIXES:
            raise CliError(f"--{opt} '{path}' has no picture suffix; name it "
                           f"{' or '.join('*' + s for s in PLOT_SUFFIXES)}")


def _write_plots(args: argparse.Namespace, res) -> None:
    """--plot / --breakdown: the pictures, or one line saying why there is nothing to draw."""
    from . import plots  # matplotlib loads only when a picture is asked for

    try:
        if args.plot:
            print(f"roofline: {plots.roofline(res.run_report, res.hardware, args.plot, res.model)}")
        if args.breakdown:
            print(f"breakdown: {plots.breakdown(res.run_report, args.breakdown, model=res.model)}")
    except ValueError as e:
        raise CliError(f"{e}; drop --plot/--breakdown for this model") from None


#: the flow's timings as ``cmd_run_model`` prints them, in order
TIMINGS = (("import_s", "import"), ("quantize_s", "quantize"), ("compile_s", "compile"),
           ("run_s", "run (simulated)"))


def cmd_run_model(args: argparse.Namespace) -> int:
    """Compile a model for the DSA, run it on the simulator, print the reports."""
    _check_outputs(args)
    pytorch = is_pytorch_program(args.model)
    if args.data is not None and not pytorch:
        raise CliError(f"--data calibrates a PyTorch program (.pt2) and '{args.model}' is not "
                       f"one; quantize an FP32 ONNX model with dsa-tvm quantize MODEL --calib DATA")
    if args.data is not None and not Path(args.data).exists():
        raise CliError(f"--data '{args.data}' not found; pass a folder of images or an .npz "
                       f"of arrays named by the program's inputs")
    model = None if pytorch else read_model(args.model)
    if model is not None and len(model_inputs(model)) != 1:
        names = model_inputs(model)
        raise CliError(f"'{args.model}' has {len(names)} inputs ({', '.join(names)}) and dsa-tvm "
                       f"run feeds one; compile it from Python (tvm.compile(mod, "
                       f"target=dsa_tvm.target(...))) and feed every input to the VM")
    res = run_model(args.model, args.hw, seed=args.seed, shapes=parse_shape_args(args.shape),
                    data=args.data)
    print(res.compile_report)
    print()
    print(res.run_report)
    agree = res.agreement(res.output_step)
    print(f"\nagainst {res.reference_name}: max |diff| {agree['max_abs_diff']:.4g}"
          + (f" = {agree['max_steps']:.2f} quantization steps, "
             f"{agree['fraction_differing']:.2%} of outputs differ" if "max_steps" in agree
             else "") + f", cosine {agree['cosine']:.6f}")
    if res.fp32_cosine is not None:
        print(f"against {res.fp32_name}: cosine {res.fp32_cosine:.6f}")
    print(", ".join(f"{label} {res.timings[k]:.2f} s" for k, label in TIMINGS
                    if k in res.timings))
    if args.trace:
        print(f"trace: {res.run_report.write_trace(args.trace)} (open in https://ui.perfetto.dev)")
    if args.json:
        Path(args.json).write_text(res.run_report.to_json())
        print(f"report: {args.json}")
    if args.csv:
        print(f"per-layer CSV: {res.run_report.write_csv(args.csv)}")
    if args.plot or args.breakdown:
        _write_plots(args, res)
    return 0 if agree.get("max_steps", 0.0) <= 1.0 + 1e-6 else 1


def cmd_hw(args: argparse.Namespace) -> int:
    names = [args.preset] if args.preset else preset_names()
    for name in names:
        cfg = load_config(name)
        print(cfg.summary())
        print(f"  source {cfg.source}, fingerprint {cfg.fingerprint.hex()}")
        print(f"  depths inp/wgt/acc {cfg.inp_depth}/{cfg.wgt_depth}/{cfg.acc_depth} rows, "
              f"peak {cfg.peak_gops:g} GOPS")
        print(f"  area ~{cfg.area_mm2:.3g} mm^2 from the [area] costs (docs/hardware.md)")
    return 0


def cmd_disasm(args: argparse.Namespace) -> int:
    cfg = load_config(args.hw)
    prog = Simulator(cfg).load_program(_read_program(args.program))
    print(disassemble(prog, cfg, with_words=args.words))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if args.timing_only and args.outputs:
        raise CliError("--timing-only skips the data work, so there are no outputs to write to "
                       "--outputs; drop one of the two")
    cfg = load_config(args.hw)
    sim = Simulator(cfg)
    prog = sim.load_program(_read_program(args.program))
    inputs = _read_inputs(args.inputs, prog) if args.inputs else {}
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
    return write_docs()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsa-tvm", description=__doc__)
    sub = p.add_subparsers(dest="cmd")
    d = sub.add_parser("demo", help="run the bundled demo program and print its counters")
    _hw_arg(d)
    d.add_argument("--trace", help="write a Perfetto/Chrome trace JSON here")
    d.add_argument("--save", help="write the program container here")
    d.set_defaults(fn=cmd_demo)
    m = sub.add_parser("run", help="compile a model (ONNX file, bundled name or PyTorch .pt2 "
                                   "program) for the DSA, run it on the simulator and print "
                                   "the per-layer report")
    m.add_argument("model", nargs="?", default="small_cnn")
    m.add_argument("--data", metavar="DIR|FILE.npz",
                   help="calibration data of a .pt2 program: a folder of images or an .npz "
                        "(default: seeded random inputs shaped like the program's)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--trace", help="write the whole model's Perfetto trace here")
    m.add_argument("--json", help="write the run report as JSON here")
    m.add_argument("--csv", help="write one line per layer (cycles, waits, bytes, roofline "
                                 "bound) as CSV here")
    m.add_argument("--plot", metavar="PNG", help="draw every DSA layer on the hardware's "
                                                 "roofline, colored by op kind (.png/.svg/.pdf)")
    m.add_argument("--breakdown", metavar="PNG", help="draw each DSA layer's cycles split into "
                                                      "compute / DRAM wait / token wait")
    add_shape_arg(m)
    _hw_arg(m)
    m.set_defaults(fn=cmd_run_model)
    h = sub.add_parser("hw", help="show hardware presets or one description")
    h.add_argument("preset", nargs="?", type=hw_spec)
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
    add_tune_parser(sub)
    g = sub.add_parser("docs", help="regenerate docs/isa.md and docs/hardware.md")
    g.set_defaults(fn=cmd_docs)
    add_quantize(sub)
    add_eval(sub)
    add_sweep(sub)
    add_cim_sweep(sub)
    add_generate(sub)
    add_qat(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["run", *argv]  # the main job: the bundled model, default preset unless --hw
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "set", None):
            args.hw = with_overrides(load_config(args.hw), args.set)
        return args.fn(args)
    except KeyboardInterrupt:
        print("dsa-tvm: error: interrupted", file=sys.stderr)
        return interrupted()
    except Exception as e:  # noqa: BLE001 - every failure ends in one line (see error_line)
        if os.environ.get("DSA_TVM_TRACEBACK"):
            raise
        print(f"dsa-tvm: error: {error_line(e)}", file=sys.stderr)
        return 2


def error_line(e: BaseException) -> str:
    """The one line ``main`` prints for an exception: the cause and, after ``; ``, the fix."""
    known = (CliError, ConfigError, IsaError, ProgramError, SimulationError, DatabaseError,
             TrackerError, IntakeError)
    if isinstance(e, known):
        return " ".join(str(e).split())
    if isinstance(e, OSError):
        where = f" '{e.filename}'" if e.filename else ""
        if isinstance(e, FileNotFoundError) and not e.filename:
            return " ".join(str(e).split())   # our own "no ... found" messages
        return f"{e.strerror or e}{where}; check the path and its permissions"
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return (f"unexpected {type(e).__name__}: {first}; this is a bug in dsa-tvm: rerun with "
            f"DSA_TVM_TRACEBACK=1 for the traceback and report it")


if __name__ == "__main__":
    from dsa_tvm.cli import main as package_main  # one CliError class for every subcommand

    sys.exit(package_main())

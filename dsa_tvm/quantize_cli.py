"""``dsa-tvm quantize``: FP32 ONNX -> int8 QDQ ONNX, with the accuracy report.

    dsa-tvm quantize model.onnx --calib photos/ --method percentile -o model_int8.onnx
    dsa-tvm quantize model.onnx --calib calib.npz --eval eval.npz --sensitivity --target-cosine 0.99

Writes the QDQ model (``-o``), prints the per-layer table and writes it as JSON
(``--report``, default next to the output). ``--calib synthetic:N`` uses N seeded
synthetic batches (image-like or token-embedding-like) when no data is at hand.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import onnx

from .cli_common import add_norm_args
from .frontend.intake import add_shape_arg, load_onnx, parse_shape_args
from .models import calibration_data
from .quant import quantize_onnx
from .quant.accuracy import accuracy_report, mixed_precision, sensitivity
from .quant.api import input_dtypes, input_shapes
from .quant.checks import check_percentile, check_target_cosine
from .quant.data import PREPROCESS, as_feeds


def add_parser(sub) -> None:
    """Register the ``quantize`` subcommand on an argparse subparsers object."""
    q = sub.add_parser("quantize", help="post-training int8 quantization of an FP32 ONNX model (QDQ), "
                                        "with a per-layer accuracy report")
    q.add_argument("model", help="FP32 ONNX model (an already-QDQ model is passed through)")
    q.add_argument("--calib", required=True,
                   help="calibration data: folder of images, .npz/.npy, or synthetic:N")
    q.add_argument("--eval", help="evaluation data (same forms; default: the calibration data)")
    q.add_argument("--method", default="minmax", choices=["minmax", "percentile", "entropy", "mse"])
    q.add_argument("--percentile", type=_percentile, default=99.999, help="(0, 100]")
    q.add_argument("--num-batches", type=_positive_int, help="use only the first N calibration batches")
    q.add_argument("--preprocess", default="imagenet", choices=list(PREPROCESS),
                   help="image preprocessing (default imagenet)")
    q.add_argument("--keep-fp32", default="", help="comma-separated node names to keep in FP32")
    q.add_argument("--symmetric-activations", action="store_true")
    q.add_argument("--per-tensor-weights", action="store_true")
    q.add_argument("--weight-bits", type=int, default=8, choices=[4, 8],
                   help="4: W4A8, int4 weight codes (half the DRAM bytes on a part with "
                        "dram.int4_weights); 8: int8 (default)")
    q.add_argument("--weight-group", type=_positive_int, default=None, metavar="G",
                   help="MatMul and 1x1 Conv weights on a --weight-bits grid per group of G "
                        "input rows (channels) with a minimum (GGUF Q4_1's form; the DSA's "
                        "grouped dense), not per output channel")
    q.add_argument("--no-keep-grids", action="store_true",
                   help="re-round MatMul weights that already lie on a per-group grid (a "
                        "weight-only int4 model) like any other, instead of keeping them as "
                        "shipped (grouped dense on the DSA: fewer bytes, more cycles a row)")
    q.add_argument("--no-bias-correction", action="store_true")
    q.add_argument("--no-outlier-split", action="store_true")
    add_norm_args(q)
    q.add_argument("--sensitivity", action="store_true", help="rank layers by what FP32 would buy")
    q.add_argument("--target-cosine", type=_cosine,
                   help="automatic mixed precision: keep the worst layers in FP32 until reached")
    q.add_argument("--max-fp32", type=_positive_int, default=8,
                   help="at most this many layers for --target-cosine")
    q.add_argument("-o", "--output", help="quantized model path (default: <model>_int8.onnx, _w4a8.onnx with "
                                           "--weight-bits 4)")
    q.add_argument("--report", help="JSON report path (default: <output>.report.json)")
    q.add_argument("--quiet", action="store_true", help="no progress bars")
    add_shape_arg(q)
    q.set_defaults(fn=cmd_quantize)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return v


def _cosine(text: str) -> float:
    try:
        check_target_cosine(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be in (0, 1] (a cosine similarity), got {text!r}") from e
    return float(text)


def _percentile(text: str) -> float:
    try:
        check_percentile(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be in (0, 100], got {text!r}") from e
    return float(text)


def _data(spec: str, model: onnx.ModelProto, what: str):
    if spec.startswith("synthetic:"):
        n = spec.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"{what} '{spec}': synthetic:N needs a positive integer N")
        return calibration_data(model, int(n), seed=0)
    if not Path(spec).exists():
        raise FileNotFoundError(f"{what} '{spec}' does not exist")
    return spec


def cmd_quantize(args: argparse.Namespace) -> int:
    try:
        return _quantize(args)
    except (ValueError, KeyError, TypeError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"dsa-tvm quantize: error: {msg}", file=sys.stderr)
        return 2


def _quantize(args: argparse.Namespace) -> int:
    src = Path(args.model)
    if not src.is_file():
        raise FileNotFoundError(f"model '{src}' does not exist")
    keep = [k for k in args.keep_fp32.split(",") if k]
    taken = load_onnx(src, parse_shape_args(args.shape))
    model = taken.model
    # the evaluation data first: a wrong shape is reported before the calibration work
    feeds = as_feeds(_data(args.eval or args.calib, model, "evaluation data" if args.eval
                           else "calibration data"),
                     input_shapes(model), args.preprocess, None, input_dtypes(model),
                     what="evaluation data" if args.eval else "calibration data")
    qm = quantize_onnx(taken, _data(args.calib, model, "calibration data"), method=args.method,
                       keep_fp32=keep, per_channel=not args.per_tensor_weights,
                       weight_bits=args.weight_bits, weight_group=args.weight_group or 0,
                       symmetric_activations=args.symmetric_activations,
                       num_batches=args.num_batches, preprocess=args.preprocess,
                       percentile=args.percentile, bias_correction=not args.no_bias_correction,
                       split_outliers=not args.no_outlier_split, show_progress=not args.quiet,
                       keep_grids=not args.no_keep_grids, quantize_norms=args.quantize_norms,
                       wide_norms=args.wide_norms)
    print(qm.summary())
    suffix = (f"_w{args.weight_bits}g{args.weight_group}.onnx" if args.weight_group
              else "_w4a8.onnx" if args.weight_bits == 4 else "_int8.onnx")
    out = Path(args.output) if args.output else src.with_name(src.stem + suffix)
    notes = []
    if not args.eval:
        notes.append("evaluated on the calibration data (pass --eval for held-out data)")
    ranking = None
    if (args.sensitivity or args.target_cosine is not None) and not qm.passthrough:
        # one ranking, on the fully quantized model: it drives the mixed precision too
        ranking = sensitivity(qm, feeds, show_progress=not args.quiet)
    if args.target_cosine is not None and not qm.passthrough:
        qm, kept, cos = mixed_precision(qm, feeds, args.target_cosine, args.max_fp32, ranking=ranking,
                                        show_progress=not args.quiet)
        met = "met" if cos >= args.target_cosine else "NOT met"
        notes.append(f"mixed precision: target cosine {args.target_cosine} {met} ({cos:.5f}) "
                     f"keeping {len(kept)} more layer(s) in FP32: {', '.join(kept) or '-'}")
    rep = accuracy_report(qm, feeds, name=src.name, show_progress=not args.quiet)
    if args.sensitivity and ranking is not None:
        rep.sensitivity = ranking
        notes.append("sensitivity measured on the fully quantized model")
    rep.notes += notes
    qm.save(out)
    print(rep)
    rpath = Path(args.report) if args.report else out.with_suffix(".report.json")
    rpath.write_text(rep.to_json())
    print(f"quantized model: {out}\nreport: {rpath}")
    bad = [o for o, c in rep.output_cosine.items() if not math.isfinite(c)]
    if bad:
        print(f"dsa-tvm quantize: error: the output cosine of {', '.join(bad)} is not a number: "
              "the FP32 or the int8 model computes NaN/Inf on the evaluation data", file=sys.stderr)
        return 1
    return 0

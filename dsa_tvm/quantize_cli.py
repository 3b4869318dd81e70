"""``dsa-tvm quantize``: FP32 ONNX -> int8 QDQ ONNX, with the accuracy report.

    dsa-tvm quantize model.onnx --calib photos/ --method percentile -o model_int8.onnx
    dsa-tvm quantize model.onnx --calib calib.npz --eval eval.npz --sensitivity --target-cosine 0.99

Writes the QDQ model (``-o``), prints the per-layer table and writes it as JSON
(``--report``, default next to the output). ``--calib synthetic:N`` uses N seeded
synthetic batches (image-like or token-embedding-like) when no data is at hand.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import onnx


def add_parser(sub) -> None:
    """Register the ``quantize`` subcommand on an argparse subparsers object."""
    q = sub.add_parser("quantize", help="post-training int8 quantization of an FP32 ONNX model (QDQ), "
                                        "with a per-layer accuracy report")
    q.add_argument("model", help="FP32 ONNX model (an already-QDQ model is passed through)")
    q.add_argument("--calib", required=True,
                   help="calibration data: folder of images, .npz/.npy, or synthetic:N")
    q.add_argument("--eval", help="evaluation data (same forms; default: the calibration data)")
    q.add_argument("--method", default="minmax", choices=["minmax", "percentile", "entropy", "mse"])
    q.add_argument("--percentile", type=float, default=99.999)
    q.add_argument("--num-batches", type=int, help="use only the first N calibration batches")
    q.add_argument("--preprocess", default="imagenet",
                   help="image preprocessing: imagenet | efficientnet | unit | raw")
    q.add_argument("--keep-fp32", default="", help="comma-separated node names to keep in FP32")
    q.add_argument("--symmetric-activations", action="store_true")
    q.add_argument("--per-tensor-weights", action="store_true")
    q.add_argument("--no-bias-correction", action="store_true")
    q.add_argument("--no-outlier-split", action="store_true")
    q.add_argument("--sensitivity", action="store_true", help="rank layers by what FP32 would buy")
    q.add_argument("--target-cosine", type=float,
                   help="automatic mixed precision: keep the worst layers in FP32 until reached")
    q.add_argument("--max-fp32", type=int, default=8, help="at most this many layers for --target-cosine")
    q.add_argument("-o", "--output", help="quantized model path (default: <model>_int8.onnx)")
    q.add_argument("--report", help="JSON report path (default: <output>.report.json)")
    q.add_argument("--quiet", action="store_true", help="no progress bars")
    from .frontend.intake import add_shape_arg

    add_shape_arg(q)
    q.set_defaults(fn=cmd_quantize)


def _data(spec: str, model: onnx.ModelProto):
    if spec.startswith("synthetic:"):
        from .models import calibration_data

        return calibration_data(model, int(spec.split(":", 1)[1]), seed=0)
    if not Path(spec).exists():
        raise FileNotFoundError(f"calibration/evaluation data '{spec}' does not exist")
    return spec


def cmd_quantize(args: argparse.Namespace) -> int:
    from .frontend.intake import load_onnx, parse_shape_args
    from .quant import quantize_onnx
    from .quant.accuracy import accuracy_report, mixed_precision, sensitivity
    from .quant.api import input_dtypes, input_shapes
    from .quant.data import as_feeds

    src = Path(args.model)
    keep = [k for k in args.keep_fp32.split(",") if k]
    try:
        taken = load_onnx(src, parse_shape_args(args.shape))
        model = taken.model
        qm = quantize_onnx(taken, _data(args.calib, model), method=args.method, keep_fp32=keep,
                           per_channel=not args.per_tensor_weights,
                           symmetric_activations=args.symmetric_activations,
                           num_batches=args.num_batches, preprocess=args.preprocess,
                           percentile=args.percentile, bias_correction=not args.no_bias_correction,
                           split_outliers=not args.no_outlier_split, show_progress=not args.quiet)
    except (ValueError, KeyError, TypeError) as e:
        print(f"dsa-tvm quantize: error: {e}", file=sys.stderr)
        return 2
    print(qm.summary())
    out = Path(args.output) if args.output else src.with_name(src.stem + "_int8.onnx")
    eval_spec = args.eval or args.calib
    feeds = as_feeds(_data(eval_spec, model), input_shapes(qm.fp32), args.preprocess,
                     None, input_dtypes(qm.fp32))
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
    return 0

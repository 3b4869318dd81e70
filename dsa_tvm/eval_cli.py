"""``dsa-tvm eval``: a QDQ model on the DSA over a dataset, against a reference.

    dsa-tvm eval model_int8.onnx --data photos/ --reference model.onnx --labels labels.txt
    dsa-tvm eval resnet18 --data eval.npz --limit 200 --workers 2 --batch 16 --json eval.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .cli_common import CliError, at_least_one, hw_spec
from .quant.data import PREPROCESS


def add_parser(sub) -> None:
    from .evaluation import DEFAULT_BATCH, TASKS

    e = sub.add_parser("eval", help="run a quantized model on the DSA over a dataset and compare "
                                    "it with the FP32 model (cosine, top-1/top-5, accuracy)")
    e.add_argument("model", help="QDQ ONNX model or bundled model name")
    e.add_argument("--data", required=True, help="folder of images, .npz or .npy")
    e.add_argument("--reference", help="FP32 ONNX model (default: the QDQ graph in onnxruntime)")
    e.add_argument("--labels", help="class indices, one per input (.npy or a text file)")
    e.add_argument("--limit", type=at_least_one, help="only the first K inputs")
    e.add_argument("--workers", type=at_least_one, help="processes (default: one per core)")
    e.add_argument("--batch", type=at_least_one, default=DEFAULT_BATCH,
                   help="inputs each worker runs at once: their launches become one batched "
                        f"simulation per program (the same outputs; default {DEFAULT_BATCH})")
    e.add_argument("--ray", metavar="ADDRESS", help="run the inputs on a Ray cluster, --workers "
                                                    "actors each compiling once ('auto', "
                                                    "host:port or 'local')")
    e.add_argument("--preprocess", default="imagenet", choices=list(PREPROCESS))
    e.add_argument("--task", default="auto", choices=list(TASKS),
                   help="what to score: class scores (top-1/top-5), embeddings (nearest-"
                        "neighbour agreement, pairwise cosine), the cosine only; auto: "
                        "from the output")
    e.add_argument("--json", help="write the report as JSON here")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.add_argument("--hw", default="default", type=hw_spec, help="hardware preset or .toml")
    e.set_defaults(fn=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from .evaluation import evaluate

    try:
        rep = evaluate(args.model, args.data, reference=args.reference, hw=args.hw,
                       labels=args.labels, limit=args.limit, workers=args.workers,
                       preprocess=args.preprocess, show_progress=not args.quiet,
                       ray_address=args.ray, task=args.task, batch=args.batch)
    except (ValueError, KeyError) as e:
        raise CliError(str(e.args[0] if e.args else e)) from None
    print(rep)
    if args.json:
        Path(args.json).write_text(rep.to_json())
        print(f"report: {args.json}")
    return 0

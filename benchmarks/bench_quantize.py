"""Post-training quantization: calibration wall time and accuracy, dsa-tvm vs onnxruntime.

    python benchmarks/bench_quantize.py                 # both real models, all methods
    python benchmarks/bench_quantize.py --reps 3 --only efficientnet

1. Calibration wall time for EfficientNet-Lite0 (16 photo crops): our quantize_onnx
   (minmax) against onnxruntime's quantize_static (QDQ, per-channel, MinMax) on the same
   feeds, best of --reps, printed as a ratio. Never asserted: the machine is shared.
2. Accuracy table on the same calibration and evaluation data: EfficientNet-Lite0 on
   scikit-image's photos (logit cosine, top-1 agreement with FP32) and all-MiniLM-L6-v2
   (sentence-embedding cosine), both quantizers.
"""

from __future__ import annotations

import argparse
import time

import onnx

from dsa_tvm.models.pretrained import (
    PHOTOS,
    SENTENCES,
    efficientnet_lite0_path,
    minilm_feeds,
    minilm_path,
    photo_batches,
)
from dsa_tvm.models.versus_ort import format_table, ours_vs_onnxruntime
from dsa_tvm.quant import quantize_onnx

CALIB_PHOTOS = 8


def best_of(reps: int, fn) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def calibration_time(reps: int) -> None:
    from dsa_tvm.models.quantize import qdq_quantize

    model = onnx.load(str(efficientnet_lite0_path()))
    calib = [{"image": x} for x in photo_batches(PHOTOS[:CALIB_PHOTOS], views=2)]
    ours = best_of(reps, lambda: quantize_onnx(model, calib, show_progress=False))
    ort = best_of(reps, lambda: qdq_quantize(model, calib, per_channel=True, calibrate_method="MinMax"))
    print(f"EfficientNet-Lite0 calibration + quantization, {len(calib)} batches, best of {reps}:")
    print(f"  dsa-tvm quantize_onnx (minmax):        {ours:7.2f} s")
    print(f"  onnxruntime quantize_static (MinMax):  {ort:7.2f} s")
    print(f"  ratio dsa-tvm / onnxruntime:           {ours / ort:7.2f}x")


def accuracy_tables(only: str | None) -> None:
    if only in (None, "efficientnet"):
        model = onnx.load(str(efficientnet_lite0_path()))
        calib = [{"image": x} for x in photo_batches(PHOTOS[:CALIB_PHOTOS], views=2)]
        evals = [{"image": x} for x in photo_batches(PHOTOS[CALIB_PHOTOS:], views=2)]
        print(f"\nEfficientNet-Lite0: {len(calib)} calibration / {len(evals)} evaluation crops "
              f"of scikit-image photos (disjoint photos)")
        rows = ours_vs_onnxruntime(model, calib, evals, "efficientnet-lite0",
                                   methods=[("minmax", "MinMax"), ("percentile", "Percentile"),
                                            ("entropy", "Entropy")])
        rows += ours_vs_onnxruntime(model, calib, evals, "efficientnet-lite0", methods=[("mse", "")],
                                    with_ort=False)
        print(format_table(rows))
    if only in (None, "minilm"):
        model = onnx.load(str(minilm_path()))
        feeds = minilm_feeds(SENTENCES)
        calib, evals = feeds[:12], feeds[12:]
        print(f"\nall-MiniLM-L6-v2: {len(calib)} calibration / {len(evals)} evaluation sentences "
              f"(embedding cosine)")
        rows = ours_vs_onnxruntime(model, calib, evals, "all-MiniLM-L6-v2", classifier=False,
                                   methods=[("minmax", "MinMax")])
        rows += ours_vs_onnxruntime(model, calib, evals, "all-MiniLM-L6-v2", classifier=False,
                                    methods=[("percentile", ""), ("mse", "")], with_ort=False)
        print(format_table(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--only", choices=["efficientnet", "minilm"])
    args = ap.parse_args()
    if args.only in (None, "efficientnet"):
        calibration_time(args.reps)
    accuracy_tables(args.only)


if __name__ == "__main__":
    main()

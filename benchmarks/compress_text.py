"""The transformer half of ``bench_compress.py``: all-MiniLM-L6-v2 (a sentence embedder),
post-training vs trained against the DSA's integers, on sentences of English text.

Unlabeled data: sentences of the Python docs (``pretrained.text_sentences``); calibration
and training sentences on one side, test sentences (other docs sentences and the bundled
everyday ones) on the other, the same for PTQ and QAT. Every row against the FP32 model
on the test sentences: embedding cosine (mean) and nearest-neighbour agreement (does each
sentence's closest other sentence stay the same); cycles and DRAM bytes of one sentence on
the ``default`` DSA.

- PTQ: ``quantize_onnx`` of the exported FP32 model (outlier channels of the projections
  split into FP32 side paths; attention matmuls int8, softmax and LayerNorm FP32).
- QAT: ``dsa_tvm.models.minilm_torch`` prepared by ``qat.prepare`` (every projection
  integer, outlier output channels split into FP32 side paths as PTQ splits them, W4A8
  with SmoothQuant's migration; attention, softmax, LayerNorm FP32; GELU a DSA table)
  and distilled (cosine loss to the FP32 embedding). The exported model on the DSA is
  checked against the prepared module: each one-projection launch bit for bit on its own
  int8 input ("k/n exact"), and end to end (the largest difference: the host's float
  ops can flip a code at a rounding tie, and a flip propagates).
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import torch
import tvm
from tvm import relax

import dsa_tvm
from dsa_tvm import qat
from dsa_tvm.models.minilm_torch import minilm
from dsa_tvm.models.pretrained import SENTENCES, minilm_feeds, minilm_path, text_sentences
from dsa_tvm.qat.layers import WeightedLayer
from dsa_tvm.quant import quantize_onnx
from dsa_tvm.runtime import take_launches


def tokens(sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    feeds = minilm_feeds(sentences)
    return (torch.from_numpy(np.concatenate([f["input_ids"] for f in feeds])),
            torch.from_numpy(np.concatenate([f["attention_mask"] for f in feeds])))


def agreement(emb: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(nearest-neighbour agreement, mean cosine) of embeddings against the FP32 ones."""
    def nearest(e: np.ndarray) -> np.ndarray:
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(1)

    cos = (emb * ref).sum(1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(ref, axis=1)
    return float((nearest(emb) == nearest(ref)).mean()), float(cos.mean())


class OnDsa:
    """A model compiled for a DSA (every region offloaded), run sentence by sentence."""

    def __init__(self, model: onnx.ModelProto, hw="default") -> None:
        with dsa_tvm.options(offload="all"):
            ex = dsa_tvm.compile(model, hw, verbose=False)
        self.report = dsa_tvm.last_compile_report()
        self.vm = relax.VirtualMachine(ex, tvm.cpu())

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
        return np.concatenate([self.vm["main"](tvm.runtime.tensor(ids[i:i + 1].numpy()),
                                               tvm.runtime.tensor(mask[i:i + 1].numpy())).numpy()
                               for i in range(len(ids))])

    def cost(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[int, int]:
        """(cycles, DRAM bytes read + written) of one sentence."""
        self(ids[:1], mask[:1])
        rep = dsa_tvm.run_report(self.vm)
        return rep.total_cycles, sum(r.dram_read + r.dram_written for r in rep.rows)


def ptq_row(label: str, bits: int, cal: list[str], test, ref: np.ndarray, group: int = 0,
            norms: bool | set[str] = False, wide_norms: bool = False) -> dict:
    """``norms``: ``quantize_norms`` (True), or {"softmax"}: LayerNorm kept FP32;
    ``wide_norms``: the norms' tensors int16."""
    t = time.perf_counter()
    model = onnx.load(str(minilm_path()))
    keep = ([n.name for n in model.graph.node if n.op_type == "LayerNormalization"]
            if norms and norms is not True and "layer_norm" not in norms else [])
    qm = quantize_onnx(model, minilm_feeds(cal), weight_bits=bits, weight_group=group,
                       show_progress=False, quantize_norms=bool(norms), keep_fp32=keep,
                       wide_norms=wide_norms)
    dsa = OnDsa(qm.model)
    nn_agree, cos = agreement(dsa(*test), ref)
    cycles, nbytes = dsa.cost(*test)
    return dict(label=label, top1=nn_agree, cos=cos, cycles=cycles, bytes=nbytes,
                exact="(DSA run)", note=f"{time.perf_counter() - t:.0f} s")


def layerwise(p, dsa: OnDsa, ids: torch.Tensor, mask: torch.Tensor) -> tuple[int, int]:
    """(launches checked, launches bit-exact): every DSA launch of one projection against
    the prepared projections run on the launch's own int8 input, so the host's float ops
    (which can flip a code at a rounding tie, and a flip propagates) are out of the
    comparison. Launches need not come in the forward pass's order (with attention on the
    device, K's region runs before Q's), so a launch is exact when one projection not yet
    matched gives its codes bit for bit (different projections' codes differ wholesale)."""
    pending = [m for m in p.modules() if isinstance(m, WeightedLayer)]
    take_launches()
    dsa(ids[:1], mask[:1])
    checked, exact = 0, 0
    for la in take_launches():
        metas = la.program.meta["layers"]
        if len(metas) != 1 or metas[0]["op"] not in ("Dense", "GroupedDense") \
                or len(la.inputs) != 1:
            continue   # regions of several layers: in the end-to-end comparison
        (x,), (y,) = la.inputs.values(), la.outputs.values()
        checked += 1
        for layer in pending:
            if layer.weight.shape[1] != x.shape[-1]:
                continue
            g, out = layer.inputs[0], layer.out
            xf = torch.from_numpy((x.astype(np.float32) - g.zero_point) * np.float32(g.s))
            with torch.no_grad():
                codes = np.round(layer.integer_forward(xf).numpy() / np.float32(out.scale))
            if codes.shape == y.shape and np.array_equal(codes.astype(np.int64) + out.zero_point,
                                                         y.astype(np.int64)):
                pending.remove(layer)
                exact += 1
                break
    return checked, exact


def _checked(p, test, hw="default") -> tuple[OnDsa, str]:
    """The exported module on the DSA, and how it compares with the prepared one: the
    largest end-to-end difference on two test sentences and the projections bit-exact."""
    dsa = OnDsa(qat.export(p), hw)
    with torch.no_grad():
        want = p(test[0][:2], test[1][:2]).numpy()
    diff = float(np.abs(dsa(test[0][:2], test[1][:2]) - want).max())
    checked, exact = layerwise(p, dsa, *test)
    return dsa, f"{exact}/{checked} exact, e2e {diff:.0e}"


def qat_rows(label: str, net, bits: int, sparse: bool, data: dict, test, ref: np.ndarray,
             steps: int, args, sparse_hw=None, group: int = 0,
             mixed_drop: float | None = None, sparse_drop: float | None = None,
             norms: bool | set[str] = False, wide_norms: bool = False) -> list[dict]:
    t = time.perf_counter()
    # PTQ's outlier split (the FFN outputs' few huge channels in FP32 beside the layer);
    # at 4 bits also SmoothQuant's scale migration into the weights (measured: it helps
    # W4A8's start, 0.897 -> 0.910 cosine, and costs int8's a little, 0.992 -> 0.990)
    p = qat.prepare(net, (data["cal"][0][:1], data["cal"][1][:1]), [data["cal"]],
                    bits=8 if mixed_drop is not None else bits, learn_scales=True,
                    split_outliers=True, smooth=0.5 if bits == 4 else None, weight_group=group,
                    quantize_norms=norms, wide_norms=wide_norms)
    note = ""
    if mixed_drop is not None:   # the most sensitive projections stay 8-bit
        sens = data["heldout"]
        base = qat.precision.output_cosine(p, sens, qat.precision.fp32_outputs(p, sens))
        widths, reached = qat.choose_bits(p, sens, base - mixed_drop, low=bits)
        note = (f"{sum(b == 8 for b in widths.values())}/{len(widths)} layers 8-bit, "
                f"{qat.precision.low_share(p, bits):.0%} of weights {bits}-bit (cosine "
                f"{reached:.4f} >= {base:.4f} - {mixed_drop}); ")
    if sparse:
        skip: list[str] = []
        how = dict(method=args.sparse_method)
        if args.sparse_method == "sparsegpt":   # refit on the first 128 training sentences
            ids = torch.cat([b[0] for b in data["train"][:128]])
            mask = torch.cat([b[1] for b in data["train"][:128]])
            how["refit_data"] = [(ids[i:i + 32], mask[i:i + 32]) for i in range(0, len(ids), 32)]
        if sparse_drop is not None:   # only the projections that tolerate it
            sens = data["heldout"]
            base = qat.precision.output_cosine(p, sens, qat.precision.fp32_outputs(p, sens))
            chosen, reached = qat.choose_sparse_layers(p, sens, base - sparse_drop,
                                                       calibration_data=[data["cal"]], **how)
            eligible = qat.sparse_choice.eligible_layers(p, 2, 4)
            skip = [k for k in eligible if k not in chosen]
            note = (f"{len(chosen)}/{len(eligible)} layers pruned (cosine {reached:.4f} >= "
                    f"{base:.4f} - {sparse_drop}); ")
        rep = qat.prune(p, 2, 4, skip=skip, calibration_data=[data["cal"]], **how)
        note = f"{args.sparse_method}: " + note
        note += f"{rep.pruned_share:.0%} of weights pruned; "
    with torch.no_grad():
        before = agreement(p(*test).numpy(), ref)
    res = qat.distill(p, net, data["train"], data["heldout"], steps=steps,
                      batch_size=args.batch, lr=args.text_lr, scale_lr=args.scale_lr,
                      loss="cosine", eval_every=args.eval_every, patience=args.patience, seed=0,
                      show_progress=True)
    with torch.no_grad():
        after = agreement(p(*test).numpy(), ref)
    dsa, exact = _checked(p, test, sparse_hw or "default")
    cycles, nbytes = dsa.cost(*test)
    if sparse:
        dense_cycles, _ = OnDsa(qat.export(p)).cost(*test)
        note += f"dense array {dense_cycles / 1e6:.3f} M cycles ({dense_cycles / cycles:.2f}x)"
    common = dict(cycles=cycles, bytes=nbytes, exact=exact)
    took = f"{time.perf_counter() - t:.0f} s, {res.summary()}"
    return [dict(label=f"{label} before training", top1=before[0], cos=before[1], note=note,
                 **common),
            dict(label=f"{label} QAT", top1=after[0], cos=after[1], note=took, **common)]


def _minilm_data(args, steps: int) -> tuple:
    """(FP32 module, test tokens, FP32 embeddings, training data, calibration sentences)."""
    n_train, n_test = (96, 24) if args.quick else (384, 48)
    docs = text_sentences(seed=0)
    train_s, test_s = docs[:n_train], docs[n_train:n_train + n_test] + list(SENTENCES)
    net = minilm()
    test = tokens(test_s)
    with torch.no_grad():
        ref = net(*test).numpy()
    ids, mask = tokens(train_s)
    cut = n_train // 8
    data = dict(cal=(ids[:32], mask[:32]),
                train=[(ids[i:i + 1], mask[i:i + 1]) for i in range(n_train - cut)],
                heldout=[(ids[-cut:], mask[-cut:])])
    print(f"all-MiniLM-L6-v2: {n_train - cut} training sentences (+{cut} held out) of the "
          f"Python docs, {len(test_s)} test sentences (docs and everyday); {steps} steps")
    return net, test, ref, data, train_s[:32]


def minilm_rows(args, steps: int) -> list[dict]:
    """MiniLM's PTQ int8 / W4A8 and QAT int8 / W4A8 rows."""
    net, test, ref, data, cal_s = _minilm_data(args, steps)
    rows = [ptq_row("MiniLM PTQ int8", 8, cal_s, test, ref),
            ptq_row("MiniLM PTQ W4A8", 4, cal_s, test, ref)]
    rows += qat_rows("MiniLM int8", net, 8, False, data, test, ref, steps, args)
    rows += qat_rows("MiniLM W4A8", net, 4, False, data, test, ref, steps, args)
    return rows


def minilm_norms_rows(args, steps: int) -> list[dict]:
    """MiniLM int8 with the attention matmuls and softmax on the DSA's integer units, then
    LayerNorm too (``quantize_norms``), PTQ against QAT: the LayerNorm outputs lose PTQ's
    outlier split (they are int8 now, not FP32 values a side path can read), which QAT
    trains for; then the norm stream on int16 grids (``wide_norms``), which keeps it."""
    net, test, ref, data, cal_s = _minilm_data(args, steps)
    rows = [ptq_row("MiniLM PTQ int8 softmax", 8, cal_s, test, ref, norms={"softmax"}),
            ptq_row("MiniLM PTQ int8 norms", 8, cal_s, test, ref, norms=True),
            ptq_row("MiniLM PTQ int8 norms, int16 stream", 8, cal_s, test, ref, norms=True,
                    wide_norms=True)]
    rows += qat_rows("MiniLM int8 softmax", net, 8, False, data, test, ref, steps, args,
                     norms={"softmax"})
    rows += qat_rows("MiniLM int8 norms", net, 8, False, data, test, ref, steps, args,
                     norms=True)
    rows += qat_rows("MiniLM int8 norms, int16 stream", net, 8, False, data, test, ref, steps,
                     args, norms=True, wide_norms=True)
    return rows


def minilm_sparse_rows(args, steps: int, sparse_hw) -> list[dict]:
    """MiniLM 2:4 sparse int8 QAT: every projection, and the ones
    ``choose_sparse_layers`` picks for ``--text-sparse-drop``."""
    net, test, ref, data, _ = _minilm_data(args, steps)
    rows = qat_rows("MiniLM int8 2:4 sparse", net, 8, True, data, test, ref, steps, args,
                    sparse_hw)
    rows += qat_rows("MiniLM int8 2:4 sparse, chosen layers", net, 8, True, data, test, ref,
                     steps, args, sparse_hw, sparse_drop=args.text_sparse_drop)
    return rows


def minilm_grouped_rows(args, steps: int) -> list[dict]:
    """MiniLM with int4 weights per group of 32 input rows (the DSA's grouped dense): PTQ
    (``quantize_onnx(..., weight_group=32)``), QAT (``prepare(..., weight_group=32)``) and
    mixed QAT (``choose_bits`` keeps the projections that lose the most at 8 bits, per
    group too, until the held-out cosine is within ``--text-target-drop`` of all-8-bit)."""
    net, test, ref, data, cal_s = _minilm_data(args, steps)
    rows = [ptq_row("MiniLM PTQ W4A8 g32", 4, cal_s, test, ref, group=32)]
    rows += qat_rows("MiniLM W4A8 g32", net, 4, False, data, test, ref, steps, args, group=32)
    rows += qat_rows("MiniLM W4A8 g32 mixed", net, 4, False, data, test, ref, steps, args,
                     group=32, mixed_drop=args.text_target_drop)
    return rows

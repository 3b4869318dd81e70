"""Noise-aware training for analog crossbars: EfficientNet-Lite0 on ``cim-pcm``, PTQ vs QAT
vs QAT with the crossbars' noise in the forward pass, measured on the simulated part.

    python benchmarks/bench_qat_analog.py            # two settings, 5 chips each
    python benchmarks/bench_qat_analog.py --quick    # one setting, fewer crops, steps, chips

EfficientNet-Lite0 with its ImageNet weights; unlabeled data as ``bench_compress.py``:
seeded random crops, training crops from every other scikit-image photo, test crops
from the rest. Rows, every one an int8 model of the same network:

- PTQ: ``dsa_tvm.quantize_onnx`` on the first 16 training crops (what ``dsa-tvm
  cim-sweep`` measures);
- QAT: ``qat.prepare`` then ``qat.distill`` (KL to the FP32 logits, learned activation
  scales) against the DSA's exact integers;
- QAT + analog noise: the same run (same data, steps, seed) with ``qat.enable_analog`` on
  the evaluated setting: every forward pass reads a new simulated chip (programming
  noise, drift, read noise, the ADC of every crossbar), the gradient goes to the clean
  weights; ``--noise-scale`` multiplies the noise while training.

Each exported model is measured by the analog evaluation (``dsa_tvm.cim_study``'s
``ImageBench``, the code behind ``dsa-tvm cim-sweep``): compiled for the setting's
description, run on the simulator over the test crops for every chip seed (``--chips``:
the same seeds for every row), output cosine and top-1 agreement against the FP32 model
in onnxruntime, mean and spread (standard deviation over chips); and once on the
digital ``default`` part. Prints a table per setting and writes ``bench_qat_analog.png``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from bench_compress import TEST_PHOTOS, TRAIN_PHOTOS, lite0

import dsa_tvm
from dsa_tvm import qat
from dsa_tvm.cim_study.cnn import LITE0, ImageBench
from dsa_tvm.models.pretrained import random_crops

#: where int8 visibly loses on the cim-pcm part (its 8-bit ADCs at 1/16 of the worst-case
#: sum), name -> (what it is, the changes to cim-pcm)
SETTINGS = {
    "pcm": ("aihwkit PCM devices at 1/4 of the published noise, read 1 h after programming, "
            "drift compensated; 8-bit ADCs",
            dict(prog_noise_scale=0.25, read_noise_scale=0.25, drift_compensation=True)),
    "gauss": ("programming noise 1% of g_max, read at once; 8-bit ADCs",
              dict(noise_model="gaussian", prog_noise_scale=0.01, read_noise_scale=0.0,
                   t_inference_s=0.0)),
}


def setting(name: str):
    return dsa_tvm.load_config("cim-pcm").replace(**SETTINGS[name][1])


def train(net, data: dict, args, hw=None, noise_scale: float = 1.0) -> tuple:
    """A prepared Lite0 fine-tuned by distillation, with analog reads on ``hw`` when given;
    (the exported QDQ model, what distill did, seconds)."""
    t = time.perf_counter()
    p = qat.prepare(net, (data["train"][0][0][:1],), data["cal"], bits=8, learn_scales=True)
    if hw is not None:
        qat.enable_analog(p, hw, seed=args.train_seed, noise_scale=noise_scale)
    res = qat.distill(p, net, data["train"], data["heldout"], steps=args.steps,
                      batch_size=args.batch, lr=args.lr, scale_lr=args.scale_lr, loss="kl",
                      eval_every=args.eval_every, patience=args.patience, seed=0,
                      show_progress=True)
    if hw is not None:
        qat.disable_analog(p)
    return qat.export(p), res, time.perf_counter() - t


def evaluate(label: str, bench: ImageBench, hws: dict, chips: int, note: str) -> dict:
    """The model of ``bench`` on the digital part and on every setting, chip by chip."""
    t = time.perf_counter()
    row = dict(label=label, note=note, digital=bench.measure(dsa_tvm.load_config("default"))
               .metrics)
    for name, cfg in hws.items():
        runs = [bench.measure(cfg.replace(noise_seed=s)).metrics for s in range(chips)]
        row[name] = {k: np.array([r[k] for r in runs]) for k in runs[0]}
    row["eval_s"] = time.perf_counter() - t
    return row


def show(rows: list[dict], name: str) -> None:
    print(f"\n== {name}: {SETTINGS[name][0]}")
    print(f"{'':<30} {'digital top-1':>13} {'cosine':>7} | {'analog top-1 (chips)':>22} "
          f"{'cosine (chips)':>19}  note")
    for r in rows:
        if name not in r:
            continue
        a, d = r[name], r["digital"]
        print(f"{r['label']:<30} {100 * d['top1_agreement']:12.1f}% {d['cosine']:7.4f} | "
              f"{100 * a['top1_agreement'].mean():13.1f}% +- {100 * a['top1_agreement'].std():4.1f}"
              f" {a['cosine'].mean():10.4f} +- {a['cosine'].std():.4f}  {r['note']}")


def plot(rows: list[dict], names: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(names), 2, figsize=(12, 1.2 + 1.6 * len(rows) * len(names)),
                             squeeze=False)
    for i, name in enumerate(names):
        mine = [r for r in rows if name in r]
        y = np.arange(len(mine))
        for ax, key, k, label in ((axes[i, 0], "top1_agreement", 100, "top-1 agreement (%)"),
                                  (axes[i, 1], "cosine", 1, "logit cosine")):
            ax.barh(y - 0.2, [r["digital"][key] * k for r in mine], 0.4, color="tab:gray",
                    label="digital int8")
            ax.barh(y + 0.2, [r[name][key].mean() * k for r in mine], 0.4,
                    xerr=[r[name][key].std() * k for r in mine], color="tab:blue",
                    label="analog (mean, std over chips)")
            ax.set_xlabel(f"{label} with FP32")
            ax.set_yticks(y, [r["label"] for r in mine])
            ax.invert_yaxis()
        axes[i, 0].set_title(f"{name}: {SETTINGS[name][0]}", loc="left", fontsize=9)
    axes[0, 1].legend(loc="lower left", fontsize=8)
    fig.suptitle("EfficientNet-Lite0 on cim-pcm: PTQ, QAT, QAT with the analog noise")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def data_sets(n_train: int, n_test: int) -> dict:
    crops = random_crops(n_train, seed=1, names=TRAIN_PHOTOS)
    test = random_crops(n_test, seed=2, names=TEST_PHOTOS)
    batches = [(torch.from_numpy(c),) for c in crops]
    cut = n_train // 8
    return dict(crops=crops, test=test, train=batches[:-cut],
                heldout=[(torch.cat([b[0] for b in batches[-cut:]]),)],
                cal=[(torch.cat([b[0] for b in batches[:16]]),)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one setting, fewer crops and chips")
    ap.add_argument("--settings", help=f"comma-separated, of {', '.join(SETTINGS)} "
                                       f"(default: all; quick: pcm)")
    ap.add_argument("--steps", type=int, help="training steps per QAT row (default 120, quick 40)")
    ap.add_argument("--chips", type=int, help="noise seeds per evaluation (default 5, quick 3)")
    ap.add_argument("--images", type=int, help="test crops (default 64, quick 24)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--scale-lr", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--patience", type=int, default=4)
    ap.add_argument("--noise-scale", default="1",
                    help="training noise multiplier(s), comma-separated: one noise-aware row "
                         "each (default 1)")
    ap.add_argument("--train-seed", type=int, default=0, help="seed of the training chips")
    ap.add_argument("--png", default="bench_qat_analog.png")
    args = ap.parse_args()
    names = (args.settings or ("pcm" if args.quick else ",".join(SETTINGS))).split(",")
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        raise SystemExit(f"--settings: unknown {unknown}; choose from {sorted(SETTINGS)}")
    n_train, n_test = (64, 24) if args.quick else (128, 64)
    n_test = args.images or n_test
    args.steps = args.steps if args.steps is not None else (40 if args.quick else 120)
    chips = args.chips or (3 if args.quick else 5)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    net = lite0()
    data = data_sets(n_train, n_test)
    hws = {n: setting(n) for n in names}
    print(f"EfficientNet-Lite0: {len(data['train'])} training crops (+{n_train // 8} held out), "
          f"{n_test} test crops; {args.steps} steps of batch {args.batch}; {chips} chips per "
          f"evaluation; settings {', '.join(names)}", flush=True)

    def measured(label: str, quantized, note: str, only: dict) -> dict:
        bench = ImageBench(LITE0, data=data["crops"][:16] + data["test"], calibration=16,
                           limit=n_test, quantized=quantized)
        row = evaluate(label, bench, only, chips, note)
        print(f"  {label}: evaluated in {row['eval_s']:.0f} s; digital "
              + ", ".join(f"{k} {v:.4f}" for k, v in row["digital"].items())
              + "".join(f"; {n} " + ", ".join(f"{k} {v.mean():.4f} +- {v.std():.4f}"
                                               for k, v in row[n].items()) for n in only),
              flush=True)
        return row

    rows = [measured("PTQ int8", None, "quantize_onnx", hws)]
    model, res, took = train(net, data, args)
    rows.append(measured("QAT int8", model, f"{took:.0f} s, {res.summary()}", hws))
    for name, cfg in hws.items():
        for k in (float(v) for v in args.noise_scale.split(",")):
            model, res, took = train(net, data, args, cfg, k)
            label = "QAT + analog noise" + (f" x{k:g}" if k != 1 else "")
            rows.append(measured(label, model, f"{took:.0f} s, {res.summary()}", {name: cfg}))
    for name in names:
        show(rows, name)
    plot(rows, names, args.png)
    print(f"wrote {args.png}; total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

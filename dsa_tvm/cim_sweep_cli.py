"""``dsa-tvm cim-sweep MODEL``: what analog crossbars do to a real model.

    dsa-tvm cim-sweep efficientnet-lite0 --adc 4,6,8 --noise 0,0.02,0.05 --drift 1s,1d,1y
    dsa-tvm cim-sweep model.onnx --data photos/ --mitigate adc,drift,bias --grid full
    dsa-tvm cim-sweep smollm2 --adc 6,8 --noise 0,0.02 --drift 1s,1y --set cim.crossbars=4096
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .cli_common import CliError, at_least_one, hw_spec


def _listed(cast, what: str):
    """argparse type of a comma-separated list of ``what``, each read by ``cast``."""
    def parse(text: str) -> list:
        try:
            return [cast(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of "
                                             f"{what}") from None
    return parse


_floats = _listed(float, "numbers")
_ints = _listed(int, "whole numbers")


def _words(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def add_parser(sub) -> None:
    p = sub.add_parser(
        "cim-sweep", help="accuracy of a model on analog crossbars against ADC bits, device "
                          "noise and drift (and the mitigations), beside the digital part; "
                          "table, JSON and plot",
        description="Every point compiles the model for a CIM description (--hw with its ADC "
                    "bits, noise and time since programming set) and runs it on the "
                    "simulator: image models against the FP32 model (output cosine, top-1 "
                    "agreement), LLMs by perplexity and greedy-token agreement, with cycles "
                    "and energy per inference or decoded token against the digital part.")
    p.add_argument("model", help="efficientnet-lite0, an FP32 ONNX image model (with --data), "
                                 "or an LLM: smollm2, tiny, a .gguf file or a Hugging Face "
                                 "folder")
    p.add_argument("--data", help="images (folder) or .npz for an ONNX model: the first "
                                  "--calibration inputs calibrate, the next --limit evaluate")
    p.add_argument("--adc", type=_ints, default=[4, 6, 8], help="ADC bits (default 4,6,8)")
    p.add_argument("--noise", type=_floats, default=[0.0, 0.02, 0.05],
                   help="device noise (default 0,0.02,0.05): gaussian, the programming "
                        "noise as a fraction of g_max; pcm, the multiplier of aihwkit's "
                        "statistics")
    p.add_argument("--drift", type=_words, default=["1s", "1d", "1y"],
                   help="times since programming (s, m, h, d, w, y; default 1s,1d,1y)")
    p.add_argument("--noise-model", choices=("gaussian", "pcm"), default="gaussian")
    p.add_argument("--mitigate", type=_words, default=[],
                   help="adc (per-column ADC ranges from calibration), drift (global drift "
                        "compensation), bias (device-bias correction), reads=K (K reads "
                        "averaged), digital=N (image models: the N most sensitive layers, "
                        "each ranked by keeping it digital alone, on the digital array): "
                        "every point is run plain and mitigated")
    p.add_argument("--grid", choices=("axes", "full"), default="axes",
                   help="axes: each axis with the others at the base (most ADC bits, least "
                        "noise, shortest time); full: every combination")
    p.add_argument("--hw", default="cim-pcm", type=hw_spec,
                   help="the CIM description the points change (default cim-pcm)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="SECTION.FIELD=VALUE", help="change a field of --hw first")
    p.add_argument("--digital", default="default", type=hw_spec,
                   help="the digital part to compare with (default: default)")
    p.add_argument("--calibration", type=at_least_one, default=8,
                   help="calibration inputs (quantization and the mitigations; default 8)")
    p.add_argument("--limit", type=at_least_one, default=16,
                   help="evaluation inputs (default 16); LLM: tokens of text per point")
    p.add_argument("--out", default="cim_sweep_out",
                   help="folder for cim_sweep.json and cim_sweep.png (made if missing)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.set_defaults(fn=cmd_cim_sweep)


def cmd_cim_sweep(args: argparse.Namespace) -> int:
    from .hw.config import ConfigError, load_config, with_overrides

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out '{out}' is a file; give a folder (it is made if missing)")
    try:
        base = with_overrides(load_config(args.hw), args.overrides)
        kwargs = dict(hw=base, adc=args.adc, noise=args.noise, drift=args.drift,
                      noise_model=args.noise_model, mitigate=args.mitigate, grid=args.grid,
                      digital=args.digital)
        if _is_llm(args.model):
            from .cim_study.llm import study_llm

            if args.data is not None:
                raise CliError("--data is for image models; drop it (an LLM is measured on "
                               "pydoc_data's bundled English text)")
            study = study_llm(args.model, tokens=args.limit * 8, **kwargs)
        else:
            from .cim_study.cnn import study_cnn

            study = study_cnn(args.model, data=args.data, calibration=args.calibration,
                              limit=args.limit, **kwargs)
    except ConfigError as e:
        raise CliError(f"{e}; change the value (docs/hardware.md gives every field's "
                       f"rule)") from None
    except ValueError as e:
        raise CliError(str(e)) from None
    print(study)
    out.mkdir(parents=True, exist_ok=True)
    print(f"json: {study.write_json(out / 'cim_sweep.json')}")
    if not args.no_plot:
        print(f"plot: {study.plot(out / 'cim_sweep.png')}")
    return 0


def _is_llm(model: str) -> bool:
    p = Path(model)
    return model in ("smollm2", "tiny") or p.suffix == ".gguf" or (p / "config.json").is_file()

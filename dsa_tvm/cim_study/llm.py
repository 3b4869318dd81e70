"""A decoder LLM on analog crossbars: perplexity and greedy-token agreement against the
FP32 model at every point of a study, decode speed and energy per token beside the digital
part.

The int8 calibration and the quantized step graphs are made once (``CompiledLLM`` on the
digital part) and every point compiles them for its description
(``CompiledLLM.on_hardware``). A point whose mitigations need calibration runs the model's
calibration text through prefill and decode inside :func:`calibrating` first. Perplexity
is over the first ``tokens`` tokens of ``pydoc_data.topics`` (English text that ships with
Python); agreement is the share of greedy tokens equal to the FP32 model's over the
prompts; cycles and energy are one decode step's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..hw.config import HardwareConfig, load_config
from .grid import CALIBRATED, parse_duration, parse_mitigations, point_config, points
from .result import CimStudy, Measured

PROMPTS = ("The capital of France is", "Water is made of",
           "The largest planet in the solar system is", "To make a cup of tea, you")


def pydoc_text() -> str:
    from pydoc_data.topics import topics

    return "\n".join(topics[k] for k in sorted(topics))


def _agreement(a: list[int], b: list[int]) -> float:
    n = min(len(a), len(b))
    return float(np.mean([x == y for x, y in zip(a[:n], b[:n])])) if n else 1.0


def _measure(llm, ids: list[int], prompts: tuple[str, ...], new_tokens: int,
             want: list[list[int]], calibrate: bool) -> tuple[dict[str, float], float, float,
                                                              str]:
    from ..runtime import release_programs
    from ..sim.cim_arrays import calibrating

    if calibrate:
        with calibrating():
            text = llm._calibration[0] if llm._calibration else prompts[0]
            llm.generate(text, new_tokens)
    ppl = llm.perplexity(ids)
    agree, cycles, energy, shared = [], [], [], 0
    for prompt, ref in zip(prompts, want):
        gen = llm.generate(prompt, new_tokens)
        agree.append(_agreement(gen.ids, ref))
        cycles += [s.cycles for s in gen.decode]
        energy.append(sum(la.result.counters.get("energy_uj", 0.0)
                          for la in llm.last_launches))
        shared = max(shared, sum(1 for la in llm.last_launches if la.result.cim is not None
                                 and not la.result.cim.fits))
    note = f"{shared} decode launches time-shared (weights beyond the crossbars)" if shared \
        else ""
    release_programs()
    return ({"perplexity": ppl, "token_agreement": float(np.mean(agree))},
            float(np.mean(cycles)) if cycles else 0.0, float(np.mean(energy)), note)


def study_llm(model: str = "smollm2", hw: "str | HardwareConfig" = "cim-pcm",
              adc: list[int] = (6, 8), noise: list[float] = (0.0, 0.02),
              drift: list = ("1s", "1y"), noise_model: str = "gaussian",
              mitigate: list[str] = (), grid: str = "axes", digital: str = "default",
              tokens: int = 128, prompts: tuple[str, ...] = PROMPTS[:2], new_tokens: int = 8,
              progress: Callable[[str], None] | None = print, **load_options: Any) -> CimStudy:
    """Perplexity, token agreement, decode cycles and energy per token of ``model`` at
    every point, and on the ``digital`` part, against the FP32 model."""
    from ..llm import load

    if tokens < 2 or new_tokens < 1:
        raise ValueError("too few tokens; perplexity needs tokens >= 2 and agreement "
                         "new_tokens >= 1")
    base = load_config(hw)
    changes = parse_mitigations(list(mitigate))
    grid_points = points(list(adc), list(noise), [parse_duration(t) if isinstance(t, str)
                                                  else float(t) for t in drift],
                         grid, mitigated=bool(changes))
    for p in grid_points:
        point_config(base, p, noise_model, changes)
    say = progress or (lambda _msg: None)
    opts = dict(prefill_buckets=(32,), context_buckets=(max(64, tokens),), **load_options)
    ref = load(model, quant="fp32", **opts)
    ids = ref.token_ids(pydoc_text())[:tokens]
    want = [ref.generate(p, new_tokens).ids for p in prompts]
    fp32_ppl = ref.perplexity(ids)
    say(f"FP32 perplexity over {len(ids)} tokens: {fp32_ppl:.3f}")
    dig = load(model, hw=load_config(digital), quant="w8a8", **opts)
    say(f"digital W8A8 on '{dig.cfg.name}'")
    m, cyc, uj, note = _measure(dig, ids, prompts, new_tokens, want, False)
    study = CimStudy(model, base.name, noise_model, list(mitigate), len(ids), "token",
                     base.mhz, Measured(None, dig.cfg.name, m, cyc, uj, note),
                     reference={"perplexity": fp32_ppl})
    for k, p in enumerate(grid_points, 1):
        cfg = point_config(base, p, noise_model, changes)
        say(f"[{k}/{len(grid_points)}] {p.label}")
        needs = p.mitigated and any(cfg.values[f] for f in CALIBRATED)
        m, cyc, uj, note = _measure(dig.on_hardware(cfg), ids, prompts, new_tokens, want,
                                    needs)
        study.points.append(Measured(p, cfg.name, m, cyc, uj, note))
    return study

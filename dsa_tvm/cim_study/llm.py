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
from ..llm.source import pydoc_text
from .grid import DIGITAL, measure_points, plan
from .result import CimStudy, Measured

PROMPTS = ("The capital of France is", "Water is made of",
           "The largest planet in the solar system is", "To make a cup of tea, you")


def _agreement(a: list[int], b: list[int]) -> float:
    n = min(len(a), len(b))
    return float(np.mean([x == y for x, y in zip(a[:n], b[:n])])) if n else 1.0


class LlmBench:
    """A decoder made ready once (the FP32 reference's perplexity and greedy tokens, the
    W8A8 calibration and quantized steps on the ``digital`` part), measured on any
    description."""

    def __init__(self, model: str = "smollm2", digital: str = "default", tokens: int = 128,
                 prompts: tuple[str, ...] = PROMPTS[:2], new_tokens: int = 8,
                 say: Callable[[str], None] = lambda _m: None, **load_options: Any):
        from ..llm import load

        if tokens < 2 or new_tokens < 1:
            raise ValueError("too few tokens; perplexity needs tokens >= 2 and agreement "
                             "new_tokens >= 1")
        # the digital model's steps run on the analog views too: down_proj's input int8
        # (byte planes would share crossbar columns between rows 256 times apart), and the
        # MLP's interior, its input and Q, K, V int8, as an analog part's own model keeps them
        opts = dict(prefill_buckets=(32,), context_buckets=(max(64, tokens),),
                    **{"wide_down": False, "wide_mlp": False, "wide_qkv": False,
                       "wide_mlp_inputs": False, **load_options})
        ref = load(model, quant="fp32", **opts)
        self.ids = ref.token_ids(pydoc_text())[:tokens]
        self.prompts, self.new_tokens = prompts, new_tokens
        self.want = [ref.generate(p, new_tokens).ids for p in prompts]
        self.fp32_perplexity = ref.perplexity(self.ids)
        say(f"FP32 perplexity over {len(self.ids)} tokens: {self.fp32_perplexity:.3f}")
        self.digital = load(model, hw=load_config(digital), quant="w8a8", **opts)
        self._models: dict[tuple, Any] = {}      # compiled view -> the model compiled for it

    def measure(self, cfg: HardwareConfig | None = None, calibrate: bool = False,
                decode: bool = True, on_calibration: bool = False) -> Measured:
        """Perplexity and greedy agreement against FP32, cycles and energy of a decode step,
        on ``cfg`` (default: the digital part); ``calibrate``: the calibration text through
        prefill and decode inside :func:`calibrating` first; ``decode=False``: perplexity
        alone (prefill steps only: one bucket compiles); ``on_calibration``: the perplexity
        of the model's calibration text instead (to choose a setting without the measured
        text)."""
        from contextlib import nullcontext

        from ..runtime import cim_conditions, compiled_view

        llm = self.digital
        if cfg is not None:   # compiled once per view: device conditions run under it
            if compiled_view(cfg) not in self._models:
                self._models[compiled_view(cfg)] = self.digital.on_hardware(cfg)
            llm = self._models[compiled_view(cfg)]
        with cim_conditions(cfg) if cfg is not None and cfg.is_cim else nullcontext():
            m = self._measure(llm, calibrate, decode, on_calibration)
        m.hw = llm.cfg.name if cfg is None else cfg.name
        return m

    def _measure(self, llm, calibrate: bool, decode: bool, on_calibration: bool) -> Measured:
        from ..sim.cim_arrays import calibrating

        text = llm._calibration[0] if llm._calibration else self.prompts[0]
        calib_ids = llm.token_ids(text)[:llm.context_buckets[-1] - self.new_tokens]
        if calibrate:   # the model's own calibration text (not the measured text)
            with calibrating():
                llm.perplexity(calib_ids)
                if decode:
                    llm.generate(calib_ids[:8], self.new_tokens)
        ppl = llm.perplexity(calib_ids if on_calibration else self.ids)
        decode = decode and not on_calibration
        agree, cycles, energy, shared = [], [], [], 0
        for prompt, ref in zip(self.prompts if decode else (), self.want):
            gen = llm.generate(prompt, self.new_tokens)
            agree.append(_agreement(gen.ids, ref))
            cycles += [s.cycles for s in gen.decode]
            energy.append(sum(la.result.counters.get("energy_uj", 0.0)
                              for la in llm.last_launches))
            shared = max(shared, sum(1 for la in llm.last_launches
                                     if la.result.cim is not None and not la.result.cim.fits))
        self.last = llm
        note = (f"{shared} decode launches time-shared (weights beyond the crossbars)"
                if shared else "")
        metrics = {"perplexity": ppl}
        if agree:
            metrics["token_agreement"] = float(np.mean(agree))
        return Measured(None, "", metrics, float(np.mean(cycles)) if cycles else 0.0,
                        float(np.mean(energy)) if energy else 0.0, note)


def study_llm(model: str = "smollm2", hw: "str | HardwareConfig" = "cim-pcm",
              adc: list[int] = (6, 8), noise: list[float] = (0.0, 0.02),
              drift: list = ("1s", "1y"), noise_model: str = "gaussian",
              mitigate: list[str] = (), grid: str = "axes", digital: str = "default",
              tokens: int = 128, prompts: tuple[str, ...] = PROMPTS[:2], new_tokens: int = 8,
              progress: Callable[[str], None] | None = print, **load_options: Any) -> CimStudy:
    """Perplexity, token agreement, decode cycles and energy per token of ``model`` at
    every point, and on the ``digital`` part, against the FP32 model."""
    grid_plan = plan(hw, adc, noise, drift, noise_model, mitigate, grid)
    if DIGITAL in grid_plan.changes:
        raise ValueError("digital=N ranks an image model's layers one run each; for an LLM "
                         "give the layers yourself: --set cim.digital_layers=NAME,...")
    say = progress or (lambda _msg: None)
    bench = LlmBench(model, digital, tokens, prompts, new_tokens, say, **load_options)
    say(f"digital W8A8 on '{bench.digital.cfg.name}'")
    study = CimStudy(model, grid_plan.base.name, noise_model, list(mitigate), len(bench.ids),
                     "token", grid_plan.base.mhz, bench.measure(),
                     reference={"perplexity": bench.fp32_perplexity})
    return measure_points(study, bench.measure, grid_plan, noise_model, say)

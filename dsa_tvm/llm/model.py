"""``dsa_tvm.llm.load``: a decoder LLM compiled for the DSA, step by step.

Quantized once (ranges from FP32 decode steps over calibration text, shared by every
bucket so the KV cache has one int8 grid), compiled once per bucket, run on the
simulator through TVM's VM; the host embeds, keeps the cache and samples.
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from tir_schedules.options import CompileOptions, options

from .buckets import CONTEXT, PREFILL, bucket, check_buckets
from .feeds import KVCache, step_feeds
from .gptq import default_texts, gptq_llama
from .records import Generation, StepRecord
from .smooth import check_alpha, check_folds, check_group, smooth_llama
from .source import Source, load_source
from .step import Arch, export_step, run_step_fp32

if TYPE_CHECKING:
    import onnx

QUANTS = ("w8a8", "w4a8", "w4g32", "fp32")
#: SmoothQuant's migration strength folded into the quantized steps' weights by default
#: (llm.smooth), and the inputs it smooths: the two folds into the RMSNorm weights. On the
#: int16 residual stream they help; the folds into up_proj's and v_proj's rows hurt
#: (their outputs have int8 grids of their own). Measured on SmolLM2, docs/llm.md.
SMOOTH: float | None = 0.5
SMOOTH_FOLDS: tuple[str, ...] = ("qkv", "gate_up")
#: weight bits of each quantization (fp32: nothing simulated). w4g32: int4 codes with a
#: scale and a minimum per group of 32 input rows (GGUF Q4_1's grid, the DSA's grouped
#: dense), the head at 8 bits on the same kind of grid
QUANT_WEIGHT_BITS = {"w8a8": 8, "w4a8": 4, "w4g32": 4}
#: input rows per weight group of each grouped quantization
QUANT_WEIGHT_GROUP = {"w4g32": 32}
#: calibration: decode steps at these many positions of each calibration text
CALIBRATION_TOKENS = 48
CALIBRATION_CACHE = 64
DEFAULT_CALIBRATION = (
    "The capital of France is Paris. It is known for the Eiffel Tower and fine food.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who "
    "told stories to the children every evening.",
    "Water boils at 100 degrees Celsius at sea level; at higher altitudes it boils at a "
    "lower temperature because the air pressure is lower.",
    # eight more (2026-12-05): a wider range of text for the int8 grids of the activations
    # that stay int8 (Q/K/V, the cache, the norms' outputs); on SmolLM2 they cut the W8A8
    # step's KL divergence from FP32 by 17% (the proxy over 2,044 tokens, docs/llm.md)
    "The committee met on Tuesday to discuss the budget for next year. After a long "
    "debate, the members agreed to increase funding for the public library.",
    "import numpy as np\n\nx = np.linspace(0, 1, 100)\ny = np.sin(2 * np.pi * x)\n"
    "print(y.mean(), y.std())\n",
    "Q: How many legs does a spider have?\nA: A spider has eight legs.\nQ: And an ant?\n"
    "A: Six.",
    "Photosynthesis converts light energy into chemical energy: plants take in carbon "
    "dioxide and water and release oxygen and glucose.",
    "1. Preheat the oven to 180 degrees.\n2. Mix the flour, sugar and eggs.\n3. Bake "
    "for 25 minutes, until golden.",
    "She opened the door slowly, unsure of what she would find. The room was dark, and "
    "the only sound was the ticking of an old clock.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, "
    "x):\n        self.items.append(x)\n",
    "The French Revolution began in 1789 and led to the end of the monarchy, the rise "
    "of Napoleon and deep changes across Europe.",
)


def check_switch(name: str, value: Any, default: bool) -> bool:
    """An on/off option: ``default`` (the part's) for None; anything but a bool is refused,
    since ``bool("no")`` would quietly turn it on."""
    if value is None:
        return default
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} must be True, False or None (the part's default), got {value!r}")


def check_quant(quant: str) -> None:
    """Refuse a quantization scheme that is not one of :data:`QUANTS`, naming them."""
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {QUANTS}, got {quant!r}")


class CompiledLLM:
    """A decoder with its quantization and per-bucket executables (built on first use)."""

    def __init__(self, source: Source, hw: str = "default", quant: str = "w8a8",
                 calibration: tuple[str, ...] = DEFAULT_CALIBRATION,
                 prefill_buckets: tuple[int, ...] = PREFILL,
                 context_buckets: tuple[int, ...] = CONTEXT, offload: str = "all",
                 rows_concat: str = "dsa", smooth: float | None = SMOOTH,
                 smooth_folds: tuple[str, ...] = SMOOTH_FOLDS, smooth_group: int | None = None,
                 wide_residual: bool = True, wide_down: bool | None = None,
                 wide_attention: bool = True, wide_logits: bool = True,
                 wide_mlp: bool | None = None, wide_inputs: bool = False,
                 wide_qkv: bool | None = None, wide_mlp_inputs: bool | None = None,
                 gptq: bool | None = None,
                 verbose: bool = False) -> None:
        from ..hw.config import load_config

        check_quant(quant)
        self.source, self.quant, self.verbose = source, quant, verbose
        #: "all": every region that compiles runs on the DSA, though the cost model would
        #: keep decode's weight-bound, launch-bound regions on the host (options.offload)
        self.offload = CompileOptions(offload=offload).offload
        #: "dsa": the cache concat is in the region, which writes the new token's K and V
        #: tiles among the cache's, laid out by the host (``lowering.cache_tiles``): one
        #: launch a decode step, the cache read once; "host": the concat runs before the
        #: region (two more launches a layer, the same bytes; docs/llm.md)
        self.rows_concat = CompileOptions(rows_concat=rows_concat).rows_concat
        self.hf, self.arch = source.model, Arch.of(source.model)
        self.cfg = load_config(hw)
        self.prefill_buckets = check_buckets(prefill_buckets, "prefill_buckets")
        self.context_buckets = check_buckets(context_buckets, "context_buckets")
        ragged = [c for c in self.context_buckets if c % self.cfg.block_out]
        if self.rows_concat == "dsa" and ragged and quant != "fp32":
            warnings.warn(f"context buckets {ragged} are not whole {self.cfg.block_out}-row "
                          f"tiles of '{self.cfg.name}': their decode steps copy the cache "
                          f"through DRAM instead of writing the new token's tiles in place "
                          f"(slower, the same numbers); use multiples of "
                          f"{self.cfg.block_out}", stacklevel=2)
        # one string is one text, not a sequence of one-character texts
        self._calibration = (calibration,) if isinstance(calibration, str) else tuple(calibration)
        if not all(isinstance(t, str) for t in self._calibration):
            raise ValueError("calibration must be a string or a sequence of strings (text the "
                             "model decodes to set the int8 ranges)")
        #: SmoothQuant's alpha (None: no smoothing); it changes nothing at quant "fp32"
        self.smooth = None if smooth is None else check_alpha(smooth)
        self.smooth_folds = check_folds(smooth_folds)   # which inputs (llm.smooth.FOLDS)
        #: input channels sharing one smoothing factor (``smooth_llama``'s ``group``). None:
        #: the weight group of a grouped quantization (per-channel factors would take its
        #: weights off their grid), else 1
        self.smooth_group = check_group(QUANT_WEIGHT_GROUP.get(quant, 1) if smooth_group is None
                                        else smooth_group)
        #: the residual stream on int16 grids (``llm.residual``; False: int8, as before)
        self.wide_residual = check_switch("wide_residual", wide_residual, True)
        #: down_proj's input (the SiLU-gate product) on an int16 grid, its dense run as two
        #: int8 byte planes (``llm.residual.gate_products``; False: int8). None: on a
        #: digital part; a CIM part keeps int8, since its per-column bias correction would
        #: mix the two planes' rows, whose errors count 256 times apart
        self.wide_down = check_switch("wide_down", wide_down, not self.cfg.is_cim)
        #: attention's probabilities on an int16 grid (NORM's ``out_wide``), P @ V run as
        #: two int8 byte planes (``llm.residual.attention_probabilities``; False: int8).
        #: A CIM part runs P @ V on its digital array too (V is no constant)
        self.wide_attention = check_switch("wide_attention", wide_attention, True)
        #: the logits (the head's output) on an int16 grid (``llm.residual.logits``)
        self.wide_logits = check_switch("wide_logits", wide_logits, True)
        #: the gated MLP's interior on int16 grids: gate and up write int16, the SiLU is an
        #: interpolated int16 table, the product reads int16 (``llm.residual.mlp_interior``;
        #: SmolLM2's KL from FP32 16% lower for 0.3% more decode cycles). None: on a digital
        #: part; a CIM part keeps its int8 outputs, as it keeps down_proj's input
        self.wide_mlp = check_switch("wide_mlp", wide_mlp, not self.cfg.is_cim)
        #: every linear layer's input (but the head's) on an int16 grid, each dense run as
        #: two int8 byte planes (``llm.residual.linear_inputs``): twice the array's work
        self.wide_inputs = check_switch("wide_inputs", wide_inputs, False)
        #: Q, K and V with their cache on int16 grids (``llm.residual.attention_operands``):
        #: the host keeps int16 codes, each attention matmul runs on two byte planes of its
        #: cache (``lowering.cache_planes``), twice the cache's bytes a step. None: on a
        #: digital part (SmolLM2's W8A8 perplexity +4.0% -> +3.0% of FP32, docs/llm.md); a
        #: CIM part keeps int8, as the analog study's digital twin does
        self.wide_qkv = check_switch("wide_qkv", wide_qkv, not self.cfg.is_cim)
        #: the gate and up projections' input on an int16 grid (``llm.residual.mlp_inputs``;
        #: ``wide_inputs`` takes every linear input): of the linear inputs the one that
        #: moves the perplexity; its two denses run as byte planes (twice their array work).
        #: None: on a digital part (with ``wide_qkv``: +2.8% of FP32); a CIM part keeps int8,
        #: since byte planes would share crossbar columns between rows 256 times apart
        self.wide_mlp_inputs = check_switch("wide_mlp_inputs", wide_mlp_inputs,
                                            not self.cfg.is_cim)
        #: the linear layers' weight codes rounded by GPTQ (``llm.gptq``) on pydoc's text;
        #: False: nearest, as the quantizer rounds. None: GPTQ for W4A8 only (at W8A8 it
        #: measured no gain on SmolLM2)
        if gptq not in (None, True, False):
            raise ValueError(f"gptq must be True, False or None (GPTQ for W4A8 only), got "
                             f"{gptq!r}")
        if gptq and quant in QUANT_WEIGHT_GROUP:
            raise ValueError(f"gptq rounds each output channel on one grid; {quant}'s weights "
                             f"keep a grid per group of {QUANT_WEIGHT_GROUP[quant]} rows: "
                             f"leave gptq off")
        self.gptq = (quant == "w4a8") if gptq is None else bool(gptq)
        self._step_hf = None   # the model the DSA's steps are exported from (step_model)
        self._calibrated = None
        self._steps: dict[tuple[int, int], Any] = {}   # bucket -> its quantized Relax step
        self._compiled: dict[tuple[int, int], Any] = {}
        #: bucket -> its full compile report (regions with their layers, for reference checks)
        self.reports: dict[tuple[int, int], Any] = {}
        self.last_launches: list = []                     # the last step's DSA launches
        self._reads: dict = {}            # (compile, program) -> its DRAM reads (llm.traffic)

    # ----------------------------------------------------------------- compile
    def _log(self, msg: str) -> None:
        if self.verbose:
            print(f"dsa_tvm.llm: {msg}", flush=True)

    @property
    def step_model(self):
        """The FP32 model the quantized steps come from: ``hf`` with SmoothQuant's factors
        folded in (``smooth``) and its weights on GPTQ's codes (``gptq``), built on first
        use; else ``hf``. The sink step runs it too,
        since the cache it starts holds v_proj's smoothed outputs. ``hf`` stays the
        unsmoothed reference (quant "fp32", the embeddings)."""
        if (self.smooth is None and not self.gptq) or self.quant == "fp32":
            return self.hf
        if self._step_hf is None:
            import copy

            t0 = time.perf_counter()
            texts = [self.source.encode(t)[:CALIBRATION_TOKENS] for t in self._calibration]
            model = (copy.deepcopy(self.hf) if self.smooth is None else
                     smooth_llama(self.hf, texts, self.smooth, self.smooth_folds,
                                  self.smooth_group))
            if self.gptq:
                gptq_llama(model, default_texts(self.source), QUANT_WEIGHT_BITS[self.quant])
            self._step_hf = model
            self._log(f"smoothed (a = {self.smooth}), GPTQ {self.gptq} in "
                      f"{time.perf_counter() - t0:.1f} s")
        return self._step_hf

    def calibration_feeds(self) -> list[dict[str, np.ndarray]]:
        """Decode-step inputs at every position but the first (the host's sink token) of
        each calibration text, the cache
        filled by the FP32 step model (one FP32 prefill per text)."""
        feeds = []
        for text in self._calibration:
            ids = self.source.encode(text)[:CALIBRATION_TOKENS]
            if not ids:
                continue
            full = step_feeds(self.hf, self.arch, ids, 0, len(ids), 0, None)
            outs = dict(zip(self.arch.output_names(),
                            run_step_fp32(self.step_model, len(ids), 0, full)))
            for p in range(1, len(ids)):   # not the sink token (run_step says why)
                kv = KVCache(self.arch, CALIBRATION_CACHE)
                kv.append(outs, p)
                feeds.append(step_feeds(self.hf, self.arch, ids[p:p + 1], p, 1,
                                        CALIBRATION_CACHE, kv))
        if not feeds:
            raise ValueError("no calibration text: give at least one non-empty string")
        return feeds

    @property
    def dram_weight_bytes(self) -> int:
        """Weight bytes one token must read from DRAM (the roofline's): every weight's
        code, int4 codes two a byte on a part that unpacks them on LOAD (``dram.int4_weights``),
        and for a grouped quantization the head's codes at 8 bits and two int16 factors
        per group of every channel."""
        a = self.arch
        packs = QUANT_WEIGHT_BITS.get(self.quant) == 4 and self.cfg.packs_int4_weights
        group = QUANT_WEIGHT_GROUP.get(self.quant)
        if group is None:
            return a.weight_bytes(4 if packs else 8)
        head = a.vocab * a.hidden
        codes = (a.weight_bytes(8) - head) // (2 if packs else 1) + head
        return codes + 4 * (a.weight_bytes(8) // group)

    def dram_kv_bytes(self, slots: int) -> int:
        """KV-cache bytes one decode step must read for ``slots`` cache slots (the
        roofline's): int8 codes, or two bytes a code when the cache is int16
        (``wide_qkv``: the host hands it over as two byte planes)."""
        return self.arch.kv_bytes(slots) * (2 if self.wide_qkv else 1)

    def on_hardware(self, hw: Any) -> "CompiledLLM":
        """This model compiled for other hardware ``hw``: the int8 calibration and the
        quantized step graphs are shared (a study of many descriptions quantizes once);
        each bucket compiles anew on first use."""
        import copy

        from ..hw.config import load_config

        other = copy.copy(self)
        other.cfg = load_config(hw)
        if (other.cfg.norm_units >= 1) != (self.cfg.norm_units >= 1):  # quantize_norms differs
            other._calibrated, other._steps = None, {}
        other._compiled, other.reports, other.last_launches, other._reads = {}, {}, [], {}
        return other

    def _step_module(self, tokens: int, cache: int):
        """The quantized step of bucket ``(tokens, cache)`` as a Relax module (kept: a
        study compiles it for many descriptions)."""
        hit = self._steps.get((tokens, cache))
        if hit is None:
            hit = self._steps[(tokens, cache)] = self._quantize(tokens, cache).to_relax()
        return hit

    def quantize_options(self, step: "onnx.ModelProto") -> dict[str, Any]:
        """The options :func:`~dsa_tvm.quant.api.quantize_onnx` calibrates the steps with
        (``step``: the calibration step as intake left it); a study overrides it to keep
        nodes FP32 or widen more tensors."""
        from .residual import (
            attention_operands,
            attention_probabilities,
            gate_products,
            head_matmuls,
            linear_inputs,
            logits,
            mlp_inputs,
            mlp_interior,
            residual_stream,
        )

        wide = ((residual_stream(step) if self.wide_residual else set())
                | (gate_products(step) if self.wide_down else set())
                | (attention_probabilities(step) if self.wide_attention else set())
                | (logits(step) if self.wide_logits else set())
                | (mlp_interior(step) if self.wide_mlp else set())
                | (linear_inputs(step) if self.wide_inputs else set())
                | (mlp_inputs(step) if self.wide_mlp_inputs else set())
                | (attention_operands(step) if self.wide_qkv else set()))
        return dict(show_progress=False, quantize_norms=self.cfg.norm_units >= 1,
                    split_outliers=False, bias_correction=False,
                    weight_bits=QUANT_WEIGHT_BITS.get(self.quant, 8), wide_tensors=wide,
                    weight_group=QUANT_WEIGHT_GROUP.get(self.quant, 0),
                    wide_weights=head_matmuls(step),
                    keep_grids=False)   # w8a8 / w4a8 re-round every weight per channel

    def _quantize(self, tokens: int, cache: int):
        from ..frontend.intake import load_onnx
        from ..quant.api import quantize_onnx, quantize_with_ranges

        fp32 = export_step(self.step_model, tokens, cache)
        if self._calibrated is None:
            t0 = time.perf_counter()
            cal = load_onnx(export_step(self.step_model, 1, CALIBRATION_CACHE))
            self._calibrated = quantize_onnx(cal, self.calibration_feeds(),
                                             **self.quantize_options(cal.model))
            self._log(f"calibrated in {time.perf_counter() - t0:.1f} s")
        return quantize_with_ranges(fp32, self._calibrated)

    def executable(self, tokens: int, cache: int):
        """The VM of bucket ``(tokens, cache)``, compiled on first use."""
        key = (tokens, cache)
        if key not in self._compiled:
            import tvm
            from tvm import relax

            from ..compile_ids import compile_id_of
            from ..pipeline import compile_report_of
            from ..target import target

            t0 = time.perf_counter()
            mod = self._step_module(tokens, cache)
            with options(offload=self.offload, rows_concat=self.rows_concat):
                ex = tvm.compile(mod, target=target(self.cfg))
            self.reports[key] = compile_report_of(compile_id_of(ex))  # newest: in full
            self._compiled[key] = (ex, relax.VirtualMachine(ex, tvm.cpu()))
            self._log(f"compiled step {key} in {time.perf_counter() - t0:.1f} s")
        return self._compiled[key]

    # ----------------------------------------------------------------- run
    def step_shape(self, n: int, start: int) -> tuple[int, int]:
        """The bucket ``(tokens, cache slots)`` of ``n`` tokens after ``start`` cached ones."""
        tokens = 1 if n == 1 else bucket(n, self.prefill_buckets, "a prefill chunk")
        return tokens, bucket(start, self.context_buckets, "a context")

    def run_step(self, ids: list[int], kv: KVCache, kind: str = "decode"
                 ) -> tuple[np.ndarray, StepRecord]:
        """Logits (len(ids), vocab) of ``ids`` after the cache; their K/V join the cache.

        The sequence's first token runs on the host in FP32 (``kind`` "sink"): decoders put
        massive activations (thousands of times the rest) on it, its keys and values are
        what every later token attends to, and one int8 grid cannot hold both (measured:
        greedy agreement 0% with it in the calibration, 74% without; see docs/llm.md)."""
        import tvm

        from ..pipeline import cpu_estimate_us
        from ..report import build_report
        from ..runtime import take_launches
        from .traffic import read_split

        n, start = len(ids), kv.length
        if start == 0:
            if n != 1:
                raise ValueError("the first token runs alone (the host's sink step)")
            kind, shape = "sink", (1, 0)
        else:
            shape = self.step_shape(n, start)
        feeds = step_feeds(self.hf, self.arch, ids, start, shape[0], shape[1],
                           kv if shape[1] else None)
        launches = []
        if self.quant == "fp32" or kind == "sink":   # torch FP32, nothing simulated
            t0 = time.perf_counter()
            out = run_step_fp32(self.step_model, shape[0], shape[1], feeds)
        else:
            ex, vm = self.executable(*shape)
            t0 = time.perf_counter()
            take_launches()
            out = vm["main"](*(tvm.runtime.tensor(feeds[nm])
                               for nm in self.arch.input_names(shape[1])))
            out = [o.numpy() for o in out]
            launches = take_launches()
        self.last_launches = launches
        wall = time.perf_counter() - t0
        outs = dict(zip(self.arch.output_names(), out))
        kv.append(outs, n)
        rec = StepRecord(kind, n, shape, start, wall_s=wall, launches=len(launches))
        if launches:
            compiled = self.reports[shape]
            rep = build_report(launches, compiled, trace=False)
            rec.cycles = rep.total_cycles
            rec.dram_read = sum(r.dram_read for r in rep.rows)
            rec.dram_written = sum(r.dram_written for r in rep.rows)
            split = read_split(launches, {d.name: d.region for d in compiled.regions},
                               self._reads)
            rec.read_weights, rec.read_kv = split["weights"], split["kv"]
            rec.read_activations = split["activations"]
            rec.macs_dsa = sum(r.macs for r in rep.rows if r.target == "DSA")
            rec.macs_cpu = sum(r.macs for r in rep.rows if r.target != "DSA")
            rec.host_us = (len(launches) * self.cfg.launch_overhead_us
                           + cpu_estimate_us(rec.macs_cpu, self.cfg))
        return outs["logits"][0, :n], rec

    def prefill(self, ids: list[int], kv: KVCache) -> tuple[np.ndarray, list[StepRecord]]:
        """Run ``ids`` into the cache: the sink token, then chunks of the largest prefill
        bucket; the logits of every token."""
        ids = self.token_ids(ids)
        logits, recs = [], []
        if kv.length == 0 and ids:
            lg, rec = self.run_step(ids[:1], kv)
            logits.append(lg)
            recs.append(rec)
            ids = ids[1:]
        chunk = self.prefill_buckets[-1]
        for i in range(0, len(ids), chunk):
            lg, rec = self.run_step(ids[i:i + chunk], kv, "prefill")
            logits.append(lg)
            recs.append(rec)
        return np.concatenate(logits), recs

    def token_ids(self, text: str | list[int]) -> list[int]:
        """Text through the tokenizer, or ids as given, every id checked against the
        vocabulary (torch would raise deep inside the embedding)."""
        ids = self.source.encode(text) if isinstance(text, str) else list(text)
        bad = [i for i in ids if not isinstance(i, (int, np.integer))
               or not 0 <= int(i) < self.arch.vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are not in 0..{self.arch.vocab - 1} (the "
                             f"model's vocabulary); pass text or ids from this model's "
                             f"tokenizer")
        return ids

    def new_cache(self) -> KVCache:
        return KVCache(self.arch, self.context_buckets[-1])

    def generate(self, prompt: str | list[int], max_new_tokens: int = 32, greedy: bool = True,
                 seed: int = 0, on_token=None) -> Generation:
        """Prefill the prompt, then decode ``max_new_tokens`` (greedy, or sampled from the
        softmax with ``seed``); ``on_token(id, text, record)`` sees each token as it comes."""
        ids = self.token_ids(prompt)
        if not ids:
            raise ValueError("empty prompt: give at least one token")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        need = len(ids) + max(max_new_tokens - 1, 0)
        if need > self.context_buckets[-1]:
            raise ValueError(f"a context of {len(ids)} prompt + {max_new_tokens} new tokens "
                             f"exceeds the largest bucket ({self.context_buckets[-1]}); ask "
                             f"for fewer tokens or pass larger context_buckets")
        rng = np.random.default_rng(seed)
        kv = self.new_cache()
        logits, steps = self.prefill(ids, kv)
        out = []
        eos = getattr(self.hf.config, "eos_token_id", None)
        for i in range(max_new_tokens):
            tok = _pick(logits[-1], greedy, rng)
            out.append(tok)
            if on_token is not None:
                on_token(tok, self.source.decode([tok]), steps[-1])
            if tok == eos or i == max_new_tokens - 1:
                break
            logits, rec = self.run_step([tok], kv, "decode")
            steps.append(rec)
        return Generation(self.source.decode(out), out, ids, steps, self.cfg.mhz,
                          self.cfg.bandwidth_bytes_per_cycle)

    def teacher_forced(self, prompt: str | list[int], continuation: list[int]) -> float:
        """Share of ``continuation``'s tokens this model's argmax predicts when fed the prompt
        and the continuation before each one (one prefill). Against a reference's own
        greedy continuation, the agreement measure one early near-tie cannot compound."""
        ids, cont = self.token_ids(prompt), self.token_ids(continuation)
        if not ids or not cont:
            raise ValueError("teacher forcing needs a prompt and at least one continuation "
                             "token")
        if len(ids) + len(cont) - 1 > self.context_buckets[-1]:
            raise ValueError(f"{len(ids)} prompt + {len(cont)} continuation tokens exceed the "
                             f"largest context bucket ({self.context_buckets[-1]})")
        logits, _ = self.prefill(ids + cont[:-1], self.new_cache())
        picks = logits[len(ids) - 1:].argmax(-1)
        return float(np.mean(picks == np.asarray(cont)))

    def perplexity(self, text: str | list[int], max_tokens: int | None = None) -> float:
        """exp(mean negative log-likelihood) of the text's tokens, each predicted from the
        ones before it in its window (windows of the largest context bucket, a fresh cache
        each; the host's float log-softmax of the step's logits)."""
        from .scoring import perplexity

        ids = self.token_ids(text)
        return perplexity(self, ids[:max_tokens] if max_tokens else ids)


def _pick(logits: np.ndarray, greedy: bool, rng: np.random.Generator) -> int:
    if greedy:
        return int(np.argmax(logits))
    p = np.exp(logits - logits.max())
    return int(rng.choice(len(p), p=p / p.sum()))


def load(model: str = "smollm2", hw: str = "default", quant: str = "w8a8", **options) -> CompiledLLM:
    """A decoder (``"smollm2"``, ``"tiny"``, a .gguf file or a Hugging Face folder) ready to
    ``generate`` on the DSA of hardware ``hw``; steps compile on first use. A wrong
    ``quant`` or ``hw`` is refused before the model's weights are read."""
    from ..hw.config import load_config

    check_quant(quant)
    load_config(hw)
    seed = options.pop("seed", 0)
    return CompiledLLM(load_source(model, seed), hw, quant, **options)

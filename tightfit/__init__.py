"""tightfit: run LLMs on hardware too small for them, and know in advance how they will perform.

The heavy parts (torch, the engine) load lazily so that `tightfit.predictor` and the CLI's
`--help` stay fast and torch-free.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from tightfit.engine.llm import LLM
    from tightfit.engine.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from tightfit.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from tightfit.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'tightfit' has no attribute {name!r}")

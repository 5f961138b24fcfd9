"""Shared fixtures: real models are loaded once per test session (they take seconds each)."""
from __future__ import annotations

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def default_llm():
    from tightfit import LLM

    return LLM(quant="fp32", num_threads=2)


@pytest.fixture(scope="session")
def gemma_llm():
    from tightfit import LLM

    return LLM("gemma3", quant="fp32", num_threads=2)


def _hf(name):
    transformers = pytest.importorskip("transformers")
    from tightfit.engine.loader.resolve import resolve_model

    path = resolve_model(name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="session")
def hf_default():
    return _hf(None)


@pytest.fixture(scope="session")
def hf_gemma():
    return _hf("gemma3")

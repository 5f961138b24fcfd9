"""One call from a model name or path to (model, ModelConfig, Tokenizer): picks the GGUF or
HF-directory loader, builds the weights in the requested format and the decoder model."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tightfit.config import ModelConfig
from tightfit.engine.loader.gguf import GGUFFile
from tightfit.engine.loader.model_config import config_from_gguf, config_from_hf
from tightfit.engine.loader.resolve import resolve_model
from tightfit.engine.loader.weights import load_gguf_weights, load_hf_weights, read_hf_config
from tightfit.errors import ModelFileError


@dataclass
class LoadedModel:
    model: Any  # DecoderModel
    config: ModelConfig
    tokenizer: Any  # Tokenizer
    path: Path
    weight_format: str
    load_time_s: float


def load_model(model: str | Path | None = None, quant: str = "fp32") -> LoadedModel:
    from tightfit.engine.models.transformer import DecoderModel
    from tightfit.engine.tokenizer import Tokenizer

    t0 = time.perf_counter()
    path = resolve_model(model)
    raw: dict = {}
    if path.is_dir():
        cfg = config_from_hf(read_hf_config(path))
        weights = load_hf_weights(path, cfg)
        tokenizer = Tokenizer.from_pretrained_dir(path)
    elif path.suffix == ".gguf" or path.is_file():
        g = GGUFFile(path)
        cfg = config_from_gguf(g)
        weights, raw = load_gguf_weights(g, cfg)
        tokenizer = Tokenizer.from_gguf(g)
    else:  # pragma: no cover - resolve_model already checked existence
        raise ModelFileError(f"cannot load {str(path)!r}")
    net = DecoderModel(cfg, weights)
    net.eval()
    return LoadedModel(net, cfg, tokenizer, path, quant, time.perf_counter() - t0)

"""One call from a model name or path to (model, ModelConfig, Tokenizer): picks the GGUF or
HF-directory loader, builds the weights in the requested format and the decoder model."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tightfit import sysmem
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


def load_model(model: str | Path | None = None, quant: str | Path = "fp32") -> LoadedModel:
    from tightfit.engine.quant.plan import PrecisionPlan

    t0 = time.perf_counter()
    plan = PrecisionPlan.parse(quant)  # validate the name before the slow part
    path = resolve_model(model)
    # An AWQ build calibrates (minutes of large temporaries): it keeps glibc's default policy.
    with contextlib.nullcontext() if plan.uses_awq else sysmem.load_time_heap():
        net, cfg, tokenizer, fmt = _load(path, plan, quant)
    if plan.uses_awq:
        sysmem.trim_heap()
    return LoadedModel(net.eval(), cfg, tokenizer, path, fmt, time.perf_counter() - t0)


def _load(path: Path, plan: Any, quant: str | Path) -> tuple[Any, ModelConfig, Any, str]:
    from tightfit.engine.models.transformer import DecoderModel, dense_factory
    from tightfit.engine.quant.plan import PlanLinearFactory
    from tightfit.engine.tokenizer import Tokenizer

    if path.suffix == ".tfq":  # written by `tightfit quantize`: already in its final formats
        from tightfit.engine.loader.quantized import load_quantized

        return load_quantized(path, quant)
    if path.is_dir():
        cfg = config_from_hf(read_hf_config(path))
        weights = load_hf_weights(path, cfg)
        tokenizer = Tokenizer.from_pretrained_dir(path)
    elif path.suffix == ".gguf" or path.is_file():
        g = GGUFFile(path)
        cfg = config_from_gguf(g)
        # fp32 dequantises at load; other formats read the stored blocks directly.
        weights = load_gguf_weights(g, cfg, keep_native=not plan.is_fp32)
        tokenizer = Tokenizer.from_gguf(g)
    else:  # pragma: no cover - resolve_model already checked existence
        raise ModelFileError(f"cannot load {str(path)!r}")
    plan.validate(cfg.num_layers)
    if plan.uses_awq:
        from tightfit.engine.quant.awq_model import build_awq_model

        net = build_awq_model(cfg, weights, plan, tokenizer)
    else:
        net = DecoderModel(cfg, weights, dense_factory if plan.is_fp32 else PlanLinearFactory(plan))
    del weights
    return net, cfg, tokenizer, str(quant)

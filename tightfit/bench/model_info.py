"""Model facts the parent process needs without loading weights or torch: the tokenizer (to cut
prompts to exact token counts, identical for every backend) and the dataset's model descriptor
(architecture numbers, parameters, stored format and bytes), both read from the GGUF file.
"""
from __future__ import annotations

import functools
import math
from collections import Counter
from typing import Any

from tightfit.bench.backends.tightfit_backend import model_arg

FORMAT_BYTES_PER_WEIGHT = {"fp32": 4.0}


@functools.lru_cache(maxsize=4)
def _gguf(name: str | None) -> Any:
    from tightfit.engine.loader.gguf import GGUFFile
    from tightfit.engine.loader.resolve import resolve_model

    path = resolve_model(model_arg(name))
    if path.is_dir():
        return path
    return GGUFFile(path)


@functools.lru_cache(maxsize=4)
def tokenizer(name: str | None) -> Any:
    from tightfit.engine.tokenizer import Tokenizer

    g = _gguf(name)
    return Tokenizer.from_pretrained_dir(g) if not hasattr(g, "tensors") else Tokenizer.from_gguf(g)


@functools.lru_cache(maxsize=4)
def _static_descriptor(name: str | None) -> dict[str, Any]:
    from tightfit.engine.loader.model_config import config_from_gguf

    g = _gguf(name)
    if not hasattr(g, "tensors"):  # an HF-layout directory: numbers come from the worker only
        return dict(name=name or "default", file_name=g.name, file_bytes=None, file_format="hf",
                    architecture=None, params_b=None, n_layers=None, hidden_size=None,
                    intermediate_size=None, n_heads=None, n_kv_heads=None, head_dim=None,
                    vocab_size=None)
    cfg = config_from_gguf(g)
    tensors = list(g.tensors())
    params = sum(math.prod(t.shape) for t in tensors)
    return dict(
        name=name or "default", file_name=g.path.name, file_bytes=g.path.stat().st_size,
        file_format=f"gguf:{_file_type(g, tensors)}", architecture=cfg.architecture,
        params_b=round(params / 1e9, 4), n_layers=cfg.num_layers, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, n_heads=cfg.num_heads,
        n_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, vocab_size=cfg.vocab_size)


def _file_type(g: Any, tensors: list[Any]) -> str:
    """The file's declared type (e.g. Q4_K_M), else the tensor type holding most parameters."""
    import gguf

    try:
        return gguf.LlamaFileType(int(g.get("general.file_type"))).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        by_type: Counter[str] = Counter()
        for t in tensors:
            by_type[t.qtype.name] += math.prod(t.shape)
        return by_type.most_common(1)[0][0]


def descriptor(name: str | None, weight_format: str, weight_bytes: int | None) -> dict[str, Any]:
    """The dataset's ModelDescriptor fields for one run."""
    return {**_static_descriptor(name), "weight_format": weight_format,
            "weight_bytes": weight_bytes}

"""Turns GGUF metadata or an HF `config.json` into a ModelConfig.

Supports the Llama family (llama, qwen2-style with QKV bias) and Gemma 3; anything else raises
UnsupportedModelError naming the architecture.
"""
from __future__ import annotations

import math
from typing import Any

from tightfit.config import ModelConfig
from tightfit.engine.loader.gguf import GGUFFile
from tightfit.errors import UnsupportedModelError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3")
_HF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "gemma3_text": "gemma3",
            "gemma3": "gemma3"}


def _unsupported(arch: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"model architecture {arch!r} is not supported; supported: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)} (Llama 2/3, SmolLM2, Qwen2-style, Gemma 3)"
    )


def _gemma3_extras(hidden: int, head_dim: int, window: int | None, scalar: float | None) -> dict:
    return dict(
        hidden_act="gelu_tanh", rope_local_theta=10000.0, sliding_window=window or 512,
        sliding_window_pattern=6, qk_norm=True, sandwich_norm=True,
        embed_scale=math.sqrt(hidden), query_pre_attn_scalar=scalar or float(head_dim),
    )


def config_from_gguf(g: GGUFFile) -> ModelConfig:
    arch = g.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise _unsupported(arch)
    hidden = int(g.arch_get("embedding_length"))
    heads = int(g.arch_get("attention.head_count"))
    kv_heads = int(g.arch_get("attention.head_count_kv", heads))
    head_dim = int(g.arch_get("attention.key_length", hidden // heads))
    tokens = g.array("tokenizer.ggml.tokens")
    vocab = int(g.arch_get("vocab_size", len(tokens) if tokens is not None else 0))
    names = set(g.tensor_names())
    base: dict[str, Any] = dict(
        architecture="gemma3" if arch == "gemma3" else "llama",
        vocab_size=vocab, hidden_size=hidden, num_layers=int(g.arch_get("block_count")),
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=int(g.arch_get("feed_forward_length")),
        max_position=int(g.arch_get("context_length", 2048)),
        rms_eps=float(g.arch_get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(g.arch_get("rope.freq_base", 10000.0)),
        tie_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        name=str(g.get("general.name", g.path.stem)),
    )
    if arch == "gemma3":
        base.update(_gemma3_extras(hidden, head_dim, g.arch_get("attention.sliding_window"), None))
    return ModelConfig(**base)


def _rope_theta(cfg: dict[str, Any], layer_type: str, legacy_key: str = "rope_theta") -> float:
    """RoPE base from `rope_parameters` (Transformers 5: flat, or per layer type) or the
    legacy top-level key."""
    params = cfg.get("rope_parameters") or {}
    if isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    theta = params.get("rope_theta", cfg.get(legacy_key))
    if theta is None:
        theta = 10000.0
    scaling = params.get("rope_type", "default")
    if scaling not in ("default", None):
        raise UnsupportedModelError(
            f"RoPE scaling type {scaling!r} is not supported yet (only plain RoPE)")
    return float(theta)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    if "text_config" in cfg:  # multimodal wrapper: use the language model's config
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", "gemma3")}
    arch = _HF_ARCH.get(str(cfg.get("model_type")))
    if arch is None:
        raise _unsupported(str(cfg.get("model_type")))
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    base: dict[str, Any] = dict(
        architecture="gemma3" if arch == "gemma3" else "llama",
        vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
        num_layers=int(cfg["num_hidden_layers"]), num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=head_dim,
        intermediate_size=int(cfg["intermediate_size"]),
        max_position=int(cfg.get("max_position_embeddings", 2048)),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg, "full_attention"),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        qkv_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
        rope_scaling=cfg.get("rope_scaling"),
        name=str(cfg.get("_name_or_path", "")),
    )
    if arch == "gemma3":
        base.update(_gemma3_extras(hidden, head_dim, cfg.get("sliding_window"),
                                   cfg.get("query_pre_attn_scalar")))
        base["rope_local_theta"] = _rope_theta(cfg, "sliding_attention", "rope_local_base_freq")
        base["sliding_window_pattern"] = int(cfg.get("sliding_window_pattern")
                                             or cfg.get("_sliding_window_pattern") or 6)
        base["final_logit_softcap"] = cfg.get("final_logit_softcapping")
    if cfg.get("layer_types") and (arch == "gemma3" or cfg.get("sliding_window")):
        base["sliding_layers"] = tuple(i for i, t in enumerate(cfg["layer_types"])
                                       if t == "sliding_attention")
        if base["sliding_layers"] and not base.get("sliding_window"):
            base["sliding_window"] = int(cfg["sliding_window"])
    return ModelConfig(**base)

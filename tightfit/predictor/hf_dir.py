"""A local Hugging Face model directory as a predictor input: the shape from its `config.json`,
the parameters counted in its `*.safetensors` headers (no weight is read).

`"model": {"path": "/models/Qwen2.5-7B-Instruct"}` (the directory, or its config.json) gives the
shape HF Transformers builds: layers, width, heads, K/V heads and head size, FFN or expert width,
vocabulary, tied or not (a `lm_head.weight` in the checkpoint says untied), experts and how many a
token uses, a window's layers and a hybrid's attending layers from `layer_types`. A multimodal
checkpoint's vision / audio towers are left out (the language model is what decodes). The
weight format is the checkpoint's (`torch_dtype`, or its `quantization_config`); a row may ask
for another (HF quantises on load, e.g. `nf4`). A quantised checkpoint's packed tensors do not
count its parameters, so there they come from the shape.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tightfit.predictor import architectures, formats

# a hybrid's non-attention layers by HF model_type (ModelSpec.mixer)
_TYPE_MIXER = {
    "granitemoehybrid": "mamba2", "nemotron_h": "mamba2", "bamba": "mamba2",
    "qwen3_next": "gated_deltanet", "qwen3_5": "gated_deltanet",
    "qwen3_5_moe": "gated_deltanet", "kimi_linear": "gated_deltanet", "lfm2": "short_conv",
    "lfm2_moe": "short_conv", "jamba": "mamba", "falcon_h1": architectures.PARALLEL_HYBRID,
}
_ATTENDS = ("full_attention", "sliding_attention", "attention", "chunked_attention")
_OTHER_TOWERS = ("vision", "visual", "audio", "speech", "multi_modal_projector",
                 "mm_projector", "image_newline")
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


class HFDirError(ValueError):
    """No config.json, or one that lacks what a shape needs."""


@dataclass(frozen=True)
class HFModel:
    path: str
    model_type: str
    name: str                  # what the architecture table is asked for the family's traits
    quant: str | None          # the checkpoint's format, formats' spelling
    spec: architectures.ModelSpec
    counted: bool              # parameters counted in the safetensors (not from the shape)
    traits_from_table: bool


def _int(cfg: dict[str, Any], *keys: str, default: int | None = None) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return int(v)
    return default


def _checkpoint_quant(cfg: dict[str, Any], top: dict[str, Any]) -> str | None:
    q = top.get("quantization_config") or cfg.get("quantization_config")
    if isinstance(q, dict):
        method = str(q.get("quant_method", "")).lower()
        if method == "bitsandbytes":
            if q.get("load_in_8bit"):
                return "8bit"
            return str(q.get("bnb_4bit_quant_type") or "nf4").lower()
        return method if formats.is_known(method) else None
    dtype = top.get("torch_dtype") or top.get("dtype") or cfg.get("torch_dtype") or cfg.get("dtype")
    return _DTYPES.get(str(dtype))


def _count(directory: Path) -> tuple[int, int, bool]:
    """(language-model parameters, of them routed experts, an lm_head present) over the
    directory's safetensors headers."""
    from safetensors import safe_open

    total = experts = 0
    head = False
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(str(f), framework="np") as st:
            for k in st.keys():
                if any(t in k for t in _OTHER_TOWERS):
                    continue
                n = math.prod(st.get_slice(k).get_shape())
                total += n
                experts += n if ".experts." in k else 0
                head = head or k.endswith("lm_head.weight")
    return total, experts, head


def read(path: str | Path) -> HFModel:
    """The language model a Hugging Face directory holds; HFDirError says what is missing."""
    p = Path(path).expanduser()
    directory = p.parent if p.name == "config.json" else p
    config = directory / "config.json"
    if not config.is_file():
        raise HFDirError(f"no config.json in {str(directory)!r} (give a GGUF file or a Hugging "
                         "Face model directory)")
    try:
        top = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HFDirError(f"{str(config)!r} is not readable JSON ({exc})") from None
    if not isinstance(top, dict):
        raise HFDirError(f"{str(config)!r} holds no JSON object")
    cfg = top.get("text_config") if isinstance(top.get("text_config"), dict) else top
    model_type = str(cfg.get("model_type") or top.get("model_type") or "")
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    heads = _int(cfg, "num_attention_heads", "n_head")
    vocab = _int(cfg, "vocab_size") or _int(top, "vocab_size")
    if not (layers and hidden and heads and vocab):
        raise HFDirError(f"{str(config)!r} lacks num_hidden_layers, hidden_size, "
                         "num_attention_heads or vocab_size")
    kv = _int(cfg, "num_key_value_heads", "num_kv_heads", default=heads)
    head_dim = _int(cfg, "head_dim", default=hidden // heads)
    n_expert = _int(cfg, "num_experts", "num_local_experts", "n_routed_experts", default=0)
    used = _int(cfg, "num_experts_per_tok", "num_experts_per_token", "moe_topk", default=0)
    inter = (_int(cfg, "moe_intermediate_size", "expert_intermediate_size") if n_expert > 1
             else None) or _int(cfg, "intermediate_size", "ffn_hidden_size", "n_inner",
                                default=4 * hidden)
    # Gemma 4: full-attention layers with K/V heads of their own number and size
    full_kv = (_int(cfg, "num_global_key_value_heads", default=kv) *
               _int(cfg, "global_head_dim", default=head_dim)) / (kv * head_dim)
    layer_types = [str(t) for t in cfg.get("layer_types") or []]
    attends = sum(1 for t in layer_types if t in _ATTENDS) if layer_types else 0
    sliding = sum(1 for t in layer_types if t == "sliding_attention")
    window = _int(cfg, "sliding_window", default=0) if sliding else 0

    quant = _checkpoint_quant(cfg, top)
    packed = quant is not None and quant not in ("bf16", "fp16", "fp32")
    counted, head_in_file = False, None
    total = experts = 0
    if not packed and any(directory.glob("*.safetensors")):
        try:
            total, experts, head = _count(directory)
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own kinds
            raise HFDirError(f"a safetensors file in {str(directory)!r} is unreadable "
                             f"({exc})") from None
        counted, head_in_file = total > 0, head
    tied = head_in_file is False if counted else bool(
        top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True)))
    if not counted:  # the shape's own count: embeddings, attention, FFN (gated), experts
        q_out, kv_out = heads * head_dim, kv * head_dim
        attn = hidden * (2 * q_out + 2 * kv_out) * (attends or layers)
        ffn_one = 3 * hidden * inter
        experts = layers * ffn_one * n_expert if n_expert > 1 else 0
        total = vocab * hidden * (1 if tied else 2) + attn + (experts or layers * ffn_one)
    active = total - (experts * (1 - used / n_expert) if n_expert > 1 and used else 0)
    name = str(top.get("_name_or_path") or directory.name)
    table = None
    for candidate in (directory.name, name):
        table = architectures.lookup(candidate) if candidate else None
        if table is not None:
            name = candidate
            break
    spec = architectures.ModelSpec(
        name=name, params_b=total / 1e9, active_params_b=active / 1e9, n_layers=layers,
        hidden_size=hidden, n_heads=heads, n_kv_heads=kv, vocab_size=vocab,
        intermediate_size=inter, head_dim=head_dim, tied_embeddings=tied,
        expert_params_b=experts / 1e9 if experts else None, sliding_window=window,
        sliding_layers=sliding, full_kv_scale=full_kv if sliding else 1.0,
        kv_shared_layers=_int(cfg, "num_kv_shared_layers", default=0),
        trained_context=_int(cfg, "max_position_embeddings", "n_positions", "max_seq_len",
                             default=0) or 0)
    mixer = _TYPE_MIXER.get(model_type, "")
    if mixer == architectures.PARALLEL_HYBRID:
        spec = replace(spec, mixer=mixer)
    elif mixer and 0 < attends < layers:
        spec = replace(spec, mixer=mixer, attention_layers=attends,
                       state_bytes_per_layer=_state(cfg, mixer, hidden))
    if table is not None and not layer_types:  # the family's window / hybrid traits
        from tightfit.predictor.gguf_header import with_traits

        spec = with_traits(spec, table, 0)
    return HFModel(str(directory), model_type, name, quant, spec, counted, table is not None)


def _state(cfg: dict[str, Any], mixer: str, hidden: int) -> float:
    """A recurrent layer's state a sequence from its config (Gated DeltaNet's linear_* heads,
    Mamba's d_state / expand / groups); 0 where the config lacks them (not counted)."""
    if mixer == "gated_deltanet":
        vh, kh = _int(cfg, "linear_num_value_heads"), _int(cfg, "linear_num_key_heads")
        kd, vd = _int(cfg, "linear_key_head_dim"), _int(cfg, "linear_value_head_dim")
        if vh and kh and kd and vd:
            return architectures.gated_deltanet_state(
                vh, kh, kd, vd, _int(cfg, "linear_conv_kernel_dim", default=4) or 4)
    elif mixer in ("mamba", "mamba2"):
        d_state = _int(cfg, "mamba_d_state", "ssm_state_size", "state_size")
        if d_state:
            return architectures.mamba_state(
                hidden, d_state, mixer == "mamba2",
                _int(cfg, "mamba_expand", "expand", default=2) or 2,
                _int(cfg, "mamba_n_groups", "n_groups", default=1) or 1,
                _int(cfg, "mamba_d_conv", "conv_kernel", "mamba_conv_kernel", default=4) or 4)
    return 0.0

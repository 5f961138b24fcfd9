"""Loads a model's tensors into fp32 torch tensors under HF-style names (`layers.N.self_attn.
q_proj.weight`, ...), from a GGUF file or an HF-layout directory (`config.json` + safetensors).

Undoes GGUF's storage conventions so one model implementation serves both sources: Llama Q/K
rows are un-permuted (llama.cpp permutes them for its RoPE layout); Gemma's norm weights hold
(1 + w) in GGUF, and HF checkpoints get the +1 added here. Raw quantised blocks can be kept for
formats that run without re-quantising (`native`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tightfit.config import ModelConfig
from tightfit.engine.loader.gguf import GGUFFile, GGUFTensor
from tightfit.errors import ModelFileError

_GGUF_LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
}
_GGUF_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def gguf_name_to_hf(name: str, cfg: ModelConfig) -> str | None:
    """Maps `blk.3.attn_q.weight` -> `layers.3.self_attn.q_proj.weight`; None if not used."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m:
        layer, part, kind = m.groups()
        if part == "ffn_norm":  # Llama: the only second norm; Gemma 3: the pre-FFN norm
            mapped = "pre_feedforward_layernorm" if cfg.sandwich_norm else "post_attention_layernorm"
        else:
            mapped = _GGUF_LAYER.get(part)
        return None if mapped is None else f"layers.{layer}.{mapped}.{kind}"
    m = re.fullmatch(r"(\w+)\.(weight|bias)", name)
    if m and m.group(1) in _GGUF_TOP:
        return f"{_GGUF_TOP[m.group(1)]}.{m.group(2)}"
    return None  # e.g. rope_freqs: recomputed from the config


def unpermute_rows(rows: int, n_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's Q/K permutation (interleaved -> rotate-half halves)."""
    half = rows // n_heads // 2
    return torch.arange(rows).view(n_heads, half, 2).transpose(1, 2).reshape(rows)


def _row_permutation(hf_name: str, cfg: ModelConfig) -> torch.Tensor | None:
    if cfg.architecture != "llama":
        return None
    if hf_name.endswith("q_proj.weight") or hf_name.endswith("q_proj.bias"):
        return unpermute_rows(cfg.num_heads * cfg.head_dim, cfg.num_heads)
    if hf_name.endswith("k_proj.weight") or hf_name.endswith("k_proj.bias"):
        return unpermute_rows(cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads)
    return None


@dataclass(frozen=True)
class NativeTensor:
    """A GGUF tensor left as stored (quantised blocks), with the row permutation still to apply.

    Produced instead of fp32 for `native` loading; `dequantize()` gives the fp32 weight."""

    tensor: GGUFTensor
    perm: torch.Tensor | None

    @property
    def qtype_name(self) -> str:
        return self.tensor.qtype.name

    def dequantize(self) -> torch.Tensor:
        from tightfit.engine.loader.dequant import dequantize

        t = self.tensor
        w = dequantize(t.data, t.qtype, t.shape, name=t.name)
        t.release()
        return w if self.perm is None else w[self.perm]

    def rows(self, a: int, b: int) -> torch.Tensor:
        """fp32 rows a..b of the (permuted) weight, dequantised from just those rows' blocks."""
        from tightfit.engine.loader.dequant import dequantize

        t = self.tensor
        idx = slice(a, b) if self.perm is None else self.perm[a:b].numpy()
        out = dequantize(t.data[idx], t.qtype, (b - a, *t.shape[1:]), name=t.name)
        t.release()  # the file pages just read leave the resident set again
        return out


_FLOAT_TYPES = ("F32", "F16", "BF16")


class LazyWeights(dict):
    """name -> NativeTensor; `pop(name)` materialises one weight at a time, so building a model
    never holds every fp32 tensor at once (peak memory ~ the model built so far + one tensor).

    With keep_native, non-float tensors are returned as NativeTensor for the weight-format
    factory to convert without a detour through fp32; norms and floats are always fp32."""

    def __init__(self, items: dict[str, NativeTensor], keep_native: bool) -> None:
        super().__init__(items)
        self.keep_native = keep_native

    def pop(self, key: str, *default: Any) -> Any:
        if key not in self and default:
            return default[0]
        item: NativeTensor = super().pop(key)
        if self.keep_native and item.qtype_name not in _FLOAT_TYPES:
            return item
        return item.dequantize()


def load_gguf_weights(g: GGUFFile, cfg: ModelConfig, keep_native: bool = False) -> LazyWeights:
    """All tensors the model uses, under HF names, materialised on `pop` (see LazyWeights)."""
    items: dict[str, NativeTensor] = {}
    for t in g.tensors():
        hf = gguf_name_to_hf(t.name, cfg)
        if hf is not None:
            items[hf] = NativeTensor(t, _row_permutation(hf, cfg))
    _check_complete(set(items), cfg, str(g.path))
    return LazyWeights(items, keep_native)


def _check_complete(names: set[str] | frozenset[str], cfg: ModelConfig, where: str) -> None:
    needed = ["embed_tokens.weight", "norm.weight"] + [
        f"layers.{i}.{p}.weight" for i in range(cfg.num_layers)
        for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm")]
    missing = [n for n in needed if n not in names]
    if missing:
        raise ModelFileError(
            f"{where} lacks {len(missing)} required tensors (first: {missing[0]}); the file is "
            "incomplete or not a supported architecture")


def load_hf_weights(directory: Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Reads every *.safetensors file in an HF-layout directory into fp32, HF names minus the
    `model.` prefix; Gemma norm weights get +1 (HF stores w, the model multiplies by 1 + w)."""
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{str(directory)!r} holds no *.safetensors files")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors = load_file(str(f))
        except Exception as exc:
            raise ModelFileError(f"cannot read {str(f)!r}: {exc}") from exc
        for name, t in tensors.items():
            name = re.sub(r"^(model\.language_model\.|language_model\.model\.|model\.)", "", name)
            if name.startswith(("vision", "multi_modal")):
                continue
            t = t.to(torch.float32)
            if cfg.architecture == "gemma3" and name.endswith("norm.weight"):
                t = t + 1.0
            weights[name] = t
    _check_complete(weights.keys(), cfg, str(directory))
    return weights


def read_hf_config(directory: Path) -> dict:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise ModelFileError(
            f"{str(directory)!r} is not a model directory: config.json is missing")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{str(path)!r} is not valid JSON: {exc}") from exc

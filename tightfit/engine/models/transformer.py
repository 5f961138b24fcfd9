"""The decoder-only transformer for the Llama family (SmolLM2, Llama 2/3, Qwen2-style with QKV
bias) and Gemma 3 (sandwich norms, QK-norm, GELU, sliding-window layers with local RoPE).

Built directly from a weight dict in HF naming (see loader/weights.py); linears come from a
factory so any weight format or precision plan plugs in. Reads and writes the paged KV cache
through AttentionMetadata; never touches the scheduler or block pool.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from tightfit.config import ModelConfig
from tightfit.engine.attention import (AttentionMetadata, fast_attention, reference_attention,
                                       write_kv)
from tightfit.engine.models.layers import GatedMLP, Rotary, RMSNorm

# (projection names, weights [out, in] each, biases or None) -> one module computing all the
# projections of a shared input, outputs concatenated (q/k/v, gate/up). A weight is an fp32
# tensor or a packed quantised form the factory knows (e.g. int4 codes read from GGUF).
LinearFactory = Callable[[list[str], list[Any], "list[torch.Tensor] | None"], nn.Module]


class DenseLinear(nn.Module):
    """fp32 linear that keeps the given tensor (no copy, no random init)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def dense_factory(names: list[str], weights: list[Any], biases: list[torch.Tensor] | None
                  ) -> nn.Module:
    """fp32 everywhere; fused projections become one matrix (one matmul instead of several)."""
    w = weights[0] if len(weights) == 1 else torch.cat(weights)
    b = None if biases is None else (biases[0] if len(biases) == 1 else torch.cat(biases))
    return DenseLinear(w, b)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor],
                 make_linear: LinearFactory, rotary: Rotary) -> None:
        super().__init__()
        p = f"layers.{layer}."
        names = [p + n for n in ("q_proj", "k_proj", "v_proj")]
        qkv_w = [w.pop(p + f"self_attn.{n}.weight") for n in ("q_proj", "k_proj", "v_proj")]
        qkv_b = ([w.pop(p + f"self_attn.{n}.bias") for n in ("q_proj", "k_proj", "v_proj")]
                 if cfg.qkv_bias else None)
        self.qkv = make_linear(names, qkv_w, qkv_b)
        o_bias = w.pop(p + "self_attn.o_proj.bias", None)
        self.o = make_linear([p + "o_proj"], [w.pop(p + "self_attn.o_proj.weight")],
                             None if o_bias is None else [o_bias])
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(w.pop(p + "self_attn.q_norm.weight"), cfg.rms_eps)
            self.k_norm = RMSNorm(w.pop(p + "self_attn.k_norm.weight"), cfg.rms_eps)
        self.rotary = rotary
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5
        self.window = cfg.sliding_window if cfg.is_sliding(layer) else None

    def forward(self, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv: tuple[torch.Tensor, torch.Tensor], mode: str) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv(x)
        nq, nk = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        q = qkv[:, :nq].view(t, self.n_heads, self.head_dim)
        k = qkv[:, nq:nq + nk].view(t, self.n_kv, self.head_dim)
        v = qkv[:, nq + nk:].reshape(t, self.n_kv, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(q, positions, meta.rope), self.rotary(k, positions, meta.rope)
        if meta.attend is not None:  # a study's own attention over this layer's q, k, v
            return self.o(meta.attend(self, q, k, v).reshape(t, -1))
        k_cache, v_cache = kv  # [num_blocks, block_size, Hkv, D]
        flat_k, flat_v = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
        write_kv(flat_k, flat_v, k, v, meta.slot_mapping)
        if mode == "reference":
            o = reference_attention(q, k_cache, v_cache, meta, self.scale, self.window)
        else:
            o = fast_attention(q, k, v, k_cache, v_cache, meta, self.scale,
                               self.window is not None)
        return self.o(o.reshape(t, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor],
                 make_linear: LinearFactory, rotary: Rotary) -> None:
        super().__init__()
        p = f"layers.{layer}."
        eps = cfg.rms_eps
        self.attn_norm = RMSNorm(w.pop(p + "input_layernorm.weight"), eps)
        self.attn = Attention(cfg, layer, w, make_linear, rotary)
        gate_up = make_linear([p + "gate_proj", p + "up_proj"],
                              [w.pop(p + "mlp.gate_proj.weight"), w.pop(p + "mlp.up_proj.weight")],
                              None)
        down = make_linear([p + "down_proj"], [w.pop(p + "mlp.down_proj.weight")], None)
        self.mlp = GatedMLP(gate_up, down, cfg.intermediate_size, cfg.hidden_act)
        self.sandwich = cfg.sandwich_norm
        if self.sandwich:
            self.post_attn_norm = RMSNorm(w.pop(p + "post_attention_layernorm.weight"), eps)
            self.ffn_norm = RMSNorm(w.pop(p + "pre_feedforward_layernorm.weight"), eps)
            self.post_ffn_norm = RMSNorm(w.pop(p + "post_feedforward_layernorm.weight"), eps)
        else:
            self.ffn_norm = RMSNorm(w.pop(p + "post_attention_layernorm.weight"), eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv: tuple[torch.Tensor, torch.Tensor], mode: str) -> torch.Tensor:
        h = self.attn(self.attn_norm(x), positions, meta, kv, mode)
        if self.sandwich:
            h = self.post_attn_norm(h)
        x = x + h
        h = self.mlp(self.ffn_norm(x))
        if self.sandwich:
            h = self.post_ffn_norm(h)
        return x + h


class DecoderModel(nn.Module):
    """forward(input_ids [T], positions [T], meta, kv_caches, logits_rows) -> logits [n, vocab]."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor],
                 make_linear: LinearFactory = dense_factory) -> None:
        super().__init__()
        self.cfg = cfg
        w = weights  # consumed: each tensor is dropped from the dict once placed (peak memory)
        embed_w = w.pop("embed_tokens.weight")
        if isinstance(embed_w, torch.Tensor):
            self.embed: nn.Module = nn.Embedding.from_pretrained(embed_w)
        else:  # stored blocks (native / quantised loading): dequantise rows per lookup
            from tightfit.engine.quant.embedding import QuantizedEmbedding

            self.embed = QuantizedEmbedding(embed_w)
        rope = Rotary(cfg.head_dim, cfg.rope_theta, cfg.max_position)
        local = (Rotary(cfg.head_dim, cfg.rope_local_theta, cfg.max_position)
                 if cfg.rope_local_theta else rope)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, w, make_linear, local if cfg.is_sliding(i) else rope)
            for i in range(cfg.num_layers))
        self.norm = RMSNorm(w.pop("norm.weight"), cfg.rms_eps)
        head_w = w.pop("lm_head.weight", None)
        if head_w is None:
            head_w = embed_w
        self.lm_head = make_linear(["lm_head"], [head_w], None)
        self.embed_scale = cfg.embed_scale
        self.rotaries = [rope] if local is rope else [rope, local]
        if w:
            raise ValueError(f"unused weights: {sorted(w)[:8]}")

    def ensure_positions(self, positions: int) -> None:
        """Rotary tables for positions 0..positions-1 (see Rotary.ensure)."""
        for rotary in self.rotaries:
            rotary.ensure(positions)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                logits_rows: torch.Tensor | None = None, mode: str = "fast") -> torch.Tensor:
        return self.forward_hidden(self.embed_tokens(input_ids), positions, meta, kv_caches,
                                   logits_rows, mode)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        if self.embed_scale != 1.0:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        return x

    def forward_hidden(self, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                       kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                       logits_rows: torch.Tensor | None = None, mode: str = "fast"
                       ) -> torch.Tensor:
        """The layers, final norm and head on embedded tokens x [T, hidden] (the part a compiled
        decode step runs; the embedding lookup stays eager)."""
        for layer, kv in zip(self.layers, kv_caches):
            x = layer(x, positions, meta, kv, mode)
        if logits_rows is not None:
            x = x[logits_rows]
        logits = self.lm_head(self.norm(x))
        if self.cfg.final_logit_softcap:
            cap = self.cfg.final_logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits

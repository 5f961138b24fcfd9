"""Paged attention over the block-table KV cache: a plain-torch reference path (per sequence,
block by block) and a fast path (one gather per group of sequences, then SDPA).

The runner builds one AttentionMetadata per step; every layer reuses it. Sliding-window layers
(Gemma 3) get their own masks. Does not manage blocks: that is the BlockPool's job.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class AttentionGroup:
    """Sequences whose queries are laid out as a [B, Lq] slab of the flattened token batch."""

    token_start: int
    batch: int
    q_len: int
    kv_index: torch.Tensor | None  # [B, Lkv] flat slot ids to gather; None = attend to new K/V only
    mask: torch.Tensor | None  # [B, 1, Lq, Lkv] bool (True = attend); None = plain causal/full
    sliding_mask: torch.Tensor | None = None


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] flat slot id where each new token's K/V is written
    groups: list[AttentionGroup]
    # Per sequence, for the reference path (flattened token order matches `query_starts`).
    query_starts: list[int] = field(default_factory=list)
    query_positions: list[list[int]] = field(default_factory=list)
    context_lens: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Stores new keys/values [T, Hkv, D] into the flat cache views [slots, Hkv, D]."""
    k_cache.index_copy_(0, slot_mapping, k)
    v_cache.index_copy_(0, slot_mapping, v)


def fast_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                   sliding: bool) -> torch.Tensor:
    """q [T, H, D]; k, v [T, Hkv, D] (already written to the cache). Returns [T, H, D]."""
    out = torch.empty_like(q)
    for g in meta.groups:
        s, n = g.token_start, g.batch * g.q_len
        qg = q[s:s + n].view(g.batch, g.q_len, *q.shape[1:]).transpose(1, 2)
        if g.kv_index is None:  # fresh prompt, no cached prefix: attend to its own K/V
            kg = k[s:s + n].view(g.batch, g.q_len, *k.shape[1:]).transpose(1, 2)
            vg = v[s:s + n].view(g.batch, g.q_len, *v.shape[1:]).transpose(1, 2)
        else:
            kg = k_cache[g.kv_index].transpose(1, 2)
            vg = v_cache[g.kv_index].transpose(1, 2)
        mask = g.sliding_mask if sliding and g.sliding_mask is not None else g.mask
        causal = mask is None and g.q_len > 1
        o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, is_causal=causal,
                                           scale=scale, enable_gqa=True)
        out[s:s + n] = o.transpose(1, 2).reshape(n, *q.shape[1:])
    return out


def reference_attention(q: torch.Tensor, k_cache_blocks: torch.Tensor,
                        v_cache_blocks: torch.Tensor, meta: AttentionMetadata, scale: float,
                        window: int | None) -> torch.Tensor:
    """Plain torch, one sequence at a time, reading K/V block by block through its block table.

    k_cache_blocks: [num_blocks, block_size, Hkv, D]. This is the definition of truth that the
    fast path is tested against: plain over fast.
    """
    out = torch.empty_like(q)
    n_heads, n_kv = q.shape[1], k_cache_blocks.shape[2]
    for i, start in enumerate(meta.query_starts):
        positions = meta.query_positions[i]
        ctx = meta.context_lens[i]
        keys = torch.cat([k_cache_blocks[b] for b in meta.block_tables[i]])[:ctx]
        vals = torch.cat([v_cache_blocks[b] for b in meta.block_tables[i]])[:ctx]
        keys = keys.repeat_interleave(n_heads // n_kv, dim=1)  # [ctx, H, D]
        vals = vals.repeat_interleave(n_heads // n_kv, dim=1)
        qi = q[start:start + len(positions)]  # [Lq, H, D]
        scores = torch.einsum("qhd,khd->hqk", qi, keys) * scale
        qpos = torch.tensor(positions).view(-1, 1)
        kpos = torch.arange(ctx).view(1, -1)
        allowed = kpos <= qpos
        if window is not None:
            allowed &= (qpos - kpos) < window
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start:start + len(positions)] = torch.einsum("hqk,khd->qhd", probs, vals)
    return out

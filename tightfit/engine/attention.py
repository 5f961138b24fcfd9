"""Paged attention over the block-table KV cache: a plain-torch reference path (per sequence,
block by block) and a fast path (one gather per group of sequences, then SDPA).

The runner builds one AttentionMetadata per step; every layer reuses it. Sliding-window layers
(Gemma 3) get their own masks. Does not manage blocks: that is the BlockPool's job.
The cache is fp32 tensors or Int8KVCache (int8 codes, per-token per-head scales); attention
always computes in fp32 on what the cache holds.
"""
from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F


@dataclass
class AttentionGroup:
    """Sequences whose queries are laid out as a [B, Lq] slab of the flattened token batch."""

    token_start: int
    batch: int
    q_len: int
    kv_index: torch.Tensor | None  # [B, Lkv] flat slot ids to gather; None = see kv_blocks
    mask: torch.Tensor | None  # [B, 1, Lq, Lkv] bool (True = attend); None = plain causal/full
    sliding_mask: torch.Tensor | None = None
    # The same gather by whole blocks (what the runner builds): [B, nb] block ids, the first
    # kv_len slots of their concatenation are read (padding beyond a sequence is masked).
    # Copying 16-slot blocks is ~4x faster than indexing slot by slot. Both None = attend to
    # the new K/V only (a fresh prompt).
    kv_blocks: torch.Tensor | None = None
    kv_len: int = 0


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] flat slot id where each new token's K/V is written
    groups: list[AttentionGroup]
    # Per sequence, for the reference path (flattened token order matches `query_starts`).
    query_starts: list[int] = field(default_factory=list)
    query_positions: list[list[int]] = field(default_factory=list)
    context_lens: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)
    # Studies only: attend(attention module, q [T, H, D], k, v [T, Hkv, D]) -> [T, H, D] replaces
    # the paged cache (no K/V written), e.g. to replay token eviction over one sequence.
    attend: Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    # Rotary cos/sin rows of this step's positions, filled by the first layer that needs them.
    rope: dict[float, tuple[torch.Tensor, ...]] = field(default_factory=dict)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (int8 codes [..., D], fp32 scales [..., 1]), symmetric absmax per row."""
    scale = x.abs().amax(dim=-1, keepdim=True) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # all-zero row: any scale
    return torch.round(x / scale).clamp_(-127, 127).to(torch.int8), scale


def dequantize_int8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return codes.to(torch.float32) * scale


def int8_round_trip(x: torch.Tensor) -> torch.Tensor:
    """What an int8 cache returns for x: used where attention reads new K/V without the cache."""
    return dequantize_int8(*quantize_int8(x))


class Int8KVCache:
    """An int8 K or V cache that stands where the fp32 cache tensor would: writes
    (`index_copy_`, item assignment) quantise, reads (indexing) return dequantised fp32, so the
    paged paths and whole-block copies need no int8 branch. Scales: one fp32 per (token, head)."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor) -> None:
        self.codes = codes  # int8 [..., Hkv, D]
        self.scale = scale  # fp32 [..., Hkv, 1]

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> "Int8KVCache":
        return cls(untouched_zeros(shape, torch.int8), untouched_zeros((*shape[:-1], 1)))

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale.nbytes

    def view(self, *shape: int) -> "Int8KVCache":
        """A view with a new leading layout; the last (head_dim) axis must stay."""
        return Int8KVCache(self.codes.view(*shape), self.scale.view(*shape[:-1], 1))

    def __getitem__(self, index: object) -> torch.Tensor:
        return dequantize_int8(self.codes[index], self.scale[index])

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        return dequantize_int8(self.codes.index_select(dim, index),
                               self.scale.index_select(dim, index))

    def __setitem__(self, index: object, value: torch.Tensor) -> None:
        self.codes[index], self.scale[index] = quantize_int8(value)

    def index_copy_(self, dim: int, index: torch.Tensor, source: torch.Tensor) -> "Int8KVCache":
        codes, scale = quantize_int8(source)
        self.codes.index_copy_(dim, index, codes)
        self.scale.index_copy_(dim, index, scale)
        return self


def untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Zeros in an anonymous memory map: pages become resident only when first written (an
    idle pool costs address space, not RSS), and slots never written read as 0. Block gathers
    read the unwritten tail of a sequence's last block as masked padding, and masked garbage
    can still poison attention (NaN * 0 = NaN), which reused heap memory from torch.empty
    could hold."""
    count = math.prod(shape)
    buf = mmap.mmap(-1, max(1, count * torch.empty((), dtype=dtype).element_size()))
    return torch.frombuffer(buf, dtype=dtype, count=count).view(shape)  # keeps buf alive


def make_kv_cache(shape: tuple[int, ...], kv_dtype: str = "fp32") -> torch.Tensor | Int8KVCache:
    """One layer's K (or V) cache [num_blocks, block_size, Hkv, D], zeroed lazily."""
    if kv_dtype == "int8":
        return Int8KVCache.empty(shape)
    assert kv_dtype == "fp32", kv_dtype
    return untouched_zeros(shape)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Stores new keys/values [T, Hkv, D] into the flat cache views [slots, Hkv, D]."""
    k_cache.index_copy_(0, slot_mapping, k)
    v_cache.index_copy_(0, slot_mapping, v)


def gather_blocks(cache_blocks: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """cache [num_blocks, block_size, Hkv, D], blocks [B, nb] -> [B, length, Hkv, D]: each row's
    blocks concatenated, the first `length` slots (int8 caches dequantise what they copy). Also
    compiled into the TorchScript decode stack (engine/scripted.py)."""
    got = cache_blocks.index_select(0, blocks.reshape(-1))
    return got.view(blocks.shape[0], -1, got.shape[2], got.shape[3])[:, :length]


def fast_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                   sliding: bool) -> torch.Tensor:
    """q [T, H, D]; k, v [T, Hkv, D] (already written to the cache); k_cache, v_cache
    [num_blocks, block_size, Hkv, D]. Returns [T, H, D]."""
    out = torch.empty_like(q)
    if isinstance(k_cache, Int8KVCache):  # new K/V read directly must equal what the cache holds
        k, v = int8_round_trip(k), int8_round_trip(v)
    for g in meta.groups:
        s, n = g.token_start, g.batch * g.q_len
        qg = q[s:s + n].view(g.batch, g.q_len, *q.shape[1:]).transpose(1, 2)
        if g.kv_blocks is not None:
            kg = gather_blocks(k_cache, g.kv_blocks, g.kv_len).transpose(1, 2)
            vg = gather_blocks(v_cache, g.kv_blocks, g.kv_len).transpose(1, 2)
        elif g.kv_index is not None:  # arbitrary slots (studies of token eviction)
            flat_k = k_cache.view(-1, *k_cache.shape[2:])
            flat_v = v_cache.view(-1, *v_cache.shape[2:])
            kg = flat_k[g.kv_index].transpose(1, 2)
            vg = flat_v[g.kv_index].transpose(1, 2)
        else:  # fresh prompt, no cached prefix: attend to its own K/V
            kg = k[s:s + n].view(g.batch, g.q_len, *k.shape[1:]).transpose(1, 2)
            vg = v[s:s + n].view(g.batch, g.q_len, *v.shape[1:]).transpose(1, 2)
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

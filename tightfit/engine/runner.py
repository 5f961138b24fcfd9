"""Turns a SchedulerOutput into one forward pass: flattens the scheduled tokens (single-token
decodes first, as one batched group; then each prefill chunk), builds slot mappings and
attention masks, runs the model and returns logits only for sequences that sample this step.

Owns the KV cache tensors; never touches queues or decides who runs.
"""
from __future__ import annotations

import mmap
import tempfile
import time
from typing import Any

import numpy as np
import torch

from tightfit.config import CacheConfig, ModelConfig
from tightfit.engine.attention import (AttentionGroup, AttentionMetadata, Int8KVCache,
                                       make_kv_cache)
from tightfit.engine.compiled import CompiledDecode
from tightfit.engine.models.transformer import DecoderModel
from tightfit.engine.scheduler import ScheduledSeq, SchedulerOutput
from tightfit.engine.scripted import ScriptedDecode


def num_kv_blocks(model: ModelConfig, cache: CacheConfig, dtype_bytes: int | None = None) -> int:
    """Blocks that fit cache.kv_cache_bytes at the cache's real bytes per token (int8 codes plus
    scales for kv_dtype="int8"); `dtype_bytes` forces a plain per-element width instead."""
    if cache.num_blocks is not None:
        return cache.num_blocks
    per_token = (cache.kv_bytes_per_token(model) if dtype_bytes is None
                 else model.kv_bytes_per_token(dtype_bytes))
    per_block = per_token * cache.block_size
    return max(1, cache.kv_cache_bytes // per_block)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cfg: ModelConfig, cache: CacheConfig,
                 num_blocks: int, attention: str = "fast", compile_decode: bool = False,
                 scripted_decode: bool = True, fused_kernels: bool = True) -> None:
        self.model = model
        self.cfg = cfg
        self.block_size = cache.block_size
        self.attention = attention
        shape = (num_blocks, cache.block_size, cfg.num_kv_heads, cfg.head_dim)
        # Anonymous maps (attention.untouched_zeros): pages become resident only when first
        # written, so an idle pool costs address space, not RSS; unwritten slots read as 0.
        kv_dtype = cache.kv_dtype
        self.kv_caches = [(make_kv_cache(shape, kv_dtype), make_kv_cache(shape, kv_dtype))
                          for _ in range(cfg.num_layers)]
        self._offsets = torch.arange(cache.block_size)
        self.length_grouping = cache.length_grouping
        self.kv_slots_useful = 0  # K/V slots attended that belong to the sequence
        self.kv_slots_padded = 0  # ... including padding up to the group's longest context
        self.block_bytes = cache.kv_bytes_per_token(cfg) * cache.block_size
        self._swap: SwapSpace | None = None
        self._swap_bytes = cache.swap_bytes
        self.last_swap_bytes, self.last_swap_s = 0, 0.0
        self.compiled: CompiledDecode | None = None
        if compile_decode and attention == "fast" and kv_dtype == "fp32":
            self.compiled = CompiledDecode.for_model(model)
            self.compiled.warmup(self.kv_caches, cache.block_size)
        self.compiled_steps = 0
        self.scripted: ScriptedDecode | None = None
        if (scripted_decode and self.compiled is None and attention == "fast"
                and kv_dtype == "fp32" and isinstance(model, DecoderModel)):
            self.scripted = ScriptedDecode.for_model(model, fused=fused_kernels)
        self.scripted_steps = 0

    def _slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        blocks = torch.tensor(block_table, dtype=torch.long)
        slots = (blocks[:, None] * self.block_size + self._offsets).flatten()
        return slots[start:end]

    def _window(self) -> int | None:
        return self.cfg.sliding_window if self.cfg.has_sliding_layers else None

    def _length_buckets(self, decodes: list[ScheduledSeq]) -> list[list[ScheduledSeq]]:
        """Decodes share one padded attention call per bucket. With length grouping, sequences
        are sorted by context length and a new bucket starts where padding to the bucket's
        longest context would more than double a member's work (one long request among short
        ones would otherwise make every short one attend over its length)."""
        if not self.length_grouping or len(decodes) < 2:
            return [decodes] if decodes else []
        items = sorted(decodes, key=lambda s: s.start)
        buckets: list[list[ScheduledSeq]] = [[items[0]]]
        for s in items[1:]:
            if s.start + 1 > 2 * (buckets[-1][0].start + 1) + self.block_size:
                buckets.append([s])
            else:
                buckets[-1].append(s)
        return buckets

    def _blocks(self, block_tables: list[list[int]], lengths: list[int]) -> torch.Tensor:
        """[B, nb] ids of the blocks holding each sequence's first `length` slots, padded with
        block 0 (its slots are masked)."""
        bs = self.block_size
        nb = (max(lengths) + bs - 1) // bs
        rows = []
        for table, n in zip(block_tables, lengths):
            used = table[:(n + bs - 1) // bs]
            rows.append(used + [0] * (nb - len(used)))
        return torch.tensor(rows, dtype=torch.long)

    def _decode_group(self, items: list[ScheduledSeq], token_start: int) -> AttentionGroup:
        ctx = [s.start + 1 for s in items]
        lmax = max(ctx)
        blocks = self._blocks([s.seq.block_table for s in items], ctx)
        kpos = torch.arange(lmax).view(1, -1)
        ctx_t = torch.tensor(ctx).view(-1, 1)
        valid = kpos < ctx_t
        mask = None if all(c == lmax for c in ctx) else valid.view(len(items), 1, 1, lmax)
        sliding = None
        window = self._window()
        if window is not None and lmax > window:
            sliding = (valid & (kpos > ctx_t - 1 - window)).view(len(items), 1, 1, lmax)
            if mask is None:
                mask = valid.view(len(items), 1, 1, lmax)
        return AttentionGroup(token_start, len(items), 1, None, mask, sliding,
                              kv_blocks=blocks, kv_len=lmax)

    def _prefill_group(self, s: ScheduledSeq, token_start: int) -> AttentionGroup:
        n, start = s.num_new_tokens, s.start
        window = self._window()
        if start == 0 and (window is None or n <= window):
            return AttentionGroup(token_start, 1, n, None, None)
        ctx = start + n
        blocks = self._blocks([s.seq.block_table], [ctx])
        qpos = torch.arange(start, ctx).view(-1, 1)
        kpos = torch.arange(ctx).view(1, -1)
        causal = kpos <= qpos
        sliding = None
        if window is not None:
            sliding = (causal & (qpos - kpos < window)).view(1, 1, n, ctx)
        return AttentionGroup(token_start, 1, n, None, causal.view(1, 1, n, ctx), sliding,
                              kv_blocks=blocks, kv_len=ctx)

    def prepare(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata,
                                                     list[ScheduledSeq]]:
        decodes = [s for s in out.scheduled if s.num_new_tokens == 1]
        buckets = self._length_buckets(decodes)
        decodes = [s for b in buckets for s in b]
        prefills = [s for s in out.scheduled if s.num_new_tokens > 1]
        ordered = decodes + prefills
        ids: list[int] = []
        pos: list[int] = []
        slots: list[torch.Tensor] = []
        meta = AttentionMetadata(slot_mapping=torch.empty(0), groups=[])
        for s in ordered:
            end = s.start + s.num_new_tokens
            meta.query_starts.append(len(ids))
            meta.query_positions.append(list(range(s.start, end)))
            meta.context_lens.append(end)
            meta.block_tables.append(s.seq.block_table)
            ids.extend(s.seq.token_ids[s.start:end])
            pos.extend(range(s.start, end))
            slots.append(self._slots(s.seq.block_table, s.start, end))
        meta.slot_mapping = torch.cat(slots)
        if decodes:
            start = 0
            for bucket in buckets:
                meta.groups.append(self._decode_group(bucket, start))
                start += len(bucket)
                ctx = [s.start + 1 for s in bucket]
                self.kv_slots_useful += sum(ctx)
                self.kv_slots_padded += len(bucket) * max(ctx)
        for s in prefills:
            meta.groups.append(self._prefill_group(s, meta.query_starts[ordered.index(s)]))
        return torch.tensor(ids), torch.tensor(pos), meta, ordered

    def swap_space(self) -> SwapSpace:
        if self._swap is None:
            self._swap = SwapSpace(self.kv_caches, self._swap_bytes // self.block_bytes)
        return self._swap

    def _do_swaps(self, out: SchedulerOutput) -> None:
        t0 = time.perf_counter()
        moved = 0
        # In the order the scheduler decided them: a slot given back by a swap-in may be taken
        # by a later swap-out of the same step, and a block freed by a swap-out may receive a
        # later swap-in.
        for direction, blocks, slots in out.swaps:
            if direction == "out":
                self.swap_space().store(blocks, slots)
            else:
                self.swap_space().load(slots, blocks)
            moved += len(blocks)
        self.last_swap_bytes = moved * self.block_bytes
        self.last_swap_s = time.perf_counter() - t0

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """Runs the step; returns the sequences that sample and their logits [n, vocab]."""
        self.last_swap_bytes = 0
        if out.swaps:
            self._do_swaps(out)
        input_ids, positions, meta, ordered = self.prepare(out)
        rows = [meta.query_starts[i] + s.num_new_tokens - 1
                for i, s in enumerate(ordered) if s.samples]
        sampling = [s for s in ordered if s.samples]
        if not sampling:
            rows_t = torch.empty(0, dtype=torch.long)
        else:
            rows_t = torch.tensor(rows)
        if (self.compiled is not None and len(rows) == len(ordered)
                and CompiledDecode.eligible(meta, self.kv_caches)):
            self.compiled_steps += 1
            return sampling, self.compiled(input_ids, positions, meta, self.kv_caches, rows_t)
        if (self.scripted is not None and rows and len(rows) == len(ordered)
                and ScriptedDecode.eligible(meta, self.kv_caches)):
            self.scripted_steps += 1
            return sampling, self.scripted(input_ids, positions, meta, self.kv_caches, rows_t)
        logits = self.model(input_ids, positions, meta, self.kv_caches, rows_t, self.attention)
        return sampling, logits


class SwapSpace:
    """A disk-backed (temporary file, memory-mapped) area holding preempted sequences' KV
    blocks, so that under a RAM budget they leave resident memory instead of being recomputed.
    One slot holds one block of every cache tensor: K and V of every layer, and for an int8
    cache its codes and scales, copied as stored (a swap round trip is exact). On a GPU this
    would be host memory."""

    def __init__(self, kv_caches: list[tuple[Any, Any]], num_slots: int) -> None:
        tensors = [t for pair in kv_caches for cache in pair for t in _block_tensors(cache)]
        groups: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        for t in tensors:  # one mapped array per (dtype, block shape)
            groups.setdefault((t.dtype, tuple(t.shape[1:])), []).append(t)
        self._files, self._maps, self.areas = [], [], []
        for (dtype, block_shape), members in groups.items():
            f = tempfile.TemporaryFile(prefix="tightfit-swap-")
            shape = (num_slots, len(members), *block_shape)
            np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
            f.truncate(int(np.prod(shape)) * np_dtype.itemsize)  # sparse: disk used as slots fill
            m = np.memmap(f, dtype=np_dtype, mode="r+", shape=shape)
            self._files.append(f)
            self._maps.append(m)
            self.areas.append((torch.from_numpy(m), members))

    def _drop_resident(self) -> None:
        # The mapping is shared and file-backed: dropping our pages keeps the data (page cache,
        # then disk) but takes it out of this process's resident set, which the budget counts.
        for m in self._maps:
            m._mmap.madvise(mmap.MADV_DONTNEED)  # type: ignore[attr-defined]

    def store(self, blocks: list[int], slots: list[int]) -> None:
        b, s = torch.tensor(blocks), torch.tensor(slots)
        for area, members in self.areas:
            for i, t in enumerate(members):
                area[s, i] = t[b]
        self._drop_resident()

    def load(self, slots: list[int], blocks: list[int]) -> None:
        b, s = torch.tensor(blocks), torch.tensor(slots)
        for area, members in self.areas:
            for i, t in enumerate(members):
                t[b] = area[s, i]
        self._drop_resident()


def _block_tensors(cache: Any) -> list[torch.Tensor]:
    """The raw tensors of one K or V cache, each indexed by block first."""
    if isinstance(cache, Int8KVCache):
        return [cache.codes, cache.scale]
    return [cache]

"""Turns a SchedulerOutput into one forward pass: flattens the scheduled tokens (single-token
decodes first, as one batched group; then each prefill chunk), builds slot mappings and
attention masks, runs the model and returns logits only for sequences that sample this step.

Owns the KV cache tensors; never touches queues or decides who runs.
"""
from __future__ import annotations

import torch

from tightfit.config import CacheConfig, ModelConfig
from tightfit.engine.attention import AttentionGroup, AttentionMetadata
from tightfit.engine.scheduler import ScheduledSeq, SchedulerOutput


def num_kv_blocks(model: ModelConfig, cache: CacheConfig, dtype_bytes: int = 4) -> int:
    if cache.num_blocks is not None:
        return cache.num_blocks
    per_block = model.kv_bytes_per_token(dtype_bytes) * cache.block_size
    return max(1, cache.kv_cache_bytes // per_block)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cfg: ModelConfig, cache: CacheConfig,
                 num_blocks: int, attention: str = "fast") -> None:
        self.model = model
        self.cfg = cfg
        self.block_size = cache.block_size
        self.attention = attention
        shape = (num_blocks, cache.block_size, cfg.num_kv_heads, cfg.head_dim)
        # torch.empty: pages become resident only when first written, so an idle pool costs
        # address space, not RSS.
        self.kv_caches = [(torch.empty(shape), torch.empty(shape)) for _ in range(cfg.num_layers)]
        self._offsets = torch.arange(cache.block_size)

    def _slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        blocks = torch.tensor(block_table, dtype=torch.long)
        slots = (blocks[:, None] * self.block_size + self._offsets).flatten()
        return slots[start:end]

    def _window(self) -> int | None:
        return self.cfg.sliding_window if self.cfg.has_sliding_layers else None

    def _decode_group(self, items: list[ScheduledSeq], token_start: int) -> AttentionGroup:
        ctx = [s.start + 1 for s in items]
        lmax = max(ctx)
        index = torch.zeros(len(items), lmax, dtype=torch.long)
        for i, s in enumerate(items):
            index[i, :ctx[i]] = self._slots(s.seq.block_table, 0, ctx[i])
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
        return AttentionGroup(token_start, len(items), 1, index, mask, sliding)

    def _prefill_group(self, s: ScheduledSeq, token_start: int) -> AttentionGroup:
        n, start = s.num_new_tokens, s.start
        window = self._window()
        if start == 0 and (window is None or n <= window):
            return AttentionGroup(token_start, 1, n, None, None)
        ctx = start + n
        index = self._slots(s.seq.block_table, 0, ctx).view(1, ctx)
        qpos = torch.arange(start, ctx).view(-1, 1)
        kpos = torch.arange(ctx).view(1, -1)
        causal = kpos <= qpos
        sliding = None
        if window is not None:
            sliding = (causal & (qpos - kpos < window)).view(1, 1, n, ctx)
        return AttentionGroup(token_start, 1, n, index, causal.view(1, 1, n, ctx), sliding)

    def prepare(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata,
                                                     list[ScheduledSeq]]:
        decodes = [s for s in out.scheduled if s.num_new_tokens == 1]
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
            meta.groups.append(self._decode_group(decodes, 0))
        for s in prefills:
            meta.groups.append(self._prefill_group(s, meta.query_starts[ordered.index(s)]))
        return torch.tensor(ids), torch.tensor(pos), meta, ordered

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """Runs the step; returns the sequences that sample and their logits [n, vocab]."""
        input_ids, positions, meta, ordered = self.prepare(out)
        rows = [meta.query_starts[i] + s.num_new_tokens - 1
                for i, s in enumerate(ordered) if s.samples]
        sampling = [s for s in ordered if s.samples]
        if not sampling:
            rows_t = torch.empty(0, dtype=torch.long)
        else:
            rows_t = torch.tensor(rows)
        logits = self.model(input_ids, positions, meta, self.kv_caches, rows_t, self.attention)
        return sampling, logits

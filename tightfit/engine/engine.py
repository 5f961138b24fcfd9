"""The engine loop: admits requests, runs scheduler -> runner -> sampler once per `step()`,
detokenises incrementally, applies stop conditions and returns per-request deltas.

Synchronous and single-threaded by design; the server drives it from one background thread.
"""
from __future__ import annotations

import itertools
import time
from typing import Any

from tightfit.config import EngineConfig
from tightfit.engine.block_pool import BlockPool
from tightfit.engine.memory_pool import MemoryPool, Tier
from tightfit.engine.request import RequestOutput, Sequence
from tightfit.engine.runner import ModelRunner, num_kv_blocks
from tightfit.engine.sampler import Sampler
from tightfit.engine.sampling_params import SamplingParams
from tightfit.engine.scheduler import Scheduler
from tightfit.engine.text import TextState, next_token_finish, new_request, request_output


class LLMEngine:
    def __init__(self, model: Any, tokenizer: Any, config: EngineConfig) -> None:
        self.config = config
        self.model_config = config.model
        self.tokenizer = tokenizer
        cache = config.cache
        blocks = num_kv_blocks(config.model, cache)
        self.max_model_len = min(config.scheduler.max_model_len, config.model.max_position)
        if hasattr(model, "ensure_positions"):  # before any compiled step reads the tables
            model.ensure_positions(self.max_model_len)
        self.pool = BlockPool(blocks, cache.block_size, cache.enable_prefix_caching)
        self.runner = ModelRunner(model, config.model, cache, blocks, config.attention,
                                  config.compile_decode, config.scripted_decode,
                                  config.fused_kernels)
        # Swap copies plain fp32 cache tensors; int8 KV preempts by recompute only.
        swap_slots = cache.swap_bytes // self.runner.block_bytes if cache.swap_bytes else 0
        memory = MemoryPool(self.pool, make_tiers(cache.tiers, self.max_model_len), swap_slots)
        self.scheduler = Scheduler(config.scheduler, self.pool, memory=memory,
                                   idle_ttl_s=cache.idle_ttl_s)
        self.scheduler.cost.block_bytes = self.runner.block_bytes
        self.sampler = Sampler()
        self._seqs: dict[str, Sequence] = {}
        self._text: dict[str, TextState] = {}
        self._arrivals = itertools.count()
        self.num_steps = 0

    @property
    def kv_capacity_tokens(self) -> int:
        return self.pool.num_blocks * self.pool.block_size

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, priority: int = 0) -> str:
        limit = min(self.max_model_len, self.kv_capacity_tokens)
        seq, state = new_request(
            self.tokenizer, prompt, params, request_id, priority, next(self._arrivals),
            self._seqs, self.model_config.vocab_size, limit,
            f"max_model_len={self.max_model_len}, KV pool={self.kv_capacity_tokens} tokens",
            "raise --max-model-len / the KV cache size")
        self.scheduler.add(seq)  # may refuse: too long for every tier, queue full
        self._seqs[seq.request_id] = seq
        self._text[seq.request_id] = state
        return seq.request_id

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort(self, request_id: str) -> None:
        seq = self._seqs.pop(request_id, None)
        if seq is not None and not seq.is_finished:
            self.scheduler.finish(seq, "abort")
        self._text.pop(request_id, None)
        self.sampler.release(request_id)

    def step(self) -> list[RequestOutput]:
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        now = time.perf_counter()
        for s in out.scheduled:
            if s.seq.metrics.first_scheduled_time is None:
                s.seq.metrics.first_scheduled_time = now
        t0 = time.perf_counter()
        sampling, logits = self.runner.execute(out)
        self.scheduler.cost.observe_prefill(time.perf_counter() - t0, out.num_tokens)
        if self.runner.last_swap_bytes:
            self.scheduler.cost.observe_swap(self.runner.last_swap_s, self.runner.last_swap_bytes)
        self.scheduler.after_step(out)
        token_ids = self.sampler.sample([s.seq for s in sampling], logits) if sampling else []
        self.num_steps += 1
        now = time.perf_counter()
        return [self._append(s.seq, tok, now) for s, tok in zip(sampling, token_ids)]

    def _append(self, seq: Sequence, token: int, now: float) -> RequestOutput:
        state = self._text[seq.request_id]
        delta, reason = next_token_finish(seq, token, now, state, self.tokenizer.stop_token_ids,
                                          self.max_model_len)
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self.sampler.release(seq.request_id)
            self._seqs.pop(seq.request_id, None)
            self._text.pop(seq.request_id, None)
        return request_output(seq, state, token, delta, reason)

    def stats(self) -> dict[str, Any]:
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "kv_usage": self.pool.usage(),
            "num_preemptions": self.scheduler.num_preemptions,
            "num_swaps": self.scheduler.num_swaps,
            "kv_usage_by_tier": self.scheduler.memory.usage_by_tier(),
            "prefix_hit_tokens": self.pool.prefix_hit_tokens,
            "prefix_query_tokens": self.pool.prefix_query_tokens,
            "kv_evicted_blocks": self.pool.evicted_blocks,
            "kv_reclaimed_idle_blocks": self.pool.reclaimed_idle_blocks,
            "waiting_by_priority": _count_by_priority(self.scheduler.waiting),
            "running_by_priority": _count_by_priority(self.scheduler.running),
        }


def make_tiers(spec: tuple[tuple[str, int, float], ...], max_model_len: int) -> tuple[Tier, ...]:
    """Tiers from the cache config; the last one stretches to max_model_len, and tiers above
    it are dropped (a request can never be longer than max_model_len)."""
    tiers = [Tier(n, min(m, max_model_len), s) for n, m, s in sorted(spec, key=lambda t: t[1])]
    kept = [t for t in tiers if t.max_len < max_model_len]
    last = tiers[len(kept)] if len(kept) < len(tiers) else tiers[-1]
    return tuple(kept) + (Tier(last.name, max_model_len, last.share),)


def _count_by_priority(seqs: list[Sequence]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for s in seqs:
        counts[s.priority] = counts.get(s.priority, 0) + 1
    return counts

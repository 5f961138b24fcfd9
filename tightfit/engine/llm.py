"""`LLM`: the offline, vLLM-like entry point — load a model once, then `generate(prompts, params)`.

`LLM(model=None)` is the embedded default model (SmolLM2-135M-Instruct); `quant="native"` runs
weights as stored in the file (GGUF 4-bit blocks on int4 kernels), "fp32" dequantises.
Batches all prompts
through the continuous-batching engine; returns outputs in prompt order.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable, Iterator, Sequence

import torch

from tightfit.config import CacheConfig, EngineConfig, SchedulerConfig, parse_bytes
from tightfit.engine.engine import LLMEngine
from tightfit.engine.loader.model_loader import load_model
from tightfit.engine.request import RequestOutput
from tightfit.engine.sampling_params import SamplingParams
from tightfit.errors import TightfitError


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else (os.cpu_count() or 1))


class LLM:
    def __init__(self, model: str | os.PathLike | None = None, quant: str = "native",
                 kv_cache_memory: int | str = "256MiB", memory_budget: int | str | None = None,
                 max_model_len: int = 2048, max_num_seqs: int = 32,
                 max_num_batched_tokens: int = 512, block_size: int = 16,
                 enable_prefix_caching: bool = True, num_threads: int | None = None,
                 attention: str = "fast") -> None:
        if attention not in ("fast", "reference"):
            raise TightfitError(f"attention must be 'fast' or 'reference', got {attention!r}")
        self.num_threads = num_threads or default_threads()
        torch.set_num_threads(self.num_threads)
        loaded = load_model(model, quant)
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.load_time_s = loaded.load_time_s
        self.memory_budget = parse_bytes(memory_budget) if memory_budget is not None else None
        cfg = EngineConfig(
            model=loaded.config,
            cache=CacheConfig(block_size=block_size, kv_cache_bytes=parse_bytes(kv_cache_memory),
                              enable_prefix_caching=enable_prefix_caching),
            scheduler=SchedulerConfig(max_num_seqs=max_num_seqs,
                                      max_num_batched_tokens=max_num_batched_tokens,
                                      max_model_len=max_model_len),
            attention=attention, num_threads=self.num_threads)
        self.engine = LLMEngine(loaded.model, loaded.tokenizer, cfg)

    def derive(self, *, block_size: int | None = None, num_blocks: int | None = None,
               max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
               enable_prefix_caching: bool | None = None, attention: str | None = None) -> "LLM":
        """A new LLM sharing this one's weights and tokenizer, with a fresh engine (own KV pool)
        built from this config with the given fields replaced."""
        c = self.config
        cache = replace(c.cache, **{k: v for k, v in dict(
            block_size=block_size, num_blocks=num_blocks,
            enable_prefix_caching=enable_prefix_caching).items() if v is not None})
        sched = replace(c.scheduler, **{k: v for k, v in dict(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens).items()
            if v is not None})
        cfg = replace(c, cache=cache, scheduler=sched, attention=attention or c.attention)
        other = object.__new__(LLM)
        other.__dict__.update(self.__dict__)
        other.engine = LLMEngine(self.loaded.model, self.tokenizer, cfg)
        return other

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    def generate(self, prompts: str | Sequence[str] | Sequence[list[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 priorities: Sequence[int] | None = None,
                 on_output: Callable[[RequestOutput], None] | None = None) -> list[RequestOutput]:
        """Runs all prompts to completion; `on_output` sees every streamed delta."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        plist = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise TightfitError(f"got {len(plist)} sampling params for {len(prompts)} prompts")
        ids = [self.engine.add_request(p, sp, priority=(priorities[i] if priorities else 0))
               for i, (p, sp) in enumerate(zip(prompts, plist))]
        final: dict[str, RequestOutput] = {}
        try:
            while len(final) < len(ids):
                for out in self.engine.step():
                    if on_output:
                        on_output(out)
                    if out.finished:
                        final[out.request_id] = out
        except BaseException:
            for rid in ids:
                self.engine.abort(rid)
            raise
        return [final[rid] for rid in ids]

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None
               ) -> Iterator[RequestOutput]:
        """Yields the deltas of one request as they are produced."""
        rid = self.engine.add_request(prompt, params)
        try:
            while True:
                for out in self.engine.step():
                    if out.request_id == rid:
                        yield out
                        if out.finished:
                            return
        finally:
            self.engine.abort(rid)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Renders messages with the model's chat template and tokenises them."""
        return self.tokenizer.encode(self.tokenizer.apply_chat_template(messages),
                                     add_special_tokens=False)

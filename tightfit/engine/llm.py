"""`LLM`: the offline, vLLM-like entry point — load a model once, then `generate(prompts, params)`.

`LLM(model=None)` is the embedded default model (SmolLM2-135M-Instruct); `quant="native"` runs
weights as stored in the file (GGUF 4-bit blocks on int4 kernels), "fp32" dequantises.
Batches all prompts
through the continuous-batching engine; returns outputs in prompt order.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch

from tightfit.config import (KV_DTYPES, CacheConfig, EngineConfig, SchedulerConfig, default_threads,
                             parse_bytes)
from tightfit.engine.engine import LLMEngine
from tightfit.engine.frontend import GenerateMixin
from tightfit.engine.loader.model_loader import load_model
from tightfit.errors import TightfitError


class LLM(GenerateMixin):
    def __init__(self, model: str | os.PathLike | None = None, quant: str = "native",
                 kv_cache_memory: int | str = "256MiB", memory_budget: int | str | None = None,
                 max_model_len: int = 2048, max_num_seqs: int = 32,
                 max_num_batched_tokens: int = 512, block_size: int = 16,
                 enable_prefix_caching: bool = True, num_threads: int | None = None,
                 attention: str = "fast", kv_dtype: str = "fp32",
                 swap_bytes: int | str = "256MiB",
                 tiers: tuple[tuple[str, int, float], ...] | None = None,
                 idle_ttl_s: float | None = 600.0, preemption_mode: str = "auto",
                 compile_decode: bool = False, scripted_decode: bool = True,
                 fused_kernels: bool = True) -> None:
        if attention not in ("fast", "reference"):
            raise TightfitError(f"attention must be 'fast' or 'reference', got {attention!r}")
        if kv_dtype not in KV_DTYPES:  # checked before the (slow) model load
            raise TightfitError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, "
                                f"got {kv_dtype!r}")
        sched = SchedulerConfig(max_num_seqs=max_num_seqs,
                                max_num_batched_tokens=max_num_batched_tokens,
                                max_model_len=max_model_len, preemption_mode=preemption_mode)
        self.memory_budget = parse_bytes(memory_budget) if memory_budget is not None else None
        kv_bytes = parse_bytes(kv_cache_memory)
        swap = parse_bytes(swap_bytes) if swap_bytes not in (0, "0") else 0
        self.num_threads = num_threads or default_threads()
        torch.set_num_threads(self.num_threads)
        if self.memory_budget is not None:  # refuse a hopeless budget before the slow load
            check_budget_before_load(self.memory_budget, model, quant, block_size, max_model_len,
                                     max_num_batched_tokens, max_num_seqs, kv_dtype)
        loaded = load_model(model, quant)
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.load_time_s = loaded.load_time_s
        if self.memory_budget is not None:
            kv_bytes = kv_bytes_for_budget(self.memory_budget, loaded, block_size, max_model_len,
                                           max_num_batched_tokens, max_num_seqs, kv_dtype)
        cache = CacheConfig(block_size=block_size, kv_cache_bytes=kv_bytes,
                            enable_prefix_caching=enable_prefix_caching, kv_dtype=kv_dtype,
                            swap_bytes=swap, tiers=tiers or CacheConfig.tiers,
                            idle_ttl_s=idle_ttl_s)
        cfg = EngineConfig(model=loaded.config, cache=cache, scheduler=sched,
                           attention=attention, num_threads=self.num_threads,
                           compile_decode=compile_decode, scripted_decode=scripted_decode,
                           fused_kernels=fused_kernels)
        self.engine = LLMEngine(loaded.model, loaded.tokenizer, cfg)

    def derive(self, *, attention: str | None = None, **fields: Any) -> "LLM":
        """A new LLM sharing this one's weights and tokenizer, with a fresh engine (own KV pool)
        built from this config with the given CacheConfig / SchedulerConfig fields replaced."""
        c = self.config
        cache_fields = {k: v for k, v in fields.items() if k in CacheConfig.__dataclass_fields__}
        sched_fields = {k: v for k, v in fields.items()
                        if k in SchedulerConfig.__dataclass_fields__}
        unknown = set(fields) - set(cache_fields) - set(sched_fields)
        if unknown:
            raise TightfitError(f"unknown engine settings: {sorted(unknown)}")
        cfg = replace(c, cache=replace(c.cache, **cache_fields),
                      scheduler=replace(c.scheduler, **sched_fields),
                      attention=attention or c.attention)
        other = object.__new__(LLM)
        other.__dict__.update(self.__dict__)
        other.engine = LLMEngine(self.loaded.model, self.tokenizer, cfg)
        return other

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

# Step temporaries the formula above misses (attention gathers, allocator arenas, file pages of
# the swap area): peak RSS under load exceeded budget by 42-68 MiB without it, measured with
# `tightfit study memory-pool --parts budget` on both formats of the default model.
RUNTIME_SLACK_BYTES = 80 * 2**20


def predicted_weight_bytes(g: Any, quant: str) -> int | None:
    """Bytes the loaded weights will hold, from a parsed GGUF file's header alone (no tensor is
    read): stored bytes for `native` (plus an int8 head when the output shares the embedding),
    4 bytes a weight for fp32, 1 for int8, 4/8 + 4/N for int4-gN; the token embedding stays as
    stored in the quantised formats. None for other formats (plan files)."""
    import re

    fmt = re.fullmatch(r"(fp32|native|int8|int4(?:-awq)?-g(\d+))", str(quant))
    if fmt is None:
        return None
    tensors = list(g.tensors())
    elems = {t.name: int(torch.Size(t.shape).numel()) for t in tensors}
    params = sum(elems.values())
    embed_name = "token_embd.weight"
    embed = elems.get(embed_name, 0)
    embed_stored = next((t.data.nbytes for t in tensors if t.name == embed_name), 0)
    tied = "output.weight" not in elems
    if quant == "fp32":
        return 4 * params
    if quant == "native":
        return sum(t.data.nbytes for t in tensors) + (embed if tied else 0)
    per_weight = 1.0 if quant == "int8" else 0.5 + 4 / int(fmt.group(2))
    body = params - embed  # the projections (and an untied head)
    return int(body * per_weight + embed_stored + (embed * per_weight if tied else 0))


def check_budget_before_load(budget: int, model: str | os.PathLike | None, quant: str,
                             block_size: int, max_model_len: int, max_batched_tokens: int,
                             max_num_seqs: int, kv_dtype: str) -> None:
    """Raises when even a lower bound of what loading leaves resident (this process now + 90% of
    the predicted weights) with the activations and one sequence's KV exceeds the budget: the
    check after loading (kv_bytes_for_budget) would refuse it too, after a load that may itself
    overrun the budget. Budgets that pass are checked again, measured, after loading. Only GGUF
    files are predicted (HF directories and .tfq files are checked after loading)."""
    import psutil

    from tightfit.engine.loader.gguf import GGUFFile
    from tightfit.engine.loader.model_config import config_from_gguf
    from tightfit.engine.loader.resolve import resolve_model

    path = resolve_model(model)
    if path.suffix != ".gguf":
        return
    g = GGUFFile(path)
    weights = predicted_weight_bytes(g, quant)
    if weights is None:
        return
    cfg = config_from_gguf(g)
    now = psutil.Process().memory_info().rss
    resident = now + 0.9 * weights
    activations, one_seq = _activation_and_sequence_bytes(
        cfg, block_size, max_model_len, max_batched_tokens, max_num_seqs, kv_dtype)
    need = resident + activations + one_seq
    if need > budget:
        raise TightfitError(
            f"memory budget {budget / 2**20:.0f} MiB cannot hold this model: it needs at least "
            f"{need / 2**20:.0f} MiB (predicted before loading: weights {weights / 2**20:.0f} MiB "
            f"in {quant}, this process {now / 2**20:.0f} MiB now, "
            f"activations ~{activations / 2**20:.0f} MiB, KV for one "
            f"{min(max_model_len, 512)}-token sequence {one_seq / 2**20:.0f} MiB); raise "
            "--memory-budget or pick a smaller weight format (--quant int4-g64)")


def _activation_and_sequence_bytes(cfg: Any, block_size: int, max_model_len: int,
                                   max_batched_tokens: int, max_num_seqs: int,
                                   kv_dtype: str) -> tuple[int, int]:
    per_token = (6 * cfg.hidden_size + 3 * cfg.intermediate_size
                 + cfg.num_heads * cfg.head_dim * 2) * 4
    activations = (max_batched_tokens * per_token + 2 * max_num_seqs * cfg.vocab_size * 4
                   + RUNTIME_SLACK_BYTES)
    kv_token = CacheConfig(kv_dtype=kv_dtype).kv_bytes_per_token(cfg)
    one_seq = -(-min(max_model_len, 512) // block_size) * block_size * kv_token
    return activations, one_seq


def kv_bytes_for_budget(budget: int, loaded: Any, block_size: int, max_model_len: int,
                        max_batched_tokens: int, max_num_seqs: int, kv_dtype: str = "fp32") -> int:
    """Sizes the KV pool so that weights + runtime + activations + KV fit in `budget` bytes.

    Weights and runtime are measured (this process's resident set after loading, which holds
    the interpreter, torch and the tokenizer too); activations are estimated from the largest
    step. Raises when the budget cannot hold the model and one full-length sequence."""
    import psutil

    cfg = loaded.config
    resident = psutil.Process().memory_info().rss
    activations, one_seq = _activation_and_sequence_bytes(
        cfg, block_size, max_model_len, max_batched_tokens, max_num_seqs, kv_dtype)
    kv = int((budget - resident - activations) * 0.95)
    if kv < one_seq:
        need = resident + activations + one_seq
        raise TightfitError(
            f"memory budget {budget / 2**20:.0f} MiB cannot hold this model: it needs at least "
            f"{need / 2**20:.0f} MiB (weights and runtime {resident / 2**20:.0f} MiB measured, "
            f"activations ~{activations / 2**20:.0f} MiB, KV for one {min(max_model_len, 512)}-"
            f"token sequence {one_seq / 2**20:.0f} MiB); raise --memory-budget or pick a smaller "
            "weight format (--quant int4-g64)")
    return kv

"""tightfit in process: requests go straight into the continuous-batching engine, added at their
arrival times while the engine steps. Each run gets a fresh engine (own KV pool, empty prefix
cache) on the same loaded weights, warmed by one untimed request, so runs do not leak cache hits
into each other and do not pay start-up costs a long-running server pays once.
"""
from __future__ import annotations

import time
from typing import Any

from tightfit.bench.backends.base import Admission, Backend, BackendOptions, Timing, now_since
from tightfit.bench.workloads import Arrival, BenchRequest
from tightfit.config import parse_bytes
from tightfit.errors import TightfitError

DEFAULT_MAX_NUM_SEQS = 32
DEFAULT_BLOCK_SIZE = 16
DEFAULT_KV = "256MiB"
DEFAULT_KV_DTYPE = "fp32"
MAX_IDLE_STEPS = 10_000  # steps in a row with no token: the engine is stuck, fail the run


def model_arg(name: str | None) -> str | None:
    return None if name in (None, "", "default") else name


def native_file(options: BackendOptions, who: str) -> Any:
    """The GGUF file of a backend that runs it on its own stored weights (quant "native")."""
    from tightfit.engine.loader.resolve import resolve_model

    if options.quant != "native":
        raise TightfitError(f"{who} runs the file's own format (its own weights): use quant "
                            f"'native', not {options.quant!r}")
    return resolve_model(model_arg(options.model))


class TightfitBackend(Backend):
    name = "tightfit"
    engine = "tightfit"

    def __init__(self, options: BackendOptions, llm: Any = None) -> None:
        super().__init__(options)
        self.llm = llm  # an already-loaded LLM (tests share one); else `load` builds it

    def load(self) -> None:
        from tightfit import LLM

        o = self.options
        t0 = time.perf_counter()
        if self.llm is None:
            self.llm = LLM(model_arg(o.model), quant=o.quant, num_threads=o.threads,
                           kv_cache_memory=o.kv_cache_memory or DEFAULT_KV,
                           memory_budget=o.memory_budget, max_model_len=o.max_model_len,
                           kv_dtype=o.kv_dtype or DEFAULT_KV_DTYPE,
                           compile_decode=bool(o.extra.get("compile_decode")),
                           scripted_decode=bool(o.extra.get("scripted_decode", True)),
                           fused_kernels=bool(o.extra.get("fused_kernels", True)))
        if self.load_time_s is None:
            self.load_time_s = time.perf_counter() - t0
        _check_quant_applied(o.quant, self.llm.loaded.model)

    def _engine_llm(self) -> Any:
        """A fresh engine on the loaded weights with this task's engine options."""
        o = self.options
        fields: dict[str, Any] = dict(max_num_seqs=o.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
                                      block_size=o.block_size or DEFAULT_BLOCK_SIZE,
                                      kv_dtype=o.kv_dtype or DEFAULT_KV_DTYPE)
        if o.memory_budget is None:  # with a budget, the engine sized the KV pool itself
            fields["kv_cache_bytes"] = parse_bytes(o.kv_cache_memory or DEFAULT_KV)
        if o.prefix_caching is not None:
            fields["enable_prefix_caching"] = o.prefix_caching
        return self.llm.derive(**fields)

    def run(self, requests: list[BenchRequest], arrival: Arrival) -> list[Timing]:
        from tightfit import SamplingParams

        engine = self._engine_llm().engine
        _warm(engine, SamplingParams)
        adm = Admission(requests, arrival)
        timings: dict[str, Timing] = {}
        done: list[Timing] = []
        t0, idle = time.perf_counter(), 0
        while not adm.done or timings:
            for req, at in adm.due(now_since(t0), len(timings)):
                self._submit(engine, req, at, timings, done, SamplingParams)
            if not timings:
                time.sleep(adm.wait_s(now_since(t0)))
                continue
            outs = engine.step()
            idle = 0 if outs else idle + 1
            if idle > MAX_IDLE_STEPS:
                raise RuntimeError(f"engine made no progress for {MAX_IDLE_STEPS} steps")
            for out in outs:
                self._record(out, t0, timings, done)
        return sorted(done, key=lambda t: t.index)

    @staticmethod
    def _submit(engine: Any, req: BenchRequest, at: float, timings: dict[str, Timing],
                done: list[Timing], sampling: Any) -> None:
        t = Timing(req.index, len(req.prompt_ids), req.max_tokens, req.priority, at)
        try:
            rid = engine.add_request(list(req.prompt_ids),
                                     sampling(max_tokens=req.max_tokens, ignore_eos=True),
                                     priority=req.priority)
        except TightfitError as exc:  # e.g. prompt longer than the context: this request fails
            t.error = str(exc)
            done.append(t)
            return
        timings[rid] = t

    @staticmethod
    def _record(out: Any, t0: float, timings: dict[str, Timing], done: list[Timing]) -> None:
        t = timings[out.request_id]
        m = out.metrics
        if t.first_token_s is None and m.first_token_time is not None:
            t.first_token_s = m.first_token_time - t0
        if out.finished:
            t.output_tokens = len(out.token_ids)
            t.finished_s = (m.finished_time or time.perf_counter()) - t0
            done.append(timings.pop(out.request_id))

    def _kv_bytes(self) -> int:
        o = self.options
        if o.memory_budget is None:
            return parse_bytes(o.kv_cache_memory or DEFAULT_KV)
        return int(self.llm.config.cache.kv_cache_bytes)

    def weight_bytes(self) -> int | None:
        from tightfit.engine.quant.linear import held_bytes

        return held_bytes(self.llm.loaded.model)

    def run_config(self) -> dict[str, Any]:
        o = self.options
        return {**super().run_config(),
                "max_num_seqs": o.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
                "max_batch_size": o.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
                "block_size": o.block_size or DEFAULT_BLOCK_SIZE,
                "kv_cache_bytes": self._kv_bytes(),
                "kv_dtype": o.kv_dtype or DEFAULT_KV_DTYPE,
                "memory_budget_bytes": parse_bytes(o.memory_budget) if o.memory_budget else None,
                "prefix_caching": True if o.prefix_caching is None else o.prefix_caching}


def _warm(engine: Any, sampling: Any) -> None:
    """One untimed 2-token request through a fresh engine: a server pays its first-step costs
    once at start-up, so a run must not pay them (its prompt shares no block with workloads)."""
    rid = engine.add_request(list(range(100, 116)), sampling(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    engine.abort(rid)


def _check_quant_applied(quant: str, model: Any) -> None:
    """Until `LLM(quant=...)` packs weights, asking for int8/int4 silently runs fp32; refuse so
    the dataset never records an fp32 run under a quantised label. Packed formats hold their big
    tensors in integer dtypes; fp32 holds them all in float32."""
    if quant == "fp32":
        return
    import torch

    big = [t for t in [*model.parameters(), *model.buffers()] if t.numel() >= 100_000]
    packed = any(getattr(m, "packed", None) is not None for m in model.modules())  # int8x2
    if big and not packed and all(t.dtype in (torch.float32, torch.float64) for t in big):
        raise TightfitError(
            f"LLM(quant={quant!r}) left every weight in fp32: this tightfit does not apply "
            f"weight format {quant!r} yet; sweep fp32 only (or update tightfit)")

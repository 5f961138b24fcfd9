"""The lite runtime's engine and offline entry point.

`LiteEngine` has the torch engine's request interface (`add_request` / `step` / `abort` /
`has_unfinished` / `stats`, `RequestOutput` deltas, the same stop and length rules), so the
`generate` / `stream` front end, the OpenAI server (`tightfit serve --runtime lite`) and the
bench drive it unchanged. Scheduling is continuous batching over sequence slots: each step
runs one forward call holding one token of every decoding sequence plus prompt chunks of
newly admitted ones, up to `max_num_batched_tokens`; a waiting request takes the first slot
that frees (lower `priority` value first, then arrival). A slot owns `max_model_len` positions
of K/V address space, resident only as written, handed back when its request ends. No prefix
cache, preemption, swapping or KV compression: those are the torch engine's.
"""
from __future__ import annotations

import itertools
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tightfit.engine.frontend import GenerateMixin
from tightfit.engine.request import RequestOutput, Sequence, Status
from tightfit.engine.sampling_params import SamplingParams
from tightfit.engine.text import TextState, new_request, next_token_finish, request_output
from tightfit.errors import TightfitError
from tightfit.lite.runtime import LiteModel
from tightfit.lite.sampler import Sampler


class _Slots:
    """The sequence slots (what the server's metrics call the pool)."""

    def __init__(self, n: int, max_model_len: int) -> None:
        self.capacity, self.max_model_len = n, max_model_len
        self.free = list(range(n))[::-1]

    @property
    def num_free(self) -> int:
        return len(self.free)


class LiteEngine:
    def __init__(self, model: LiteModel, max_num_batched_tokens: int = 512) -> None:
        if not isinstance(max_num_batched_tokens, int) or max_num_batched_tokens < 1:
            raise TightfitError("max_num_batched_tokens must be an integer >= 1, got "
                                f"{max_num_batched_tokens!r}")
        self.model = model
        self.tokenizer = model.tokenizer
        self.max_model_len = model.max_model_len
        self.kv_capacity_tokens = model.max_model_len  # per sequence: each slot holds a full one
        self.max_num_batched_tokens = max_num_batched_tokens
        self.config = SimpleNamespace(scheduler=SimpleNamespace(
            max_num_seqs=model.max_num_seqs, max_model_len=model.max_model_len,
            max_num_batched_tokens=max_num_batched_tokens))
        # the server reads scheduler.running / scheduler.waiting and pool.num_free
        self.scheduler = SimpleNamespace(running=[], waiting=[])
        self.pool = _Slots(model.max_num_seqs, model.max_model_len)
        self.sampler = Sampler()
        self._seqs: dict[str, Sequence] = {}
        self._slot: dict[str, int] = {}
        self._text: dict[str, TextState] = {}
        self._arrivals = itertools.count()
        self.num_steps = 0

    # -- requests ------------------------------------------------------------------------------

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, priority: int = 0) -> str:
        seq, state = new_request(self.tokenizer, prompt, params, request_id, priority,
                                 next(self._arrivals), self._seqs, self.model.vocab_size,
                                 self.max_model_len, "max_model_len", "raise --max-model-len")
        self._seqs[seq.request_id] = seq
        self._text[seq.request_id] = state
        self.scheduler.waiting.append(seq)
        return seq.request_id

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting)

    def abort(self, request_id: str) -> None:
        seq = self._seqs.pop(request_id, None)
        if seq is not None:
            self._finish(seq, "abort")
        self._text.pop(request_id, None)
        self.sampler.release(request_id)

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.status, seq.finish_reason = Status.FINISHED, reason
        for queue in (self.scheduler.running, self.scheduler.waiting):
            if seq in queue:
                queue.remove(seq)
        slot = self._slot.pop(seq.request_id, None)
        if slot is not None:
            self.model.release(slot)
            self.pool.free.append(slot)

    # -- one step ------------------------------------------------------------------------------

    def _admit(self) -> None:
        waiting = self.scheduler.waiting
        waiting.sort(key=lambda s: (s.priority, s.arrival_index))
        while waiting and self.pool.free:
            seq = waiting.pop(0)
            self._slot[seq.request_id] = self.pool.free.pop()
            seq.status = Status.RUNNING
            seq.metrics.first_scheduled_time = time.perf_counter()
            self.scheduler.running.append(seq)

    def step(self) -> list[RequestOutput]:
        self._admit()
        running = self.scheduler.running
        if not running:
            return []
        # one token of every decoding sequence first, then prompt chunks in admission order
        order = sorted(running, key=lambda s: (s.num_tokens - s.num_computed_tokens > 1,
                                               s.priority, s.arrival_index))
        budget = max(self.max_num_batched_tokens,
                     sum(s.num_tokens - s.num_computed_tokens == 1 for s in order))
        tokens: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        rows: list[int] = []
        work: list[tuple[Sequence, int]] = []
        for seq in order:
            take = min(seq.num_tokens - seq.num_computed_tokens, budget - len(tokens))
            if take <= 0:
                break
            start = seq.num_computed_tokens
            tokens += seq.token_ids[start:start + take]
            slots += [self._slot[seq.request_id]] * take
            positions += range(start, start + take)
            work.append((seq, take))
            if start + take == seq.num_tokens:  # its last token is in: it samples
                rows.append(len(tokens) - 1)
        logits = self.model.forward(tokens, slots, positions, rows)
        sampling = []
        for seq, take in work:
            seq.num_computed_tokens += take
            if seq.num_computed_tokens == seq.num_tokens:
                sampling.append(seq)
        token_ids = self.sampler.sample(sampling, logits) if sampling else []
        self.num_steps += 1
        now = time.perf_counter()
        return [self._append(seq, tok, now) for seq, tok in zip(sampling, token_ids)]

    def _append(self, seq: Sequence, token: int, now: float) -> RequestOutput:
        state = self._text[seq.request_id]
        delta, reason = next_token_finish(seq, token, now, state, self.tokenizer.stop_token_ids,
                                          self.max_model_len)
        if reason is not None:
            self._finish(seq, reason)
            self.sampler.release(seq.request_id)
            self._seqs.pop(seq.request_id, None)
            self._text.pop(seq.request_id, None)
        return request_output(seq, state, token, delta, reason)

    def stats(self) -> dict[str, Any]:
        running, waiting = self.scheduler.running, self.scheduler.waiting
        held = sum(s.num_computed_tokens for s in running)
        return {
            "num_running": len(running),
            "num_waiting": len(waiting),
            "kv_usage": held / (self.pool.capacity * self.max_model_len),
            "num_preemptions": 0,
            "num_swaps": 0,
            "kv_usage_by_tier": {},
            "waiting_by_priority": dict(Counter(s.priority for s in waiting)),
            "running_by_priority": dict(Counter(s.priority for s in running)),
        }


class LiteLLM(GenerateMixin):
    """The lite runtime's counterpart of `tightfit.LLM` (same `generate` / `stream` /
    `chat_prompt`): a llama-architecture GGUF file on its own weights, without torch."""

    def __init__(self, model: str | Path | None = None, *, num_threads: int | None = None,
                 max_model_len: int = 2048, max_num_seqs: int = 32,
                 max_num_batched_tokens: int = 512, march: str | None = None) -> None:
        self.model = LiteModel(model, threads=num_threads, max_model_len=max_model_len,
                               max_num_seqs=max_num_seqs, march=march)
        self.tokenizer = self.model.tokenizer
        self.num_threads = self.model.threads
        self.load_time_s = self.model.load_time_s
        # what the server and `tightfit chat` read of a loaded model: its file and name
        self.loaded = SimpleNamespace(path=self.model.path, config=SimpleNamespace(
            name=self.model.gguf.get("general.name")))
        self.engine = LiteEngine(self.model, max_num_batched_tokens)

    def derive(self, **fields: Any) -> LiteLLM:
        """A new LiteLLM on the same weights and slots with a fresh engine (the bench gives
        each run one); `max_num_batched_tokens` is the one engine setting it takes."""
        unknown = set(fields) - {"max_num_batched_tokens"}
        if unknown:
            raise TightfitError(f"the lite runtime has no engine settings {sorted(unknown)}")
        other = object.__new__(LiteLLM)
        other.__dict__.update(self.__dict__)
        other.engine = LiteEngine(self.model, fields.get("max_num_batched_tokens",
                                                         self.engine.max_num_batched_tokens))
        return other

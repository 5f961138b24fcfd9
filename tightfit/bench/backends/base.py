"""The backend interface the bench drives, and the admission clock every backend shares.

A backend loads one model once, then replays request lists (token ids, output lengths, arrival
offsets) and reports per-request times. It runs inside a worker process (see `worker.py`), so it
may import torch; this module does not. Backends never compute summary metrics (`metrics.py`).
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tightfit.bench.workloads import Arrival, BenchRequest
from tightfit.errors import TightfitError


@dataclass(frozen=True)
class BackendOptions:
    """Everything that decides how a backend loads and serves (the sweep's config axes)."""

    model: str | None = None  # None / "default": the embedded default model
    quant: str = "fp32"
    threads: int = 2
    max_num_seqs: int | None = None  # batch cap (tightfit: scheduler; hf: static batch size)
    block_size: int | None = None
    kv_cache_memory: str | None = None
    kv_dtype: str | None = None  # tightfit: "fp32" | "int8"
    memory_budget: str | None = None
    prefix_caching: bool | None = None
    max_model_len: int = 2048
    # backend-specific, recorded as given (tightfit: {"compile_decode": true} or
    # {"scripted_decode": false} for eager decode steps, {"fused_kernels": false} for the
    # TorchScript stack on ATen ops only); kept out of the
    # fields above so that stored runs keep their keys
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model in ("", "default"):  # one spelling, so equal runs get equal keys
            object.__setattr__(self, "model", None)
        if not isinstance(self.threads, int) or self.threads < 1:
            raise TightfitError(f"threads must be an integer >= 1, got {self.threads!r}")

    def load_key(self) -> tuple[Any, ...]:
        """Options that need a fresh model load when they change (the rest reuse the weights)."""
        return (self.model, self.quant, self.threads, self.memory_budget, self.max_model_len,
                bool(self.extra.get("compile_decode")),
                bool(self.extra.get("scripted_decode", True)),
                bool(self.extra.get("fused_kernels", True)))


@dataclass
class Timing:
    """One request, in seconds from the start of the run."""

    index: int
    prompt_tokens: int
    max_tokens: int
    priority: int
    arrival_s: float
    output_tokens: int = 0
    first_token_s: float | None = None
    finished_s: float | None = None
    error: str | None = None


class Admission:
    """Releases requests: closed loop keeps `concurrency` in flight (arrival = when sent); open
    loop releases each at its offset (arrival = the offset, so queueing counts in TTFT)."""

    def __init__(self, requests: list[BenchRequest], arrival: Arrival) -> None:
        self.arrival = arrival
        def key(r: BenchRequest) -> tuple[float, int]:
            return (0.0 if arrival.kind == "closed" else r.arrival_s or 0.0, r.index)

        self.pending: deque[BenchRequest] = deque(sorted(requests, key=key))

    @property
    def done(self) -> bool:
        return not self.pending

    def due(self, now: float, in_flight: int) -> list[tuple[BenchRequest, float]]:
        out = []
        if self.arrival.kind == "closed":
            while self.pending and in_flight + len(out) < self.arrival.concurrency:
                out.append((self.pending.popleft(), now))
        else:
            while self.pending and (self.pending[0].arrival_s or 0.0) <= now:
                r = self.pending.popleft()
                out.append((r, r.arrival_s or 0.0))
        return out

    def wait_s(self, now: float) -> float:
        """Seconds until the next open-loop arrival (0 for closed loop or nothing pending)."""
        if not self.pending or self.arrival.kind == "closed":
            return 0.0
        return max(0.0, (self.pending[0].arrival_s or 0.0) - now)


class Backend(ABC):
    name: ClassVar[str]  # as in sweep files and the dataset's config.backend
    engine: ClassVar[str]  # the predictor's engine family

    def __init__(self, options: BackendOptions) -> None:
        self.options = options
        self.load_time_s: float | None = None

    @abstractmethod
    def load(self) -> None:
        """Loads the model (sets `load_time_s`); raises with a clear message when it cannot."""

    @abstractmethod
    def run(self, requests: list[BenchRequest], arrival: Arrival) -> list[Timing]:
        """Replays the requests; greedy, every request produces exactly `max_tokens` tokens."""

    def warmup(self) -> None:
        """One short untimed pass so first-call costs do not land in the first measurement."""
        reqs = [BenchRequest(i, tuple(range(100, 116)), 4, None, 0) for i in range(2)]
        self.run(reqs, Arrival("closed", concurrency=2))

    def weight_bytes(self) -> int | None:
        return None

    def server_pid(self) -> int | None:
        """The process that serves, when that is not this one (llama-server): its peak RSS is
        the backend's, and its CPU time is not counted as other processes' load."""
        return None

    def run_config(self) -> dict[str, Any]:
        """Fields of the dataset's `RunConfig` this backend knows (defaults resolved)."""
        o = self.options
        return dict(backend=self.name, engine=self.engine, threads=o.threads,
                    max_num_seqs=None, max_batch_size=None, block_size=None, kv_cache_bytes=None,
                    kv_dtype=None, kv_retention=None, memory_budget_bytes=None,
                    prefix_caching=None, extra=dict(o.extra))

    def close(self) -> None:
        """Releases what `load` acquired (servers, threads); the worker exits after it anyway."""


def now_since(t0: float) -> float:
    return time.perf_counter() - t0

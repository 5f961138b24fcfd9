"""A request's state inside the engine (tokens, block table, progress, timings) and the output
object handed back to callers. Plain Python; the scheduler and engine own the transitions."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from tightfit.engine.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    arrival_index: int = 0
    prompt: str | None = None
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chain hashes of cached full blocks
    status: Status = Status.WAITING
    finish_reason: str | None = None
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    num_preemptions: int = 0
    tier: int = 0  # memory-pool length tier
    waiting_since: float = 0.0  # when it last entered the waiting queue (for aging)
    swap_slots: list[int] = field(default_factory=list)  # parked KV blocks while swapped out
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.perf_counter()))

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED


@dataclass
class RequestOutput:
    """What `LLM.generate` returns and `LLMEngine.step` streams (`delta_*` = new since last)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.metrics.ttft_s if self.metrics else None

    @property
    def decode_tok_s(self) -> float | None:
        """Generated tokens after the first, per second of decoding."""
        m = self.metrics
        if not m or m.first_token_time is None or m.finished_time is None or len(self.token_ids) < 2:
            return None
        dt = m.finished_time - m.first_token_time
        return (len(self.token_ids) - 1) / dt if dt > 0 else None

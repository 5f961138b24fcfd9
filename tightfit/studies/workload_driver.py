"""Drives an in-process engine with timed arrivals (open loop) and records per-request
latencies: the shared harness of the memory-pool and skewed-batching studies. Wall clock, one
engine, no threads: a request is added once its arrival time has passed, between steps."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tightfit.engine.sampling_params import SamplingParams


@dataclass
class Arrival:
    at_s: float
    prompt: list[int]
    params: SamplingParams
    priority: int = 0
    label: str = ""


@dataclass
class Finished:
    label: str
    priority: int
    ttft_s: float
    latency_s: float
    tokens: int


def drive(llm: Any, arrivals: list[Arrival]) -> list[Finished]:
    eng = llm.engine
    pending = sorted(arrivals, key=lambda a: a.at_s)
    labels: dict[str, Arrival] = {}
    done: list[Finished] = []
    t0 = time.perf_counter()
    while pending or eng.has_unfinished():
        now = time.perf_counter() - t0
        while pending and pending[0].at_s <= now:
            a = pending.pop(0)
            labels[eng.add_request(a.prompt, a.params, priority=a.priority)] = a
        if not eng.has_unfinished():
            time.sleep(min(0.005, max(0.0, pending[0].at_s - now)))
            continue
        for out in eng.step():
            if out.finished:
                a, m = labels.pop(out.request_id), out.metrics
                done.append(Finished(a.label, a.priority, m.first_token_time - m.arrival_time,
                                     m.finished_time - m.arrival_time, len(out.token_ids)))
    return done


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def corpus_ids(tokenizer: Any) -> list[int]:
    """Real text for prompts: the standard library's pydoc topics (no download)."""
    import pydoc_data.topics as topics

    return tokenizer.encode("\n\n".join(topics.topics[k] for k in sorted(topics.topics)))

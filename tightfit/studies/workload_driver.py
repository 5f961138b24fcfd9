"""Drives an in-process engine with timed arrivals (open loop) and records per-request
latencies: the shared harness of the memory-pool and skewed-batching studies. Wall clock, one
engine, no threads: a request is added once its arrival time has passed, between steps. Its
latencies count from its scheduled arrival time, as a client would see them: the wait for the
step in flight when it arrived is included."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from tightfit.engine.sampling_params import SamplingParams


@dataclass
class Arrival:
    at_s: float
    prompt: list[int]
    params: SamplingParams
    priority: int = 0
    label: str = ""
    gated: bool = False  # at_s counts from the moment the driver's gate first holds


@dataclass
class Finished:
    label: str
    priority: int
    ttft_s: float
    latency_s: float
    tokens: int


def drive(llm: Any, arrivals: list[Arrival],
          gate: Callable[[Any], bool] | None = None) -> list[Finished]:
    """Runs the arrivals to completion. `gate(engine)` is checked between steps; gated
    arrivals are released relative to when it first holds (e.g. "the pool is saturated")."""
    eng = llm.engine
    pending = list(arrivals)
    gate_open = 0.0 if gate is None else None
    arrived_at: dict[str, tuple[Arrival, float]] = {}
    done: list[Finished] = []
    t0 = time.perf_counter()

    def due_at(a: Arrival) -> float | None:
        if not a.gated:
            return a.at_s
        return None if gate_open is None else gate_open + a.at_s

    while pending or eng.has_unfinished():
        now = time.perf_counter() - t0
        if gate_open is None and gate is not None and gate(eng):
            gate_open = now
        for a in sorted((a for a in pending if (d := due_at(a)) is not None and d <= now),
                        key=due_at):
            pending.remove(a)
            rid = eng.add_request(a.prompt, a.params, priority=a.priority)
            arrived_at[rid] = (a, t0 + due_at(a))
        if not eng.has_unfinished():
            nxt = [d for a in pending if (d := due_at(a)) is not None]
            if not nxt:
                raise RuntimeError("gated arrivals are pending but the engine is idle: the "
                                   "gate can never open")
            time.sleep(min(0.005, max(0.0, min(nxt) - now)))
            continue
        for out in eng.step():
            if out.finished:
                (a, arrived), m = arrived_at.pop(out.request_id), out.metrics
                done.append(Finished(a.label, a.priority, m.first_token_time - arrived,
                                     m.finished_time - arrived, len(out.token_ids)))
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

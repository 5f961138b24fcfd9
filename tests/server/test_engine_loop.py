"""The engine-thread bridge against a fake engine (no model, milliseconds): admission bounds,
event routing, aborts freeing blocks, failure isolation, drain on stop."""
from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from tightfit.engine.request import RequestOutput
from tightfit.engine.sampling_params import SamplingParams
from tightfit.errors import RequestError
from tightfit.server.engine_loop import EngineFailure, EngineLoop, QueueFullError


class FakeEngine:
    """One token per step per sequence; a sequence holds one KV block; seed 666 breaks step()."""

    def __init__(self, blocks: int = 8) -> None:
        self.pool = SimpleNamespace(num_free=blocks, num_blocks=blocks)
        self.scheduler = SimpleNamespace(running=[], waiting=[], num_preemptions=0)
        self.seqs: dict[str, Any] = {}
        self.step_gate = threading.Event()
        self.step_gate.set()
        self.thread_ids: set[int] = set()

    def add_request(self, ids: list[int], params: SamplingParams, request_id: str,
                    priority: int = 0) -> str:
        self.thread_ids.add(threading.get_ident())
        if not ids:
            raise RequestError("the prompt is empty: give at least one token")
        seq = SimpleNamespace(request_id=request_id, priority=priority, ids=ids, params=params,
                              out=[])
        self.seqs[request_id] = seq
        self.scheduler.waiting.append(seq)
        self.pool.num_free -= 1
        return request_id

    def has_unfinished(self) -> bool:
        return bool(self.seqs)

    def step(self) -> list[RequestOutput]:
        self.thread_ids.add(threading.get_ident())
        self.step_gate.wait(5)
        sched = self.scheduler
        sched.running += sched.waiting
        sched.waiting.clear()
        if any(s.params.seed == 666 for s in sched.running):
            raise RuntimeError("injected failure")
        return [self._emit(s) for s in list(sched.running)]

    def _emit(self, seq: Any) -> RequestOutput:
        seq.out.append(7)
        done = len(seq.out) >= seq.params.max_tokens
        if done:
            self._drop(seq.request_id)
        return RequestOutput(seq.request_id, None, seq.ids, "x" * len(seq.out), list(seq.out),
                             done, "length" if done else None, "x", [7])

    def _drop(self, rid: str) -> None:
        seq = self.seqs.pop(rid)
        for queue in (self.scheduler.running, self.scheduler.waiting):
            if seq in queue:
                queue.remove(seq)
        self.pool.num_free += 1

    def abort(self, rid: str) -> None:
        self.thread_ids.add(threading.get_ident())
        if rid in self.seqs:
            self._drop(rid)

    def stats(self) -> dict[str, Any]:
        return {"kv_usage": 1 - self.pool.num_free / self.pool.num_blocks, "num_preemptions": 0}


def run(coro_fn: Any, engine: FakeEngine, capacity: int = 8) -> Any:
    async def main() -> Any:
        loop = EngineLoop(engine, capacity)
        loop.start(asyncio.get_running_loop())
        try:
            return await asyncio.wait_for(coro_fn(loop), 10)
        finally:
            await asyncio.to_thread(loop.stop, 5)
    return asyncio.run(main())


async def drain(group: Any, total: int = 1) -> list[Any]:
    events, done = [], 0
    while done < total:
        ev = await group.queue.get()
        events.append(ev)
        done += bool(ev.error is not None or ev.output.finished)
    return events


def seq(max_tokens: int = 3, seed: int | None = None, ids: list[int] | None = None) -> Any:
    return ([1, 2] if ids is None else ids), SamplingParams(max_tokens=max_tokens, seed=seed)


def test_events_arrive_in_order_and_capacity_is_released() -> None:
    engine = FakeEngine()

    async def body(loop: EngineLoop) -> Any:
        group = loop.submit([seq(3), seq(2)])
        await group.admitted
        events = await drain(group, 2)
        return events, loop.outstanding

    events, outstanding = run(body, engine)
    by_index = {i: [e.output.token_ids for e in events if e.index == i] for i in (0, 1)}
    assert by_index == {0: [[7], [7, 7], [7, 7, 7]], 1: [[7], [7, 7]]}
    assert outstanding == 0 and engine.pool.num_free == 8
    assert len(engine.thread_ids) == 1 and threading.get_ident() not in engine.thread_ids


def test_over_capacity_is_refused_without_queueing() -> None:
    engine = FakeEngine()
    engine.step_gate.clear()  # hold the first request in flight

    async def body(loop: EngineLoop) -> Any:
        first = loop.submit([seq(), seq()])
        with pytest.raises(QueueFullError, match="capacity"):
            loop.submit([seq()])
        engine.step_gate.set()
        await drain(first, 2)
        return loop.submit([seq()]) is not None

    assert run(body, engine, capacity=2)


def test_engine_refusal_reaches_the_caller() -> None:
    async def body(loop: EngineLoop) -> Any:
        group = loop.submit([seq(ids=[])])
        with pytest.raises(RequestError, match="empty"):
            await group.admitted
        return loop.outstanding

    assert run(body, FakeEngine()) == 0


def test_abort_frees_blocks() -> None:
    engine = FakeEngine()

    async def body(loop: EngineLoop) -> Any:
        group = loop.submit([seq(max_tokens=10_000)])
        await group.admitted
        await group.queue.get()
        loop.abort(group)
        while loop.outstanding:
            await asyncio.sleep(0.01)
        return engine.pool.num_free

    assert run(body, engine) == 8


def test_failing_step_fails_its_request_and_the_loop_goes_on() -> None:
    engine = FakeEngine()

    async def body(loop: EngineLoop) -> Any:
        bad = loop.submit([seq(seed=666)])
        await bad.admitted
        (event,) = await drain(bad)
        good = loop.submit([seq(2)])
        await good.admitted
        return event, await drain(good), loop.alive

    event, good_events, alive = run(body, engine)
    assert isinstance(event.error, EngineFailure) and "injected failure" in str(event.error)
    assert good_events[-1].output.finished and alive
    assert engine.pool.num_free == 8


def test_stop_drains_in_flight_requests() -> None:
    engine = FakeEngine()

    async def main() -> Any:
        loop = EngineLoop(engine, 8)
        loop.start(asyncio.get_running_loop())
        group = loop.submit([seq(50)])
        await group.admitted
        stopper = asyncio.create_task(asyncio.to_thread(loop.stop, 5))
        events = await drain(group)
        await stopper
        return events, loop.alive

    events, alive = asyncio.run(main())
    assert events[-1].output.finished and len(events[-1].output.token_ids) == 50
    assert not alive

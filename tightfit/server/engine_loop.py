"""Async bridge to the synchronous engine: one background thread owns the `LLMEngine` and is the
only caller of it; the event loop hands it requests and aborts through a condition-guarded inbox
and gets per-request events back on asyncio queues. Admission is bounded (`QueueFullError`).

A failing engine step fails the sequences it was working on and the loop goes on. No per-token
work happens on the event loop beyond putting events on queues.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from tightfit.engine.request import RequestOutput
from tightfit.engine.sampling_params import SamplingParams
from tightfit.errors import TightfitError
from tightfit.server.metrics import ServerMetrics

log = logging.getLogger(__name__)

IDLE_BACKOFF_S = 0.005  # pause after a step that did nothing, instead of spinning


class QueueFullError(Exception):
    """The server holds as many sequences as it may; the client should retry later."""


class ShuttingDownError(Exception):
    """The server is draining and takes no new requests."""


class EngineFailure(Exception):
    """An internal error failed this request (the server itself keeps going)."""


@dataclass
class Event:
    """What a request's queue receives: one output of choice `index`, or an error."""

    index: int
    output: RequestOutput | None = None
    error: BaseException | None = None


@dataclass
class RequestGroup:
    """One HTTP request's engine sequences (its `n` choices x prompts); events on `queue`."""

    group_id: str
    seqs: list[tuple[list[int], SamplingParams]]
    priority: int
    queue: asyncio.Queue[Event]
    admitted: asyncio.Future[None]
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: bool = False

    @property
    def request_ids(self) -> list[str]:
        return [f"{self.group_id}-{i}" for i in range(len(self.seqs))]


@dataclass
class _Track:
    """Engine-thread bookkeeping of one live sequence."""

    group: RequestGroup
    index: int
    last_token: float | None = None


class EngineLoop:
    def __init__(self, engine: Any, capacity: int, metrics: ServerMetrics | None = None) -> None:
        self.engine = engine
        self.capacity = capacity
        self.metrics = metrics or ServerMetrics()
        self._cond = threading.Condition()
        self._inbox: deque[RequestGroup] = deque()
        self._aborts: deque[str] = deque()
        self._outstanding = 0  # sequences admitted or waiting for admission; under _cond
        self._stopping = False
        self._deadline = 0.0
        self._active: dict[str, _Track] = {}  # engine thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- event-loop side ----------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="tightfit-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    @property
    def outstanding(self) -> int:
        return self._outstanding

    def submit(self, seqs: list[tuple[list[int], SamplingParams]], priority: int = 0
               ) -> RequestGroup:
        """Queues the sequences of one request (call on the event loop). Await `admitted`:
        it raises TightfitError when the engine refuses them (e.g. prompt too long)."""
        assert self._loop is not None, "start() the loop first"
        group = RequestGroup(uuid.uuid4().hex[:16], seqs, priority, asyncio.Queue(),
                             self._loop.create_future())
        with self._cond:
            if self._stopping:
                raise ShuttingDownError("the server is shutting down")
            if self._outstanding + len(seqs) > self.capacity:
                raise QueueFullError(
                    f"the server is at capacity ({self._outstanding} of {self.capacity} "
                    "sequences in flight): retry later")
            self._outstanding += len(seqs)
            self._inbox.append(group)
            self._cond.notify()
        return group

    def abort(self, group: RequestGroup) -> None:
        """Stops a request's sequences and frees their KV blocks (thread-safe, idempotent)."""
        with self._cond:
            group.cancelled = True
            self._aborts.extend(group.request_ids)
            self._cond.notify()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Lets in-flight sequences finish for up to `timeout_s`, aborts the rest, joins."""
        with self._cond:
            self._stopping = True
            self._deadline = time.monotonic() + timeout_s
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s + 10)

    # -- engine thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            work = self._wait_for_work()
            if work is None:
                break
            try:
                self._iterate(*work)
            except Exception as exc:  # a bug in the bridge itself: fail what is live, go on
                log.exception("engine loop iteration failed")
                self._fail(list(self._active), exc)
        self._fail(list(self._active), ShuttingDownError("the server shut down"), abort=True)

    def _wait_for_work(self) -> tuple[list[RequestGroup], list[str]] | None:
        with self._cond:
            while not (self._inbox or self._aborts or self._active or self._stopping):
                self._cond.wait()
            if self._stopping and (not self._active and not self._inbox
                                   or time.monotonic() > self._deadline):
                self._reject_inbox()
                return None
            groups, aborts = list(self._inbox), list(self._aborts)
            self._inbox.clear()
            self._aborts.clear()
        return groups, aborts

    def _reject_inbox(self) -> None:
        for group in self._inbox:
            self._outstanding -= len(group.seqs)
            self._resolve(group, ShuttingDownError("the server is shutting down"))
        self._inbox.clear()

    def _iterate(self, groups: list[RequestGroup], aborts: list[str]) -> None:
        for rid in aborts:
            self._abort_one(rid)
        for group in groups:
            self._admit(group)
        if self._active and not self._step():
            with self._cond:  # nothing could run (e.g. waiting for memory): no hot spin
                self._cond.wait(IDLE_BACKOFF_S)
        self._publish()

    def _abort_one(self, rid: str) -> None:
        if self._active.pop(rid, None) is not None:
            self.engine.abort(rid)
            self._release(1)

    def _admit(self, group: RequestGroup) -> None:
        if group.cancelled:
            self._release(len(group.seqs))
            self._resolve(group, asyncio.CancelledError())
            return
        added: list[str] = []
        try:
            for i, (rid, (ids, params)) in enumerate(zip(group.request_ids, group.seqs)):
                self.engine.add_request(ids, params, request_id=rid, priority=group.priority)
                added.append(rid)
                self._active[rid] = _Track(group, i)
        except Exception as exc:
            for rid in added:
                self._active.pop(rid, None)
                self.engine.abort(rid)
            self._release(len(group.seqs))
            err = exc if isinstance(exc, TightfitError) else EngineFailure(f"admission: {exc}")
            self._resolve(group, err)
            return
        self._resolve(group, None)

    def _step(self) -> bool:
        """One engine step; False when it had nothing to do."""
        t0 = time.perf_counter()
        try:
            outputs = self.engine.step()
        except Exception as exc:
            log.exception("engine step failed")
            self._fail(self._step_victims(), exc)
            return True
        now = time.perf_counter()
        events: list[tuple[RequestGroup, Event]] = []
        for out in outputs:
            track = self._active.get(out.request_id)
            if track is None:  # aborted while the step ran
                continue
            try:
                events.append((track.group, self._route(track, out, now)))
            except Exception as exc:
                log.exception("routing output of %s failed", out.request_id)
                self._fail([out.request_id], exc)
        self._deliver(events)
        return bool(outputs) or now - t0 > IDLE_BACKOFF_S

    def _step_victims(self) -> list[str]:
        """The sequences a failed step was working on: the running batch, or (when nothing
        ran, so admission itself failed) the waiting ones."""
        sched = self.engine.scheduler
        seqs = sched.running or sched.waiting
        return [s.request_id for s in seqs if s.request_id in self._active]

    def _route(self, track: _Track, out: RequestOutput, now: float) -> Event:
        m = self.metrics
        if track.last_token is None:
            m.ttft.observe(now - track.group.arrival)
            m.prompt_tokens.inc(len(out.prompt_token_ids))
        else:
            m.itl.observe(now - track.last_token)
        track.last_token = now
        m.generation_tokens.inc(len(out.delta_token_ids))
        if out.finished:
            m.e2e.observe(now - track.group.arrival)
            m.success.labels(out.finish_reason or "unknown").inc()
            del self._active[out.request_id]
            self._release(1)
        return Event(track.index, output=out)

    def _fail(self, rids: list[str], exc: BaseException, abort: bool = True) -> None:
        events = []
        for rid in rids:
            track = self._active.pop(rid, None)
            if track is None:
                continue
            if abort:
                try:
                    self.engine.abort(rid)
                except Exception:
                    log.exception("abort of %s failed", rid)
            self._release(1)
            self.metrics.failure.inc()
            err = exc if isinstance(exc, ShuttingDownError) else EngineFailure(
                f"{type(exc).__name__}: {exc}")
            events.append((track.group, Event(track.index, error=err)))
        self._deliver(events)

    def _release(self, n: int) -> None:
        with self._cond:
            self._outstanding -= n

    def _publish(self) -> None:
        sched = self.engine.scheduler
        self.metrics.set_queues(Counter(s.priority for s in sched.running),
                                Counter(s.priority for s in sched.waiting))
        self.metrics.set_engine_stats(self.engine.stats(), self.engine.pool.num_free)

    # -- hand-over to the event loop ------------------------------------------------------------

    def _deliver(self, events: list[tuple[RequestGroup, Event]]) -> None:
        if events:
            self._call_soon(_put_all, events)

    def _resolve(self, group: RequestGroup, error: BaseException | None) -> None:
        self._call_soon(_settle, group.admitted, error)

    def _call_soon(self, fn: Any, *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


def _put_all(events: list[tuple[RequestGroup, Event]]) -> None:
    for group, event in events:
        group.queue.put_nowait(event)


def _settle(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.done():
        return
    if isinstance(error, asyncio.CancelledError):
        fut.cancel()
    elif error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)

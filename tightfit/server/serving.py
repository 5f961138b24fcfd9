"""OpenAI requests -> engine sequences -> OpenAI responses (one JSON body, or SSE chunks ending
`data: [DONE]`). Tokenises on the event loop (cheap), checks the context window up front, and
aborts a request's sequences whenever its client goes away. No model code runs here."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from tightfit.engine.request import RequestOutput
from tightfit.errors import TightfitError
from tightfit.server import protocol as P
from tightfit.server.config import ServerConfig
from tightfit.server.engine_loop import (EngineFailure, EngineLoop, QueueFullError,
                                         RequestGroup, ShuttingDownError)
from tightfit.server.errors import APIError, error_body, param_of
from tightfit.server.metrics import ServerMetrics
from tightfit.server.sampling import Job, chat_job, completion_job


@dataclass(frozen=True)
class ServingContext:
    tokenizer: Any
    loop: EngineLoop
    config: ServerConfig
    metrics: ServerMetrics
    model_name: str
    context_len: int  # longest prompt + output the engine can hold

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"model {model!r} does not exist: this server serves "
                           f"{self.model_name!r} (see GET /v1/models)", param="model",
                           code="model_not_found")


async def create_completion(ctx: ServingContext, req: P.CompletionRequest,
                            request: Request) -> Response:
    ctx.check_model(req.model)
    return await _run(ctx, completion_job(ctx, req), request)


async def create_chat_completion(ctx: ServingContext, req: P.ChatCompletionRequest,
                                 request: Request) -> Response:
    ctx.check_model(req.model)
    return await _run(ctx, chat_job(ctx, req), request)


async def _run(ctx: ServingContext, job: Job, request: Request) -> Response:
    group = await _admit(ctx, job)
    rid = ("chatcmpl-" if job.chat else "cmpl-") + group.group_id
    if job.stream:
        return _SSEResponse(_sse(ctx, job, group, rid), lambda: ctx.loop.abort(group))
    finals = await _collect_or_abort(ctx, group, len(job.params), request)
    if finals is None:
        return Response(status_code=499)  # nobody is listening any more
    return JSONResponse(_final_response(ctx, job, rid, finals).model_dump())


async def _admit(ctx: ServingContext, job: Job) -> RequestGroup:
    try:
        group = ctx.loop.submit(job.seqs(), job.priority)
    except QueueFullError as exc:
        ctx.metrics.rejected.labels("queue_full").inc()
        raise APIError(429, str(exc), code="queue_full",
                       headers={"Retry-After": str(ctx.config.retry_after_s)}) from exc
    except ShuttingDownError as exc:
        raise APIError(503, str(exc), code="shutting_down",
                       headers={"Retry-After": str(ctx.config.retry_after_s)}) from exc
    try:
        await group.admitted
    except TightfitError as exc:
        raise APIError(400, str(exc), param=param_of(str(exc)) or job.prompt_param) from exc
    except EngineFailure as exc:
        raise APIError(500, f"the engine could not take this request: {exc}") from exc
    except BaseException:
        ctx.loop.abort(group)
        raise
    return group


async def _collect(group: RequestGroup, total: int) -> list[RequestOutput]:
    finals: dict[int, RequestOutput] = {}
    while len(finals) < total:
        event = await group.queue.get()
        if event.error is not None:
            raise APIError(500, f"generation failed: {event.error}")
        assert event.output is not None
        if event.output.finished:
            finals[event.index] = event.output
    return [finals[i] for i in range(total)]


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect_or_abort(ctx: ServingContext, group: RequestGroup, total: int,
                            request: Request) -> list[RequestOutput] | None:
    """The final outputs, or None when the client disconnected first (request aborted)."""
    collect = asyncio.ensure_future(_collect(group, total))
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
        if collect.done():
            return collect.result()
        ctx.loop.abort(group)
        return None
    except BaseException:
        ctx.loop.abort(group)
        raise
    finally:
        collect.cancel()
        watch.cancel()


def _usage(job: Job, finals: list[RequestOutput]) -> P.Usage:
    prompt = sum(len(p) for p in job.prompts)  # each prompt once, however many choices
    completion = sum(len(o.token_ids) for o in finals)
    return P.Usage(prompt_tokens=prompt, completion_tokens=completion,
                   total_tokens=prompt + completion)


def _final_response(ctx: ServingContext, job: Job, rid: str, finals: list[RequestOutput]
                    ) -> P.ChatCompletionResponse | P.CompletionResponse:
    created, usage = int(time.time()), _usage(job, finals)
    if job.chat:
        return P.ChatCompletionResponse(
            id=rid, created=created, model=ctx.model_name, usage=usage,
            choices=[P.ChatChoice(index=i, message=P.AssistantMessage(content=o.text),
                                  finish_reason=o.finish_reason) for i, o in enumerate(finals)])
    return P.CompletionResponse(
        id=rid, created=created, model=ctx.model_name, usage=usage,
        choices=[P.CompletionChoice(index=i, text=o.text, finish_reason=o.finish_reason)
                 for i, o in enumerate(finals)])


# -- streaming -------------------------------------------------------------------------------

def _sse_line(payload: Any) -> bytes:
    text = payload.model_dump_json() if hasattr(payload, "model_dump_json") else payload
    return f"data: {text}\n\n".encode()


class _Chunker:
    """Builds the SSE chunks of one request (chat or text completion shapes)."""

    def __init__(self, ctx: ServingContext, job: Job, rid: str) -> None:
        self.job, self.rid, self.model = job, rid, ctx.model_name
        self.created = int(time.time())

    def delta(self, index: int, text: str, finish: str | None, role: bool = False) -> bytes:
        if self.job.chat:
            delta = P.ChatDelta(role="assistant" if role else None, content=text)
            return _sse_line(P.ChatCompletionChunk(
                id=self.rid, created=self.created, model=self.model,
                choices=[P.ChatChunkChoice(index=index, delta=delta, finish_reason=finish)]))
        return _sse_line(P.CompletionResponse(
            id=self.rid, created=self.created, model=self.model,
            choices=[P.CompletionChoice(index=index, text=text, finish_reason=finish)]))

    def usage(self, usage: P.Usage) -> bytes:
        cls = P.ChatCompletionChunk if self.job.chat else P.CompletionResponse
        return _sse_line(cls(id=self.rid, created=self.created, model=self.model, choices=[],
                             usage=usage))


async def _sse(ctx: ServingContext, job: Job, group: RequestGroup, rid: str
               ) -> AsyncIterator[bytes]:
    chunker = _Chunker(ctx, job, rid)
    total = len(job.params)
    finals: dict[int, RequestOutput] = {}
    if job.chat:
        for i in range(total):
            yield chunker.delta(i, "", None, role=True)
    while len(finals) < total:
        event = await group.queue.get()
        if event.error is not None:
            yield _sse_line(json.dumps(error_body(500, f"generation failed: {event.error}")))
            yield b"data: [DONE]\n\n"
            return
        out = event.output
        assert out is not None
        if out.delta_text or out.finished:
            yield chunker.delta(event.index, out.delta_text, out.finish_reason)
        if out.finished:
            finals[event.index] = out
    if job.include_usage:
        yield chunker.usage(_usage(job, [finals[i] for i in range(total)]))
    yield b"data: [DONE]\n\n"


class _SSEResponse(StreamingResponse):
    """A streaming response that runs `on_close` however the stream ends (finished, client gone,
    cancelled): aborting a finished request is a no-op, aborting a live one frees its blocks."""

    def __init__(self, body: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()

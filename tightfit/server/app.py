"""`create_app(llm, config)`: the FastAPI application — routes, guards, error mapping, and the
lifespan that starts and drains the engine thread and the resource monitor.
The routes are thin: the work is in serving.py (generation) and tightfit.predictor."""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from tightfit import __version__
from tightfit.server import errors
from tightfit.server import protocol as P
from tightfit.server.config import ServerConfig
from tightfit.server.engine_loop import EngineLoop
from tightfit.server.errors import APIError
from tightfit.server.metrics import ServerMetrics
from tightfit.server.middleware import APIKeyMiddleware, BodyLimitMiddleware
from tightfit.server.monitor import ResourceMonitor
from tightfit.server.serving import ServingContext, create_chat_completion, create_completion

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": P.ErrorResponse} for code in (400, 401, 404, 413, 429, 500)}


def default_model_name(llm: Any) -> str:
    """The served model name: the model file's name without its extension."""
    path = getattr(getattr(llm, "loaded", None), "path", None)
    return path.stem if path is not None else "tightfit"


def create_app(llm: Any, config: ServerConfig | None = None) -> FastAPI:
    """An app serving `llm` (a tightfit.LLM, whose engine it drives from its own thread)."""
    config = config or ServerConfig()
    engine = llm.engine
    metrics = ServerMetrics()
    loop = EngineLoop(engine, engine.config.scheduler.max_num_seqs + config.max_queue, metrics)
    monitor = ResourceMonitor(config.monitor_interval_s, on_sample=metrics.set_resources)
    ctx = ServingContext(tokenizer=llm.tokenizer, loop=loop, config=config, metrics=metrics,
                         model_name=config.model_name or default_model_name(llm),
                         context_len=min(engine.max_model_len, engine.kv_capacity_tokens))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop.start(asyncio.get_running_loop())
        monitor.start()
        try:
            yield
        finally:  # uvicorn has waited for open connections by now; drain what is left
            await asyncio.to_thread(loop.stop, config.drain_timeout_s)
            monitor.stop()

    app = FastAPI(title="tightfit", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible serving of a tightfit engine.")
    app.state.ctx, app.state.llm, app.state.monitor = ctx, llm, monitor
    errors.install(app)
    reject = lambda reason: metrics.rejected.labels(reason).inc()  # noqa: E731
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes, on_reject=reject)
    if config.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key, on_reject=reject)
    _add_routes(app, ctx, monitor)
    return app


def _add_routes(app: FastAPI, ctx: ServingContext, monitor: ResourceMonitor) -> None:
    started = int(time.time())

    @app.head("/health", include_in_schema=False)
    @app.get("/health")
    async def health() -> JSONResponse:
        ok = ctx.loop.alive
        return JSONResponse({"status": "ok" if ok else "unavailable"}, 200 if ok else 503)

    @app.get("/v1/models", response_model=P.ModelList, responses=ERROR_RESPONSES)
    async def list_models() -> P.ModelList:
        return P.ModelList(data=[_card(ctx, started)])

    @app.get("/v1/models/{model}", response_model=P.ModelCard, responses=ERROR_RESPONSES)
    async def get_model(model: str) -> P.ModelCard:
        ctx.check_model(model)
        return _card(ctx, started)

    @app.post("/v1/completions", response_model=P.CompletionResponse, responses=ERROR_RESPONSES)
    async def completions(body: P.CompletionRequest, request: Request) -> Response:
        return await create_completion(ctx, body, request)

    @app.post("/v1/chat/completions", response_model=P.ChatCompletionResponse,
              responses=ERROR_RESPONSES)
    async def chat_completions(body: P.ChatCompletionRequest, request: Request) -> Response:
        return await create_chat_completion(ctx, body, request)

    @app.post("/v1/predict", response_model=P.PredictResponse, responses=ERROR_RESPONSES)
    def predict(body: Any = Body(..., examples=[{"scenarios": [{"id": "x1"}]}])
                ) -> P.PredictResponse:
        """Scenarios in (`{"scenarios": [...]}` or a bare JSON list; see docs/predictor.md),
        one prediction row each out (bad rows carry an `error` entry naming the field)."""
        from tightfit.predictor import predict as run_predict

        return P.PredictResponse(data=run_predict(_scenarios(body), files=False))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/monitor")
    async def resources() -> JSONResponse:
        """The monitoring agent's latest sample of process and device resources."""
        from dataclasses import asdict

        return JSONResponse(asdict(monitor.snapshot()))


def _scenarios(body: Any) -> list[Any]:
    if isinstance(body, list):
        return body
    if isinstance(body, dict) and isinstance(body.get("scenarios"), list):
        return body["scenarios"]
    raise APIError(400, 'the body must be {"scenarios": [...]} or a JSON list of scenarios',
                   param="scenarios")


def _card(ctx: ServingContext, created: int) -> P.ModelCard:
    return P.ModelCard(id=ctx.model_name, created=created, max_model_len=ctx.context_len)

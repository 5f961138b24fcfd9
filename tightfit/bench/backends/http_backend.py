"""tightfit through its own OpenAI-compatible server: the worker process loads the model, serves
it with uvicorn on a free local port (a background thread), and replays the workload as streaming
`/v1/completions` requests (token-id prompts, `ignore_eos`, `priority`) from an asyncio client.

What this adds over the in-process backend is the HTTP, JSON and SSE cost a real client pays.
TTFT is measured at the first streamed text chunk (a token that decodes to no text yet, such as
half a UTF-8 character, shows up with the next one); output lengths come from the final `usage`.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

try:
    import httpx
    import uvicorn

    from tightfit.server.app import create_app
    from tightfit.server.config import ServerConfig
except ImportError as exc:  # the registry turns this into a clear "not installed" message
    raise ImportError(f"the tightfit-http backend needs the tightfit server: {exc}") from exc

from tightfit.bench.backends.base import Timing
from tightfit.bench.backends.tightfit_backend import TightfitBackend
from tightfit.bench.workloads import Arrival, BenchRequest

START_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TightfitHTTPBackend(TightfitBackend):
    name = "tightfit-http"
    engine = "tightfit"

    def load(self) -> None:
        super().load()
        self._server: Any = None
        self._served_options: Any = None

    def _ensure_server(self) -> None:
        """(Re)starts the server when the engine options changed since the last run."""
        if self._server is not None and self._served_options == self.options:
            return
        self.close()
        port = _free_port()
        app = create_app(self._engine_llm(), ServerConfig(port=port, max_queue=4096))
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                     log_level="warning", lifespan="on"))
        threading.Thread(target=self._server.run, daemon=True).start()
        deadline = time.perf_counter() + START_TIMEOUT_S
        while not self._server.started:
            if time.perf_counter() > deadline:
                raise RuntimeError(
                    f"the tightfit server did not start within {START_TIMEOUT_S:g} s")
            time.sleep(0.05)
        self.url, self._served_options = f"http://127.0.0.1:{port}", self.options

    def run(self, requests: list[BenchRequest], arrival: Arrival) -> list[Timing]:
        self._ensure_server()
        return asyncio.run(self._drive(requests, arrival))

    async def _drive(self, requests: list[BenchRequest], arrival: Arrival) -> list[Timing]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=self.url, timeout=None, limits=limits) as client:
            t0 = time.perf_counter()
            if arrival.kind == "closed":
                queue: asyncio.Queue[BenchRequest] = asyncio.Queue()
                for r in sorted(requests, key=lambda r: r.index):
                    queue.put_nowait(r)
                out: list[Timing] = []
                await asyncio.gather(*(self._consumer(client, queue, t0, out)
                                       for _ in range(arrival.concurrency)))
            else:
                out = list(await asyncio.gather(*(self._at(client, r, t0) for r in requests)))
        return sorted(out, key=lambda t: t.index)

    async def _consumer(self, client: Any, queue: asyncio.Queue[BenchRequest], t0: float,
                        out: list[Timing]) -> None:
        while not queue.empty():
            r = queue.get_nowait()
            out.append(await self._one(client, r, time.perf_counter() - t0, t0))

    async def _at(self, client: Any, r: BenchRequest, t0: float) -> Timing:
        at = r.arrival_s or 0.0
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
        return await self._one(client, r, at, t0)

    async def _one(self, client: Any, r: BenchRequest, at: float, t0: float) -> Timing:
        t = Timing(r.index, len(r.prompt_ids), r.max_tokens, r.priority, at)
        body = {"prompt": list(r.prompt_ids), "max_tokens": r.max_tokens, "temperature": 0,
                "ignore_eos": True, "priority": r.priority, "stream": True,
                "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                t.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode()[:200]}"
                return t
            async for line in resp.aiter_lines():
                self._on_line(line, t, t0)
        t.finished_s = time.perf_counter() - t0
        return t

    @staticmethod
    def _on_line(line: str, t: Timing, t0: float) -> None:
        if not line.startswith("data: ") or line == "data: [DONE]":
            return
        chunk = json.loads(line[6:])
        if "error" in chunk:
            t.error = str(chunk["error"])
        elif chunk.get("choices") and t.first_token_s is None:
            t.first_token_s = time.perf_counter() - t0
        if chunk.get("usage"):
            t.output_tokens = int(chunk["usage"]["completion_tokens"])

    def close(self) -> None:
        if getattr(self, "_server", None) is not None:
            self._server.should_exit = True
            time.sleep(0.2)
            self._server = None

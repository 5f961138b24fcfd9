"""Replays a workload against an OpenAI-compatible `/v1/completions` endpoint as streaming
requests (token-id prompts, greedy, `ignore_eos`) from an asyncio client: closed loop keeps
`concurrency` requests in flight, open loop sends each at its arrival offset.

Shared by the backends that measure a server: tightfit's own (`http_backend.py`) and llama.cpp's
`llama-server` (`llama_server_backend.py`). TTFT is taken at the first streamed chunk with a
choice; output lengths come from the final `usage` chunk.
"""
from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx

from tightfit.bench.backends.base import Timing
from tightfit.bench.workloads import Arrival, BenchRequest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CompletionsClient:
    """Mixin: the class sets `self.url` before `drive` runs, and may extend `request_body`."""

    url: str

    def request_body(self, r: BenchRequest) -> dict[str, Any]:
        return {"prompt": list(r.prompt_ids), "max_tokens": r.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}

    def drive(self, requests: list[BenchRequest], arrival: Arrival) -> list[Timing]:
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
        for attempt in (1, 2):
            try:
                async with client.stream("POST", "/v1/completions",
                                         json=self.request_body(r)) as resp:
                    if resp.status_code != 200:
                        t.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode()[:200]}"
                        return t
                    async for line in resp.aiter_lines():
                        on_line(line, t, t0)
                break
            except (httpx.RemoteProtocolError, httpx.ReadError):
                # A kept-alive connection the server closed as the request went out (llama-server
                # does, now and then): nothing was answered, so the request is sent once more
                # on a new connection, the wait counted in its TTFT.
                if attempt == 2 or t.first_token_s is not None:
                    raise
        t.finished_s = time.perf_counter() - t0
        return t


def on_line(line: str, t: Timing, t0: float) -> None:
    """Folds one server-sent-events line into the request's timing."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return
    chunk = json.loads(line[6:])
    if "error" in chunk:
        t.error = str(chunk["error"])
    elif chunk.get("choices") and t.first_token_s is None:
        t.first_token_s = time.perf_counter() - t0
    if chunk.get("usage"):
        t.output_tokens = int(chunk["usage"]["completion_tokens"])

"""Live servers for the server tests: uvicorn in a background thread on 127.0.0.1 (a free port),
each over its own engine derived from the session's `default_llm` (weights shared)."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Iterator

import httpx
import pytest

from tightfit.server.app import create_app
from tightfit.server.config import ServerConfig
from tightfit.server import launch


class LiveServer:
    def __init__(self, llm: Any, config: ServerConfig) -> None:
        self.llm = llm
        self.config = config
        self.app = create_app(llm, config)
        self._sock = launch.bind_socket("127.0.0.1", 0)
        self.url = launch.base_url(self._sock)
        self._server = launch.make_server(self.app, config)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._sock]))

    def start(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < deadline and self._thread.is_alive(), "server did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(60)

    @property
    def engine(self) -> Any:
        return self.llm.engine

    @property
    def loop(self) -> Any:
        return self.app.state.ctx.loop

    @property
    def model(self) -> str:
        return self.app.state.ctx.model_name

    def openai(self, **kw: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"),
                             max_retries=0, timeout=kw.pop("timeout", 120), **kw)

    def http(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 120), **kw)

    def wait_idle(self, timeout: float = 20) -> None:
        """Until no sequence is in flight (aborts are processed asynchronously)."""
        deadline = time.monotonic() + timeout
        while self.loop.outstanding or self.engine.has_unfinished():
            assert time.monotonic() < deadline, \
                f"still busy: {self.loop.outstanding} outstanding"
            time.sleep(0.02)


@pytest.fixture(scope="session")
def server(default_llm: Any) -> Iterator[LiveServer]:
    """The shared server: 32 sequences a batch, a 128-block KV pool (2048 tokens)."""
    live = LiveServer(default_llm.derive(num_blocks=128, max_num_seqs=32), ServerConfig()).start()
    yield live
    live.stop()


@pytest.fixture(scope="session")
def lite_server() -> Iterator[LiveServer]:
    """The same server over the lite runtime (tightfit.lite): 8 sequence slots of 512
    positions."""
    from tightfit.lite import LiteLLM

    live = LiveServer(LiteLLM(None, num_threads=2, max_model_len=512, max_num_seqs=8),
                      ServerConfig()).start()
    yield live
    live.stop()


@pytest.fixture()
def make_server(default_llm: Any) -> Iterator[Callable[..., LiveServer]]:
    """Factory of extra servers with their own config and engine; stopped after the test."""
    started: list[LiveServer] = []

    def make(num_blocks: int = 64, max_num_seqs: int = 4, **config: Any) -> LiveServer:
        llm = default_llm.derive(num_blocks=num_blocks, max_num_seqs=max_num_seqs)
        live = LiveServer(llm, ServerConfig(**config)).start()
        started.append(live)
        return live

    yield make
    for live in started:
        live.stop()

"""tightfit through its own OpenAI-compatible server: the worker process loads the model, serves
it with uvicorn on a free local port (a background thread), and replays the workload as streaming
`/v1/completions` requests (token-id prompts, `ignore_eos`, `priority`) from an asyncio client
(`openai_client.py`, shared with the llama-server backend).

What this adds over the in-process backend is the HTTP, JSON and SSE cost a real client pays.
TTFT is measured at the first streamed text chunk (a token that decodes to no text yet, such as
half a UTF-8 character, shows up with the next one); output lengths come from the final `usage`.
"""
from __future__ import annotations

import threading
import time
from typing import Any

try:
    import uvicorn

    from tightfit.bench.backends.openai_client import CompletionsClient, free_port
    from tightfit.server.app import create_app
    from tightfit.server.config import ServerConfig
except ImportError as exc:  # the registry turns this into a clear "not installed" message
    raise ImportError(f"the tightfit-http backend needs the tightfit server: {exc}") from exc

from tightfit.bench.backends.base import Timing
from tightfit.bench.backends.tightfit_backend import TightfitBackend
from tightfit.bench.workloads import Arrival, BenchRequest

START_TIMEOUT_S = 60.0


class TightfitHTTPBackend(CompletionsClient, TightfitBackend):
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
        port = free_port()
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

    def request_body(self, r: BenchRequest) -> dict[str, Any]:
        return {**super().request_body(r), "priority": r.priority}

    def run(self, requests: list[BenchRequest], arrival: Arrival) -> list[Timing]:
        self._ensure_server()
        return self.drive(requests, arrival)

    def close(self) -> None:
        if getattr(self, "_server", None) is not None:
            self._server.should_exit = True
            time.sleep(0.2)
            self._server = None

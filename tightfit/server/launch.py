"""Running an app under uvicorn: bind the socket ourselves (so port 0 works and the real port is
known), print a banner once the server accepts connections, and drain on SIGTERM/SIGINT:
uvicorn stops accepting, waits for open requests, then the app's lifespan stops the engine."""
from __future__ import annotations

import asyncio
import json
import signal
import socket
from typing import Any, Callable

import uvicorn

from tightfit.server.config import API_KEY_ENV, ServerConfig


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def make_server(app: Any, config: ServerConfig, log_level: str = "warning") -> uvicorn.Server:
    cfg = uvicorn.Config(app, log_level=log_level, access_log=config.access_log,
                         timeout_graceful_shutdown=int(config.drain_timeout_s),
                         lifespan="on", timeout_keep_alive=5)
    return uvicorn.Server(cfg)


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def banner(url: str, model: str, config: ServerConfig) -> str:
    auth = f" -H \"Authorization: Bearer ${API_KEY_ENV}\"" if config.api_key else ""
    body = json.dumps({"model": model, "max_tokens": 32,
                       "messages": [{"role": "user", "content": "Hello! Who are you?"}]})
    exposure = "" if config.host in ("127.0.0.1", "localhost", "::1") else \
        f"  (bound to {config.host}: reachable from other machines)"
    return (f"tightfit is serving {model} at {url}/v1 (OpenAI-compatible){exposure}\n"
            f"  endpoints: /v1/chat/completions /v1/completions /v1/models /v1/predict "
            f"/health /metrics\n"
            f"  try it:\n"
            f"    curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
            f"-d '{body}'\n"
            f"  stop with Ctrl-C or SIGTERM (in-flight requests finish first)")


def serve(app: Any, config: ServerConfig, on_ready: Callable[[str], None],
          log_level: str = "warning") -> None:
    """Serves until SIGTERM/SIGINT, then drains and returns (exit status 0, not a re-raised
    signal: uvicorn re-delivers the signal to the previous handler, which here does nothing)."""
    sock = bind_socket(config.host, config.port)
    server = make_server(app, config, log_level)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    asyncio.run(_serve(server, sock, on_ready))


async def _serve(server: uvicorn.Server, sock: socket.socket,
                 on_ready: Callable[[str], None]) -> None:
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        on_ready(base_url(sock))
    await task

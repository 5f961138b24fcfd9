"""The bench's streaming client against a server that closes kept-alive connections under it
(llama-server does: 10 of 40 sequential streamed requests on one connection came back
"Server disconnected without sending a response", 2026-12-07)."""
from __future__ import annotations

import json
import socket
import threading

from tightfit.bench.backends.openai_client import CompletionsClient
from tightfit.bench.workloads import Arrival, BenchRequest


def _sse(tokens: int) -> bytes:
    events = [{"choices": [{"text": "x"}]} for _ in range(tokens)]
    events.append({"choices": [], "usage": {"completion_tokens": tokens}})
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return (f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}").encode()


def _serve(sock: socket.socket, answered: list[int]) -> None:
    """Answers the first request on each connection and drops the connection at the second
    without a word (a keep-alive limit as the request goes out)."""
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        with conn:
            for served in range(2):
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                if not data:
                    break
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(next(l.split(b":")[1] for l in head.split(b"\r\n")
                                  if l.lower().startswith(b"content-length")))
                while len(rest) < length:
                    rest += conn.recv(65536)
                if served == 1:
                    break
                conn.sendall(_sse(json.loads(rest)["max_tokens"]))
                answered.append(1)


class _Client(CompletionsClient):
    def __init__(self, url: str) -> None:
        self.url = url


def test_a_request_the_server_dropped_unanswered_is_sent_again():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    answered: list[int] = []
    threading.Thread(target=_serve, args=(sock, answered), daemon=True).start()
    try:
        reqs = [BenchRequest(i, (1, 2, 3), 4, None, 0) for i in range(6)]
        got = _Client(f"http://127.0.0.1:{sock.getsockname()[1]}").drive(
            reqs, Arrival("closed", concurrency=1))
    finally:
        sock.close()
    # every second request met a dropped connection; each went out again and was answered
    assert len(answered) == 6
    assert [(t.error, t.output_tokens) for t in got] == [(None, 4)] * 6
    assert all(t.finished_s >= t.first_token_s > t.arrival_s for t in got)

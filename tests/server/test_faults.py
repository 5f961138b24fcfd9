"""Overload and faults: a disconnecting client frees its KV blocks, a full server answers 429 at
once, an injected engine failure fails only its request, SIGTERM drains and exits."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import openai
import pytest

LONG = {"prompt": "Tell me a long story about a dragon.", "max_tokens": 400,
        "temperature": 0, "ignore_eos": True}


def wait_for(cond: Any, timeout: float = 15, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_stream_disconnect_aborts_and_frees_blocks(server: Any) -> None:
    server.wait_idle()
    pool, start = server.engine.pool, server.engine.pool.num_free
    with server.http() as http:
        with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
            lines = r.iter_lines()
            for _ in range(3):
                while not next(lines).startswith("data: "):
                    pass
            assert pool.num_free < start and server.loop.outstanding == 1
    # the connection is closed here, mid-stream: the server must abort the request
    wait_for(lambda: pool.num_free == start and server.loop.outstanding == 0, what="blocks")
    assert not server.engine.has_unfinished()


def test_non_stream_disconnect_aborts_and_frees_blocks(server: Any) -> None:
    server.wait_idle()
    pool, start = server.engine.pool, server.engine.pool.num_free
    with server.http(timeout=1.5) as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/completions", json=LONG)
    wait_for(lambda: pool.num_free == start and server.loop.outstanding == 0, what="blocks")


def test_full_server_answers_429_with_retry_after(make_server: Any) -> None:
    live = make_server(max_num_seqs=1, max_queue=0, retry_after_s=3)
    with live.http() as http, live.http() as other:
        with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
            lines = r.iter_lines()  # keep a reference: dropping it closes the connection
            first = next(line for line in lines if line.startswith("data: "))
            assert live.loop.outstanding == 1, first
            t0 = time.monotonic()
            refused = other.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
            assert time.monotonic() - t0 < 5, "a full server must answer at once"
            with pytest.raises(openai.RateLimitError):
                live.openai().completions.create(model=live.model, prompt="hi", max_tokens=1)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
        err = refused.json()["error"]
        assert err["type"] == "rate_limit_error" and "capacity" in err["message"]
        live.wait_idle()
        assert other.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}).is_success
        assert 'tightfit:requests_rejected_total{reason="queue_full"} 2.0' in \
            other.get("/metrics").text


def test_injected_engine_failure_fails_only_that_request(make_server: Any,
                                                         monkeypatch: Any) -> None:
    live = make_server()
    runner = live.engine.runner
    real = runner.execute

    def execute(out: Any, *args: Any, **kw: Any) -> Any:
        if any(s.seq.params.seed == 666 for s in out.scheduled):
            raise RuntimeError("injected fault")
        return real(out, *args, **kw)

    monkeypatch.setattr(runner, "execute", execute)
    start = live.engine.pool.num_free
    poison = {"prompt": "hello", "max_tokens": 4, "seed": 666}
    with live.http() as http:
        r = http.post("/v1/completions", json=poison)
        assert r.status_code == 500 and "injected fault" in r.json()["error"]["message"]
        stream = http.post("/v1/completions", json={**poison, "stream": True})
        assert stream.status_code == 200 and "injected fault" in stream.text
        assert stream.text.rstrip().endswith("data: [DONE]")
        ok = http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
        assert http.get("/health").json() == {"status": "ok"}
        assert "tightfit:request_failure_total 2.0" in http.get("/metrics").text
    live.wait_idle()
    assert live.engine.pool.num_free == start


def _start_cli_server() -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "tightfit", "serve", "--port", "0", "--quant", "fp32",
           "--threads", "2", "--kv-cache-memory", "32MiB", "--max-num-seqs", "4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    banner = []
    for line in proc.stdout:
        banner.append(line)
        if "curl " in line:
            break
    match = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", "".join(banner))
    assert match, f"no banner: {banner!r} {proc.stderr.read() if proc.poll() else ''}"
    return proc, match.group(1)


def test_sigterm_drains_in_flight_requests_then_exits() -> None:
    proc, url = _start_cli_server()
    first_chunk, result = threading.Event(), {}

    def client() -> None:
        body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            events = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    first_chunk.set()
            result["events"] = events

    try:
        thread = threading.Thread(target=client)
        thread.start()
        assert first_chunk.wait(120), "no first token"
        proc.send_signal(signal.SIGTERM)
        thread.join(120)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    events = result["events"]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 24
    assert "drained and stopped" in proc.stderr.read()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=5)

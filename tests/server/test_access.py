"""Access: 127.0.0.1 by default, bearer API key on every endpoint but /health (401 otherwise),
413 for bodies over the limit (declared or streamed)."""
from __future__ import annotations

import argparse
from typing import Any, Iterator

import openai
import pytest

from tightfit.cli import serve as serve_cli
from tightfit.server.config import API_KEY_ENV, ServerConfig
from tightfit.server.launch import banner

KEY = "s3cret-key"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_binds_loopback_by_default(monkeypatch: Any) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    config = serve_cli.config_from_args(parse())
    assert config.host == "127.0.0.1" and ServerConfig().host == "127.0.0.1"
    assert config.api_key is None


def test_api_key_from_flag_or_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert serve_cli.config_from_args(parse()).api_key == "from-env"
    assert serve_cli.config_from_args(parse("--api-key", "flag")).api_key == "flag"


def test_banner_shows_a_curl_without_leaking_the_key() -> None:
    text = banner("http://127.0.0.1:8000", "m", ServerConfig(api_key=KEY))
    assert "curl http://127.0.0.1:8000/v1/chat/completions" in text
    assert f"${API_KEY_ENV}" in text and KEY not in text


@pytest.fixture()
def guarded(make_server: Any) -> Iterator[Any]:
    yield make_server(api_key=KEY, max_body_bytes=4096)


@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
    ("POST", "/v1/predict"), ("GET", "/metrics"), ("GET", "/openapi.json"),
    ("GET", "/v1/monitor"), ("GET", "/no/such/path")])
def test_every_endpoint_but_health_needs_the_key(guarded: Any, method: str, path: str) -> None:
    with guarded.http() as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = http.request(method, path, headers=headers, json={})
            assert r.status_code == 401, (path, headers, r.text)
            assert r.json()["error"]["type"] == "authentication_error"
            assert r.headers["www-authenticate"] == "Bearer"
        assert http.get("/health").status_code == 200
        ok = http.request(method, path, headers={"Authorization": f"Bearer {KEY}"}, json={})
        assert ok.status_code != 401


def test_openai_client_with_and_without_the_key(guarded: Any) -> None:
    with pytest.raises(openai.AuthenticationError):
        guarded.openai(api_key="nope").models.list()
    r = guarded.openai(api_key=KEY).completions.create(model=guarded.model, prompt="Hi",
                                                       max_tokens=1)
    assert r.usage.completion_tokens == 1


def test_declared_body_over_the_limit_gets_413(guarded: Any) -> None:
    body = {"prompt": "x" * 5000, "max_tokens": 1}
    with guarded.http(headers={"Authorization": f"Bearer {KEY}"}) as http:
        r = http.post("/v1/completions", json=body)
    assert r.status_code == 413
    assert "4096" in r.json()["error"]["message"]


def test_streamed_body_over_the_limit_gets_413(guarded: Any) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'", "max_tokens": 1}'

    with guarded.http(headers={"Authorization": f"Bearer {KEY}",
                               "Content-Type": "application/json"}) as http:
        r = http.post("/v1/completions", content=chunks())
    assert r.status_code == 413, r.text
    assert r.json()["error"]["message"].startswith("request body too large")


def test_body_under_the_limit_passes(guarded: Any) -> None:
    with guarded.http(headers={"Authorization": f"Bearer {KEY}"}) as http:
        r = http.post("/v1/completions", json={"prompt": "x" * 100, "max_tokens": 1})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("argv, needle", [
    (["--port", "70000"], "port"), (["--max-queue", "-1"], "max_queue"),
    (["--max-body-bytes", "0"], "max_body_bytes"), (["--api-key", " "], "api_key")])
def test_bad_server_options_fail_before_the_model_loads(capsys: Any, argv: list[str],
                                                        needle: str) -> None:
    from tightfit.cli.main import main

    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and "loading" not in err

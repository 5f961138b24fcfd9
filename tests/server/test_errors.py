"""Bad input gets a 4xx with an OpenAI-style error body naming the problem (raw HTTP)."""
from __future__ import annotations

from typing import Any

import pytest

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module", params=["torch", "lite"])
def server(request: Any, server: Any) -> Any:
    """Both runtimes behind the server: the torch engine's and the lite runtime's."""
    return server if request.param == "torch" else request.getfixturevalue("lite_server")


def check_error(r: Any, status: int, *needles: str, param: str | None = "?") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    for needle in needles:
        assert needle in err["message"], (needle, err["message"])
    if param != "?":
        assert err["param"] == param, err
    return err


def test_malformed_json(server: Any) -> None:
    with server.http() as http:
        r = http.post(CHAT, content=b'{"messages": [', headers={"content-type": "application/json"})
    check_error(r, 400, "not valid JSON")


@pytest.mark.parametrize("body, needle, param", [
    ({"messages": "hello", "max_tokens": 2}, "messages", "messages"),
    ({"messages": MSG, "max_tokens": "two"}, "max_tokens", "max_tokens"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens", "max_tokens"),
    ({"messages": MSG, "max_tokens": 2, "temperature": -1}, "temperature", "temperature"),
    ({"messages": MSG, "max_tokens": 2, "temperature": 3}, "temperature", "temperature"),
    ({"messages": MSG, "max_tokens": 2, "top_p": 1.5}, "top_p", "top_p"),
    ({"messages": MSG, "max_tokens": 2, "n": 0}, "n", "n"),
    ({"messages": MSG, "max_tokens": 2, "n": 99}, "n=99", "n"),
    ({"messages": MSG, "max_tokens": 2, "stop": [""]}, "stop", "stop"),
    ({"messages": MSG, "max_tokens": 2, "seed": 2**70}, "seed", "seed"),
    ({"messages": MSG, "max_tokens": 2, "priority": "high"}, "priority", "priority"),
    ({"messages": [{"role": "wizard", "content": "x"}], "max_tokens": 2}, "role", None),
    ({"messages": [], "max_tokens": 2}, "messages", "messages"),
    ({"messages": MSG, "max_tokens": 2, "logprobs": True}, "logprobs is not supported",
     "logprobs"),
    ({"messages": MSG, "max_tokens": 2, "tools": [{"type": "function"}]}, "tools", "tools"),
])
def test_wrong_types_and_invalid_sampling_values(server: Any, body: dict, needle: str,
                                                  param: str | None) -> None:
    with server.http() as http:
        err = check_error(http.post(CHAT, json=body), 400, needle)
    if param is not None:
        assert err["param"] is not None and err["param"].startswith(param)


def test_unknown_model(server: Any) -> None:
    with server.http() as http:
        r = http.post(TEXT, json={"model": "gpt-4o", "prompt": "hi", "max_tokens": 1})
    err = check_error(r, 404, "gpt-4o", server.model, param="model")
    assert err["code"] == "model_not_found"


def test_prompt_too_long(server: Any) -> None:
    long_prompt = "word " * 3000
    with server.http() as http:
        r = http.post(TEXT, json={"prompt": long_prompt, "max_tokens": 1})
        err = check_error(r, 400, "context", "shorten", param="prompt")
        assert err["code"] == "context_length_exceeded"
        r = http.post(TEXT, json={"prompt": "hi", "max_tokens": 100_000})
        check_error(r, 400, "max_tokens=100000", param="max_tokens")


@pytest.mark.parametrize("prompt, needle", [
    ("", "empty"), ([], "prompt"), ([999_999], "outside the vocabulary"), ([-1], "-1")])
def test_bad_prompts(server: Any, prompt: Any, needle: str) -> None:
    with server.http() as http:
        check_error(http.post(TEXT, json={"prompt": prompt, "max_tokens": 1}), 400, needle)


def test_unsupported_completion_options(server: Any) -> None:
    with server.http() as http:
        r = http.post(TEXT, json={"prompt": "hi", "max_tokens": 1, "echo": True})
    assert check_error(r, 400, "echo", param="echo")["code"] == "unsupported_parameter"


def test_unknown_route_and_method(server: Any) -> None:
    with server.http() as http:
        check_error(http.get("/v1/nothing"), 404, "/v1/nothing")
        check_error(http.get(TEXT), 405, "GET")
        check_error(http.get("/v1/models/nope"), 404, "nope")


def test_predict_bad_body(server: Any) -> None:
    with server.http() as http:
        check_error(http.post("/v1/predict", json={"rows": []}), 400, "scenarios")
        check_error(http.post("/v1/predict", json="x"), 400)


def test_errors_leave_nothing_in_flight(server: Any) -> None:
    server.wait_idle()
    assert server.loop.outstanding == 0

"""Property-based fuzz of the endpoints (hypothesis) against the live server: arbitrary JSON,
arbitrary bytes and near-valid requests with wrong-typed fields never get a 5xx, and every
4xx carries an OpenAI-style error body. Bounded: small max_tokens, ~100 examples in all."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

ENDPOINTS = ["/v1/completions", "/v1/chat/completions", "/v1/predict"]


@pytest.fixture(scope="module", params=["torch", "lite"])
def server(request: Any, server: Any) -> Any:
    """Both runtimes behind the server: the torch engine's and the lite runtime's."""
    return server if request.param == "torch" else request.getfixturevalue("lite_server")


FUZZ = settings(max_examples=35, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats()
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)
# Anything but null: a missing max_tokens would mean "the rest of the context" (slow, valid).
junk = json_values.filter(lambda v: v is not None)
texts = st.text(max_size=24)
VALID = {
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "n": st.integers(1, 3),
    "seed": st.integers(0, 2**32), "stop": texts | st.lists(texts, max_size=3),
    "stream": st.booleans(), "stream_options": st.fixed_dictionaries(
        {"include_usage": st.booleans()}), "priority": st.integers(-5, 5),
    "top_k": st.integers(-1, 50), "ignore_eos": st.booleans(), "model": st.none(),
}
message = st.fixed_dictionaries({
    "role": st.sampled_from(["user", "system", "assistant"]),
    "content": texts | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
                                max_size=2)})


def near_valid(required: dict[str, Any]) -> Any:
    """A valid body (optional fields drawn at random), then - half the time - one field set
    to an arbitrary JSON value."""
    valid = st.fixed_dictionaries({**required, "max_tokens": st.integers(1, 2)},
                                  optional=VALID)
    keys = sorted([*required, "max_tokens", *VALID])
    return st.tuples(valid, st.none() | st.tuples(st.sampled_from(keys), junk)).map(
        lambda pair: pair[0] if pair[1] is None else {**pair[0], pair[1][0]: pair[1][1]})


def completion_bodies() -> Any:
    return near_valid({"prompt": texts | st.lists(st.integers(0, 49_151), max_size=6)})


def chat_bodies() -> Any:
    return near_valid({"messages": st.lists(message, min_size=1, max_size=3)})


def post(server: Any, path: str, body: Any) -> Any:
    """Encoded here, not by httpx, so that NaN and Infinity literals reach the server too."""
    with server.http(timeout=60) as http:
        return http.post(path, content=json.dumps(body),
                         headers={"content-type": "application/json"})


def check(r: Any) -> None:
    event(f"status {r.status_code}")
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert set(err) == {"message", "type", "param", "code"}


@FUZZ
@given(path=st.sampled_from(ENDPOINTS), body=json_values)
def test_arbitrary_json(server: Any, path: str, body: Any) -> None:
    check(post(server, path, body))


@FUZZ
@given(path=st.sampled_from(ENDPOINTS), body=st.binary(max_size=64))
def test_arbitrary_bytes(server: Any, path: str, body: bytes) -> None:
    with server.http(timeout=60) as http:
        check(http.post(path, content=body, headers={"content-type": "application/json"}))


@FUZZ
@given(body=completion_bodies())
def test_near_valid_completions(server: Any, body: dict) -> None:
    check(post(server, "/v1/completions", body))


@FUZZ
@given(body=chat_bodies())
def test_near_valid_chat(server: Any, body: dict) -> None:
    check(post(server, "/v1/chat/completions", body))


def test_fuzzing_left_nothing_in_flight(server: Any) -> None:
    server.wait_idle()

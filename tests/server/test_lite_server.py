"""`tightfit serve --runtime lite`: the same OpenAI server over the lite runtime's engine, driven
by the official client against a live server (chat and completions, streaming, concurrency,
errors, metrics). The lite server (tests/server/conftest.py) also takes the error and fuzz tests
of test_errors.py and test_fuzz.py."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tightfit import SamplingParams
from tightfit.lite import LiteLLM

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def reference() -> LiteLLM:
    """Another lite model on the same file, for expected outputs (never shares the server's
    sequence slots)."""
    return LiteLLM(None, num_threads=2, max_model_len=512, max_num_seqs=1)


def test_chat_matches_the_runtime_with_exact_usage(lite_server: Any, reference: LiteLLM) -> None:
    prompt_ids = reference.tokenizer.encode_chat(MESSAGES)
    ref = reference.generate([prompt_ids], SamplingParams(max_tokens=8))[0]
    r = lite_server.openai().chat.completions.create(model=lite_server.model, messages=MESSAGES,
                                                     max_tokens=8, temperature=0)
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == len(prompt_ids)
    assert r.usage.completion_tokens == len(ref.token_ids)


def test_stream_equals_non_stream(lite_server: Any) -> None:
    client = lite_server.openai()
    args = dict(model=lite_server.model, prompt="Once upon a time", max_tokens=10, temperature=0)
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert whole.model == lite_server.model == "SmolLM2-135M-Instruct.Q4_1"


def test_concurrent_requests_all_complete(lite_server: Any, reference: LiteLLM) -> None:
    prompts = [f"List {i} fruits:" for i in range(12)]  # 8 slots: some wait for a free one
    client = lite_server.openai()

    def ask(p: str) -> Any:
        return client.completions.create(model=lite_server.model, prompt=p, max_tokens=6,
                                         temperature=0)

    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(ask, prompts))
    lite_server.wait_idle()
    want = reference.generate(prompts, SamplingParams(max_tokens=6))
    assert [g.choices[0].text for g in got] == [w.text for w in want]
    assert lite_server.engine.pool.num_free == 8


def test_errors_are_4xx_naming_the_value(lite_server: Any) -> None:
    with lite_server.http() as http:
        r = http.post("/v1/completions", json={"prompt": "word " * 2000, "max_tokens": 1})
        assert r.status_code == 400 and "context" in r.json()["error"]["message"]
        r = http.post("/v1/chat/completions", json={"messages": "nope"})
        assert r.status_code == 400 and "messages" in r.text
        r = http.post("/v1/completions", json={"prompt": [999_999], "max_tokens": 1})
        assert r.status_code == 400 and "outside the vocabulary" in r.text


def test_health_and_metrics(lite_server: Any) -> None:
    with lite_server.http() as http:
        assert http.get("/health").json() == {"status": "ok"}
        text = http.get("/metrics").text
    assert "tightfit:generation_tokens_total" in text and "tightfit:kv_cache_free_blocks" in text

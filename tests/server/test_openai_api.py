"""The OpenAI-compatible endpoints driven by the official `openai` client against a live server:
streaming and not, exact usage, max_tokens / stop / n / seed / priority, and /v1/predict."""
from __future__ import annotations

from typing import Any

import pytest

from tightfit import SamplingParams
from tightfit.server import metrics as M

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def expected(llm: Any, prompt_ids: list[int], max_tokens: int) -> Any:
    """Greedy reference from the session model (another engine on the same weights; called only
    while the server is idle, so the two never run at once)."""
    return llm.generate([prompt_ids], SamplingParams(max_tokens=max_tokens))[0]


def test_models_lists_the_served_model(server: Any) -> None:
    models = server.openai().models.list()
    assert [m.id for m in models.data] == [server.model]
    assert server.openai().models.retrieve(server.model).id == server.model


def test_chat_matches_the_engine_with_exact_usage(server: Any, default_llm: Any) -> None:
    prompt_ids = default_llm.tokenizer.encode_chat(MESSAGES)
    ref = expected(default_llm, prompt_ids, 8)
    r = server.openai().chat.completions.create(model=server.model, messages=MESSAGES,
                                                max_tokens=8, temperature=0)
    assert r.object == "chat.completion" and r.model == server.model
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == len(prompt_ids)
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.total_tokens == len(prompt_ids) + len(ref.token_ids)


def test_chat_stream_equals_non_stream_and_reports_usage(server: Any) -> None:
    client = server.openai()
    args = dict(model=server.model, messages=MESSAGES, max_tokens=8, temperature=0)
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(
        **args, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_usage_ends_with_done(server: Any) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0, "stream": True}
    with server.http() as http:
        r = http.post("/v1/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line for line in r.text.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]" and '"usage":null' in events[0]


def test_completion_honours_max_tokens(server: Any, default_llm: Any) -> None:
    prompt = "The quick brown fox"
    client = server.openai()
    r = client.completions.create(model=server.model, prompt=prompt, max_tokens=5,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens == len(default_llm.tokenizer.encode(prompt))
    streamed = client.completions.create(model=server.model, prompt=prompt, max_tokens=5,
                                         temperature=0, stream=True,
                                         extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == r.choices[0].text


def test_stop_string_cuts_the_text(server: Any) -> None:
    client = server.openai()
    args = dict(model=server.model, prompt="Count: one, two, three,", max_tokens=8,
                temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**args).choices[0].text
    stop = full.strip()[2:5]
    assert stop, f"generated text too short to pick a stop string: {full!r}"
    cut = client.completions.create(**args, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full[:full.index(stop)]


def test_n_choices_with_a_seed_are_reproducible(server: Any) -> None:
    client = server.openai()
    args = dict(model=server.model, prompt="My favourite colour is", max_tokens=4, n=3,
                temperature=1.0, top_p=0.9, seed=1234)
    a, b = client.completions.create(**args), client.completions.create(**args)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.usage.prompt_tokens == b.usage.prompt_tokens  # the prompt counts once
    assert a.usage.completion_tokens <= 12


def test_token_id_prompts_and_priority(server: Any, default_llm: Any) -> None:
    ids = default_llm.tokenizer.encode("Hello there")
    r = server.openai().completions.create(model=server.model, prompt=[ids, ids], max_tokens=2,
                                           temperature=0, extra_body={"priority": -3})
    assert len(r.choices) == 2 and r.choices[0].text == r.choices[1].text
    assert r.usage.prompt_tokens == 2 * len(ids)


def test_health_and_metrics(server: Any) -> None:
    server.openai().completions.create(model=server.model, prompt="Hi", max_tokens=2)
    with server.http() as http:
        assert http.get("/health").json() == {"status": "ok"}
        text = http.get("/metrics").text
        snap = http.get("/v1/monitor").json()
    for name in (M.NUM_REQUESTS_RUNNING, M.NUM_REQUESTS_WAITING, M.KV_CACHE_USAGE,
                 M.NUM_PREEMPTIONS + "_total", M.TTFT + "_bucket", M.ITL + "_bucket",
                 M.PROMPT_TOKENS + "_total", M.GENERATION_TOKENS + "_total",
                 M.PROCESS_RSS, M.PROCESS_CPU):
        assert name in text, name
    assert _value(text, M.GENERATION_TOKENS + "_total") >= 2
    assert _value(text, M.TTFT + "_count") >= 1
    assert 'tightfit:num_requests_running{priority="0"}' in text
    assert snap["rss_bytes"] > 50 * 2**20 and snap["system_memory_total_bytes"] > 0


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.parametrize("wrap", [True, False])
def test_predict(server: Any, wrap: bool) -> None:
    rows = [{"id": "bad"}, {"id": "ok", "hardware": {"name": "RTX 3070"},
                             "model": {"name": "Meta-Llama-3-8B", "params_b": 8.03},
                             "quant": "Q4_K_M", "engine": "llama.cpp",
                             "workload": {"prompt_tokens": 512, "gen_tokens": 128, "batch": 1}}]
    # a row naming a file on the server's machine: the service does not open it
    from tightfit.engine.loader.resolve import resolve_model
    rows.append({"id": "file", "hardware": {"name": "RTX 3070"}, "engine": "llama.cpp",
                 "model": {"path": str(resolve_model("gemma3"))}})
    # a deployment that does not fit says why and what would
    rows.append({**rows[1], "id": "big", "hardware": {"name": "Raspberry Pi 5"}, "quant": "F16"})
    with server.http() as http:
        r = http.post("/v1/predict", json={"scenarios": rows} if wrap else rows)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["id"] for d in data] == ["bad", "ok", "file", "big"]
    assert "error" in data[0] and "error" not in data[1] and data[1]["decode_tok_s"] > 0
    assert data[1]["fits"] is True and data[1]["fits_reason"] is None
    assert data[1]["capacity"]["max_context_tokens"] > 640 and data[1]["capacity"]["max_batch"] > 1
    assert data[2]["error"]["field"] == "model.path"
    assert data[3]["fits"] is False and "Raspberry Pi 5" in data[3]["fits_reason"]
    assert "fits (quant)" in data[3]["fits_reason"]


def test_openapi_schema_lists_the_endpoints(server: Any) -> None:
    with server.http() as http:
        paths = http.get("/openapi.json").json()["paths"]
    assert {"/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/predict",
            "/health", "/metrics"} <= set(paths)

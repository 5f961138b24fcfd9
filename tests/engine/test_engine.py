"""Engine behaviour on the real default model: batching invariance, chunked prefill, paged
attention paths, prefix caching, preemption, sampling, stop conditions and bad input."""
from __future__ import annotations

import pytest
import torch

from tightfit import SamplingParams
from tightfit.errors import RequestError

PROMPTS = ["Hi", "The history of the Roman Empire is long and", "def add(a, b):\n",
           "List three fruits: apple,", "A" * 3 + " quick brown fox jumps over the lazy dog. " * 6]
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def solo(default_llm):
    """Each prompt generated alone, the reference for the batching tests."""
    return [default_llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS]


def test_batch_of_different_lengths_matches_each_alone(default_llm, solo):
    outs = default_llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == solo


def test_chunked_prefill_gives_same_tokens(default_llm, solo):
    small = default_llm.derive(max_num_batched_tokens=7, block_size=4)
    outs = small.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == solo


def test_preemption_under_a_tiny_kv_pool_gives_same_tokens(default_llm, solo):
    tiny = default_llm.derive(num_blocks=12, block_size=8)  # 96 tokens for 5 sequences
    outs = tiny.generate(PROMPTS, GREEDY)
    assert tiny.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == solo


def test_reference_attention_path_agrees_with_fast_path(default_llm):
    """Same steps (chunked prefill over several blocks, batched decode with padding masks)
    through both paths: logits agree to fp32 rounding, tokens are identical."""
    fast = default_llm.derive(block_size=4, max_num_batched_tokens=9, attention="fast")
    ref = default_llm.derive(block_size=4, max_num_batched_tokens=9, attention="reference")
    for llm in (fast, ref):
        llm.captured = []
        orig = llm.engine.runner.execute

        def capture(out, orig=orig, llm=llm):
            seqs, logits = orig(out)
            llm.captured.append(logits.clone())
            return seqs, logits
        llm.engine.runner.execute = capture
    a = fast.generate(PROMPTS[:4], SamplingParams(max_tokens=10, ignore_eos=True))
    b = ref.generate(PROMPTS[:4], SamplingParams(max_tokens=10, ignore_eos=True))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert len(fast.captured) == len(ref.captured)
    for x, y in zip(fast.captured, ref.captured):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-4)


def test_repeated_system_prompt_is_served_from_prefix_cache(default_llm):
    llm = default_llm.derive(block_size=16)
    system = {"role": "system", "content": "You are a careful assistant. " * 8}
    first = llm.chat_prompt([system, {"role": "user", "content": "Name a colour."}])
    second = llm.chat_prompt([system, {"role": "user", "content": "Name an animal."}])
    computed = []
    orig = llm.engine.runner.execute

    def count(out):
        computed.append(out.num_tokens)
        return orig(out)
    llm.engine.runner.execute = count
    a = llm.generate([first], SamplingParams(max_tokens=4))[0]
    before = sum(computed)
    b = llm.generate([second], SamplingParams(max_tokens=4))[0]
    assert a.num_cached_tokens == 0
    shared = next(i for i, (x, y) in enumerate(zip(first, second)) if x != y)
    assert b.num_cached_tokens == shared // 16 * 16 > 0
    # the second request computed only its uncached prompt tail plus its decode steps
    assert sum(computed) - before == len(second) - b.num_cached_tokens + len(b.token_ids) - 1
    # and the result equals a run without any cache
    cold = default_llm.derive(enable_prefix_caching=False)
    assert cold.generate([second], SamplingParams(max_tokens=4))[0].token_ids == b.token_ids


def test_same_seed_same_text_different_seed_differs(default_llm):
    p = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.95, top_k=50, seed=7)
    a = default_llm.generate("Tell me a story:", p)[0]
    b = default_llm.generate("Tell me a story:", p)[0]
    assert a.token_ids == b.token_ids
    others = [default_llm.generate("Tell me a story:", SamplingParams(
        max_tokens=20, temperature=1.0, seed=s))[0].token_ids for s in (1, 2, 3)]
    assert any(o != a.token_ids for o in others)


def test_a_tiny_temperature_samples_the_greedy_token(default_llm):
    """Validation lets any temperature > 0 through; 1e-45 once overflowed logits / temperature
    to inf and the step failed (found by the server fuzz test on the lite runtime)."""
    g = default_llm.generate("The sky is", SamplingParams(max_tokens=6, ignore_eos=True))[0]
    for t in (1e-45, 1e-300):
        tiny = default_llm.generate("The sky is", SamplingParams(
            max_tokens=6, temperature=t, seed=1, ignore_eos=True))[0]
        assert tiny.token_ids == g.token_ids


def test_top_k_one_equals_greedy(default_llm):
    g = default_llm.generate("The sky is", SamplingParams(max_tokens=12, ignore_eos=True))[0]
    k1 = default_llm.generate("The sky is", SamplingParams(
        max_tokens=12, temperature=0.8, top_k=1, seed=3, ignore_eos=True))[0]
    assert g.token_ids == k1.token_ids


def test_stop_string_truncates_and_streams_nothing_past_it(default_llm):
    base = default_llm.generate("Count: 1, 2, 3,", SamplingParams(max_tokens=16))[0]
    assert " 5" in base.text
    deltas = []
    out = default_llm.generate("Count: 1, 2, 3,", SamplingParams(max_tokens=16, stop=[" 5"]),
                               on_output=lambda o: deltas.append(o.delta_text))[0]
    assert out.finish_reason == "stop"
    assert out.text == base.text[:base.text.index(" 5")]
    assert "".join(deltas) == out.text


def test_max_tokens_and_stop_token(default_llm):
    out = default_llm.generate("Hello", SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3 and out.finish_reason == "length"
    first = default_llm.generate("Hello", SamplingParams(max_tokens=3, ignore_eos=True))[0]
    stopped = default_llm.generate("Hello", SamplingParams(
        max_tokens=3, stop_token_ids=(first.token_ids[1],), ignore_eos=True))[0]
    assert stopped.token_ids == first.token_ids[:2] and stopped.finish_reason == "stop"


def test_outputs_carry_timings(default_llm):
    out = default_llm.generate("Hello there", SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert out.ttft_s is not None and out.ttft_s > 0
    assert out.decode_tok_s is not None and out.decode_tok_s > 0


@pytest.mark.parametrize("kwargs, word", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-1), "temperature"),
    (dict(top_p=0), "top_p"), (dict(top_k=-2), "top_k")])
def test_invalid_sampling_values_are_named(kwargs, word):
    with pytest.raises(RequestError, match=word):
        SamplingParams(**kwargs)


def test_too_long_and_empty_prompts_are_refused(default_llm):
    with pytest.raises(RequestError, match="context window"):
        default_llm.generate([[1] * 5000], GREEDY)
    with pytest.raises(RequestError, match="empty"):
        default_llm.generate([[]], GREEDY)
    assert not default_llm.engine.has_unfinished()

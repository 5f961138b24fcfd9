"""Scenario workloads: the named templates, exact token counts, reproducibility, arrivals."""
from __future__ import annotations

import random

import pytest

from tightfit.bench import model_info
from tightfit.bench.workloads import (SCENARIOS, Arrival, Lengths, Overrides, build_workload,
                                      corpus_text, get_scenario, rng_for)
from tightfit.errors import TightfitError

ISSUE_TEMPLATES = ("chat", "long-doc-qa", "code-completion", "summarisation",
                   "batch-classification", "agent-tool-calls", "finance-risk",
                   "industrial-inspection")


@pytest.fixture(scope="module")
def tok():
    return model_info.tokenizer(None)


def test_the_issue_templates_exist_with_their_traits():
    assert set(ISSUE_TEMPLATES) <= set(SCENARIOS)
    arrivals = {SCENARIOS[n].arrival.kind for n in ISSUE_TEMPLATES}
    assert arrivals == {"closed", "poisson", "bursty"}
    assert SCENARIOS["industrial-inspection"].slo_ttft_ms == 50
    assert SCENARIOS["industrial-inspection"].prompt.hi <= 16
    assert len(SCENARIOS["chat"].priorities) == 2
    assert SCENARIOS["code-completion"].source == "code"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_prompts_have_exactly_the_sampled_token_counts(tok, name):
    s = SCENARIOS[name]
    w = build_workload(name, tok, seed=3)
    assert len(w.requests) == s.num_requests
    lengths = rng_for(name, 3, "lengths")  # the stream build_workload samples lengths from
    for r in w.requests:
        want_prompt, want_out = s.prompt.sample(lengths), s.output.sample(lengths)
        assert len(r.prompt_ids) == want_prompt
        assert r.max_tokens == want_out
        assert s.prompt.lo <= len(r.prompt_ids) <= s.prompt.hi


def test_prompts_are_real_text_from_the_corpus(tok):
    w = build_workload("summarisation", tok, seed=0, overrides=Overrides(num_requests=2))
    text = tok.decode(list(w.requests[0].prompt_ids))
    assert len(text) > 1000 and text[10:-10] in corpus_text("prose")
    code = tok.decode(list(build_workload("code-completion", tok, 0).requests[0].prompt_ids))
    assert code[10:-10] in corpus_text("code")


def test_same_seed_same_workload_other_seed_other_workload(tok):
    a = build_workload("chat", tok, seed=7)
    b = build_workload("chat", tok, seed=7)
    c = build_workload("chat", tok, seed=8)
    assert a == b
    assert a.requests != c.requests


def test_bos_is_prepended_when_the_model_wants_it_and_counts_in_the_length():
    gemma = model_info.tokenizer("gemma3")
    assert gemma.add_bos_token
    w = build_workload("ttft", gemma, seed=0)
    assert all(r.prompt_ids[0] == gemma.bos_token_id and len(r.prompt_ids) == 18
               for r in w.requests)


def test_overrides_reshape_the_template(tok):
    w = build_workload("chat", tok, 0, Overrides(num_requests=5, prompt_tokens=33,
                                                 output_tokens=7, concurrency=3))
    assert [len(r.prompt_ids) for r in w.requests] == [33] * 5
    assert {r.max_tokens for r in w.requests} == {7}
    d = w.describe()
    assert (d["arrival"], d["concurrency"], d["context_tokens_max"]) == ("closed", 3, 40)
    assert all(r.arrival_s is None for r in w.requests)


def test_poisson_and_bursty_arrivals():
    rng = random.Random(0)
    times = Arrival("poisson", rate_rps=4.0).times(rng, 400)
    assert times[0] == 0.0 and times == sorted(times)
    assert 80 < times[-1] < 120  # mean gap 0.25 s
    burst = Arrival("bursty", rate_rps=2.0, burst_size=4).times(random.Random(1), 10)
    assert burst[0:4] == [burst[0]] * 4 and burst[4:8] == [burst[4]] * 4 and burst[4] > burst[0]
    assert len(set(burst)) == 3


def test_lengths_distributions_stay_in_bounds():
    rng = random.Random(0)
    xs = [Lengths(8, 64, median=20).sample(rng) for _ in range(500)]
    assert min(xs) >= 8 and max(xs) <= 64 and 14 <= sorted(xs)[250] <= 26
    assert Lengths.fixed(5).sample(rng) == 5


def test_bad_input_gets_clear_messages(tok):
    with pytest.raises(TightfitError, match="unknown scenario 'nope'; known: .*chat"):
        get_scenario("nope")
    with pytest.raises(TightfitError, match="lo <= hi"):
        Lengths(10, 5)
    with pytest.raises(TightfitError, match="rate_rps"):
        Arrival("poisson")
    with pytest.raises(TightfitError, match="closed, poisson or bursty"):
        Arrival("weekly")  # type: ignore[arg-type]
    with pytest.raises(TightfitError, match="num_requests"):
        build_workload("chat", tok, 0, Overrides(num_requests=0))

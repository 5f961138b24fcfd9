"""The memory-pool and skewed-batching studies at small sizes on the default model: every
request finishes, the configurations differ the way they claim, and the CLI checks its input.
Timing ratios are reported by `tightfit study`, never asserted here (shared, noisy host)."""
from __future__ import annotations

import pytest

from tightfit.cli.main import main
from tightfit.engine.sampling_params import SamplingParams
from tightfit.studies.memory_pool import priority_study, tiers_study
from tightfit.studies.skewed_batching import skewed_batching_study
from tightfit.studies.workload_driver import Arrival, corpus_ids, drive


def test_priority_study_preempts_low_priority_for_high(default_llm):
    r = priority_study(default_llm, n_low=2, n_high=2, spacing_s=0.05, low_prompt=24,
                       low_tokens=24)
    # every batch slot is held by low priority: each high one must take a slot from one
    assert r["preemptions"] >= 1
    for key in ("high_ttft_p95_loaded_s", "high_ttft_p95_idle_s"):
        assert 0 < r[key] < 60
    assert r["ratio_p95"] == pytest.approx(r["high_ttft_p95_loaded_s"] / r["high_ttft_p95_idle_s"])


def test_tiers_study_runs_both_pools(default_llm):
    r = tiers_study(default_llm, n_long=2, n_short=3, long_prompt=520)
    assert set(r) == {"shared pool", "tiers 512/2048"}
    for v in r.values():
        assert 0 < v["short_p50_s"] <= v["short_p99_s"]


def test_skewed_batching_grouping_removes_padded_work(default_llm):
    r = skewed_batching_study(default_llm, long_tokens=200, short_tokens=12, gen=3)
    assert r["padded batch"]["wasted_kv_work"] > 0.5
    assert r["length-grouped"]["wasted_kv_work"] == 0.0


def test_gated_arrivals_wait_for_the_gate_and_count_from_it(default_llm):
    ids = corpus_ids(default_llm.tokenizer)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    seen = []

    def gate(engine):  # opens once the first request has produced 3 tokens
        running = engine.scheduler.running
        ok = bool(running) and running[0].num_tokens >= len(ids[:10]) + 3
        seen.append(ok)
        return ok

    done = drive(default_llm.derive(), [Arrival(0.0, ids[:10], params, label="first"),
                                         Arrival(0.0, ids[20:30], params, label="gated",
                                                 gated=True)], gate=gate)
    by = {f.label: f for f in done}
    assert set(by) == {"first", "gated"} and all(f.tokens == 6 for f in done)
    assert seen.count(False) >= 1 and seen[-1] is True
    assert by["gated"].latency_s < by["first"].latency_s


def test_gate_that_never_opens_is_an_error(default_llm):
    ids = corpus_ids(default_llm.tokenizer)
    with pytest.raises(RuntimeError, match="gate can never open"):
        drive(default_llm.derive(), [Arrival(0.0, ids[:5], SamplingParams(max_tokens=2),
                                             gated=True)], gate=lambda e: False)


@pytest.mark.parametrize("argv, needle", [
    (["study", "memory-pool", "--parts", "priority,speed"], "speed"),
    (["study", "memory-pool", "--budget", "12XB"], "12XB"),
    (["study", "skewed-batching", "--long-tokens", "4000"], "--long-tokens 4000"),
    (["study", "skewed-batching", "--short-tokens", "0"], "--short-tokens"),
])
def test_study_bad_input_is_one_line(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err

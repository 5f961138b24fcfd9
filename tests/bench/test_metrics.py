"""Timings -> results: exact values on hand-made timings."""
from __future__ import annotations

import pytest

from tightfit.bench.backends.base import Timing
from tightfit.bench.metrics import percentile, summarize


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20, 30, 40, 50], 90) == pytest.approx(46.0)
    assert percentile([], 50) is None


def test_summary_of_two_requests_exact():
    # A: arrives 0, first token 1, finishes 3 with 5 tokens (TPOT 0.5), prompt 100.
    # B: arrives 1, first token 2, finishes 6 with 3 tokens (TPOT 2.0), prompt 50, priority 1.
    ts = [Timing(0, 100, 5, 0, 0.0, 5, 1.0, 3.0), Timing(1, 50, 3, 1, 1.0, 3, 2.0, 6.0)]
    r = summarize(ts, slo_ttft_ms=1000, peak_rss_mib=123.0, load_time_s=2.5)
    assert r["num_ok"] == 2 and r["duration_s"] == 6.0
    assert r["ttft_s_p50"] == 1.0 and r["ttft_s_mean"] == 1.0
    assert r["tpot_s_p50"] == 1.25 and r["tpot_s_mean"] == 1.25
    assert r["e2e_s_p50"] == 4.0
    assert r["prefill_tok_s"] == 75.0  # median of 100/1 and 50/1
    # decoding windows [1, 3] and [2, 6] cover 5 s; tokens after the first: 4 + 2.
    assert r["decode_tok_s"] == pytest.approx(6 / 5)
    assert r["decode_tok_s_per_stream"] == pytest.approx((2.0 + 0.5) / 2)
    assert r["throughput_tok_s"] == pytest.approx(8 / 6)
    assert r["request_throughput_rps"] == pytest.approx(2 / 6)
    assert r["slo_ttft_attainment"] == 1.0
    assert r["ttft_s_p50_by_priority"] == {"0": 1.0, "1": 1.0}
    assert (r["peak_rss_mib"], r["load_time_s"]) == (123.0, 2.5)


def test_failed_requests_are_left_out_and_all_failed_raises():
    ok = Timing(0, 10, 2, 0, 0.0, 2, 0.5, 1.0)
    bad = Timing(1, 9999, 2, 0, 0.0, error="prompt too long")
    r = summarize([ok, bad])
    assert r["num_ok"] == 1 and r["prompt_tokens_total"] == 10 + 9999
    with pytest.raises(RuntimeError, match="prompt too long"):
        summarize([bad])


def test_single_token_outputs_have_no_tpot():
    r = summarize([Timing(0, 10, 1, 0, 0.0, 1, 0.2, 0.2)])
    assert r["tpot_s_p50"] is None and r["decode_tok_s"] is None and r["ttft_s_p50"] == 0.2

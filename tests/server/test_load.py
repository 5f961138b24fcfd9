"""Bounded load on loopback: 200 streaming requests at 32 concurrency, 16 tokens each, finish
with zero failures and flat memory (process RSS after the run within RSS_MARGIN_MB of RSS after
a warm-up at the same concurrency). The server runs in this process, so RSS covers both."""
from __future__ import annotations

import asyncio
from typing import Any

import psutil

from tightfit.server.loadtest import request_body, run_load, summarize

RSS_MARGIN_MB = 48
CONCURRENCY, REQUESTS, MAX_TOKENS = 32, 200, 16


def test_200_streaming_requests_at_32_concurrency(server: Any) -> None:
    body = request_body(MAX_TOKENS, model=server.model)
    warm = asyncio.run(run_load(server.url, CONCURRENCY, 2 * CONCURRENCY, body))
    assert all(r.ok for r in warm), {r.error for r in warm}
    server.wait_idle()
    rss_warm = psutil.Process().memory_info().rss / 2**20

    results = asyncio.run(run_load(server.url, CONCURRENCY, REQUESTS, body))
    server.wait_idle()
    rss_after = psutil.Process().memory_info().rss / 2**20

    summary = summarize("tightfit", CONCURRENCY, results, 1.0)
    assert summary.failures == 0, summary.errors
    assert len(results) == REQUESTS and all(r.tokens == MAX_TOKENS for r in results)
    assert all(r.ttft_s is not None and len(r.itl_s) <= MAX_TOKENS - 1 for r in results)
    assert rss_after - rss_warm < RSS_MARGIN_MB, (rss_warm, rss_after)
    assert server.engine.pool.num_free == server.engine.pool.num_blocks
    print(f"\nload: RSS {rss_warm:.0f} MiB after warm-up, {rss_after:.0f} MiB after "
          f"{REQUESTS} requests; TTFT p50 {summary.ttft_p50_s:.3f} s, p99 "
          f"{summary.ttft_p99_s:.3f} s; ITL p50 {summary.itl_p50_s:.3f} s, "
          f"p99 {summary.itl_p99_s:.3f} s")

"""The tightfit-http backend: the same engine behind the OpenAI-compatible server, driven by
streaming requests (shared session model; the server runs in a thread on a free port)."""
from __future__ import annotations

import pytest

pytest.importorskip("tightfit.server.app")
pytest.importorskip("httpx")


def test_streaming_requests_through_the_server(default_llm):
    from tightfit.bench.backends.base import BackendOptions
    from tightfit.bench.backends.http_backend import TightfitHTTPBackend
    from tightfit.bench.workloads import Arrival, BenchRequest

    b = TightfitHTTPBackend(BackendOptions(threads=2, max_num_seqs=4), llm=default_llm)
    b.load()
    try:
        reqs = [BenchRequest(i, tuple(range(300 + i, 310 + i)), 3, at, i % 2)
                for i, at in enumerate([0.0, 0.0, 0.2])]
        ts = b.run(reqs, Arrival("poisson", rate_rps=5.0))
        assert [t.output_tokens for t in ts] == [3, 3, 3]
        assert all(t.error is None and t.arrival_s <= t.first_token_s <= t.finished_s for t in ts)
        closed = b.run(reqs[:2], Arrival("closed", concurrency=1))
        assert closed[1].arrival_s >= closed[0].finished_s  # one at a time
    finally:
        b.close()

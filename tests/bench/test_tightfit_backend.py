"""The tightfit backend on the real default model (shared session LLM): closed and open loop,
exact output lengths, per-request failures; and one real run through a worker process."""
from __future__ import annotations

import pytest

from tightfit.bench.backends.base import BackendOptions
from tightfit.bench.backends.tightfit_backend import TightfitBackend, _check_quant_applied
from tightfit.bench.runner import Callbacks, RunContext, Task, run_tasks
from tightfit.bench.workloads import Arrival, BenchRequest, Overrides
from tightfit.errors import TightfitError


@pytest.fixture(scope="module")
def backend(default_llm):
    b = TightfitBackend(BackendOptions(threads=2, max_num_seqs=4), llm=default_llm)
    b.load()
    return b


def _req(i, n_prompt, n_out, at=None, priority=0):
    return BenchRequest(i, tuple(range(200 + i, 200 + i + n_prompt)), n_out, at, priority)


def test_closed_loop_keeps_concurrency_and_exact_lengths(backend):
    reqs = [_req(0, 10, 4), _req(1, 20, 3), _req(2, 30, 4)]
    ts = backend.run(reqs, Arrival("closed", concurrency=2))
    assert [t.output_tokens for t in ts] == [4, 3, 4]
    assert all(t.arrival_s <= t.first_token_s <= t.finished_s for t in ts)
    # the third is sent only when one of the first two has finished
    assert ts[2].arrival_s >= min(ts[0].finished_s, ts[1].finished_s)


def test_open_loop_uses_the_planned_arrival_times(backend):
    reqs = [_req(0, 8, 2, at=0.0), _req(1, 8, 2, at=0.3)]
    ts = backend.run(reqs, Arrival("poisson", rate_rps=1.0))
    assert [t.arrival_s for t in ts] == [0.0, 0.3]
    assert ts[1].first_token_s >= 0.3


def test_a_too_long_prompt_fails_only_its_request(backend):
    ts = backend.run([_req(0, 5000, 2), _req(1, 8, 2)], Arrival("closed", concurrency=2))
    assert "context window" in ts[0].error and ts[0].first_token_s is None
    assert ts[1].error is None and ts[1].output_tokens == 2


def test_run_config_and_weight_bytes(backend):
    cfg = backend.run_config()
    assert (cfg["backend"], cfg["engine"], cfg["max_num_seqs"], cfg["block_size"]) == \
        ("tightfit", "tightfit", 4, 16)
    assert cfg["kv_dtype"] == "fp32" and cfg["kv_cache_bytes"] == 256 * 2**20
    assert 30e6 < backend.weight_bytes() < 700e6  # ~135M params, packed or fp32


def test_an_unapplied_weight_format_is_refused():
    import torch

    fp32_model = torch.nn.Linear(1000, 1000)
    with pytest.raises(TightfitError, match="does not apply weight format 'int8'"):
        _check_quant_applied("int8", fp32_model)
    _check_quant_applied("fp32", fp32_model)
    packed = torch.nn.Module()
    packed.register_buffer("w", torch.zeros(1000, 500, dtype=torch.uint8))
    _check_quant_applied("int4-g64", packed)


def test_runner_end_to_end_on_the_real_model():
    """One real measurement through a worker process (loads the default model there)."""
    task = Task("tightfit", BackendOptions(threads=2), "ttft",
                Overrides(num_requests=2, output_tokens=2))
    got = []
    run_tasks([task], RunContext.gather(), Callbacks(result=lambda m, t: got.append(m)))
    (m,) = got
    assert m.status == "ok", m.error
    assert m.results.num_ok == 2 and m.results.output_tokens_total == 4
    assert 0 < m.results.ttft_s_p50 < 30 and m.results.peak_rss_mib > 300
    assert 200 < m.results.load_peak_rss_mib <= m.results.peak_rss_mib
    assert m.results.load_time_s > 0 and m.model.weight_bytes > 400e6

"""Fixtures for the dataset tests: a complete, valid measurement row built by hand."""
from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tightfit.data.schema import Measurement


def row(**changes: Any) -> dict[str, Any]:
    """A valid row as a dict (every field explicit); `changes` are dotted-path replacements."""
    base: dict[str, Any] = dict(
        schema_version=7, id="r1", run_key="k1", sweep="s", status="ok", error=None,
        created_at="2026-01-02T03:04:05Z", contended=False,
        hardware=dict(machine_id="m", kind="cpu", cpu_model="CPU", cpu_flags=["avx2"],
                      cpu_cores_physical=2, cpu_threads_logical=2, threads_used=2,
                      memory_total_gib=24.0, memory_bandwidth_gbps=20.0, matmul_gflops=100.0,
                      microbench_load_avg_1m=0.1, gpu_name=None, gpu_memory_gib=None, gpu_count=0,
                      load_avg_1m=0.5, other_cpu_cores_mean=0.0, probe_matmul_gflops=90.0,
                      probe_bandwidth_gbps=18.0, probe_kernel_gflops=40.0,
                      probe_bandwidth_threads_gbps=30.0, probe_kernel_stream_gbps=10.0,
                      os="Linux"),
        software=dict(python="3.11", tightfit="0.1.0", tightfit_commit="abc+dirty",
                      torch="2.13.0", transformers=None,
                      numpy="2.0", llama_cpp_python=None),
        model=dict(name="default", file_name="m.gguf", file_bytes=1, file_format="gguf:Q4_1",
                   architecture="llama", params_b=0.135, n_layers=30, hidden_size=576,
                   intermediate_size=1536, n_heads=9, n_kv_heads=3, head_dim=64, vocab_size=49152,
                   weight_format="fp32", weight_bytes=540_000_000),
        config=dict(backend="tightfit", engine="tightfit", threads=2, max_num_seqs=32,
                    max_batch_size=32, block_size=16, kv_cache_bytes=1, kv_dtype="fp32",
                    kv_retention=None, memory_budget_bytes=None, prefix_caching=True, extra={}),
        workload=dict(scenario="chat", seed=0, num_requests=2, arrival="closed", concurrency=1,
                      rate_rps=None, burst_size=None, prompt_tokens_mean=10.0, prompt_tokens_max=12,
                      gen_tokens_mean=4.0, gen_tokens_max=4, context_tokens_max=16,
                      priority_mix={"0": 1.0}, slo_ttft_ms=None),
        results=dict(num_ok=2, duration_s=1.0, ttft_s_mean=0.1, ttft_s_p50=0.1, ttft_s_p90=0.1,
                     ttft_s_p99=0.1, tpot_s_mean=0.05, tpot_s_p50=0.05, tpot_s_p90=0.05,
                     tpot_s_p99=0.05, e2e_s_p50=0.3, e2e_s_p99=0.3, prefill_tok_s=100.0,
                     decode_tok_s=20.0, decode_tok_s_per_stream=20.0, throughput_tok_s=8.0,
                     request_throughput_rps=2.0, output_tokens_total=8, prompt_tokens_total=20,
                     peak_rss_mib=500.0, load_time_s=1.0, load_peak_rss_mib=450.0,
                     slo_ttft_attainment=None,
                     ttft_s_p50_by_priority={"0": 0.1}))
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        target = base
        for p in parents:
            target = target[p]
        target[leaf] = value
    return base


@pytest.fixture
def make_row():
    return row


@pytest.fixture
def make_measurement():
    def make(**changes: Any) -> Measurement:
        return Measurement.model_validate(row(**changes))
    return make


@pytest.fixture
def utc():
    return dt.timezone.utc

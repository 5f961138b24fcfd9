"""The measurement schema shared by the bench (writer) and the predictor (reader): one pydantic
`Measurement` per benchmark run, versioned, with units in field names and explicit nulls.

Field metadata drives the quality gates: `key=True` marks fields the predictor cannot do without
(stricter missing-rate threshold); `na=True` marks fields that are null by design in some runs (a
GPU on a CPU machine, engine knobs another backend lacks) and are left out of missing rates.
Migration of older rows lives in `migrate.py`. No torch, numpy or engine import here.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

SCHEMA_VERSION = 7
Status = Literal["ok", "failed"]


def key(description: str, default: Any = ...) -> Any:
    """A field the predictor needs: missing-rate gate 0.5%. Required unless a default is given
    (explicit nulls: a writer must say `None`, not leave a field out)."""
    return Field(default=default, description=description, json_schema_extra={"key": True})


def na(description: str, default: Any = ...) -> Any:
    """A field that is null by design in some runs: not counted in missing rates."""
    return Field(default=default, description=description, json_schema_extra={"na": True})


def plain(description: str, default: Any = ...) -> Any:
    """An ordinary field: missing-rate gate 2%."""
    return Field(default=default, description=description)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class Hardware(_Strict):
    """The machine a run was taken on (see `tightfit.bench.fingerprint`)."""

    machine_id: str | None = key("stable hash of CPU model, core count and memory size")
    kind: Literal["cpu", "gpu", "apple"] | None = key("the device the model ran on")
    cpu_model: str | None = key("CPU model name as the OS reports it")
    cpu_flags: list[str] | None = plain("SIMD and matrix ISA flags relevant to inference")
    cpu_cores_physical: int | None = plain("physical cores of the machine")
    cpu_threads_logical: int | None = key("logical CPUs available to the process")
    threads_used: int | None = key("threads the backend was told to use")
    memory_total_gib: float | None = key("installed RAM, GiB")
    memory_bandwidth_gbps: float | None = key("measured copy bandwidth, GB/s (read + write)")
    matmul_gflops: float | None = key("measured fp32 matmul rate, GFLOP/s (all cores)")
    microbench_load_avg_1m: float | None = plain("1-min load average when the micro-benchmarks ran")
    gpu_name: str | None = na("GPU name through NVML (null: none)")
    gpu_memory_gib: float | None = na("GPU memory through NVML, GiB (null: no GPU)")
    gpu_count: int = plain("number of NVML GPUs", 0)
    load_avg_1m: float | None = key("1-min load average at the start of this run (contention)")
    probe_matmul_gflops: float | None = na(
        "fp32 GEMM rate (512^3 numpy, median over ~0.1 s) on the run's threads, mean of probes "
        "just before and after the run (null: rows before schema version 4)")
    probe_bandwidth_gbps: float | None = na(
        "copy rate (256 MiB numpy, read + write bytes, best of 3), mean of probes just before "
        "and after the run (null: rows before schema version 4)")
    probe_kernel_gflops: float | None = na(
        "rate of a hand-written block-format kernel (the lite runtime's Q4_0 matrix-vector "
        "product, 4096 x 4096, one token) on the run's threads, GFLOP/s, mean of probes just "
        "before and after the run (null: rows before schema version 5, no C compiler, or a CPU "
        "without AVX-512 VNNI, where that kernel is plain C)")
    probe_bandwidth_threads_gbps: float | None = na(
        "copy rate as probe_bandwidth_gbps, the copy split over the run's threads (equal to it "
        "at one thread), mean of probes just before and after the run (null: rows before "
        "schema version 6)")
    probe_kernel_stream_gbps: float | None = na(
        "rate at which the same kernel (Q8_0 here) streams a 16384 x 8192 matrix, 143 MB, "
        "beyond the caches, on the run's threads, GB/s of matrix bytes, mean of probes just "
        "before and after the run (null: rows before schema version 7, or as "
        "probe_kernel_gflops)")
    other_cpu_cores_mean: float | None = plain(
        "CPU cores kept busy by other processes during the run (system busy time minus this "
        "backend's own CPU time, per second of the run)")
    os: str | None = plain("operating system and kernel")


class Software(_Strict):
    python: str | None = plain("Python version")
    tightfit: str | None = plain("tightfit version")
    tightfit_commit: str | None = na(
        "git commit of the tightfit checkout, '+dirty' when it had local changes (null: not a "
        "checkout) - added in schema version 2")
    torch: str | None = na("torch version (null when not installed)")
    transformers: str | None = na("transformers version (null when not installed)")
    numpy: str | None = plain("numpy version")
    llama_cpp_python: str | None = na("llama-cpp-python version (null when not installed)")


class ModelDescriptor(_Strict):
    name: str = key("model name as given to the bench (e.g. 'default', 'gemma3', a path)")
    file_name: str | None = plain("model file name")
    file_bytes: int | None = plain("size of the model file on disk, bytes")
    file_format: str | None = plain("stored tensor format, e.g. 'gguf:Q4_1'")
    architecture: str | None = key("'llama', 'gemma3', ...")
    params_b: float | None = key("parameters, billions (embedding counted once)")
    n_layers: int | None = key("decoder layers")
    hidden_size: int | None = key("model width")
    intermediate_size: int | None = key("feed-forward width")
    n_heads: int | None = key("attention heads")
    n_kv_heads: int | None = key("key/value heads")
    head_dim: int | None = plain("per-head width")
    vocab_size: int | None = key("vocabulary size")
    weight_format: str = key("weights as run: fp32 | int8 | int4-g64 | native | ...")
    weight_bytes: int | None = key("bytes of weights as held in memory for the run")


class RunConfig(_Strict):
    backend: str = key("bench backend: tightfit | tightfit-http | tightfit-serve | hf | llamacpp | "
                       "llama-server")
    engine: str = key("engine family, as the predictor names it: tightfit | hf-transformers | "
                      "llama.cpp")
    threads: int = key("threads the backend used")
    max_num_seqs: int | None = na("batch cap: sequences decoded together (tightfit)")
    max_batch_size: int | None = plain("most requests batched in one step by this backend")
    block_size: int | None = na("KV block size, tokens (tightfit)")
    kv_cache_bytes: int | None = na("KV pool size, bytes (tightfit)")
    kv_dtype: str | None = na("KV cache dtype (null: the backend's default)")
    kv_retention: float | None = na("fraction of KV kept by compression (null: all)")
    memory_budget_bytes: int | None = na("engine memory budget, bytes (null: none)")
    prefix_caching: bool | None = na("prefix cache enabled (tightfit)")
    extra: dict[str, Any] = plain("other backend options, as given", {})


class WorkloadDescriptor(_Strict):
    scenario: str = key("named scenario template (tightfit.bench.workloads)")
    seed: int = plain("seed of prompt cutting, lengths, arrivals and priorities", 0)
    num_requests: int = key("requests in the run")
    arrival: Literal["closed", "poisson", "bursty"] = key("arrival process")
    concurrency: int | None = na("requests in flight (closed loop)")
    rate_rps: float | None = na("mean arrival rate, requests/s (open loop)")
    burst_size: int | None = na("requests per burst (bursty)")
    prompt_tokens_mean: float = key("mean prompt length, tokens")
    prompt_tokens_max: int = plain("longest prompt, tokens")
    gen_tokens_mean: float = key("mean requested output length, tokens")
    gen_tokens_max: int = plain("longest requested output, tokens")
    context_tokens_max: int = key("longest prompt + output, tokens")
    priority_mix: dict[str, float] = plain("share of requests per priority (lower = sooner)", {})
    slo_ttft_ms: float | None = na("the scenario's TTFT target, ms (null: none)")


class Results(_Strict):
    num_ok: int = key("requests that completed")
    duration_s: float = key("first arrival to last finish, seconds")
    ttft_s_mean: float | None = key("time to first token, mean over requests, s")
    ttft_s_p50: float | None = key("TTFT median, s")
    ttft_s_p90: float | None = plain("TTFT 90th percentile, s")
    ttft_s_p99: float | None = plain("TTFT 99th percentile, s")
    tpot_s_mean: float | None = key("time per output token after the first, mean, s")
    tpot_s_p50: float | None = key("TPOT median, s")
    tpot_s_p90: float | None = plain("TPOT 90th percentile, s")
    tpot_s_p99: float | None = plain("TPOT 99th percentile, s")
    e2e_s_p50: float | None = plain("arrival to last token, median, s")
    e2e_s_p99: float | None = plain("arrival to last token, 99th percentile, s")
    prefill_tok_s: float | None = key(
        "median over requests of prompt tokens / TTFT (queueing included)")
    decode_tok_s: float | None = key(
        "tokens after the first, summed over requests, per second of decoding")
    decode_tok_s_per_stream: float | None = plain("median of one request's decode rate, tok/s")
    throughput_tok_s: float | None = key("output tokens / duration, tok/s")
    request_throughput_rps: float | None = plain("completed requests / duration, 1/s")
    output_tokens_total: int = plain("output tokens produced", 0)
    prompt_tokens_total: int = plain("prompt tokens submitted", 0)
    peak_rss_mib: float | None = key("peak resident memory of the backend process so far, MiB")
    load_time_s: float | None = key("model load time of the backend process, s")
    load_peak_rss_mib: float | None = na(
        "peak resident memory of the backend process when load and warm-up ended, before any "
        "measured run, MiB (null: rows before schema 3)", None)
    slo_ttft_attainment: float | None = na("share of requests meeting the scenario's TTFT target")
    ttft_s_p50_by_priority: dict[str, float] = plain("TTFT median per priority class, s", {})


class Measurement(_Strict):
    schema_version: int = Field(default=SCHEMA_VERSION, description="schema version of this row")
    id: str = key("unique id of this row")
    run_key: str = key("hash of everything that defines the run (resumable sweeps skip it)")
    sweep: str | None = plain("sweep name, or 'compare' for `tightfit bench`")
    created_at: dt.datetime = key("when the run finished, ISO 8601 UTC")
    status: Status = key("ok | failed")
    error: str | None = na("why the run failed (null when ok)")
    contended: bool | None = plain(
        "other processes took >= 0.25 of a core on average during the run (see hardware)")
    hardware: Hardware
    software: Software
    model: ModelDescriptor
    config: RunConfig
    workload: WorkloadDescriptor | None = na(
        "the workload (null if the run failed before it was built)")
    results: Results | None = na("results (null when the run failed)")

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: dt.datetime) -> dt.datetime:
        if value.tzinfo is None:
            raise ValueError("created_at must carry a timezone (UTC)")
        return value.astimezone(dt.timezone.utc)

    @field_serializer("created_at")
    def _iso(self, value: dt.datetime) -> str:
        iso = value.astimezone(dt.timezone.utc).isoformat(timespec="seconds")
        return iso.replace("+00:00", "Z")


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)

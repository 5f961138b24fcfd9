"""Memory-pool benchmarks (issue: memory pool under a hard budget), each configuration side by
side in one run on the same weights:
  priority  - high-priority TTFT p95 with the pool saturated by low-priority work vs idle engine
  tiers     - short requests' p99 latency under a flood of long ones: tiers vs one shared pool
  budget    - peak RSS under load vs the --memory-budget it was given
Timings are wall-clock on whatever machine runs it; compare the columns, not across runs."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from tightfit.engine.sampling_params import SamplingParams
from tightfit.sysmem import peak_rss_bytes, reset_peak_rss
from tightfit.studies.workload_driver import Arrival, corpus_ids, drive, percentile


def priority_study(llm: Any, n_low: int = 12, n_high: int = 16, spacing_s: float = 0.25,
                   low_prompt: int = 160, low_tokens: int = 160) -> dict[str, float]:
    """Low-priority requests fill every batch slot and the KV pool (sized to hold them with
    little to spare); once all of them are past prefill, high-priority requests arrive every
    `spacing_s`. Their TTFT p95 is compared with the same arrivals on an idle engine."""
    ids = corpus_ids(llm.tokenizer)
    high = [Arrival(spacing_s * i, ids[5000 + 50 * i:5000 + 50 * i + 24],
                    SamplingParams(max_tokens=8, ignore_eos=True), 0, "high", gated=True)
            for i in range(n_high)]
    low = [Arrival(0.0, ids[200 * i:200 * i + low_prompt],
                   SamplingParams(max_tokens=low_tokens, ignore_eos=True), 9, "low")
           for i in range(n_low)]
    need = n_low * (low_prompt + low_tokens)
    busy = llm.derive(kv_cache_bytes=need * llm.loaded.config.kv_bytes_per_token(4),
                      max_num_seqs=n_low, tiers=(("all", 2048, 1.0),))
    loaded = [f.ttft_s for f in drive(busy, low + high, gate=_saturated(n_low))
              if f.label == "high"]
    idle = [f.ttft_s for f in drive(llm.derive(), [replace(h, gated=False) for h in high])]
    stats = busy.engine.scheduler
    return {"high_ttft_p50_loaded_s": percentile(loaded, 50),
            "high_ttft_p95_loaded_s": percentile(loaded, 95),
            "high_ttft_p50_idle_s": percentile(idle, 50),
            "high_ttft_p95_idle_s": percentile(idle, 95),
            "ratio_p95": percentile(loaded, 95) / percentile(idle, 95),
            "preemptions": stats.num_preemptions, "swaps": stats.num_swaps}


def _saturated(n_running: int) -> Any:
    """Gate: n_running requests hold batch slots and none is still prefilling."""
    def gate(engine: Any) -> bool:
        sch = engine.scheduler
        return (len(sch.running) >= n_running and not sch.waiting
                and all(s.num_computed_tokens >= s.num_prompt_tokens for s in sch.running))
    return gate


def tiers_study(llm: Any, n_long: int = 6, n_short: int = 16,
                long_prompt: int = 900) -> dict[str, dict[str, float]]:
    ids = corpus_ids(llm.tokenizer)
    longs = [Arrival(0.0, ids[1000 * i:1000 * i + long_prompt],
                     SamplingParams(max_tokens=48, ignore_eos=True), 0, "long")
             for i in range(n_long)]
    shorts = [Arrival(0.3 + 0.25 * i, ids[9000 + 40 * i:9000 + 40 * i + 30],
                      SamplingParams(max_tokens=16, ignore_eos=True), 0, "short")
              for i in range(n_short)]
    kv = (long_prompt + 48) * 3 * llm.loaded.config.kv_bytes_per_token(4)  # 3 long requests
    out = {}
    for name, tiers in (("shared pool", (("all", 2048, 1.0),)),
                        ("tiers 512/2048", (("short", 512, 0.3), ("long", 2048, 0.7)))):
        run = llm.derive(kv_cache_bytes=kv, tiers=tiers, max_num_seqs=32)
        lat = [f.latency_s for f in drive(run, longs + shorts) if f.label == "short"]
        out[name] = {"short_p50_s": percentile(lat, 50), "short_p99_s": percentile(lat, 99)}
    return out


def budget_study_subprocess(budget: str = "640MiB", quant: str = "native",
                            model: str | None = None, n: int = 24) -> dict[str, float]:
    """budget_study in a fresh interpreter: the caller's own loaded model must not count."""
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(budget_study, (budget, quant, model, n))


def budget_study(budget: str = "640MiB", quant: str = "native", model: str | None = None,
                 n: int = 24) -> dict[str, float]:
    """Run in a fresh process for an honest peak RSS (the caller's own model would count)."""
    from tightfit import LLM
    from tightfit.config import parse_bytes

    llm = LLM(model, quant=quant, memory_budget=budget)
    load_peak = peak_rss_bytes()  # conversion temporaries of the load itself
    reset_peak_rss()
    ids = corpus_ids(llm.tokenizer)
    prompts = [ids[300 * i:300 * i + 250] for i in range(n)]
    llm.generate(prompts, SamplingParams(max_tokens=64, ignore_eos=True))
    peak = peak_rss_bytes()
    b = parse_bytes(budget)
    return {"budget_mib": b / 2**20, "peak_rss_mib": peak / 2**20,
            "load_peak_rss_mib": load_peak / 2**20,
            "overshoot_mib": (peak - b) / 2**20, "kv_tokens": llm.engine.kv_capacity_tokens,
            "preemptions": llm.engine.scheduler.num_preemptions}

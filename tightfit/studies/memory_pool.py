"""Memory-pool benchmarks (issue: memory pool under a hard budget), each configuration side by
side in one run on the same weights:
  priority  - high-priority TTFT p95 with the pool saturated by low-priority work vs idle engine
  tiers     - short requests' p99 latency under a flood of long ones: tiers vs one shared pool
  budget    - peak RSS under load vs the --memory-budget it was given
Timings are wall-clock on whatever machine runs it; compare the columns, not across runs."""
from __future__ import annotations

import resource
from typing import Any

from tightfit.engine.sampling_params import SamplingParams
from tightfit.studies.workload_driver import Arrival, corpus_ids, drive, percentile


def priority_study(llm: Any, n_low: int = 12, n_high: int = 8) -> dict[str, float]:
    ids = corpus_ids(llm.tokenizer)
    high = [Arrival(0.5 + 0.4 * i, ids[5000 + 50 * i:5000 + 50 * i + 24],
                    SamplingParams(max_tokens=8, ignore_eos=True), 0, "high")
            for i in range(n_high)]
    low = [Arrival(0.0, ids[200 * i:200 * i + 160], SamplingParams(max_tokens=96, ignore_eos=True),
                   9, "low") for i in range(n_low)]
    # the pool holds the low-priority load with little to spare
    need = n_low * (160 + 96)
    busy = llm.derive(kv_cache_bytes=need * llm.loaded.config.kv_bytes_per_token(4),
                      max_num_seqs=n_low, tiers=(("all", 2048, 1.0),))
    loaded = [f.ttft_s for f in drive(busy, low + high) if f.label == "high"]
    idle = [f.ttft_s for f in drive(llm.derive(), high)]
    return {"high_ttft_p95_loaded_s": percentile(loaded, 95),
            "high_ttft_p95_idle_s": percentile(idle, 95),
            "ratio": percentile(loaded, 95) / percentile(idle, 95),
            "preemptions": busy.engine.scheduler.num_preemptions}


def tiers_study(llm: Any, n_long: int = 6, n_short: int = 16) -> dict[str, dict[str, float]]:
    ids = corpus_ids(llm.tokenizer)
    longs = [Arrival(0.0, ids[1000 * i:1000 * i + 900], SamplingParams(max_tokens=48,
                                                                        ignore_eos=True), 0, "long")
             for i in range(n_long)]
    shorts = [Arrival(0.3 + 0.25 * i, ids[9000 + 40 * i:9000 + 40 * i + 30],
                      SamplingParams(max_tokens=16, ignore_eos=True), 0, "short")
              for i in range(n_short)]
    kv = 3000 * llm.loaded.config.kv_bytes_per_token(4)  # ~3 long requests' worth
    out = {}
    for name, tiers in (("shared pool", (("all", 2048, 1.0),)),
                        ("tiers 512/2048", (("short", 512, 0.3), ("long", 2048, 0.7)))):
        run = llm.derive(kv_cache_bytes=kv, tiers=tiers, max_num_seqs=32)
        lat = [f.latency_s for f in drive(run, longs + shorts) if f.label == "short"]
        out[name] = {"short_p50_s": percentile(lat, 50), "short_p99_s": percentile(lat, 99)}
    return out


def budget_study(budget: str = "640MiB", quant: str = "native", n: int = 24) -> dict[str, float]:
    """Run in a fresh process for an honest peak RSS (the caller's own model would count)."""
    from tightfit import LLM
    from tightfit.config import parse_bytes

    llm = LLM(quant=quant, memory_budget=budget)
    ids = corpus_ids(llm.tokenizer)
    prompts = [ids[300 * i:300 * i + 250] for i in range(n)]
    llm.generate(prompts, SamplingParams(max_tokens=64, ignore_eos=True))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    b = parse_bytes(budget)
    return {"budget_mib": b / 2**20, "peak_rss_mib": peak / 2**20,
            "overshoot_mib": (peak - b) / 2**20, "kv_tokens": llm.engine.kv_capacity_tokens,
            "preemptions": llm.engine.scheduler.num_preemptions}

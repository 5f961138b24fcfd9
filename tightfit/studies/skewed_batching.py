"""Skewed request lengths under dynamic batching (source brief ch. 3.3): seven short requests
and one very long one decode together. Without length grouping every decode step pads the
batch's attention to the longest context; with it, decodes are grouped by length bucket.
Reports padded vs useful K/V work and latency, both configurations in one run."""
from __future__ import annotations

import time
from typing import Any

from tightfit.engine.sampling_params import SamplingParams
from tightfit.studies.workload_driver import corpus_ids


def skewed_batching_study(llm: Any, long_tokens: int = 1800, short_tokens: int = 40,
                          n_short: int = 7, gen: int = 32) -> dict[str, dict[str, float]]:
    ids = corpus_ids(llm.tokenizer)
    prompts = [ids[4000 + 100 * i:4000 + 100 * i + short_tokens] for i in range(n_short)]
    prompts.append(ids[:long_tokens])
    params = SamplingParams(max_tokens=gen, ignore_eos=True)
    out = {}
    for name, grouping in (("padded batch", False), ("length-grouped", True)):
        run = llm.derive(length_grouping=grouping)
        t0 = time.perf_counter()
        res = run.generate(prompts, params)
        wall = time.perf_counter() - t0
        r = run.engine.runner
        short_lat = [o.metrics.finished_time - o.metrics.arrival_time for o in res[:n_short]]
        out[name] = {"wasted_kv_work": 1 - r.kv_slots_useful / max(1, r.kv_slots_padded),
                     "wall_s": wall, "short_mean_latency_s": sum(short_lat) / n_short,
                     "agg_tok_s": sum(len(o.token_ids) for o in res) / wall}
    return out

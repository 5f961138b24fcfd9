"""Per-request timings -> the dataset's `Results` fields. Pure Python, exact on given inputs.

Definitions (also in docs/measurements.md): TTFT = first token - arrival (queueing included);
TPOT = (last token - first token) / (tokens - 1); decode tok/s = tokens after the first, summed
over requests, per second of the window in which any request was decoding; throughput = all
output tokens / (last finish - first arrival); prefill tok/s = median of prompt tokens / TTFT.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Sequence

from tightfit.bench.backends.base import Timing


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def completed(timings: Sequence[Timing]) -> list[Timing]:
    return [t for t in timings if t.error is None and t.first_token_s is not None
            and t.finished_s is not None]


def summarize(timings: Sequence[Timing], slo_ttft_ms: float | None = None,
              peak_rss_mib: float | None = None,
              load_time_s: float | None = None,
              load_peak_rss_mib: float | None = None) -> dict[str, Any]:
    ok = completed(timings)
    if not ok:
        errors = sorted({t.error for t in timings if t.error})
        raise RuntimeError("no request completed" + (f": {errors[0]}" if errors else ""))
    ttft = [t.first_token_s - t.arrival_s for t in ok]  # type: ignore[operator]
    tpot = [_tpot(t) for t in ok if t.output_tokens > 1]
    e2e = [t.finished_s - t.arrival_s for t in ok]  # type: ignore[operator]
    start = min(t.arrival_s for t in ok)
    end = max(t.finished_s for t in ok)  # type: ignore[type-var]
    duration = end - start
    out_total = sum(t.output_tokens for t in ok)
    return dict(
        num_ok=len(ok), duration_s=duration,
        ttft_s_mean=_mean(ttft), ttft_s_p50=percentile(ttft, 50), ttft_s_p90=percentile(ttft, 90),
        ttft_s_p99=percentile(ttft, 99),
        tpot_s_mean=_mean(tpot), tpot_s_p50=percentile(tpot, 50), tpot_s_p90=percentile(tpot, 90),
        tpot_s_p99=percentile(tpot, 99),
        e2e_s_p50=percentile(e2e, 50), e2e_s_p99=percentile(e2e, 99),
        prefill_tok_s=percentile([t.prompt_tokens / d for t, d in zip(ok, ttft) if d > 0], 50),
        decode_tok_s=_decode_rate(ok),
        decode_tok_s_per_stream=percentile([1.0 / x for x in tpot if x > 0], 50),
        throughput_tok_s=out_total / duration if duration > 0 else None,
        request_throughput_rps=len(ok) / duration if duration > 0 else None,
        output_tokens_total=out_total, prompt_tokens_total=sum(t.prompt_tokens for t in timings),
        peak_rss_mib=peak_rss_mib, load_time_s=load_time_s, load_peak_rss_mib=load_peak_rss_mib,
        slo_ttft_attainment=(sum(x * 1000 <= slo_ttft_ms for x in ttft) / len(ok)
                             if slo_ttft_ms is not None else None),
        ttft_s_p50_by_priority=_by_priority(ok, ttft))


def _tpot(t: Timing) -> float:
    return (t.finished_s - t.first_token_s) / (t.output_tokens - 1)  # type: ignore[operator]


def _decode_rate(ok: Sequence[Timing]) -> float | None:
    """Tokens after each request's first, over the union of the requests' decoding intervals."""
    spans = sorted((t.first_token_s, t.finished_s) for t in ok if t.output_tokens > 1)
    covered, cur_lo, cur_hi = 0.0, None, None
    for lo, hi in spans:
        if cur_hi is None or lo > cur_hi:
            covered += (cur_hi - cur_lo) if cur_hi is not None else 0.0  # type: ignore[operator]
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)  # type: ignore[type-var]
    covered += (cur_hi - cur_lo) if cur_hi is not None else 0.0  # type: ignore[operator]
    tokens = sum(t.output_tokens - 1 for t in ok if t.output_tokens > 1)
    return tokens / covered if covered > 0 else None


def _by_priority(ok: Sequence[Timing], ttft: Sequence[float]) -> dict[str, float]:
    groups: dict[int, list[float]] = defaultdict(list)
    for t, x in zip(ok, ttft):
        groups[t.priority].append(x)
    return {str(p): percentile(xs, 50) for p, xs in sorted(groups.items())}  # type: ignore[misc]

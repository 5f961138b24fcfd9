"""The KV-compression study (brief ch. 3.1): perplexity and top-1 agreement against the
uncompressed fp32 cache when each sequence keeps only a fraction r of its tokens (an eviction
policy) and/or stores K/V as int8; KV bytes per token; latency per token per r.

Quality runs the project's perplexity protocol (engine/scoring.py windows). Each window is
scored in one forward whose attention (the `attend` hook of AttentionMetadata) replays eviction
token by token, layer by layer (kv_compress.simulate_eviction): query t sees exactly the keys
that a cache limited to floor(r x (t + 1)) tokens (never fewer than the policy's floor, 5 by
default) would hold, as in token-by-token decoding,
without 512 forwards. This bypasses the paged cache, which is much simpler than giving block
tables holes. Latency times real decode steps through the engine's fast paged path gathering
only the kept slots (what eviction would cost in the engine) plus the per-step eviction
bookkeeping, on random K/V and, for heavy hitters, random scores (timing does not depend on
the values); rows are timed interleaved and a noise floor is reported.
Limits: one kept set per layer, shared by its heads; sliding-window layers (Gemma 3) keep their
window and are not evicted; the engine itself does not evict yet.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from tightfit.config import CacheConfig, ModelConfig
from tightfit.engine.attention import (AttentionGroup, AttentionMetadata, fast_attention,
                                       int8_round_trip, make_kv_cache)
from tightfit.engine.kv_compress import (EvictionPolicy, check_ratio, make_policy,
                                         retention_budget, simulate_eviction, softmax_mass)
from tightfit.engine.scoring import WINDOW_TOKENS, TokenScores, corpus_windows, perplexity
from tightfit.errors import TightfitError

DEFAULT_POLICIES = ("sink-recent", "heavy-hitter")


def ratio_grid(step: float = 0.1, low: float = 0.1, high: float = 0.9) -> list[float]:
    """low, low + step, ..., high (the brief's sweep is step 0.05)."""
    if step <= 0 or high < low:
        raise TightfitError(f"bad ratio grid: {low}..{high} step {step}")
    return [round(low + i * step, 6) for i in range(round((high - low) / step) + 1)]


@dataclass
class _Occupancy:
    """Kept (query, key) pairs vs the uncompressed causal count, summed over layers."""

    kept: int = 0
    full: int = 0


def _head_logits(attn: Any, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Pre-softmax scores [H, T, T] of one layer (GQA keys repeated per query head)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return torch.einsum("qhd,khd->hqk", q, k) * attn.scale


def _mask(attn: Any, q: torch.Tensor, k: torch.Tensor, policy: EvictionPolicy | None,
          ratio: float) -> torch.Tensor:
    t = q.shape[0]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    if attn.window is not None:  # sliding layers keep their own window, no eviction
        return causal & ~torch.ones(t, t, dtype=torch.bool).tril(-attn.window)
    if policy is None or ratio >= 1.0:
        return causal
    return simulate_eviction(_head_logits(attn, q, k), policy, ratio)


def _attend_fn(policy: EvictionPolicy | None, ratio: float, kv_dtype: str,
               occ: _Occupancy) -> Callable[..., torch.Tensor]:
    def attend(attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if kv_dtype == "int8":  # attention sees what an int8 cache would hold
            k, v = int8_round_trip(k), int8_round_trip(v)
        mask = _mask(attn, q, k, policy, ratio)
        t = q.shape[0]
        occ.kept += int(mask.sum())
        occ.full += t * (t + 1) // 2
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], attn_mask=mask,
                                           scale=attn.scale, enable_gqa=True)
        return o[0].transpose(0, 1)
    return attend


def compressed_logits(model: Any, ids: Sequence[int], policy: EvictionPolicy | None = None,
                      ratio: float = 1.0, kv_dtype: str = "fp32") -> tuple[torch.Tensor, float]:
    """Logits [n, vocab] at every position of `ids` under eviction at ratio r (and int8 K/V),
    and the mean cache occupancy relative to the uncompressed cache (1.0 = nothing evicted)."""
    occ = _Occupancy()
    meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), groups=[],
                             attend=_attend_fn(policy, check_ratio(ratio), kv_dtype, occ))
    n = len(ids)
    no_cache = [(None, None)] * len(model.layers)
    with torch.inference_mode():
        logits = model(torch.tensor(list(ids)), torch.arange(n), meta, no_cache, torch.arange(n))
    return logits, occ.kept / occ.full


def score_compressed(model: Any, ids: Sequence[int], policy: EvictionPolicy | None = None,
                     ratio: float = 1.0, kv_dtype: str = "fp32") -> tuple[TokenScores, float]:
    """Per-position NLL and top-1 of one window under compression, and the mean occupancy."""
    logits, occupancy = compressed_logits(model, ids, policy, ratio, kv_dtype)
    logits = logits[:-1].to(torch.float64)
    nll = F.cross_entropy(logits, torch.tensor(list(ids)[1:]), reduction="none")
    return TokenScores(nll=nll, top1=logits.argmax(dim=-1)), occupancy


# ---- latency: real decode steps through the paged fast path, gathering only the kept slots ----

def _filled_caches(cfg: ModelConfig, tokens: int, block_size: int, kv_dtype: str,
                   seed: int = 0) -> list[tuple[Any, Any]]:
    blocks = -(-tokens // block_size)
    slots, row = blocks * block_size, (cfg.num_kv_heads, cfg.head_dim)
    gen = torch.Generator().manual_seed(seed)
    caches = []
    for _ in range(cfg.num_layers):
        pair = (make_kv_cache((blocks, block_size, *row), kv_dtype),
                make_kv_cache((blocks, block_size, *row), kv_dtype))
        for c in pair:
            c.view(-1, *row).index_copy_(0, torch.arange(slots),
                                         torch.randn(slots, *row, generator=gen))
        caches.append(pair)
    return caches


def kept_positions(policy: EvictionPolicy | None, ratio: float, context: int,
                   seed: int = 0) -> torch.Tensor:
    """Positions 0..context (the newest = the decoding token) kept at ratio r; heavy hitters
    chosen by random scores (a scattered set, as accumulated attention gives)."""
    positions = torch.arange(context + 1)
    if policy is None or ratio >= 1.0:
        return positions
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(context + 1, generator=gen) if policy.needs_scores else None
    budget = retention_budget(ratio, context + 1, policy.min_tokens)
    return positions[policy.select(positions, scores, budget)]


def decode_step_fns(model: Any, caches: list[tuple[Any, Any]], kept: torch.Tensor,
                    policy: EvictionPolicy | None) -> dict[str, Callable[[], Any]]:
    """Callables for one decode step at the newest kept position: "step" = the whole model
    forward attending to the kept slots (block table = identity, so slot = position),
    "attention" = its attention alone (all layers), "evict" = the step's eviction bookkeeping
    for all layers as this study does it (select among kept + 1 tokens; heavy hitters first add
    the new query's attention mass)."""
    cfg = model.cfg
    pos = int(kept[-1])
    meta = AttentionMetadata(slot_mapping=torch.tensor([pos]),
                             groups=[AttentionGroup(0, 1, 1, kept.view(1, -1), None)])
    args = (torch.tensor([0]), torch.tensor([pos]), meta, caches, torch.tensor([0]))
    q = torch.randn(1, cfg.num_heads, cfg.head_dim)
    k = torch.randn(1, cfg.num_kv_heads, cfg.head_dim)
    n = len(kept)
    z = np.random.default_rng(0).standard_normal((cfg.num_heads, n))
    mass = torch.zeros(n + 1, dtype=torch.float64)

    def attention() -> None:
        for kc, vc in caches:
            fast_attention(q, k, k, kc, vc, meta, cfg.head_dim ** -0.5, False)

    def evict() -> None:
        if policy is None or n == pos + 1:  # nothing is evicted at this ratio
            return
        for _ in range(cfg.num_layers):
            if policy.needs_scores:
                mass.numpy()[:n] += softmax_mass(z)
            policy.select(torch.arange(n + 1), mass if policy.needs_scores else None, n)
    return {"step": lambda: model(*args), "attention": attention, "evict": evict}


def _time_ms(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _relative_iqr(times: list[float]) -> float:
    q1, _, q3 = statistics.quantiles(times, n=4)
    return (q3 - q1) / statistics.median(times)


# ---- the sweep ----

@dataclass(frozen=True)
class StudyRow:
    policy: str  # "none" = no eviction
    ratio: float
    kv_dtype: str
    perplexity: float
    top1_agreement: float  # vs the uncompressed fp32 cache, same positions
    occupancy: float  # mean cached tokens / uncompressed (all layers, all steps)
    kv_bytes_per_token: float  # per token of context: bytes per cached token x occupancy
    kv_bytes_at_end: int  # the cache of one full window at this ratio
    decode_ms: float | None = None  # one model decode step over the kept slots (median)
    attention_ms: float | None = None  # its attention alone, all layers
    evict_ms: float | None = None  # the step's eviction bookkeeping, all layers

    @property
    def token_ms(self) -> float | None:
        """Latency per generated token: decode step plus eviction bookkeeping."""
        return None if self.decode_ms is None else self.decode_ms + (self.evict_ms or 0.0)


@dataclass(frozen=True)
class KVStudyResult:
    model: str
    windows: int
    window_tokens: int
    protocol_perplexity: float  # the engine's own scoring (scoring.py), fp32 cache
    bytes_per_token: dict[str, int]  # kv_dtype -> bytes per cached token
    latency_context: int
    rows: list[StudyRow] = field(default_factory=list)
    # median over rows of the decode-step times' interquartile range / median: the noise floor
    latency_noise: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _row(policy: str, ratio: float, kv_dtype: str, scores: list[TokenScores],
         base: list[TokenScores], occupancy: float, per_token: int, tokens: int) -> StudyRow:
    nll = torch.cat([s.nll for s in scores])
    agree = torch.cat([s.top1 == b.top1 for s, b in zip(scores, base)]).double().mean()
    return StudyRow(policy, ratio, kv_dtype, perplexity(nll), float(agree), occupancy,
                    per_token * occupancy, per_token * retention_budget(ratio, tokens))


def _sweep_one(llm: Any, windows: list[list[int]], policy: EvictionPolicy | None, ratio: float,
               kv_dtype: str, base: list[TokenScores]) -> StudyRow:
    model = llm.loaded.model
    out = [score_compressed(model, w, policy, ratio, kv_dtype) for w in windows]
    per_token = CacheConfig(kv_dtype=kv_dtype).kv_bytes_per_token(model.cfg)
    occupancy = statistics.fmean(o for _, o in out)
    return _row(policy.name if policy else "none", ratio, kv_dtype, [s for s, _ in out], base,
                occupancy, per_token, len(windows[0]))


def _protocol_ppl(llm: Any, windows: list[list[int]]) -> float:
    from tightfit.engine.scoring import score_tokens

    fp32 = llm if llm.config.cache.kv_dtype == "fp32" else llm.derive(kv_dtype="fp32")
    return perplexity(torch.cat([score_tokens(fp32, w).nll for w in windows]))


def _with_latency(rows: list[StudyRow], llm: Any, policies: dict[str, EvictionPolicy],
                  context: int, repeats: int) -> tuple[list[StudyRow], float]:
    """Times every row; rows are interleaved round by round (round 0 warms up) so that load
    from other processes hits all ratios alike. Returns the rows and the noise floor."""
    model, block = llm.loaded.model, llm.config.cache.block_size
    caches = {dt: _filled_caches(model.cfg, context + 1, block, dt)
              for dt in sorted({r.kv_dtype for r in rows})}
    fns = [decode_step_fns(model, caches[r.kv_dtype],
                           kept_positions(policies.get(r.policy), r.ratio, context),
                           policies.get(r.policy)) for r in rows]
    times: list[dict[str, list[float]]] = [{name: [] for name in f} for f in fns]
    with torch.inference_mode():
        for round_ in range(repeats + 1):
            for f, t in zip(fns, times):
                for name, fn in f.items():
                    ms = _time_ms(fn)
                    if round_:
                        t[name].append(ms)
    med = statistics.median
    out = [replace(r, decode_ms=med(t["step"]), attention_ms=med(t["attention"]),
                   evict_ms=med(t["evict"])) for r, t in zip(rows, times)]
    return out, med(_relative_iqr(t["step"]) for t in times)


def run_kv_study(llm: Any, ratios: Sequence[float] | None = None,
                 policies: Sequence[str] = DEFAULT_POLICIES, windows: int = 2,
                 window_tokens: int = WINDOW_TOKENS, kv_dtype: str = "fp32", sinks: int = 4,
                 recent_frac: float = 0.5, latency_context: int = 512, latency_repeats: int = 10,
                 progress: Callable[[str], None] | None = None) -> KVStudyResult:
    """The sweep: the uncompressed fp32 baseline, int8 without eviction (kv_dtype="int8"), then
    every policy x ratio with K/V in kv_dtype; latency per row when latency_context > 0."""
    ratios = [check_ratio(r) for r in (ratios if ratios is not None else ratio_grid())]
    if kv_dtype not in ("fp32", "int8"):
        raise TightfitError(f"kv_dtype must be fp32 or int8, got {kv_dtype!r}")
    options = {"sink-recent": {"sinks": sinks}, "heavy-hitter": {"recent_frac": recent_frac}}
    made = {p: make_policy(p, **options.get(p, {})) for p in policies}
    say = progress or (lambda _msg: None)
    wins = corpus_windows(llm.tokenizer, windows, window_tokens)
    model = llm.loaded.model
    say("baseline (fp32 cache, nothing evicted)")
    base = [score_compressed(model, w)[0] for w in wins]
    rows = [_row("none", 1.0, "fp32", base, base, 1.0,
                 CacheConfig().kv_bytes_per_token(model.cfg), window_tokens)]
    if kv_dtype == "int8":
        say("int8 cache, nothing evicted")
        rows.append(_sweep_one(llm, wins, None, 1.0, "int8", base))
    for name, policy in made.items():
        for r in ratios:
            say(f"{name} r={r:g}")
            rows.append(_sweep_one(llm, wins, policy, r, kv_dtype, base))
    noise = None
    if latency_context > 0:
        say(f"decode latency at context {latency_context}")
        rows, noise = _with_latency(rows, llm, made, latency_context, max(2, latency_repeats))
    return KVStudyResult(
        model=model.cfg.name, windows=windows, window_tokens=window_tokens,
        protocol_perplexity=_protocol_ppl(llm, wins),
        bytes_per_token={dt: CacheConfig(kv_dtype=dt).kv_bytes_per_token(model.cfg)
                         for dt in ("fp32", "int8")},
        latency_context=latency_context, rows=rows, latency_noise=noise)


def largest_jumps(result: KVStudyResult) -> dict[str, dict[str, Any]]:
    """Per policy, as r falls from 1 (the uncompressed row of the same KV dtype): the step with
    the largest relative rise in perplexity and in decode latency (the brief's "critical point"
    claim: latency jumps below ~35% retention)."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r.policy for r in result.rows if r.policy != "none"):
        rows = sorted((r for r in result.rows if r.policy == name), key=lambda r: -r.ratio)
        anchor = [r for r in result.rows if r.policy == "none" and r.kv_dtype == rows[0].kv_dtype]
        if rows[0].ratio < 1.0 and anchor:
            rows.insert(0, anchor[0])
        steps = list(zip(rows, rows[1:]))
        if not steps:
            continue
        ppl = max(steps, key=lambda s: s[1].perplexity / s[0].perplexity)
        jump: dict[str, Any] = {"ppl_step": (ppl[0].ratio, ppl[1].ratio),
                                "ppl_rise": ppl[1].perplexity / ppl[0].perplexity - 1}
        if rows[0].token_ms is not None:
            lat = max(steps, key=lambda s: s[1].token_ms / s[0].token_ms)
            rise = lat[1].token_ms / lat[0].token_ms - 1
            jump.update(latency_step=(lat[0].ratio, lat[1].ratio), latency_rise=rise,
                        beyond_noise=rise > 2 * (result.latency_noise or 0.0))
        out[name] = jump
    return out

"""`tightfit study`: the brief's ch. 3 measurements as runnable studies, one sub-command each:
`kv-compression`, `memory-pool` (priority, length tiers, budget) and `skewed-batching`. A thin
shell over tightfit.studies; no torch import at module level.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tightfit.cli.common import add_model_args, build_llm
from tightfit.errors import TightfitError

POLICY_NAMES = ("sink-recent", "heavy-hitter")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("study", help="run a measurement study from the brief (ch. 3)",
                       description="Runnable studies of the brief's decay paths.")
    studies = p.add_subparsers(dest="study", metavar="STUDY")
    _register_kv(studies)
    _register_pool(studies)
    _register_skewed(studies)
    p.set_defaults(func=run, study_parser=p)


POOL_PARTS = ("priority", "tiers", "budget")


def _register_pool(studies: argparse._SubParsersAction) -> None:
    m = studies.add_parser(
        "memory-pool", help="priority TTFT under saturation, length tiers, budget vs peak RSS",
        description="Each part runs both of its configurations in one run on the same weights: "
                    "priority = high-priority TTFT p95 with every slot and the KV pool held by "
                    "low-priority work vs an idle engine; tiers = short requests' p99 latency "
                    "under a flood of long ones, tiers 512/2048 vs one shared pool; budget = "
                    "peak RSS of a fresh process under load vs its --memory-budget.")
    add_model_args(m)
    m.add_argument("--parts", default=",".join(POOL_PARTS),
                   help=f"comma-separated: {', '.join(POOL_PARTS)} (default: all)")
    m.add_argument("--budget", default="640MiB",
                   help="budget part: the --memory-budget given to the fresh process "
                        "(default: 640MiB)")
    m.add_argument("--json", action="store_true", help="print one JSON object")
    m.set_defaults(func=run_pool)


def _register_skewed(studies: argparse._SubParsersAction) -> None:
    k = studies.add_parser(
        "skewed-batching", help="7 short + 1 long request: padded vs length-grouped decode",
        description="Seven short requests and one very long one decode together, once with the "
                    "batch's attention padded to the longest context and once grouped by length "
                    "bucket: wasted K/V work, wall time, short requests' latency.")
    add_model_args(k)
    k.add_argument("--long-tokens", type=int, default=1800, help="long prompt (default: 1800)")
    k.add_argument("--short-tokens", type=int, default=40, help="short prompts (default: 40)")
    k.add_argument("--json", action="store_true", help="print one JSON object")
    k.set_defaults(func=run_skewed)


def parse_parts(text: str) -> list[str]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    for p in parts:
        if p not in POOL_PARTS:
            raise TightfitError(f"unknown memory-pool study part {p!r}: use "
                                f"{', '.join(POOL_PARTS)}")
    if not parts:
        raise TightfitError("--parts is empty: use e.g. priority,tiers")
    return parts


def run_pool(args: argparse.Namespace) -> int:
    from tightfit.config import parse_bytes

    parts = parse_parts(args.parts)
    parse_bytes(args.budget)  # a bad size fails before the model load
    from rich.console import Console

    from tightfit.studies import memory_pool as mp

    console = Console(stderr=True, quiet=args.json)
    result: dict[str, Any] = {"quant": args.quant}
    if "priority" in parts or "tiers" in parts:
        llm = build_llm(args)
        result["model"] = llm.loaded.config.name
        if "priority" in parts:
            console.log("priority: low-priority work saturates the engine; then high arrives")
            result["priority"] = mp.priority_study(llm)
        if "tiers" in parts:
            console.log("tiers: a flood of long requests, shared pool vs tiers 512/2048")
            result["tiers"] = mp.tiers_study(llm)
    if "budget" in parts:
        console.log(f"budget: fresh process, --memory-budget {args.budget}, 24 requests")
        result["budget"] = mp.budget_study_subprocess(args.budget, args.quant, args.model)
    if args.json:
        print(json.dumps(result))
    else:
        _print_pool(result)
    return 0


def _print_pool(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    if "priority" in result:
        p = result["priority"]
        t = Table(title=f"priority: high-priority TTFT ({result.get('model')}, {result['quant']})")
        for col in ("engine", "TTFT p50 (s)", "TTFT p95 (s)"):
            t.add_column(col, justify="left" if col == "engine" else "right")
        t.add_row("idle", f"{p['high_ttft_p50_idle_s']:.3f}", f"{p['high_ttft_p95_idle_s']:.3f}")
        t.add_row("saturated by low priority", f"{p['high_ttft_p50_loaded_s']:.3f}",
                  f"{p['high_ttft_p95_loaded_s']:.3f}")
        console.print(t)
        verdict = "met" if p["ratio_p95"] <= 2 else "missed"
        console.print(f"p95 ratio {p['ratio_p95']:.2f}x (target <= 2x: {verdict}); "
                      f"{p['preemptions']} preemptions, {p['swaps']} by swap")
    if "tiers" in result:
        t = Table(title="length tiers: short requests' latency under a flood of long ones")
        for col in ("KV pool", "short p50 (s)", "short p99 (s)"):
            t.add_column(col, justify="left" if col == "KV pool" else "right")
        for name, r in result["tiers"].items():
            t.add_row(name, f"{r['short_p50_s']:.2f}", f"{r['short_p99_s']:.2f}")
        console.print(t)
    if "budget" in result:
        b = result["budget"]
        console.print(f"budget {b['budget_mib']:.0f} MiB: peak RSS serving {b['peak_rss_mib']:.0f} "
                      f"MiB ({b['overshoot_mib']:+.0f} MiB vs budget), KV pool "
                      f"{b['kv_tokens']:,} tokens, {b['preemptions']} preemptions; the load "
                      f"alone peaked at {b['load_peak_rss_mib']:.0f} MiB")


def run_skewed(args: argparse.Namespace) -> int:
    for name in ("long_tokens", "short_tokens"):
        if getattr(args, name) < 1:
            raise TightfitError(f"--{name.replace('_', '-')} must be >= 1, got "
                                f"{getattr(args, name)}")
    if args.long_tokens + 32 > args.max_model_len:
        raise TightfitError(f"--long-tokens {args.long_tokens} + 32 generated tokens exceeds "
                            f"--max-model-len {args.max_model_len}: lower it or raise the other")
    from tightfit.studies.skewed_batching import skewed_batching_study

    llm = build_llm(args)
    result = skewed_batching_study(llm, long_tokens=args.long_tokens,
                                   short_tokens=args.short_tokens)
    if args.json:
        print(json.dumps({"quant": args.quant, **result}))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"7 x {args.short_tokens}-token + 1 x {args.long_tokens}-token prompts, "
                    "32 tokens each")
    for col in ("decode batching", "wasted K/V work", "wall (s)", "short mean latency (s)",
                "tok/s"):
        t.add_column(col, justify="left" if col == "decode batching" else "right")
    for name, r in result.items():
        t.add_row(name, f"{r['wasted_kv_work']:.0%}", f"{r['wall_s']:.2f}",
                  f"{r['short_mean_latency_s']:.2f}", f"{r['agg_tok_s']:.1f}")
    Console(width=None if sys.stdout.isatty() else 160).print(t)
    return 0


KV_HELP = "perplexity, top-1 agreement, KV bytes and latency vs retention"
KV_DESCRIPTION = ("Scores the fixed perplexity protocol with a KV cache that keeps only a "
                  "fraction r of each sequence's tokens (eviction policy), optionally stored as "
                  "int8, against the uncompressed fp32 cache; times decode steps per r.")


def _register_kv(studies: argparse._SubParsersAction) -> None:
    add_kv_args(studies.add_parser("kv-compression", help=KV_HELP, description=KV_DESCRIPTION))


def add_kv_args(k: argparse.ArgumentParser) -> None:
    """The KV-compression study's options (also `tightfit eval kv`)."""
    add_model_args(k)  # --kv-dtype here = the compressed cache's storage (baseline stays fp32)
    k.add_argument("--windows", type=int, default=2, help="protocol windows (default: 2)")
    k.add_argument("--window-tokens", type=int, default=512,
                   help="tokens per window (default: 512, the protocol's)")
    k.add_argument("--ratios", default=None,
                   help="comma-separated retention ratios in (0, 1] (default: 0.1,0.2,...,0.9)")
    k.add_argument("--step", type=float, default=None,
                   help="ratio grid 0.1..0.9 with this step (the brief sweeps 0.05)")
    k.add_argument("--policy", default=",".join(POLICY_NAMES),
                   help="comma-separated: sink-recent, heavy-hitter, or none (no eviction "
                        "rows: with --kv-dtype int8, int8 alone) (default: both)")
    k.add_argument("--sinks", type=int, default=4, help="sink tokens (default: 4)")
    k.add_argument("--recent-frac", type=float, default=0.5,
                   help="heavy-hitter: share of the budget for recent tokens (default: 0.5)")
    k.add_argument("--latency-context", type=int, default=512,
                   help="context length of the timed decode steps; 0 = skip (default: 512)")
    k.add_argument("--latency-repeats", type=int, default=10,
                   help="timed decode steps per row, median reported (default: 10)")
    k.add_argument("--json", action="store_true", help="print one JSON object")
    k.set_defaults(func=run_kv)


def parse_ratios(text: str | None, step: float | None) -> list[float] | None:
    from tightfit.engine.kv_compress import check_ratio
    from tightfit.studies.kv_compression import ratio_grid

    if text is None:
        return ratio_grid(step) if step is not None else None
    out = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise TightfitError(f"cannot read retention ratio {part!r}: use e.g. 0.1,0.5"
                                ) from None
        out.append(check_ratio(value))
    return out


def parse_policies(text: str) -> list[str]:
    """Comma-separated policy names; "none" = no eviction rows (e.g. int8 alone)."""
    names = [p.strip() for p in text.split(",") if p.strip() and p.strip() != "none"]
    for n in names:
        if n not in POLICY_NAMES:
            raise TightfitError(f"unknown eviction policy {n!r}: use {', '.join(POLICY_NAMES)}")
    return names


def run(args: argparse.Namespace) -> int:
    args.study_parser.print_help()  # a study's own parser sets its func
    return 2


def run_kv(args: argparse.Namespace) -> int:
    ratios = parse_ratios(args.ratios, args.step)  # validate before the (slow) model load
    policies = parse_policies(args.policy)
    from rich.console import Console

    from tightfit.studies.kv_compression import largest_jumps, run_kv_study

    llm = build_llm(argparse.Namespace(**{**vars(args), "kv_dtype": "fp32"}))
    console = Console(stderr=True, quiet=args.json)
    result = run_kv_study(llm, ratios, policies, args.windows, args.window_tokens,
                          args.kv_dtype, args.sinks, args.recent_frac, args.latency_context,
                          args.latency_repeats, progress=lambda m: console.log(m))
    jumps = largest_jumps(result)
    if args.json:
        print(json.dumps({**result.to_dict(), "largest_jumps": jumps, "quant": args.quant}))
    else:
        _print_table(result, jumps)
    return 0


def _print_table(result: Any, jumps: dict[str, dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    base = result.rows[0].perplexity
    t = Table(title=f"KV compression: {result.model}, {result.windows} x "
                    f"{result.window_tokens} tokens (baseline = fp32 cache, nothing evicted)")
    for col in ("policy", "r", "KV", "ppl", "d ppl", "top-1 agree", "kept", "KV B/token",
                "KV/window", "decode ms", "attn ms", "evict ms"):
        t.add_column(col, justify="left" if col in ("policy", "KV") else "right")
    for r in result.rows:
        t.add_row(r.policy, f"{r.ratio:g}", r.kv_dtype, f"{r.perplexity:.3f}",
                  f"{(r.perplexity / base - 1) * 100:+.2f}%", f"{r.top1_agreement:.1%}",
                  f"{r.occupancy:.3f}", f"{r.kv_bytes_per_token:,.0f}",
                  f"{r.kv_bytes_at_end / 1024:,.0f} KiB", _ms(r.decode_ms), _ms(r.attention_ms),
                  _ms(r.evict_ms))
    console = Console(width=None if sys.stdout.isatty() else 160)  # files: no wrapped cells
    console.print(t)
    b = result.bytes_per_token
    console.print(f"baseline perplexity {base:.4f}; the engine's own scoring of the same windows "
                  f"(fp32 cache): {result.protocol_perplexity:.4f}")
    console.print(f"bytes per cached token: fp32 {b['fp32']:,}, "
                  f"int8 {b['int8']:,} ({b['fp32'] / b['int8']:.2f}x smaller)")
    if result.latency_noise is not None:
        console.print(f"latency at context {result.latency_context}: noise floor (median "
                      f"interquartile range of a row's decode steps) {result.latency_noise:.1%}")
    for name, j in jumps.items():
        line = f"{name}: largest perplexity step r={j['ppl_step'][0]:g}->{j['ppl_step'][1]:g} " \
               f"({j['ppl_rise']:+.1%})"
        if "latency_step" in j and j["latency_rise"] > 0:
            line += f"; largest per-token latency step r={j['latency_step'][0]:g}->" \
                    f"{j['latency_step'][1]:g} ({j['latency_rise']:+.1%}, " \
                    f"{'beyond' if j['beyond_noise'] else 'within'} 2x the noise floor)"
        elif "latency_step" in j:
            line += "; per-token latency never rose as r fell"
        console.print(line)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"

"""`tightfit eval ppl`: perplexity and top-1 agreement with the fp32 model on the project's fixed
protocol (see tightfit/engine/scoring.py), for several weight formats side by side.
`tightfit eval kv`: the same protocol against a compressed KV cache (= `tightfit study
kv-compression`)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="measure model quality (perplexity)",
                       description="Quality measurements. `tightfit eval ppl --help` for the "
                                   "perplexity protocol.")
    p.set_defaults(func=lambda _args: (p.print_help(), 2)[1])
    inner = p.add_subparsers(dest="eval_command", metavar="WHAT")
    ppl = inner.add_parser(
        "ppl", help="perplexity and top-1 agreement with fp32",
        description="Perplexity on the fixed protocol: pydoc_data.topics values joined by blank "
                    "lines in sorted-key order, tokenised; the first N non-overlapping windows "
                    "of 512 tokens; exp(mean NLL). fp32 always runs first as the reference for "
                    "top-1 agreement (share of positions whose argmax matches fp32).")
    ppl.add_argument("--model", "-m", default=None,
                     help="GGUF file, HF-layout directory or packaged model name "
                          "(default: the embedded SmolLM2-135M)")
    ppl.add_argument("--quant", action="append", default=[],
                     help="weight format or precision-plan file to compare (repeatable; a path "
                          "ending in .tfq loads that quantised file; 'lite' = the file's own "
                          "weights on the lite runtime, --runtime lite); default: native")
    ppl.add_argument("--windows", type=int, default=16,
                     help="512-token windows to score (default: 16, the protocol)")
    ppl.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    ppl.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ppl.set_defaults(func=run_ppl)
    from tightfit.cli.study import KV_DESCRIPTION, KV_HELP, add_kv_args

    add_kv_args(inner.add_parser("kv", help=f"KV compression: {KV_HELP}",
                                 description=KV_DESCRIPTION + " Same as `tightfit study "
                                                              "kv-compression`."))


def run_ppl(args: argparse.Namespace) -> int:
    from tightfit.cli.quantize import show_awq_progress
    from tightfit.engine.scoring import WINDOW_TOKENS, compare_formats
    from tightfit.errors import TightfitError

    if args.windows < 1:
        raise TightfitError(f"--windows must be at least 1, got {args.windows}")
    show_awq_progress()
    quants = args.quant or ["native"]
    if not args.json:
        print(f"{'format':<24} {'ppl':>9} {'vs fp32':>8} {'top-1':>7} {'load s':>7} {'eval s':>7}")
    ref: list[float] = []

    def show(r: Any) -> None:
        ref.append(ref[0] if ref else r.perplexity)
        if not args.json:
            print(f"{r.quant:<24} {r.perplexity:>9.4f} {r.delta_pct(ref[0]):>+7.2f}% "
                  f"{100 * r.top1_agreement:>6.2f}% {r.load_s:>7.1f} {r.eval_s:>7.1f}", flush=True)

    results = compare_formats(args.model, quants, args.windows, args.threads, on_result=show)
    if args.json:
        print(json.dumps({
            "model": args.model or "smollm2-135m", "windows": args.windows,
            "window_tokens": WINDOW_TOKENS, "predicted_tokens": results[0].tokens,
            "results": [{"quant": r.quant, "perplexity": round(r.perplexity, 4),
                         "delta_pct": round(r.delta_pct(results[0].perplexity), 3),
                         "top1_agreement": round(r.top1_agreement, 5),
                         "load_s": round(r.load_s, 2), "eval_s": round(r.eval_s, 2)}
                        for r in results]}))
    else:
        print(f"({args.windows} windows x {WINDOW_TOKENS} tokens, {results[0].tokens} predictions)",
              file=sys.stderr)
    return 0

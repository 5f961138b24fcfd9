"""`tightfit predict`: scenarios (JSONL) in, predictions (JSONL) out. A thin shell over
tightfit.predictor.predict; no torch."""
from __future__ import annotations

import argparse
import sys

from tightfit.predictor import jsonl


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "predict", help="predict latency, throughput, memory and fit for scenarios (JSONL)",
        description="Read one scenario a line (see docs/predictor.md) and write one prediction a "
                    "line: fits, peak_memory_gb, prefill_tok_s, decode_tok_s, ttft_s, tpot_s, "
                    "bottleneck, factors, interval. Bad rows get an 'error' entry.")
    p.add_argument("--input", "-i", required=True, help="JSONL file of scenarios ('-' = stdin)")
    p.add_argument("--output", "-o", help="write predictions here instead of stdout")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output (JSONL; the default, kept for symmetry)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tightfit.predictor import predict

    out = predict(jsonl.read_jsonl(args.input))
    jsonl.write_jsonl(out, args.output)
    bad = sum("error" in r for r in out)
    if bad:
        print(f"{bad} of {len(out)} rows had errors (see their 'error' entries)", file=sys.stderr)
    return 1 if bad == len(out) else 0

"""`tightfit predict`: scenarios (JSONL) in, predictions (JSONL) out. A thin shell over
tightfit.predictor.predict; no torch."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from tightfit.predictor import jsonl


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "predict", help="predict latency, throughput, memory and fit for scenarios (JSONL)",
        description="Read one scenario a line (see docs/predictor.md) and write one prediction a "
                    "line: fits (and fits_reason: why not, and what would fit), "
                    "peak_memory_gb, prefill_tok_s, decode_tok_s, ttft_s, tpot_s, bottleneck, "
                    "factors, interval, capacity (the largest context and batch that stay on "
                    "the device). Bad rows get an 'error' entry.")
    p.add_argument("--input", "-i", required=True, help="JSONL file of scenarios ('-' = stdin)")
    p.add_argument("--output", "-o", help="write predictions here instead of stdout")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true",
                      help="machine-readable output (JSONL; the default, kept for symmetry)")
    form.add_argument("--table", action="store_true",
                      help="one readable line a scenario (fit, memory, rates with the decode "
                           "band, TTFT, bottleneck, headroom) and why a row does not fit, instead "
                           "of JSONL")
    p.set_defaults(func=run)


def table_line(d: dict[str, Any]) -> str:
    """A prediction in one line (and its fits_reason on a second), as docs/predictor.md shows
    the example."""
    rid = str(d.get("id"))
    if "error" in d:
        return f"{rid:20s} error: {d['error']['message']}"
    fit = {True: "fits", False: "does not fit", None: "fit undecided"}[d["fits"]]
    if d["fits"] and d["offload_fraction"]:
        fit += f" (offload {100 * d['offload_fraction']:.0f}%)"
    load = " (peak while loading)" if d["memory"].get("peak_phase") == "load" else ""
    lo, hi = d["interval"]["decode_tok_s"]
    pre = f"prefill {d['prefill_tok_s']:.0f} tok/s  " if d.get("prefill_tok_s") else ""
    share = d["factors"].get(f"decode_share_{d['bottleneck']}")
    cap = d["capacity"]
    room = (f"capacity {cap['max_context_tokens']} tokens / {cap['max_batch']} seqs"
            if cap["max_context_tokens"] or cap["max_batch"] else "capacity none")
    line = (f"{rid:20s} {fit}  {d['peak_memory_gb']:.2f} GiB{load}  {pre}decode "
            f"{d['decode_tok_s']:.1f} tok/s [{lo:.1f}, {hi:.1f}]  ttft {d['ttft_s']:.3g} s  "
            f"bottleneck {d['bottleneck']}" + (f" ({share:.2f})" if share is not None else "") +
            f"  {room}")
    return line + (f"\n   fits_reason: {d['fits_reason']}" if d.get("fits_reason") else "")


def run(args: argparse.Namespace) -> int:
    from tightfit.predictor import predict

    out = predict(jsonl.read_jsonl(args.input))
    if args.table:
        jsonl.write_text("".join(table_line(d) + "\n" for d in out), args.output)
    else:
        jsonl.write_jsonl(out, args.output)
    bad = sum("error" in r for r in out)
    if bad:
        print(f"{bad} of {len(out)} rows had errors (see their 'error' entries)", file=sys.stderr)
    return 1 if bad == len(out) else 0

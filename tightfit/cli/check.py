"""`tightfit check`: a CI gate. Predict each scenario and exit 1 if any predicted TTFT or TPOT
breaks its SLO (or a scenario does not fit, or is invalid); 0 when all pass."""
from __future__ import annotations

import argparse
import json
from typing import Any

from tightfit.errors import TightfitError
from tightfit.predictor import jsonl


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "check", help="fail (exit 1) when a scenario's predicted TTFT/TPOT breaks an SLO",
        description="Predict each scenario and compare with the SLOs. Exit 0: all pass; 1: a "
                    "predicted violation, a scenario that does not fit, or an invalid row.")
    p.add_argument("--input", "-i", required=True, help="JSONL file of scenarios ('-' = stdin)")
    p.add_argument("--ttft-slo", type=float, help="max time to first token, seconds")
    p.add_argument("--tpot-slo", type=float, help="max time per output token, seconds")
    p.add_argument("--use-upper-bound", action="store_true",
                   help="judge by the pessimistic end of the error band, not the point estimate")
    p.add_argument("--json", action="store_true", help="print one JSON verdict a line")
    p.set_defaults(func=run)


def verdict(pred: dict[str, Any], ttft: float | None, tpot: float | None, upper: bool) -> list[str]:
    """Reasons a prediction fails the gate (empty when it passes)."""
    if "error" in pred:
        return [f"invalid scenario: {pred['error']['message']}"]
    reasons = []
    # the prediction's own reason (predictor.fit): what is over what, and what would fit
    why = pred.get("fits_reason") or f"peak {pred['peak_memory_gb']} GiB"
    if pred.get("fits") is False:
        reasons.append(why if why.startswith("does not fit") else f"does not fit: {why}")
    elif pred.get("fits") is None:
        reasons.append(f"fit undecided: {why}")
    for name, slo in (("ttft_s", ttft), ("tpot_s", tpot)):
        if slo is None:
            continue
        value = pred["interval"][name][1] if upper else pred[name]
        if value > slo:
            reasons.append(f"{name} {value:.4g} > SLO {slo:g}")
    return reasons


def run(args: argparse.Namespace) -> int:
    from tightfit.predictor import predict

    for flag, value in (("--ttft-slo", args.ttft_slo), ("--tpot-slo", args.tpot_slo)):
        if value is not None and value <= 0:
            raise TightfitError(f"{flag} {value} must be a positive number of seconds")
    if args.ttft_slo is None and args.tpot_slo is None:
        raise TightfitError("give --ttft-slo and/or --tpot-slo (seconds)")
    failed = 0
    for pred in predict(jsonl.read_jsonl(args.input)):
        reasons = verdict(pred, args.ttft_slo, args.tpot_slo, args.use_upper_bound)
        failed += bool(reasons)
        if args.json:
            print(json.dumps({"id": pred.get("id"), "pass": not reasons, "reasons": reasons}))
        else:
            print(f"{'FAIL' if reasons else 'ok  '} {pred.get('id')}: " +
                  ("; ".join(reasons) if reasons else
                   f"ttft {pred['ttft_s']:.3g}s, tpot {pred['tpot_s']:.3g}s"))
    return 1 if failed else 0

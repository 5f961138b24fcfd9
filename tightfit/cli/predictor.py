"""`tightfit predictor evaluate|fit`: the predictor's honest evaluation (held out by device and by
model) and refitting of the packaged model. Needs scikit-learn; no torch."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("predictor", help="evaluate or refit the performance predictor",
                              description="Maintenance commands for the performance predictor.")
    sub = p.add_subparsers(dest="predictor_command", metavar="ACTION")
    ev = sub.add_parser("evaluate", help="held-out accuracy: leave-one-device-out and "
                                         "leave-one-model-out on the shipped measurement tables")
    ev.add_argument("--split", choices=("device", "machine", "model", "both", "all"),
                    default="all",
                    help="which held-out split(s) to run: device (a machine at one thread count), "
                         "machine (each machine of tightfit's own dataset at all its thread "
                         "counts; scores those rows only), model; both = device and model; "
                         "default all three")
    ev.add_argument("--no-screen", action="store_true",
                    help="skip feature screening inside folds (faster; all candidate features)")
    ev.add_argument("--plots", metavar="DIR", help="write predicted-vs-measured PNGs here")
    ev.add_argument("--brief-factors", choices=("default", "all", "none"), default="default",
                    help="ablation of the brief's lambda_mem/comp/quant factors as candidate "
                         "features: default = where they helped held out (no phase since "
                         "2026-12-05), all = every phase, none = no phase")
    ev.add_argument("--without-brief-factors", action="store_const", const="none",
                    dest="brief_factors", help="same as --brief-factors none")
    ev.add_argument("--decode-rate-features", action="store_const", const="all",
                    default="default", dest="rate_features",
                    help="ablation: let decode's residual use the device compute-rate features "
                         "too (log TFLOPS, FLOP/byte, compute share; default: prefill only)")
    ev.add_argument("--measurements", action="append", default=[], metavar="FILE",
                    help="tightfit dataset JSONL (e.g. data/measurements/cpu-2core.jsonl) whose "
                         "single-stream runs join the evaluation (repeatable)")
    ev.add_argument("--json", action="store_true", help="print the results as JSON")
    ev.set_defaults(func=run_evaluate)
    sc = sub.add_parser("score", help="the shipped model against measured runs, nothing fitted "
                                      "(new measurements before they join the fit)")
    sc.add_argument("measurements", nargs="+", metavar="FILE",
                    help="tightfit dataset JSONL, e.g. data/measurements/cpu-2core.jsonl")
    sc.add_argument("--batched", action="store_true",
                    help="score the closed-loop concurrent runs (aggregate decode tok/s at the "
                         "batch the engine ran) instead of the single-stream ones")
    sc.add_argument("--scenarios", action="store_true",
                    help="FILE holds `tightfit predict` input rows, each with a `measured` "
                         "object (decode_tok_s, prefill_tok_s, ttft_s, peak_memory_gb): figures "
                         "measured elsewhere, e.g. docs/examples/batched-bench.jsonl")
    sc.add_argument("--json", action="store_true", help="print the results as JSON")
    sc.set_defaults(func=run_score)
    fit = sub.add_parser("fit", help="fit on all shipped data and save the model JSON")
    fit.add_argument("--output", "-o", help="where to write (default: the per-data-hash cache)")
    fit.set_defaults(func=run_fit)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_evaluate(args: argparse.Namespace) -> int:
    from tightfit.predictor import report

    from tightfit.errors import TightfitError

    for path in args.measurements:
        if not Path(path).is_file():
            raise TightfitError(f"--measurements {path!r} does not exist: give a dataset JSONL "
                                "such as data/measurements/cpu-2core.jsonl")
    splits = {"both": ("device", "model"), "all": ("device", "machine", "model")}.get(
        args.split, (args.split,))
    result = report.run(splits, screen=not args.no_screen,
                        brief=args.brief_factors,
                        measurements=tuple(args.measurements), rates=args.rate_features)
    pairs = result.pop("_pairs")
    if args.plots:
        from tightfit.predictor import plots

        for split, prs in pairs.items():
            for metric in ("decode_tok_s", "prefill_tok_s"):
                path = Path(args.plots) / f"predictor_{split}_{metric}.png"
                plots.scatter(prs, metric, f"held out by {split}: {metric}", path)
    print(json.dumps(result, indent=1, default=str) if args.json else report.render(result))
    return 0


def run_score(args: argparse.Namespace) -> int:
    from tightfit.errors import TightfitError
    from tightfit.predictor import report

    for path in args.measurements:
        if not Path(path).is_file():
            raise TightfitError(f"{path!r} does not exist: give a dataset JSONL such as "
                                "data/measurements/cpu-2core.jsonl, or with --scenarios a "
                                "scenarios JSONL such as docs/examples/batched-bench.jsonl")
    if args.scenarios and args.batched:
        raise TightfitError("--scenarios and --batched do not go together: a scenario row gives "
                            "its own workload.batch")
    result = report.score_scenarios(tuple(args.measurements)) if args.scenarios else \
        report.score(tuple(args.measurements), batched=args.batched)
    print(json.dumps(result, indent=1, default=str) if args.json else report.render(result))
    return 0


def run_fit(args: argparse.Namespace) -> int:
    from tightfit.predictor import artefact

    path = Path(args.output) if args.output else None
    model = artefact.fit_and_save(path)
    where = path or artefact.cache_dir() / f"{model.data_hash}.json"
    print(f"fitted on data {model.data_hash}: decode features {list(model.decode.base)} "
          f"crosses {list(model.decode.crosses)}; prefill features {list(model.prefill.base)} -> {where}")
    return 0

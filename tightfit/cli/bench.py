"""`tightfit bench`: measure. Without a subcommand (or `compare`): tightfit vs HF Transformers
(`--vs hf`) or llama.cpp (`--vs llamacpp`) side by side with the issues' targets. `run`: one
scenario on one backend. `sweep FILE`: a YAML sweep, resumable. `report`: plots + Markdown from
stored runs. `scenarios`: the workload templates.
Thin shell over `tightfit.bench`; no torch import here (backends run in worker processes).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tightfit.errors import TightfitError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "bench", help="benchmark tightfit against HF Transformers or llama.cpp; sweeps; reports",
        description="Without a subcommand: tightfit side by side with a baseline on the same GGUF "
                    "and prompts, each engine in its own process, with the targets marked "
                    "met/missed. --vs hf (default): HF Transformers, fp32 weights. --vs llamacpp: "
                    "llama-bench, llama-server and llama-cpp-python on the file's own 4-bit "
                    "weights (build them once with `make llamacpp`).")
    _compare_args(p)
    p.set_defaults(func=run_compare)
    sub = p.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    c = sub.add_parser("compare", help="tightfit vs a baseline side by side (the default)")
    _compare_args(c)
    c.set_defaults(func=run_compare)
    _register_run(sub)
    _register_sweep(sub)
    _register_report(sub)
    s = sub.add_parser("scenarios", help="list the workload templates")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=run_scenarios)


def _compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model path or name (default: embedded SmolLM2)")
    p.add_argument("--threads", type=int, default=2, help="threads per backend (default 2)")
    p.add_argument("--quick", action="store_true", help="16 generated tokens instead of 64")
    p.add_argument("--vs", default="hf", choices=("hf", "llamacpp"),
                   help="the baseline: hf = HF Transformers fp32 (issue 2's targets); llamacpp = "
                        "llama-bench, llama-server and llama-cpp-python on the file's own 4-bit "
                        "weights (issue 7's targets; build them with `make llamacpp`)")
    p.add_argument("--compile", action="store_true",
                   help="tightfit backends run decode steps through torch.compile (the first "
                        "load compiles for minutes; cached on disk afterwards)")
    p.add_argument("--no-script", dest="scripted", action="store_false",
                   help="tightfit backends run decode steps eagerly instead of through the "
                        "TorchScript decode stack (to compare the two)")
    p.add_argument("--no-fused", dest="fused", action="store_false",
                   help="tightfit backends run the TorchScript decode stack without the fused "
                        "C++ decode kernels (to compare the two)")
    p.add_argument("--backends", default=None,
                   help="comma-separated subset of the suite's backends (default: all of them)")
    _store_args(p)
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")


def _store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", type=Path, default=None,
                   help="JSONL file to append the runs to (default: the dataset directory)")
    p.add_argument("--no-record", action="store_true", help="do not store the runs")
    p.add_argument("--refresh-fingerprint", action="store_true",
                   help="re-measure memory bandwidth and matmul rate for this machine")


def _store(args: argparse.Namespace, default_name: str) -> Any:
    from tightfit.bench.session import default_store_dir
    from tightfit.data.store import MeasurementStore

    if args.no_record:
        return None
    return MeasurementStore(args.store or default_store_dir() / f"{default_name}.jsonl")


def run_compare(args: argparse.Namespace) -> int:
    from tightfit.bench import compare, report, session

    if args.threads < 1:
        raise TightfitError(f"--threads must be >= 1, got {args.threads}")
    suite = compare.SUITES[args.vs]
    backends = (tuple(b.strip() for b in args.backends.split(",") if b.strip())
                if args.backends else None)
    tasks = compare.compare_tasks(args.model, args.threads, args.quick, backends, suite,
                                  compile_decode=args.compile, scripted_decode=args.scripted,
                                  fused_kernels=args.fused)
    rows = session.execute(tasks, _store(args, "compare"), "tightfit bench",
                           args.refresh_fingerprint)
    comp = compare.collect(rows, args.model or "default", args.threads, suite)
    if suite.name == "llamacpp" and (backends is None or compare.LLAMA_BENCH in backends):
        _llama_bench(comp, args)
    if args.json:
        print(json.dumps(comp.to_json(), indent=2))
    else:
        console = report.console()
        console.print(report.compare_table(comp))
        for line in report.compare_footer(comp):
            console.print(line, highlight=False)
    return 0 if not comp.errors else 1


def _llama_bench(comp: Any, args: argparse.Namespace) -> None:
    """llama.cpp's own tg / pp figures on the same file, after the backends (so they do not share
    the cores); a missing binary is a note, not a failure."""
    from rich.console import Console

    from tightfit.bench import compare, llama_cpp_tools
    from tightfit.bench.backends.tightfit_backend import model_arg
    from tightfit.engine.loader.resolve import resolve_model

    if llama_cpp_tools.find_binary("llama-bench") is None:
        comp.notes.append(f"llama-bench skipped: not found ({llama_cpp_tools.BUILD_HINT})")
        return
    gen = 16 if args.quick else 128
    path = resolve_model(model_arg(args.model))
    with Console(stderr=True).status(f"llama-bench -p 512 -n {gen} -t {args.threads}"):
        try:
            figures = llama_cpp_tools.run_llama_bench(path, args.threads, 512, gen)
        except TightfitError as exc:
            comp.errors.setdefault(compare.LLAMA_BENCH, []).append(str(exc))
            return
    comp_note = ", ".join(f"{f.test} {f.tok_s:.1f} ± {f.stddev:.1f} tok/s" for f in figures)
    compare.add_llama_bench(comp, figures, f"llama-bench ({len(figures)} tests, "
                                           f"{figures[0].repetitions if figures else 0} "
                                           f"repetitions each): {comp_note}")


def _register_run(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = sub.add_parser("run", help="one scenario on one backend")
    r.add_argument("--backend", default="tightfit",
                   help="tightfit | tightfit-http | hf | llamacpp | llama-server")
    r.add_argument("--scenario", default="chat",
                   help="a template name (`tightfit bench scenarios`)")
    r.add_argument("--model", default=None)
    r.add_argument("--quant", default="fp32")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--max-num-seqs", type=int, default=None)
    for name in ("num-requests", "prompt-tokens", "output-tokens", "concurrency"):
        r.add_argument(f"--{name}", type=int, default=None)
    r.add_argument("--rate", type=float, default=None, help="open-loop arrivals per second")
    r.add_argument("--seed", type=int, default=0)
    _store_args(r)
    r.add_argument("--json", action="store_true", help="print the measurement as JSON")
    r.set_defaults(func=run_one)


def run_one(args: argparse.Namespace) -> int:
    from tightfit.bench import report, session
    from tightfit.bench.backends.base import BackendOptions
    from tightfit.bench.runner import Task
    from tightfit.bench.workloads import Overrides

    task = Task(args.backend, BackendOptions(model=args.model, quant=args.quant,
                                             threads=args.threads, max_num_seqs=args.max_num_seqs),
                args.scenario, Overrides(args.num_requests, args.prompt_tokens, args.output_tokens,
                                         args.concurrency, args.rate), args.seed, sweep="adhoc")
    rows = session.execute([task], _store(args, "adhoc"), "tightfit bench run",
                           args.refresh_fingerprint)
    if args.json:
        print(json.dumps([m.model_dump(mode="json") for m in rows], indent=2))
    else:
        report.console().print(report.summary_table(rows, "tightfit bench run"))
    return 0 if rows and all(m.status == "ok" for m in rows) else 1


def _register_sweep(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser("sweep", help="run a YAML sweep (resumable)")
    s.add_argument("file", type=Path, help="sweep YAML (see docs/measurements.md)")
    s.add_argument("--dry-run", action="store_true", help="list the runs; run nothing")
    s.add_argument("--skip-failed", action="store_true",
                   help="on resume, also skip runs stored as failed (default: retry them)")
    s.add_argument("--limit", type=int, default=None, help="run at most N of the pending runs")
    s.add_argument("--refresh-fingerprint", action="store_true")
    s.add_argument("--json", action="store_true", help="print the new measurements as JSON lines")
    s.set_defaults(func=run_sweep)


def run_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tightfit.bench import report, session, sweep
    from tightfit.data.store import MeasurementStore

    sw = sweep.load_sweep(args.file)
    plan = sweep.plan(sw)
    store = MeasurementStore(sw.store_path)
    done = store.run_keys(include_failed=args.skip_failed)
    pending = [t for t in plan.tasks if t.run_key not in done]
    pending = pending[:args.limit] if args.limit is not None else pending
    err = Console(stderr=True)
    skipped = len(plan.tasks) - len(pending)
    err.print(f"sweep {sw.spec.name}: {len(plan.tasks)} runs planned, {skipped} already stored "
              f"or beyond --limit, {len(pending)} to run -> {sw.store_path}")
    for line in sorted(set(plan.skipped)):
        err.print(f"[yellow]not planned: {line} ({plan.skipped.count(line)}x)[/]")
    if args.dry_run:
        for t in pending:
            print(t.label)
        return 0
    rows = session.execute(pending, store, f"sweep {sw.spec.name}", args.refresh_fingerprint)
    if args.json:
        for m in rows:
            print(json.dumps(m.model_dump(mode="json")))
    else:
        report.console().print(report.summary_table(rows, f"sweep {sw.spec.name}: this invocation"))
    return 0 if all(m.status == "ok" for m in rows) else 1


def _register_report(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = sub.add_parser("report", help="PNG plots + Markdown report from stored runs")
    r.add_argument("paths", nargs="*", type=Path,
                   help="JSONL files or directories (default: the dataset directory)")
    r.add_argument("--out", type=Path, default=None,
                   help="output directory (default: <first path's dir>/../reports/<name>)")
    r.add_argument("--title", default=None)
    r.add_argument("--sweep", default=None, help="only rows of this sweep name")
    r.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from tightfit.bench import plots, report, session
    from tightfit.data.store import read_measurements

    paths = args.paths or [session.default_store_dir()]
    result = read_measurements(paths)
    rows = [m for m in result.measurements if args.sweep in (None, m.sweep)]
    if not rows:
        raise TightfitError(f"no measurements found in {', '.join(map(str, paths))}"
                            + (f" for sweep {args.sweep!r}" if args.sweep else ""))
    name = args.sweep or (paths[0].stem if paths[0].is_file() else "all")
    base = paths[0].parent if paths[0].is_file() else paths[0]
    out = args.out or base.parent / "reports" / name
    pngs = plots.all_plots(rows, out)
    md = report.markdown_report(rows, args.title or f"Measurements: {name}", pngs, out)
    (out / "README.md").write_text(md)
    console = report.console()
    for line in result.skipped:
        console.print(f"[yellow]skipped {line}[/]", highlight=False)
    console.print(f"wrote {out / 'README.md'} and {len(pngs)} plot(s) from {len(rows)} rows")
    return 0


def run_scenarios(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rich.table import Table

    from tightfit.bench.report import console
    from tightfit.bench.workloads import SCENARIOS

    if args.json:
        print(json.dumps({k: asdict(s) for k, s in SCENARIOS.items()}, indent=2))
        return 0
    table = Table(title="workload templates (descriptions: --json)")
    table.add_column("name", no_wrap=True)
    for col in ("prompt tok", "output tok", "arrival", "n", "priorities", "SLO TTFT"):
        table.add_column(col)
    for s in SCENARIOS.values():
        a = s.arrival
        burst = f" bursts of {a.burst_size}" if a.burst_size else ""
        arrival = f"closed x{a.concurrency}" if a.kind == "closed" else \
            f"{a.kind} {a.rate_rps}/s{burst}"
        table.add_row(s.name, f"{s.prompt.lo}-{s.prompt.hi}", f"{s.output.lo}-{s.output.hi}",
                      arrival, str(s.num_requests),
                      " ".join(f"{p}:{w:g}" for p, w in s.priorities),
                      f"{s.slo_ttft_ms:g} ms" if s.slo_ttft_ms else "—")
    console().print(table)
    return 0

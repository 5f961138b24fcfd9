"""`tightfit data check`: quality gates on the measurement dataset — missing rate per field, and
PSI against a baseline (another run or release) when given. Exit 1 when any gate fails, loudly;
2 for unreadable input. Thin shell over `tightfit.data.quality`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tightfit.errors import TightfitError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("data", help="the measurement dataset: quality checks")
    sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    c = sub.add_parser(
        "check", help="missing rate per field and PSI against a baseline; exit 1 on a failure",
        description="Gates (from the source brief): missing <= 0.5% for key fields, <= 2% for "
                    "others; PSI <= 0.10 for key fields, <= 0.15 for others.")
    c.add_argument("paths", nargs="*", type=Path,
                   help="JSONL files or directories (default: the dataset directory)")
    c.add_argument("--baseline", nargs="+", type=Path, default=None,
                   help="files or directories of the reference run/release for PSI")
    c.add_argument("--sweep", default=None, help="only rows of this sweep name (both sides)")
    c.add_argument("--bins", type=int, default=10, help="PSI bins (quantiles of the baseline)")
    c.add_argument("--all", action="store_true", help="list every check, not only failures")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.set_defaults(func=run_check)
    e = sub.add_parser(
        "export", help="write the dataset as one Parquet file (for pandas, DuckDB, Spark)",
        description="Flattens every measurement (dotted column names such as "
                    "results.ttft_s_p50; lists and maps as JSON text) into one Parquet table. "
                    "The JSONL files stay the source of truth: append-only and crash-safe.")
    e.add_argument("output", type=Path, help="the .parquet file to write")
    e.add_argument("paths", nargs="*", type=Path,
                   help="JSONL files or directories (default: the dataset directory)")
    e.add_argument("--sweep", default=None, help="only rows of this sweep name")
    e.set_defaults(func=run_export)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_export(args: argparse.Namespace) -> int:
    from tightfit.bench.session import default_store_dir
    from tightfit.data.store import flatten

    if args.output.suffix != ".parquet":
        raise TightfitError(f"output {str(args.output)!r} should end in .parquet")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise TightfitError("Parquet export needs pyarrow: pip install -e .[parquet]") from None
    rows, skipped = _load(args.paths or [default_store_dir()], args.sweep)
    if not rows:
        raise TightfitError("no measurements to export (empty files, or none for that --sweep)")
    flat = [flatten(m) for m in rows]
    columns = sorted({k for r in flat for k in r})
    data = {c: [_cell(r.get(c)) for r in flat] for c in columns}
    table = pa.table(data)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, args.output)
    print(f"{len(rows)} measurements, {len(columns)} columns -> {args.output}"
          + (f" ({len(skipped)} unreadable lines skipped)" if skipped else ""))
    return 0


def _cell(value: object) -> object:
    """Parquet columns need one type: nested values become JSON text."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


def _load(paths: list[Path], sweep: str | None) -> tuple[list, list[str]]:
    from tightfit.data.store import read_measurements

    result = read_measurements(paths)
    rows = [m for m in result.measurements if sweep in (None, m.sweep)]
    return rows, result.skipped


def run_check(args: argparse.Namespace) -> int:
    from tightfit.bench.session import default_store_dir
    from tightfit.data import quality

    if args.bins < 2:
        raise TightfitError(f"--bins must be >= 2, got {args.bins}")
    rows, skipped = _load(args.paths or [default_store_dir()], args.sweep)
    if not rows:
        raise TightfitError("no measurements to check (empty files, or none for that --sweep)")
    base = None
    if args.baseline:
        base, skipped_base = _load(args.baseline, args.sweep)
        skipped += skipped_base
        if not base:
            raise TightfitError("the baseline holds no measurements")
    report = quality.check(rows, base, bins=args.bins)
    if args.json:
        print(json.dumps(_as_json(report, skipped), indent=2))
    else:
        _print(report, skipped, args.all)
    return 0 if report.passed and not skipped else 1


def _as_json(report, skipped: list[str]) -> dict:  # type: ignore[no-untyped-def]
    return {"passed": report.passed and not skipped, "rows": report.rows,
            "baseline_rows": report.baseline_rows, "unreadable_lines": skipped,
            "checks": [{"kind": c.kind, "field": c.field, "tier": c.tier, "value": c.value,
                        "threshold": c.threshold, "n": c.n, "passed": c.passed}
                       for c in report.checks]}


def _print(report, skipped: list[str], show_all: bool) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console
    from rich.table import Table

    console = Console()
    shown = report.checks if show_all else report.failures
    if shown:
        table = Table(title="data check" + ("" if show_all else ": failures"))
        for col in ("check", "field", "tier", "value", "limit", "n", ""):
            table.add_column(col)
        for c in shown:
            value = "—" if c.value is None else (f"{c.value:.2%}" if c.kind == "missing"
                                                 else f"{c.value:.4f}")
            limit = f"{c.threshold:.2%}" if c.kind == "missing" else f"{c.threshold:.2f}"
            table.add_row(c.kind, c.field, c.tier, value, limit, str(c.n),
                          "[green]ok[/]" if c.passed else "[bold red]FAIL[/]")
        console.print(table)
    for line in skipped:
        console.print(f"[bold red]unreadable:[/] {line}", highlight=False)
    n_psi = sum(c.kind == "psi" for c in report.checks)
    verdict = "[green]PASSED[/]" if report.passed and not skipped else "[bold red]FAILED[/]"
    console.print(f"{verdict}: {report.rows} rows, {len(report.checks) - n_psi} missing-rate "
                  f"checks, {n_psi} PSI checks"
                  + (f" against {report.baseline_rows} baseline rows" if n_psi else "")
                  + f", {len(report.failures)} failed")

"""What people read: the rich tables printed at the end of `tightfit bench` and of a sweep, and
the Markdown report (`tightfit bench report`) that embeds the PNG plots of `plots.py`.
Reads `Measurement`s only; runs nothing.
"""
from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

from tightfit.bench.compare import METRICS, Comparison
from tightfit.data.schema import Measurement


def console() -> Console:
    """Stdout console; when piped (no terminal to measure), wide enough for the tables."""
    import sys

    return Console() if sys.stdout.isatty() else Console(width=200)


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit in ("MiB", "tok/s"):
        return f"{value:,.1f}"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def compare_table(comp: Comparison) -> Table:
    suite = comp.suite
    table = Table(title=suite.title.format(model=comp.model, threads=comp.threads))
    table.add_column("metric", justify="left")
    columns = [(col, head) for col, head in suite.columns if col in comp.values]
    for _, head in columns:
        table.add_column(head, justify="right")
    for name, justify in (("ratio", "right"), ("target", "left"), ("", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    alt = bool(suite.alt) and any(t.ours in comp.values for t in suite.alt.values())
    if alt:  # the same targets on the second engine's columns
        table.add_column(f"{suite.alt_label} ratio", justify="right")
        table.add_column("", justify="left")
    verdicts, alt_verdicts = comp.verdicts(), comp.verdicts(alt=True)
    for m in METRICS:
        ratio = comp.ratio(m.key)
        target = suite.targets.get(m.key)
        cells = [f"{m.label} ({m.unit})",
                 *(_fmt(comp.values[col].get(m.key), m.unit) for col, _ in columns),
                 f"{ratio:.2f}x" if ratio else "—", target.describe() if target else "",
                 _mark(target, verdicts.get(m.key))]
        if alt:
            alt_ratio = comp.alt_ratio(m.key)
            cells += [f"{alt_ratio:.2f}x" if alt_ratio else "",
                      _mark(suite.alt.get(m.key), alt_verdicts.get(m.key))]
        table.add_row(*cells)
    return table


def _mark(target: Any, verdict: bool | None) -> str:
    return "" if target is None else {True: "[green]met[/]", False: "[red]missed[/]",
                                      None: "[yellow]n/a[/]"}[verdict]


def compare_footer(comp: Comparison) -> list[str]:
    lines = [f"{b}: {e}" for b, errs in comp.errors.items() for e in errs]
    if comp.load_avg_1m is not None:
        busy = (f", other processes kept {comp.other_cpu_cores:.2f} cores busy"
                if comp.other_cpu_cores is not None else "")
        lines.append(f"machine load: 1-min load average up to {comp.load_avg_1m:.2f}{busy}")
    return lines + comp.notes


SUMMARY_COLUMNS = (
    ("backend", lambda m: m.config.backend), ("model", lambda m: m.model.name),
    ("format", lambda m: m.model.weight_format), ("thr", lambda m: str(m.config.threads)),
    ("scenario", lambda m: m.workload.scenario if m.workload else "—"),
    ("prompt", lambda m: f"{m.workload.prompt_tokens_mean:.0f}" if m.workload else "—"),
    ("conc", lambda m: str(m.workload.concurrency or "open") if m.workload else "—"),
    ("TTFT p50 s", lambda m: _fmt(m.results.ttft_s_p50) if m.results else "—"),
    ("TPOT p50 s", lambda m: _fmt(m.results.tpot_s_p50) if m.results else "—"),
    ("decode tok/s", lambda m: _fmt(m.results.decode_tok_s, "tok/s") if m.results else "—"),
    ("thru tok/s", lambda m: _fmt(m.results.throughput_tok_s, "tok/s") if m.results else "—"),
    ("RSS MiB", lambda m: _fmt(m.results.peak_rss_mib, "MiB") if m.results else "—"),
    ("status", lambda m: ("[red]failed[/]" if m.status == "failed" else "ok")
     + (" *" if m.contended else "")),
)


def summary_table(rows: Sequence[Measurement], title: str) -> Table:
    table = Table(title=title, caption="* taken while other processes used >= 0.25 core")
    for name, _ in SUMMARY_COLUMNS:
        table.add_column(name, justify="left" if name in ("backend", "model", "scenario", "status")
                         else "right")
    for m in rows:
        table.add_row(*(get(m) for _, get in SUMMARY_COLUMNS))
    return table


def markdown_report(rows: Sequence[Measurement], title: str, plots: Sequence[Path],
                    out_dir: Path) -> str:
    ok = [m for m in rows if m.status == "ok"]
    failed = [m for m in rows if m.status == "failed"]
    lines = [f"# {title}", "",
             f"Generated {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')} from "
             f"{len(rows)} measurements ({len(ok)} ok, {len(failed)} failed; "
             f"{sum(bool(m.contended) for m in rows)} taken under contention).", ""]
    lines += _machines(rows) + [""]
    for p in plots:
        lines += [f"![{p.stem}]({p.relative_to(out_dir).as_posix()})", ""]
    lines += ["## Results", "", _md_table(ok), ""]
    if failed:
        lines += ["## Failed runs", ""] + [f"- `{_label(m)}`: {m.error}" for m in failed] + [""]
    return "\n".join(lines)


def _machines(rows: Sequence[Measurement]) -> list[str]:
    seen: dict[str, Any] = {}
    for m in rows:
        seen.setdefault(m.hardware.machine_id or "?", m.hardware)
    out = ["## Machines", ""]
    for mid, h in seen.items():
        out.append(f"- `{mid}`: {h.cpu_model}, {h.cpu_threads_logical} logical CPUs, "
                   f"{h.memory_total_gib} GiB, copy {h.memory_bandwidth_gbps} GB/s, matmul "
                   f"{h.matmul_gflops} GFLOP/s, flags {' '.join(h.cpu_flags or [])}")
    loads = Counter(round(m.hardware.load_avg_1m or 0) for m in rows)
    out.append(f"- load average at run start (rounded: runs): {dict(sorted(loads.items()))}")
    return out


def _label(m: Measurement) -> str:
    return " ".join(str(x) for x in (m.config.backend, m.model.name, m.model.weight_format,
                                     f"t{m.config.threads}",
                                     m.workload.scenario if m.workload else "?"))


def _md_table(rows: Sequence[Measurement]) -> str:
    head = [name for name, _ in SUMMARY_COLUMNS]
    body = [[_plain(get(m)) for _, get in SUMMARY_COLUMNS] for m in rows]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in body])


def _plain(text: str) -> str:
    for tag in ("[red]", "[green]", "[yellow]", "[/]"):
        text = text.replace(tag, "")
    return text

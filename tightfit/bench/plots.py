"""Matplotlib PNGs for a sweep report: throughput against concurrency, TTFT against prompt length,
single-stream decode by thread count, and throughput per scenario. Each plot is drawn only when
the rows hold the variation it needs; returns the files written. Headless (Agg).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import median
from typing import Callable, Sequence

from tightfit.data.schema import Measurement

Series = dict[str, list[tuple[float, float]]]


def _series_key(m: Measurement) -> str:
    return f"{m.config.backend} {m.model.name} {m.model.weight_format} t{m.config.threads}"


def _collect(rows: Sequence[Measurement], x: Callable[[Measurement], float | None],
             y: Callable[[Measurement], float | None]) -> Series:
    raw: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for m in rows:
        xv, yv = x(m), y(m)
        if xv is not None and yv is not None:
            raw[_series_key(m)][xv].append(yv)
    return {k: sorted((xv, median(ys)) for xv, ys in pts.items()) for k, pts in sorted(raw.items())}


def _line_plot(series: Series, path: Path, title: str, xlabel: str, ylabel: str,
               logy: bool = False, logx: bool = False) -> Path | None:
    if not any(len(pts) >= 2 for pts in series.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if logy:
        ax.set_yscale("log")
    if logx:
        from matplotlib.ticker import ScalarFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ok(rows: Sequence[Measurement]) -> list[Measurement]:
    return [m for m in rows if m.status == "ok" and m.results and m.workload
            and m.config.backend != "simulated"]


def throughput_vs_concurrency(rows: Sequence[Measurement], out: Path) -> list[Path]:
    paths = []
    by_scenario: dict[str, list[Measurement]] = defaultdict(list)
    for m in _ok(rows):
        if m.workload and m.workload.arrival == "closed":
            by_scenario[m.workload.scenario].append(m)
    for scenario, ms in sorted(by_scenario.items()):
        s = _collect(ms, lambda m: m.workload.concurrency if m.workload else None,
                     lambda m: m.results.throughput_tok_s if m.results else None)
        p = _line_plot(s, out / f"throughput_vs_concurrency_{scenario}.png",
                       f"{scenario}: aggregate output tok/s", "requests in flight", "tok/s",
                       logx=True)
        paths += [p] if p else []
    return paths


def ttft_vs_prompt(rows: Sequence[Measurement], out: Path) -> list[Path]:
    ms = [m for m in _ok(rows) if m.workload and m.workload.concurrency == 1]
    s = _collect(ms, lambda m: m.workload.prompt_tokens_mean if m.workload else None,
                 lambda m: m.results.ttft_s_p50 if m.results else None)
    p = _line_plot(s, out / "ttft_vs_prompt.png", "TTFT, one request at a time",
                   "prompt tokens", "TTFT p50 (s)", logy=True, logx=True)
    return [p] if p else []


def decode_by_threads(rows: Sequence[Measurement], out: Path) -> list[Path]:
    ms = [m for m in _ok(rows) if m.workload and m.workload.concurrency == 1]
    raw: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for m in ms:
        if m.results and m.results.decode_tok_s is not None:
            key = f"{m.config.backend} {m.model.name} {m.model.weight_format}"
            raw[key].append((m.config.threads, m.results.decode_tok_s))
    series = {k: sorted((t, median([v for tt, v in pts if tt == t])) for t in {t for t, _ in pts})
              for k, pts in sorted(raw.items())}
    p = _line_plot(series, out / "decode_by_threads.png", "single-stream decode rate",
                   "threads", "decode tok/s")
    return [p] if p else []


def throughput_by_scenario(rows: Sequence[Measurement], out: Path) -> list[Path]:
    ms = _ok(rows)
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for m in ms:
        if m.results and m.results.throughput_tok_s and m.workload:
            cells[(m.workload.scenario, _series_key(m))].append(m.results.throughput_tok_s)
    scenarios = sorted({s for s, _ in cells})
    keys = sorted({k for _, k in cells})
    if len(scenarios) < 2 or not keys:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(7, len(scenarios) * 0.9), 4.2))
    width = 0.8 / len(keys)
    for i, k in enumerate(keys):
        vals = [median(cells[(s, k)]) if cells.get((s, k)) else 0.0 for s in scenarios]
        ax.bar([j + i * width for j in range(len(scenarios))], vals, width, label=k)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(scenarios))], scenarios, rotation=30,
                  ha="right", fontsize=8)
    ax.set(title="output tok/s per scenario (median over runs)", ylabel="tok/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "throughput_by_scenario.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def all_plots(rows: Sequence[Measurement], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [*throughput_by_scenario(rows, out), *throughput_vs_concurrency(rows, out),
            *ttft_vs_prompt(rows, out), *decode_by_threads(rows, out)]

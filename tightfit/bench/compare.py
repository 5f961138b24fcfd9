"""`tightfit bench`: tightfit side by side with a baseline on the same model file and prompts, in
one run, each engine in its own process, with an issue's targets judged as ratios.

Two suites:
- `hf` (default; issue 2): fp32 weights against HF Transformers fp32 on the same GGUF.
- `llamacpp` (issue 7): the GGUF's own 4-bit weights (`native`) against llama.cpp on the same
  file: `llama-bench` (tg128 / pp512, llama.cpp's own figures), `llama-server` with parallel
  slots against `tightfit serve` (both in their own process, 16 concurrent streaming requests)
  and llama-cpp-python (its peak RSS, the issue's memory baseline).
Metrics: single-stream decode, TTFT on a short prompt, prefill on a ~510-token prompt, aggregate
throughput at 16 concurrent requests, peak RSS and load time. Builds tasks and reads
measurements; the runner runs them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tightfit.bench.backends.base import BackendOptions
from tightfit.bench.runner import Task
from tightfit.bench.workloads import Overrides
from tightfit.data.schema import Measurement

SWEEP_NAME = "compare"
BASELINE = "hf"
LLAMA_BENCH = "llama-bench"  # a column filled by the llama-bench program, not by a backend


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    scenario: str
    field: str  # Results field, or "peak" / "load" for process-wide figures
    higher_is_better: bool


METRICS = (
    Metric("decode_tok_s", "decode, 1 stream", "tok/s", "decode", "decode_tok_s", True),
    Metric("ttft_s", "TTFT, 18-token prompt", "s", "ttft", "ttft_s_p50", False),
    Metric("prefill_tok_s", "prefill, 510-token prompt", "tok/s", "prefill", "prefill_tok_s", True),
    Metric("aggregate_tok_s", "aggregate, 16 concurrent", "tok/s", "concurrent-16",
           "throughput_tok_s", True),
    Metric("peak_rss_mib", "peak RSS", "MiB", "", "peak", False),
    Metric("load_time_s", "load time", "s", "", "load", False),
)


@dataclass(frozen=True)
class Target:
    metric: str
    kind: Literal["ratio_min", "ratio_max", "abs_max"]
    value: float
    ours: str = "tightfit"  # the column judged
    base: str = BASELINE  # the column it is judged against
    base_label: str = "HF"

    def describe(self) -> str:
        return {"ratio_min": f">= {self.value:g}x {self.base_label}",
                "ratio_max": f"<= {self.value:g}x {self.base_label}",
                "abs_max": f"<= {self.value:g} s"}[self.kind]

    def met(self, ours: float | None, base: float | None) -> bool | None:
        if ours is None or (self.kind != "abs_max" and not base):
            return None
        if self.kind == "abs_max":
            return ours <= self.value
        ratio = ours / base  # type: ignore[operator]
        return ratio >= self.value if self.kind == "ratio_min" else ratio <= self.value


@dataclass(frozen=True)
class Suite:
    name: str
    title: str  # "{model}" and "{threads}" are filled in
    quant: str
    columns: tuple[tuple[str, str], ...]  # (backend or LLAMA_BENCH, header)
    plan: dict[str, tuple[str, ...]]  # backend -> scenarios it runs
    targets: dict[str, Target]
    base: str  # the column ratios are taken against for metrics without a target
    # the same targets judged on a second engine's columns (the lite runtime), shown beside
    alt: dict[str, Target] = field(default_factory=dict)
    alt_label: str = ""


_ALL = ("decode", "ttft", "prefill", "concurrent-16")

# Issue 2, item 7 (default model, 2 threads, fp32 weights).
HF_SUITE = Suite(
    "hf", "tightfit vs HF Transformers — {model}, {threads} threads, fp32", "fp32",
    (("tightfit", "tightfit"), ("hf", "HF fp32")), {"tightfit": _ALL, "hf": _ALL},
    {t.metric: t for t in (
        Target("aggregate_tok_s", "ratio_min", 2.5), Target("decode_tok_s", "ratio_min", 1.3),
        Target("ttft_s", "ratio_max", 0.5), Target("peak_rss_mib", "ratio_max", 0.6),
        Target("load_time_s", "abs_max", 5.0))},
    "hf")

# Issue 7, item 6 (default model, 2 threads, the file's own 4-bit weights).
LLAMACPP_SUITE = Suite(
    "llamacpp", "tightfit vs llama.cpp — {model}, {threads} threads, the file's own weights",
    "native",
    (("tightfit", "tightfit"), ("tightfit-serve", "tightfit serve"),
     ("tightfit-lite", "lite"), ("tightfit-lite-serve", "lite serve"),
     (LLAMA_BENCH, "llama-bench"), ("llamacpp", "llama-cpp-python"),
     ("llama-server", "llama-server")),
    {"tightfit": _ALL, "tightfit-serve": ("concurrent-16",), "tightfit-lite": _ALL,
     "tightfit-lite-serve": ("concurrent-16",),
     "llamacpp": ("decode", "ttft", "prefill"), "llama-server": ("concurrent-16",)},
    {t.metric: t for t in (
        Target("decode_tok_s", "ratio_min", 1.0, base=LLAMA_BENCH, base_label="llama-bench tg"),
        Target("aggregate_tok_s", "ratio_min", 1.0, ours="tightfit-serve", base="llama-server",
               base_label="llama-server"),
        Target("peak_rss_mib", "ratio_max", 1.2, base="llamacpp",
               base_label="llama-cpp-python"))},
    "llamacpp",
    {t.metric: t for t in (
        Target("decode_tok_s", "ratio_min", 1.0, ours="tightfit-lite", base=LLAMA_BENCH,
               base_label="llama-bench tg"),
        Target("aggregate_tok_s", "ratio_min", 1.0, ours="tightfit-lite-serve",
               base="llama-server", base_label="llama-server"),
        Target("peak_rss_mib", "ratio_max", 1.2, ours="tightfit-lite", base="llamacpp",
               base_label="llama-cpp-python"))},
    "lite")

SUITES = {s.name: s for s in (HF_SUITE, LLAMACPP_SUITE)}
TARGETS = HF_SUITE.targets  # kept for callers that knew only the HF comparison


def compare_tasks(model: str | None, threads: int, quick: bool,
                  backends: tuple[str, ...] | None = None, suite: Suite = HF_SUITE,
                  compile_decode: bool = False, scripted_decode: bool = True,
                  fused_kernels: bool = True) -> list[Task]:
    gen = 16 if quick else 64
    # decode as llama-bench's tg128 -r 3: three 128-token generations one after another, the
    # rate pooled over them (one 64-token request moved +-15% between runs on this VM)
    decode = Overrides(output_tokens=16) if quick else Overrides(output_tokens=128,
                                                                   num_requests=3)
    out = {"decode": decode, "ttft": Overrides(), "prefill": Overrides(),
           "concurrent-16": Overrides(output_tokens=gen)}
    # llama-bench is a program the CLI runs after the backends, not a backend
    chosen = [b for b in (backends if backends is not None else suite.plan) if b != LLAMA_BENCH]
    def options(backend: str) -> BackendOptions:
        extra: dict[str, bool] = {}
        if backend in ("tightfit", "tightfit-serve", "tightfit-http"):
            if compile_decode:
                extra["compile_decode"] = True
            if not scripted_decode:
                extra["scripted_decode"] = False
            if not fused_kernels:
                extra["fused_kernels"] = False
        return BackendOptions(model=model, quant=suite.quant, threads=threads, extra=extra)

    return [Task(b, options(b), scenario, out[scenario], sweep=SWEEP_NAME)
            for b in chosen for scenario in suite.plan.get(b, _ALL)]


@dataclass
class Comparison:
    model: str
    threads: int
    suite: Suite = HF_SUITE
    values: dict[str, dict[str, float | None]] = field(default_factory=dict)  # column -> metric
    errors: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    load_avg_1m: float | None = None
    other_cpu_cores: float | None = None

    def _pair(self, metric: str) -> tuple[str, str]:
        t = self.suite.targets.get(metric)
        return (t.ours, t.base) if t is not None and t.kind != "abs_max" else \
            ("tightfit", self.suite.base)

    def _ratio(self, metric: str, ours_col: str, base_col: str) -> float | None:
        ours = self.values.get(ours_col, {}).get(metric)
        base = self.values.get(base_col, {}).get(metric)
        return ours / base if ours is not None and base else None

    def ratio(self, metric: str, backend: str | None = None) -> float | None:
        ours_col, base_col = self._pair(metric)
        return self._ratio(metric, backend or ours_col, base_col)

    def verdicts(self, alt: bool = False) -> dict[str, bool | None]:
        """Each target met or not (None: a column is missing); `alt`: the suite's second
        engine's."""
        targets = self.suite.alt if alt else self.suite.targets
        return {k: t.met(self.values.get(t.ours, {}).get(k), self.values.get(t.base, {}).get(k))
                for k, t in targets.items()}

    def alt_ratio(self, metric: str) -> float | None:
        t = self.suite.alt.get(metric)
        if t is None or t.kind == "abs_max":
            return None
        return self._ratio(metric, t.ours, t.base)

    def to_json(self) -> dict[str, Any]:
        verdicts, alt = self.verdicts(), self.verdicts(alt=True)
        out = {"suite": self.suite.name, "model": self.model, "threads": self.threads,
               "values": self.values, "ratios": {m.key: self.ratio(m.key) for m in METRICS},
               "targets": {k: {"target": t.describe(), "met": verdicts[k]}
                           for k, t in self.suite.targets.items()}}
        if self.suite.alt:
            out[f"{self.suite.alt_label}_targets"] = {
                k: {"column": t.ours, "target": t.describe(), "ratio": self.alt_ratio(k),
                    "met": alt[k]} for k, t in self.suite.alt.items()}
        return {**out, "errors": self.errors, "notes": self.notes, "load_avg_1m": self.load_avg_1m,
                "other_cpu_cores_mean": self.other_cpu_cores}


def collect(measurements: list[Measurement], model: str, threads: int,
            suite: Suite = HF_SUITE) -> Comparison:
    """Folds the runs of `compare_tasks` into one comparison."""
    comp = Comparison(model, threads, suite)
    loads, others = [], []
    for m in measurements:
        backend = m.config.backend
        vals = comp.values.setdefault(backend, {mt.key: None for mt in METRICS})
        if m.status != "ok" or m.results is None or m.workload is None:
            scenario = m.workload.scenario if m.workload else "?"
            comp.errors.setdefault(backend, []).append(f"{scenario}: {m.error}")
            continue
        r = m.results
        for mt in METRICS:
            if mt.scenario == m.workload.scenario:
                vals[mt.key] = getattr(r, mt.field)
        vals["peak_rss_mib"] = max(vals["peak_rss_mib"] or 0.0, r.peak_rss_mib or 0.0) or None
        vals["load_time_s"] = r.load_time_s
        h = m.hardware
        loads += [h.load_avg_1m] if h.load_avg_1m is not None else []
        others += [h.other_cpu_cores_mean] if h.other_cpu_cores_mean is not None else []
    comp.load_avg_1m = max(loads) if loads else None
    comp.other_cpu_cores = round(max(others), 2) if others else None
    return comp


def add_llama_bench(comp: Comparison, figures: list[Any], note: str) -> None:
    """Puts llama-bench's tg / pp figures in their column (decode / prefill)."""
    vals = comp.values.setdefault(LLAMA_BENCH, {mt.key: None for mt in METRICS})
    for f in figures:
        if f.test.startswith("tg"):
            vals["decode_tok_s"] = f.tok_s
        elif f.test.startswith("pp") and "+" not in f.test:
            vals["prefill_tok_s"] = f.tok_s
    comp.notes.append(note)

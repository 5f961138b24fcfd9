"""`tightfit bench`: tightfit against HF Transformers on the same prompts, in one run, each in its
own worker process: single-stream decode, TTFT on a short prompt, prefill on a ~510-token prompt,
aggregate throughput at 16 concurrent requests, peak RSS and load time — with the engine-core
targets (issue 2) judged as ratios. Builds tasks and reads measurements; the runner runs them.
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

    def describe(self) -> str:
        return {"ratio_min": f">= {self.value:g}x HF", "ratio_max": f"<= {self.value:g}x HF",
                "abs_max": f"<= {self.value:g} s"}[self.kind]

    def met(self, ours: float | None, base: float | None) -> bool | None:
        if ours is None or (self.kind != "abs_max" and not base):
            return None
        if self.kind == "abs_max":
            return ours <= self.value
        ratio = ours / base  # type: ignore[operator]
        return ratio >= self.value if self.kind == "ratio_min" else ratio <= self.value


# Issue 2, item 7 (default model, 2 threads, fp32 weights).
TARGETS = {t.metric: t for t in (
    Target("aggregate_tok_s", "ratio_min", 2.5), Target("decode_tok_s", "ratio_min", 1.3),
    Target("ttft_s", "ratio_max", 0.5), Target("peak_rss_mib", "ratio_max", 0.6),
    Target("load_time_s", "abs_max", 5.0))}


def compare_tasks(model: str | None, threads: int, quick: bool,
                  backends: tuple[str, ...] = ("tightfit", BASELINE)) -> list[Task]:
    gen = 16 if quick else 64
    plan = (("decode", Overrides(output_tokens=gen)), ("ttft", Overrides()),
            ("prefill", Overrides()), ("concurrent-16", Overrides(output_tokens=gen)))
    return [Task(b, BackendOptions(model=model, quant="fp32", threads=threads), scenario, o,
                 sweep=SWEEP_NAME) for b in backends for scenario, o in plan]


@dataclass
class Comparison:
    model: str
    threads: int
    values: dict[str, dict[str, float | None]] = field(default_factory=dict)  # backend -> metric
    errors: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    load_avg_1m: float | None = None
    other_cpu_cores: float | None = None

    def ratio(self, metric: str, backend: str = "tightfit") -> float | None:
        ours = self.values.get(backend, {}).get(metric)
        base = self.values.get(BASELINE, {}).get(metric)
        return ours / base if ours is not None and base else None

    def verdicts(self) -> dict[str, bool | None]:
        ours, base = self.values.get("tightfit", {}), self.values.get(BASELINE, {})
        return {k: t.met(ours.get(k), base.get(k)) for k, t in TARGETS.items()}

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "threads": self.threads, "values": self.values,
                "ratios": {m.key: self.ratio(m.key) for m in METRICS},
                "targets": {k: {"target": t.describe(), "met": self.verdicts()[k]}
                            for k, t in TARGETS.items()},
                "errors": self.errors, "notes": self.notes, "load_avg_1m": self.load_avg_1m,
                "other_cpu_cores_mean": self.other_cpu_cores}


def collect(measurements: list[Measurement], model: str, threads: int) -> Comparison:
    """Folds the runs of `compare_tasks` into one comparison."""
    comp = Comparison(model, threads)
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

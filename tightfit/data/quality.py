"""Quality gates on measurements: missing rate per field and population-stability index (PSI).

Thresholds follow the source brief: missing <= 0.5% for key fields and <= 2% for others; PSI
<= 0.10 for key fields and <= 0.15 for others. Fields marked `na` in the schema (null by design)
are not gated; results and workload fields are judged over successful runs only, since a failed
run has no results by design. Pure Python; the numbers are exact for given inputs (see tests).
"""
from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from types import UnionType
from typing import Any, Iterable, Literal, Sequence, Union, get_args, get_origin

from pydantic import BaseModel

from tightfit.data.schema import Measurement
from tightfit.data.store import flatten

Tier = Literal["key", "other", "na"]
OK_ONLY_SECTIONS = ("results.", "workload.")
PSI_SECTIONS = ("results.", "workload.")
PSI_EPS = 1e-4


@dataclass(frozen=True)
class Thresholds:
    missing_key: float = 0.005
    missing_other: float = 0.02
    psi_key: float = 0.10
    psi_other: float = 0.15


@dataclass(frozen=True)
class FieldSpec:
    name: str  # dotted: "results.ttft_s_p50"
    tier: Tier
    numeric: bool


@dataclass(frozen=True)
class Check:
    kind: Literal["missing", "psi"]
    field: str
    tier: Tier
    value: float | None  # None: not computable (too few rows)
    threshold: float
    n: int

    @property
    def passed(self) -> bool:
        return self.value is None or self.value <= self.threshold


@dataclass
class QualityReport:
    checks: list[Check] = field(default_factory=list)
    rows: int = 0
    baseline_rows: int | None = None

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def passed(self) -> bool:
        return not self.failures


def field_specs(model: type[BaseModel] = Measurement, prefix: str = "") -> list[FieldSpec]:
    """Every leaf field of the schema with its tier (from the `key` / `na` field metadata)."""
    specs: list[FieldSpec] = []
    for name, info in model.model_fields.items():
        sub = _submodel(info.annotation)
        dotted = f"{prefix}{name}"
        if sub is not None:
            specs += field_specs(sub, f"{dotted}.")
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        tier: Tier = "key" if extra.get("key") else "na" if extra.get("na") else "other"
        specs.append(FieldSpec(dotted, tier, _is_numeric(info.annotation)))
    return specs


def _submodel(annotation: Any) -> type[BaseModel] | None:
    for t in (annotation, *get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def _is_numeric(annotation: Any) -> bool:
    """int / float, optionally `| None`; not bool, not containers."""
    union = get_origin(annotation) in (Union, UnionType)
    types = get_args(annotation) if union else (annotation,)
    return any(t in (int, float) for t in types) and bool not in types


def is_missing(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


def missing_rate(values: Sequence[Any]) -> float:
    """Share of values that are null, empty or NaN (0.0 for no values)."""
    return sum(map(is_missing, values)) / len(values) if values else 0.0


def psi(expected: Sequence[float], actual: Sequence[float], bins: int = 10,
        eps: float = PSI_EPS) -> float:
    """PSI of `actual` against `expected`, with bins at the quantiles of `expected`.

    Edges: the distinct values `sorted(expected)[floor(i * n / bins)]` for i = 1..bins-1; a value
    x falls in bin `bisect_right(edges, x)`. Empty bins count as `eps`. Sum of (a - e) ln(a / e).
    """
    if not expected or not actual:
        raise ValueError("psi needs at least one value on each side")
    e_sorted = sorted(expected)
    n = len(e_sorted)
    edges = sorted({e_sorted[math.floor(i * n / bins)] for i in range(1, bins)})
    return _psi_from_counts(Counter(bisect_right(edges, x) for x in expected),
                            Counter(bisect_right(edges, x) for x in actual),
                            len(expected), len(actual), range(len(edges) + 1), eps)


def psi_categorical(expected: Sequence[Any], actual: Sequence[Any], eps: float = PSI_EPS) -> float:
    """PSI over categories (every value seen on either side is one bin)."""
    cats = sorted({*map(str, expected), *map(str, actual)})
    return _psi_from_counts(Counter(map(str, expected)), Counter(map(str, actual)),
                            len(expected), len(actual), cats, eps)


def _psi_from_counts(ce: Counter[Any], ca: Counter[Any], ne: int, na_: int,
                     bins: Iterable[Any], eps: float) -> float:
    total = 0.0
    for b in bins:
        e = max(ce.get(b, 0) / ne, eps)
        a = max(ca.get(b, 0) / na_, eps)
        total += (a - e) * math.log(a / e)
    return total


def check(measurements: Sequence[Measurement], baseline: Sequence[Measurement] | None = None,
          thresholds: Thresholds = Thresholds(), bins: int = 10) -> QualityReport:
    """Missing rates over `measurements`; PSI of each numeric field against `baseline` if given."""
    rows = [flatten(m) for m in measurements]
    report = QualityReport(rows=len(rows),
                           baseline_rows=len(baseline) if baseline is not None else None)
    specs = [s for s in field_specs() if s.tier != "na"]
    for spec in specs:
        values = [r.get(spec.name) for r in _population(rows, spec.name)]
        limit = thresholds.missing_key if spec.tier == "key" else thresholds.missing_other
        report.checks.append(Check("missing", spec.name, spec.tier, missing_rate(values), limit,
                                   len(values)))
    if baseline is not None:
        base_rows = [flatten(m) for m in baseline]
        for spec in specs:
            if spec.numeric and spec.name.startswith(PSI_SECTIONS):
                report.checks.append(_psi_check(spec, base_rows, rows, thresholds, bins))
    return report


def _population(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    if name.startswith(OK_ONLY_SECTIONS):
        return [r for r in rows if r.get("status") == "ok"]
    return rows


def _psi_check(spec: FieldSpec, base_rows: list[dict[str, Any]], rows: list[dict[str, Any]],
               thresholds: Thresholds, bins: int) -> Check:
    def values(rs: list[dict[str, Any]]) -> list[float]:
        return [float(r[spec.name]) for r in _population(rs, spec.name)
                if not is_missing(r.get(spec.name))]

    e, a = values(base_rows), values(rows)
    limit = thresholds.psi_key if spec.tier == "key" else thresholds.psi_other
    value = psi(e, a, bins) if len(e) >= 2 and len(a) >= 2 else None
    return Check("psi", spec.name, spec.tier, value, limit, min(len(e), len(a)))

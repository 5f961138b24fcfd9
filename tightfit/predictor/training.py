"""Fit the predictor from observations: per phase, screen features, fit the ridge, and derive the
error band from grouped cross-validation residuals (held out by device, never at random).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Sequence

from tightfit.predictor import features, models, roofline, screening
from tightfit.predictor.datasets import Observation
from tightfit.predictor.models import PredictorModel, ResidualModel

PHASE_METRIC = {"decode": "decode_tok_s", "prefill": "prefill_tok_s"}


@dataclass(frozen=True)
class Sample:
    rows: list[dict[str, float]]
    target: list[float]
    groups: list[str]
    weights: list[float]


def base_rate(o: Observation, phase: str, b: roofline.Breakdown) -> float:
    """The analytic rate of the phase for the observation's scenario (`b`: its breakdown)."""
    w = o.scenario.workload
    if phase == "decode":
        return w.batch / b.decode.total
    return w.batch * w.prompt_tokens / b.prefill.total


def measured_rate(o: Observation, phase: str, b: roofline.Breakdown) -> float:
    """The observation's rate of the phase. A rate over a whole request (`whole_request`) is
    taken back to its decode steps' rate by removing the analytic TTFT (the prompt, the request
    overhead) from its wall time, leaving the steps at least half of it."""
    w = o.scenario.workload
    if phase != "decode" or not o.whole_request:
        return o.value
    total = w.batch * w.gen_tokens / o.value
    steps = max(total - b.prefill.total - b.request_overhead_s, 0.5 * total)
    return w.batch * max(w.gen_tokens - 1, 1) / steps


def sample(obs: Sequence[Observation], phase: str) -> Sample:
    """Features and log(measured/analytic) targets; rows weighted 1/sqrt(rows of their device)."""
    chosen = [o for o in obs if o.metric == PHASE_METRIC[phase]]
    per_device = Counter(o.device_key for o in chosen)
    rows, y, groups, wts = [], [], [], []
    for o in chosen:
        b = roofline.analyse(o.scenario)
        rows.append(features.features(o.scenario, b, phase))
        y.append(math.log(measured_rate(o, phase, b) / base_rate(o, phase, b)))
        groups.append(o.device_key)
        wts.append(1.0 / math.sqrt(per_device[o.device_key]))
    return Sample(rows, y, groups, wts)


def _class_devices(smp: Sample) -> dict[str, set[str]]:
    devices: dict[str, set[str]] = {}
    for row, group in zip(smp.rows, smp.groups):
        devices.setdefault(models.device_class_of(row), set()).add(group)
    return devices


def placed_classes(smp: Sample) -> tuple[str, ...]:
    """Device classes with at least `features.MIN_CLASS_DEVICES` devices in the sample: the
    ones whose level the rows pin down rather than measure on one device."""
    return tuple(sorted(c for c, devs in _class_devices(smp).items()
                        if c and len(devs) >= features.MIN_CLASS_DEVICES))


def _drop_unplaced(names: list[str], placed: tuple[str, ...]) -> list[str]:
    return [n for n in names if not n.startswith("class_") or n.removeprefix("class_") in placed]


def supported(names: list[str], smp: Sample) -> list[str]:
    """Candidates less the device-class flags of classes with fewer than
    `features.MIN_CLASS_DEVICES` devices in the sample: such a flag measures that one device."""
    return _drop_unplaced(names, placed_classes(smp))


def fit_phase(obs: Sequence[Observation], phase: str, candidates: Sequence[str] | None = None,
              screen: bool = True, band: bool = True) -> ResidualModel:
    smp = sample(obs, phase)
    placed = placed_classes(smp)
    names = _drop_unplaced(list(candidates or features.candidate_names(phase)), placed)
    if screen and len(set(smp.groups)) >= 3:
        sel = screening.select(smp.rows, smp.target, smp.groups, names, phase, smp.weights,
                               always=features.DECODE_ALWAYS if phase == "decode"
                               else features.ENGINE_FEATURES)
        kept, crosses = list(sel.kept), list(sel.crosses)
        info: dict[str, object] = {
            "threshold": sel.threshold, "cv_r2": round(sel.cv_r2, 4),
            "sensitivity": {k: round(v, 4) for k, v in sel.sensitivity.items()},
            "dropped": [n for n in names if n not in kept], "cross_gains": sel.cross_gains}
    else:
        kept, crosses, info = names, [], {"threshold": None}
    model = models.fit(phase, smp.rows, smp.target, kept, crosses, smp.weights)
    interval, by_class = _band(smp, kept, crosses, phase) if band else (model.interval, {})
    info["n_rows"] = len(smp.rows)
    return replace(model, interval=interval, class_interval=by_class, info=info,
                   known_classes=placed,
                   known_engines=tuple(sorted({models.engine_of(r) for r in smp.rows}))
                   if phase in features.PHYSICS_FOR_UNSEEN_ENGINE else (),
                   unseen_class_physics=phase in features.PHYSICS_FOR_UNSEEN_CLASS,
                   unplaced_class_physics=phase in features.PHYSICS_FOR_UNPLACED_CLASS)


MIN_BAND_ROWS = 30  # held-out residuals a device class needs for a band of its own


def _quantiles(res: list[float]) -> tuple[float, float]:
    res = sorted(res)
    return (res[int(0.05 * (len(res) - 1))], res[int(0.95 * (len(res) - 1))])


def _band(smp: Sample, kept: list[str], crosses: list[tuple[str, str]], phase: str
          ) -> tuple[tuple[float, float], dict[str, tuple[float, float]]]:
    """5% and 95% quantiles of leave-one-device-out log residuals: over every row, and per
    device class with at least MIN_BAND_ROWS rows (two CPUs whose kernels differ 2x at equal
    probes make the CPU band wide; a GPU's prediction should not carry it)."""
    res: list[tuple[str, float]] = []
    for g in sorted(set(smp.groups)):
        tr = [i for i, x in enumerate(smp.groups) if x != g]
        if not tr:
            continue
        m = models.fit(phase, [smp.rows[i] for i in tr], [smp.target[i] for i in tr], kept,
                       crosses, [smp.weights[i] for i in tr])
        res += [(models.device_class_of(smp.rows[i]), smp.target[i] - m.predict_log(smp.rows[i]))
                for i, x in enumerate(smp.groups) if x == g]
    if len(res) < 5:
        return (-0.5, 0.5), {}
    by_class: dict[str, list[float]] = {}
    for cls, r in res:
        by_class.setdefault(cls, []).append(r)
    return _quantiles([r for _, r in res]), {c: _quantiles(v) for c, v in sorted(by_class.items())
                                             if c and len(v) >= MIN_BAND_ROWS}


def fit_predictor(obs: Sequence[Observation], data_hash: str, screen: bool = True,
                  band: bool = True) -> PredictorModel:
    return PredictorModel(fit_phase(obs, "decode", screen=screen, band=band),
                          fit_phase(obs, "prefill", screen=screen, band=band), data_hash)

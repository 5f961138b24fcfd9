"""Honest evaluation: leave-one-device-out and leave-one-model-out (never a random split).

In each fold the whole fit (screening included) sees only the training groups; every figure is
on the held-out group. Compares the full predictor with the analytic base alone and with a naive
bandwidth/compute roofline, so the gain is visible.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from tightfit.predictor import core, features, roofline, training
from tightfit.predictor.datasets import Observation
from tightfit.predictor.scenario import Scenario
from tightfit.predictor.models import PredictorModel, ResidualModel

METRICS = ("decode_tok_s", "prefill_tok_s", "ttft_s", "peak_memory_gb", "fits")
MEMORY_TARGET_SHARE, MEMORY_TARGET_GB = 0.10, 150e6 / 2**30  # issue 5: within 10% or 150 MB


def memory_within_target(pred: float, true: float) -> bool:
    """Peak memory within 10% of the measured value, or within 150 MB of it (small models)."""
    return abs(pred - true) <= max(MEMORY_TARGET_SHARE * true, MEMORY_TARGET_GB)


_ZERO = ResidualModel("x", (), (), (), (), (), 0.0, 0.0)


@dataclass(frozen=True)
class Scores:
    n: int
    mape: float
    median: float
    p90: float
    max: float
    r2_log: float

    def as_dict(self) -> dict[str, float]:
        return {"n": self.n, "mape": self.mape, "median": self.median, "p90": self.p90,
                "max": self.max, "r2_log": self.r2_log}


def scores(pred: Sequence[float], true: Sequence[float]) -> Scores:
    ape = sorted(100 * abs(p - t) / t for p, t in zip(pred, true))
    n = len(ape)
    if n == 0:
        return Scores(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    lt = [math.log(t) for t in true]
    lp = [math.log(max(p, 1e-12)) for p in pred]
    mu = sum(lt) / n
    ss = sum((x - mu) ** 2 for x in lt)
    r2 = 1 - sum((a - b) ** 2 for a, b in zip(lt, lp)) / ss if ss > 0 else math.nan
    return Scores(n, sum(ape) / n, ape[n // 2], ape[min(n - 1, int(math.ceil(0.9 * n)) - 1)],
                  ape[-1], r2)


def value_of(p: core.Prediction, metric: str) -> float | None:
    if metric == "fits":
        return None if p.fits is None else float(p.fits)
    return getattr(p, metric)


def predicted(o: Observation, p: core.Prediction) -> float | None:
    """The prediction of what the observation measured (a rate over a whole request for an
    observation that measured one: `Observation.whole_request`)."""
    if o.metric == "decode_tok_s" and o.whole_request:
        return core.request_tok_s(p, o.scenario)
    return value_of(p, o.metric)


def naive_value(o: Observation) -> float | None:
    if o.metric == "decode_tok_s":
        return roofline.naive_decode_tok_s(o.scenario)
    if o.metric == "prefill_tok_s":
        return roofline.naive_prefill_tok_s(o.scenario)
    return None


def fold_of(groups: Sequence[str], n_folds: int | None, seed: int = 0) -> dict[str, int]:
    """Group -> fold. None: one fold per group; else groups dealt into n folds in a seeded order."""
    uniq = sorted(set(groups))
    if n_folds is None or n_folds >= len(uniq):
        return {g: i for i, g in enumerate(uniq)}
    order = sorted(uniq, key=lambda g: hashlib.sha256(f"{seed}:{g}".encode()).hexdigest())
    return {g: i % n_folds for i, g in enumerate(order)}


def cross_validate(obs: Sequence[Observation], key: Callable[[Observation], str],
                   screen: bool = True, n_folds: int | None = None,
                   exclude: Sequence[str] = (), brief: str = "default", rates: str = "default",
                   scored: Callable[[Observation], bool] | None = None
                   ) -> list[tuple[Observation, core.Prediction]]:
    """Predictions for every observation from a model fitted without its group (all rows of a
    group are held out together; n_folds groups several groups into one fold). `scored`: predict
    only the rows it accepts (folds holding none of them are not fitted)."""
    folds = fold_of([key(o) for o in obs], n_folds)
    wanted = {folds[key(o)] for o in obs if scored is None or scored(o)}
    out = []
    for fold in sorted(wanted):
        train = [o for o in obs if folds[key(o)] != fold]
        model = PredictorModel(_fit(train, "decode", screen, exclude, brief, rates),
                               _fit(train, "prefill", screen, exclude, brief, rates), "cv")
        out += [(o, core.predict_scenario(o.scenario, model)) for o in obs
                if folds[key(o)] == fold and (scored is None or scored(o))]
    return out


def _fit(train: Sequence[Observation], phase: str, screen: bool,
         exclude: Sequence[str] = (), brief: str = "default",
         rates: str = "default") -> ResidualModel:
    if not any(o.metric == training.PHASE_METRIC[phase] for o in train):
        return _ZERO
    names = [n for n in features.candidate_names(phase, brief, rates) if n not in exclude]
    return training.fit_phase(train, phase, candidates=names, screen=screen, band=False)


def analytic_only(obs: Sequence[Observation]) -> list[tuple[Observation, core.Prediction]]:
    model = PredictorModel(_ZERO, _ZERO, "none")
    return [(o, core.predict_scenario(o.scenario, model)) for o in obs]


def summarise(pairs: Sequence[tuple[Observation, core.Prediction]],
              sources: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Scores per metric (fits: accuracy in %), optionally restricted to some sources."""
    out: dict[str, dict[str, float]] = {}
    for metric in METRICS:
        sel = [(o, p) for o, p in pairs if o.metric == metric and (not sources or o.source in sources)]
        if metric == "fits":
            got = [(predicted(o, p), o.value) for o, p in sel]
            known = [(a, b) for a, b in got if a is not None]
            if sel:
                out[metric] = {"n": len(sel), "accuracy": 100 * sum(a == b for a, b in known) / len(sel),
                               "undecided": len(sel) - len(known)}
            continue
        vals = [(predicted(o, p), o.value) for o, p in sel]
        vals = [(a, b) for a, b in vals if a is not None]
        if vals:
            out[metric] = scores([a for a, _ in vals], [b for _, b in vals]).as_dict()
            if metric == "peak_memory_gb":
                out[metric]["within_target"] = 100 * sum(
                    memory_within_target(a, b) for a, b in vals) / len(vals)
    return out


def summarise_naive(obs: Sequence[Observation], sources: Sequence[str] | None = None
                    ) -> dict[str, dict[str, float]]:
    out = {}
    for metric in ("decode_tok_s", "prefill_tok_s"):
        sel = [o for o in obs if o.metric == metric and (not sources or o.source in sources)]
        pv = [(naive_value(o), o.value) for o in sel]
        if pv:
            out[metric] = scores([a for a, _ in pv if a], [b for a, b in pv if a]).as_dict()
    return out


def by_model(o: Observation) -> str:
    return o.model_key


def device_key(o: Observation) -> str:
    return o.device_key


def by_machine(o: Observation) -> str:
    """A machine of tightfit's own dataset held out at every thread count at once (leave-one-
    device-out holds out one thread count, its other thread count still in the fit)."""
    return o.machine_key or o.device_key


# `tightfit calibrate`'s engine runs: tightfit, the lite runtime and (where llama-cpp-python is
# installed) llama.cpp, the embedded default model as stored (Q4_1), a 128-token prompt, every
# core (the dataset's rows of that configuration generate 128 tokens where calibrate
# generates 32).
CALIBRATION_ENGINES = ("tightfit", "tightfit-lite", "llama.cpp")
CALIBRATION_RUN = ("default", "q4_1", 128)


def calibrated(pairs: Sequence[tuple[Observation, core.Prediction]]
               ) -> list[tuple[Observation, core.Prediction]]:
    """Held-out predictions of tightfit's own rows as `tightfit calibrate` on each machine would
    correct them (predictor/local.py): the machine's row of an engine's calibration run, at its
    most threads, gives measured / predicted for decode and prefill (clipped as local.py clips),
    and that scales the predictions of the same engine's other rows on the machine whose
    weights it carries to (local.carries: not float weights). HF, which calibrate does not
    run, is left as it is; the calibration rows themselves are not scored. Rows
    of a machine without a calibration row are dropped."""
    from tightfit.predictor import local

    def is_run(s: Scenario) -> bool:
        return (s.engine in CALIBRATION_ENGINES
                and (s.model.name, s.quant, s.workload.prompt_tokens) == CALIBRATION_RUN)

    runs: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
    for o, p in pairs:
        got = predicted(o, p)
        if is_run(o.scenario) and o.metric in ("decode_tok_s", "prefill_tok_s") and got:
            runs.setdefault((by_machine(o), o.scenario.engine), {}).setdefault(
                o.scenario.device.cpu_cores, {})[o.metric] = local.factor(o.value, got)
    machines = {m for m, _ in runs}
    out = []
    for o, p in pairs:
        s, key = o.scenario, (by_machine(o), o.scenario.engine)
        if key[0] not in machines:
            continue
        if key in runs:
            cores = max(runs[key])
            if is_run(s) and s.device.cpu_cores == cores:
                continue
            if local.carries(CALIBRATION_RUN[1], s.quant):
                p = local.apply(p, runs[key][cores], "calibrated", s)
        out.append((o, p))
    return out

"""Predictions for this machine ("local"/"this") corrected by the calibration's engine run.

`tightfit calibrate` stores, next to the measured bandwidth and matmul rate, a short run of a
real engine (decode and prefill rates of a known model). For a scenario on the local device and
the same engine, the predictor's own prediction of that calibration run is compared with what
was measured, and the ratio (clipped to [1/4, 4]) scales the scenario's decode and prefill
predictions: the machine's quirks the specs miss (threading, kernels, contention at calibration
time) carry over to models it has not run, in weights of the same kind (`carries`). Pure: no
torch.
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from tightfit.predictor import architectures
from tightfit.predictor.formats import FLOAT_WEIGHTS
from tightfit.predictor.scenario import Scenario, Workload, device_profile_path, stored_bits

MAX_FACTOR = 4.0
LOCAL_NOTE = "hardware from the local device profile"


def carries(run_quant: str, quant: str) -> bool:
    """Whether a calibration run's correction carries to a scenario's weights: block / integer
    formats decode through compute-bound dot-product kernels, float weights through a GEMV that
    streams memory, and a CPU's speed at one says little about the other (two 2-core VMs in
    tightfit's dataset: the one whose Q4_1 kernels run at half the other's speed streams fp32
    weights as fast; docs/predictor.md, "A second machine")."""
    return (run_quant.lower() in FLOAT_WEIGHTS) == (quant.lower() in FLOAT_WEIGHTS)


def factor(measured: float, predicted: float) -> float:
    """A calibration run's correction: measured / predicted, clipped to [1/MAX_FACTOR,
    MAX_FACTOR]."""
    return max(1 / MAX_FACTOR, min(MAX_FACTOR, measured / predicted))


def engine_runs() -> list[dict[str, Any]]:
    path = device_profile_path()
    try:
        return list(json.loads(path.read_text()).get("engine_runs") or [])
    except (OSError, ValueError, AttributeError):
        return []


def calibration_scenario(s: Scenario, run: dict[str, Any]) -> Scenario | None:
    model = architectures.lookup(str(run.get("model", "")))
    if model is None:
        return None
    quant = str(run["quant"])
    # calibrate runs llama.cpp through llama-cpp-python, without flash attention
    wl = Workload(int(run["prompt_tokens"]), int(run["gen_tokens"]), 1,
                  int(run["prompt_tokens"]) + int(run["gen_tokens"]),
                  flash_attn=False if run.get("engine") == "llama.cpp" else None)
    return replace(s, id=f"{s.id}:calibration", model=model, quant=quant,
                   bits_per_weight=stored_bits(quant, model), workload=wl, notes=(),
                   embed_bits=None)


def factors(s: Scenario, predict: Any) -> tuple[dict[str, float], str | None]:
    """(metric -> measured/predicted factor, note) for a local scenario; ({}, None) if none."""
    if LOCAL_NOTE not in s.notes:
        return {}, None
    for run in engine_runs():
        if run.get("engine") != s.engine or not carries(str(run.get("quant", "")), s.quant):
            continue
        cal = calibration_scenario(s, run)
        if cal is None:
            continue
        p = predict(cal)
        out: dict[str, float] = {}
        for metric in ("decode_tok_s", "prefill_tok_s"):
            measured, predicted = run.get(metric), getattr(p, metric)
            if measured and predicted:
                out[metric] = factor(measured, predicted)
        if out:
            text = ", ".join(f"{k} x{v:.2f}" for k, v in out.items())
            return out, f"corrected by the calibration run of {run['model']} ({text})"
    return {}, None


def apply(p: Any, f: dict[str, float], note: str, s: Scenario) -> Any:
    """A Prediction with decode/prefill rates scaled by the calibration factors; TTFT's prompt
    part scales with the prefill factor, its fixed request cost does not (scaling all of it had
    a 16-token prompt's TTFT wrong by up to 4.4x after calibrate; docs/predictor.md)."""
    d, pf = f.get("decode_tok_s", 1.0), f.get("prefill_tok_s", 1.0)
    w = s.workload
    prompt_s = w.batch * w.prompt_tokens / p.prefill_tok_s if p.prefill_tok_s else 0.0
    ttft = p.ttft_s - prompt_s + prompt_s / pf
    t_scale = ttft / p.ttft_s if p.ttft_s > 0 else 1.0
    interval = dict(p.interval)
    for key, k in (("decode_tok_s", d), ("prefill_tok_s", pf)):
        if key in interval:
            lo, hi = interval[key]
            interval[key] = (lo * k, hi * k)
    if "tpot_s" in interval:
        lo, hi = interval["tpot_s"]
        interval["tpot_s"] = (lo / d, hi / d)
    if "ttft_s" in interval:
        lo, hi = interval["ttft_s"]
        interval["ttft_s"] = (lo * t_scale, hi * t_scale)
    return replace(p, decode_tok_s=p.decode_tok_s * d, tpot_s=p.tpot_s / d,
                   prefill_tok_s=None if p.prefill_tok_s is None else p.prefill_tok_s * pf,
                   ttft_s=ttft, interval=interval, notes=tuple(p.notes) + (note,))

"""The `tightfit predictor evaluate` report: runs the splits and renders text or JSON.

Splits: leave-one-device-out (one fold per device; a machine of tightfit's own dataset at one
thread count is a device), leave-one-machine-out (each machine of tightfit's own dataset held out
at all its thread counts; scored on those rows only, the other rows' folds being the device
split's) and leave-one-model-out (every row of a model held out together; models dealt into 10
seeded folds to keep the run short).
"""
from __future__ import annotations

import math
import statistics
from typing import Any

from tightfit.predictor import datasets, evaluate, features

SOURCES = {"all": None, "apple": ["apple"], "llmfit": ["llmfit"], "design": ["design"],
           "tightfit": ["tightfit"]}


BRIEF = features.BRIEF_FEATURES


def run(splits: tuple[str, ...] = ("device", "model"), screen: bool = True,
        model_folds: int = 10, exclude: tuple[str, ...] = (), brief: str = "default",
        measurements: tuple[str, ...] = (), rates: str = "default") -> dict[str, Any]:
    """`measurements`: tightfit dataset files (JSONL) whose single-stream runs join the shared
    tables; their device is this machine at the thread count used."""
    obs, rules = datasets.load_all()
    if measurements:
        own, own_rules = datasets.load_own(list(measurements))
        obs = obs + own
        rules.update({f"tightfit data: {k}": v for k, v in own_rules.items()})
    out: dict[str, Any] = {"rules": dict(rules), "n_observations": len(obs),
                           "screen": screen, "excluded_features": list(exclude),
                           "brief_factors": brief, "rate_features": rates}
    out["naive"] = {k: evaluate.summarise_naive(obs, v) for k, v in SOURCES.items()}
    base = evaluate.analytic_only(obs)
    out["analytic"] = {k: evaluate.summarise(base, v) for k, v in SOURCES.items()}
    pairs_by_split = {}
    for split in splits:
        key = {"device": evaluate.device_key, "machine": evaluate.by_machine,
               "model": evaluate.by_model}[split]
        folds = model_folds if split == "model" else None
        # the machine split differs from the device split on tightfit's own rows only
        scored = (lambda o: o.source == "tightfit") if split == "machine" else None
        pairs = evaluate.cross_validate(obs, key, screen=screen, n_folds=folds, exclude=exclude,
                                        brief=brief, rates=rates, scored=scored)
        pairs_by_split[split] = pairs
        out[f"held_out_{split}"] = {k: evaluate.summarise(pairs, v) for k, v in SOURCES.items()
                                    if split != "machine" or k == "tightfit"}
        if split == "device":
            out["per_device"] = _per_device(pairs)
        out.setdefault("per_engine", {})[split] = _per_engine(pairs)
        if split == "machine":
            cal = evaluate.calibrated(pairs)
            out["held_out_machine_calibrated"] = {"tightfit": evaluate.summarise(cal)}
            out["per_engine"]["machine_calibrated"] = _per_engine(cal)
            out["per_machine"] = {m: evaluate.summarise([(o, p) for o, p in pairs
                                                         if evaluate.by_machine(o) == m])
                                  for m in sorted({evaluate.by_machine(o) for o, _ in pairs})}
    out["_pairs"] = pairs_by_split
    return out


def score(measurements: tuple[str, ...], batched: bool = False) -> dict[str, Any]:
    """The shipped model, as it is, against measured single-stream runs (nothing is fitted):
    scores per engine. For new measurements (another day, a changed engine) before they join
    the fit; in-sample for runs the model was fitted on. `batched`: the closed-loop concurrent
    runs instead (datasets.load_own), the aggregate decode rate against the batch model, also
    per engine and batch (`per_batch`: with the median of predicted / measured)."""
    from tightfit.predictor import artefact, core

    obs, rules = datasets.load_own(list(measurements), batched=batched)
    model = artefact.load()
    pairs = [(o, core.predict_scenario(o.scenario, model)) for o in obs]
    out = {"rules": dict(rules), "n_observations": len(obs),
           "per_engine": {"score": _per_engine(pairs)}}
    if batched:
        out["per_batch"] = _per_batch(pairs)
    return out


SCORED_METRICS = ("decode_tok_s", "prefill_tok_s", "ttft_s", "request_tok_s", "peak_memory_gb")


def score_scenarios(paths: tuple[str, ...]) -> dict[str, Any]:
    """The shipped model, as it is, against figures measured elsewhere: rows of `tightfit
    predict`'s input, each with a `measured` object holding any of SCORED_METRICS (public
    benchmark tables, a user's own runs). Scores per metric, and decode per device and batch
    (`per_device_batch`, with the median of predicted / measured). A row the predictor rejects
    is counted in `errors` with its field; a row without `measured` in `unmeasured`."""
    from tightfit.predictor import api, jsonl

    rows = [r for p in paths for r in jsonl.read_jsonl(p)]
    answers = api.predict(rows)
    got: dict[str, list[tuple[float, float]]] = {}
    groups: dict[tuple[str, int], list[tuple[float, float]]] = {}
    errors: dict[str, int] = {}
    unmeasured = 0
    for row, ans in zip(rows, answers):
        if "error" in ans:
            field = ans["error"]["field"]
            errors[field] = errors.get(field, 0) + 1
            continue
        measured = row.get("measured") if isinstance(row, dict) else None
        if not isinstance(measured, dict):
            unmeasured += 1
            continue
        for metric in SCORED_METRICS:
            m, p = measured.get(metric), ans.get(metric)
            if isinstance(m, (int, float)) and m > 0 and isinstance(p, (int, float)):
                got.setdefault(metric, []).append((float(p), float(m)))
                if metric == "decode_tok_s":
                    hw = row.get("hardware") or {}
                    name = str(hw.get("name") or "?") if isinstance(hw, dict) else "?"
                    batch = (row.get("workload") or {}).get("batch") or 1
                    groups.setdefault((name, int(batch)), []).append((float(p), float(m)))
    return {"n_rows": len(rows), "errors": errors, "unmeasured": unmeasured,
            "per_metric": {metric: _ratio_scored(sel) for metric, sel in got.items()},
            "per_device_batch": _ratio_scores(groups)}


def _ratio_scored(sel: list[tuple[float, float]]) -> dict[str, float]:
    """Scores of (predicted, measured) pairs, with the median of predicted / measured."""
    sc = evaluate.scores([a for a, _ in sel], [b for _, b in sel]).as_dict()
    sc["ratio_median"] = statistics.median(a / b for a, b in sel)
    return sc


def _ratio_scores(groups: dict[tuple[str, int], list[tuple[float, float]]]
                  ) -> dict[str, dict[str, float]]:
    """`_ratio_scored` of each group, keyed "<group> batch <n>"."""
    return {f"{name} batch {batch}": _ratio_scored(sel)
            for (name, batch), sel in sorted(groups.items())}


def _per_batch(pairs: list[Any]) -> dict[str, dict[str, float]]:
    """Decode scores per (engine, batch), with the median of predicted / measured."""
    groups: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for o, p in pairs:
        got = evaluate.predicted(o, p)
        if o.metric == "decode_tok_s" and got is not None:
            groups.setdefault((o.scenario.engine, o.scenario.workload.batch), []).append(
                (got, o.value))
    return _ratio_scores(groups)


def _per_engine(pairs: list[Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Held-out scores of tightfit's own dataset, one engine at a time (tightfit, HF, llama.cpp
    measured on the same machine)."""
    engines = sorted({o.scenario.engine for o, _ in pairs if o.source == "tightfit"})
    return {e: evaluate.summarise([(o, p) for o, p in pairs
                                   if o.source == "tightfit" and o.scenario.engine == e])
            for e in engines}


def _per_device(pairs: list[Any]) -> dict[str, dict[str, float]]:
    devices = sorted({o.device_key for o, _ in pairs if o.metric == "decode_tok_s"})
    res = {}
    for d in devices:
        sel = [(evaluate.predicted(o, p), o.value) for o, p in pairs if o.device_key == d and o.metric == "decode_tok_s"]
        res[d] = evaluate.scores([a for a, _ in sel], [b for _, b in sel]).as_dict()
    return res


def _fmt(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def render(result: dict[str, Any]) -> str:
    lines = []
    if "n_observations" in result:
        lines += [f"observations: {result['n_observations']}", "data rules (rows affected):"]
        lines += [f"  {n:4d}  {rule}"
                  for rule, n in sorted(result["rules"].items(), key=lambda x: -x[1])]
    head = f"{'metric':16s}{'n':>5s}{'MAPE%':>8s}{'med%':>8s}{'p90%':>8s}{'max%':>8s}{'R2log':>7s}"
    for section in [k for k in result if k.startswith(("held_out", "analytic", "naive"))]:
        for source, table in result[section].items():
            if not table:
                continue
            lines += ["", f"[{section} / {source}]", head]
            for metric, s in table.items():
                if metric == "fits":
                    lines.append(f"{'fits':16s}{s['n']:5d}  accuracy {s['accuracy']:.1f}% "
                                 f"(undecided {s['undecided']})")
                else:
                    lines.append(f"{metric:16s}{s['n']:5d}" + "".join(
                        f"{_fmt(s[k]):>8s}" for k in ("mape", "median", "p90", "max")) +
                        f"{_fmt(s['r2_log']):>7s}" + (
                            f"  within 10% or 150 MB: {s['within_target']:.1f}%"
                            if "within_target" in s else ""))
    for split, engines in result.get("per_engine", {}).items():
        if not engines:
            continue
        title = ("the shipped model as it is (in-sample for runs it was fitted on)"
                 if split == "score" else f"held_out_{split}")
        lines += ["", f"[{title}: tightfit dataset per engine]",
                  f"{'engine':18s}{'metric':16s}{'n':>5s}{'MAPE%':>8s}{'max%':>8s}"]
        for engine, table in engines.items():
            for metric, s in table.items():
                if metric != "fits":
                    lines.append(f"{engine:18s}{metric:16s}{s['n']:5d}{_fmt(s['mape']):>8s}"
                                 f"{_fmt(s['max']):>8s}" + (
                                     f"  within 10%/150 MB {s['within_target']:.0f}%"
                                     if "within_target" in s else ""))
    if "per_machine" in result:
        lines += ["", "[held_out_machine: tightfit dataset per machine]",
                  f"{'machine':40s}{'metric':16s}{'n':>5s}{'MAPE%':>8s}{'max%':>8s}"]
        for machine, table in result["per_machine"].items():
            for metric, s in table.items():
                lines.append(f"{machine[:40]:40s}{metric:16s}{s['n']:5d}{_fmt(s['mape']):>8s}"
                             f"{_fmt(s['max']):>8s}")
    if "per_metric" in result:
        lines.append(f"scenarios: {result['n_rows']}, rejected (by field): {result['errors']}, "
                     f"without measured figures: {result['unmeasured']}")
    for key, title, head in (("per_metric", "[the shipped model against the rows' measured "
                              "figures]", "metric"),
                             ("per_batch", "\n[the shipped model: aggregate decode per engine "
                              "and batch]", "engine, batch"),
                             ("per_device_batch", "\n[the shipped model: aggregate decode per "
                              "device and batch]", "device, batch")):
        if not result.get(key):
            continue
        lines += [title, f"{head:32s}{'n':>5s}{'MAPE%':>8s}{'max%':>8s}{'pred/meas':>11s}"]
        for d, s in result[key].items():
            lines.append(f"{d[:32]:32s}{s['n']:5d}{_fmt(s['mape']):>8s}{_fmt(s['max']):>8s}"
                         f"{s['ratio_median']:>11.2f}")
    if "per_device" in result:
        lines += ["", "[held_out_device: decode per device]", f"{'device':32s}{'n':>5s}{'MAPE%':>8s}{'max%':>8s}"]
        for d, s in result["per_device"].items():
            lines.append(f"{d[:32]:32s}{s['n']:5d}{_fmt(s['mape']):>8s}{_fmt(s['max']):>8s}")
    return "\n".join(lines)

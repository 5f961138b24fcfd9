"""The pure function behind `tightfit predict`, `tightfit check` and POST /v1/predict.

`predict(rows) -> rows`: one output object per input object, in order, matched by `id`. A bad row
gets {"id", "error": {"field", "message"}} and the others are still answered. No torch import.
"""
from __future__ import annotations

from typing import Any, Sequence

from tightfit.predictor import artefact, core, fit, local
from tightfit.predictor.models import PredictorModel
from tightfit.predictor.scenario import RowError, Scenario, parse_row


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def to_json(p: core.Prediction, s: Scenario) -> dict[str, Any]:
    return {
        "id": p.id, "fits": p.fits, "fits_reason": p.fits_reason,
        "fits_on_device": p.fits_on_device,
        "peak_memory_gb": _round(p.peak_memory_gb), "offload_fraction": _round(p.offload_fraction, 3),
        "prefill_tok_s": _round(p.prefill_tok_s), "decode_tok_s": _round(p.decode_tok_s),
        "ttft_s": _round(p.ttft_s), "tpot_s": _round(p.tpot_s),
        "request_tok_s": _round(core.request_tok_s(p, s)), "bottleneck": p.bottleneck,
        "factors": p.factors,
        "interval": {k: [_round(lo), _round(hi)] for k, (lo, hi) in p.interval.items()},
        "notes": list(p.notes),
        "memory": {k: v if isinstance(v, str) else _round(v) for k, v in p.memory.items()},
        "capacity": fit.capacity(s),
    }


def predict_one(row: Any, model: PredictorModel | None = None,
                files: bool = True) -> dict[str, Any]:
    """One row's prediction; `files`: the row may name a local GGUF file (`model.path`)."""
    rid = row.get("id") if isinstance(row, dict) else None
    try:
        scenario = parse_row(row, files)
        observed = row.get("observed") if isinstance(row.get("observed"), dict) else None
        m = model or artefact.load()
        pred = core.predict_scenario(scenario, m, observed)
        f, note = local.factors(scenario, lambda s: core.predict_scenario(s, m))
        return to_json(local.apply(pred, f, note, scenario) if note else pred, scenario)
    except RowError as exc:
        return {"id": rid, "error": {"field": exc.field, "message": str(exc)}}


def predict(rows: Sequence[Any], model: PredictorModel | None = None,
            files: bool = True) -> list[dict[str, Any]]:
    """Predict every row; rows that fail validation carry an `error` entry naming the field.
    `files=False` (the server) refuses rows that name a local file to read."""
    m = model or artefact.load()
    return [predict_one(r, m, files) for r in rows]

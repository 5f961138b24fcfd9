"""Feature screening finds the real drivers on synthetic data and drops noise."""
from __future__ import annotations

import random

from tightfit.predictor import models, screening


def _data(n: int = 240, seed: int = 0):
    rng = random.Random(seed)
    rows, y, groups = [], [], []
    for i in range(n):
        f = {"a": rng.gauss(0, 1), "b": rng.gauss(0, 1), "noise": rng.gauss(0, 1)}
        rows.append(f)
        y.append(0.5 * f["a"] + 0.4 * f["a"] * f["b"] + rng.gauss(0, 0.05))
        groups.append(f"g{i % 12}")
    return rows, y, groups


def test_drops_noise_and_finds_the_cross() -> None:
    rows, y, groups = _data()
    sel = screening.select(rows, y, groups, ["a", "b", "noise"], "decode")
    assert "a" in sel.kept and "noise" not in sel.kept
    assert ("a", "b") in sel.crosses or ("b", "a") in sel.crosses
    assert sel.sensitivity["a"] > 10 * sel.sensitivity["noise"]
    assert sel.cv_r2 > 0.9


def test_model_round_trips_through_json(tmp_path) -> None:
    rows, y, _ = _data(60)
    m = models.fit("decode", rows, y, ["a", "b"], [("a", "b")])
    pm = models.PredictorModel(m, m, "h")
    pm.save(tmp_path / "m.json")
    back = models.PredictorModel.load(tmp_path / "m.json")
    assert back.decode.predict_log(rows[3]) == m.predict_log(rows[3])


def test_inputs_are_clipped_to_the_training_range() -> None:
    rows, y, _ = _data(60)
    m = models.fit("decode", rows, y, ["a"], [])
    far = m.predict_log({"a": 1e6})
    edge = m.predict_log({"a": max(r["a"] for r in rows)})
    assert far == edge

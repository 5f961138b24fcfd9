"""Online correction: converges after a shift while the frozen model stays wrong; stable without."""
from __future__ import annotations

import math
import random

import pytest

from tightfit.predictor import online

KEY = online.key_for("llama.cpp", "cpu", "box")
CONVERGE_WITHIN = 12  # observations to get within 5% after a 40% slowdown


def test_brief_learning_rate_and_buckets() -> None:
    assert online.learning_rate(0.1, 0.0) == pytest.approx(0.1)
    assert online.learning_rate(0.1, 0.5) == pytest.approx(0.1 * 2.0 * 1.5)
    assert online.learning_rate(0.1, 1.0) == pytest.approx(0.1 * 3.0 * 2.2)
    assert [online.bucket_weight(e) for e in (0.0, 0.29, 0.3, 0.69, 0.7, 1.0)] == \
        [1.0, 1.0, 1.5, 1.5, 2.2, 2.2]


def _run(shift: float, n: int, noise: float, seed: int = 0):
    rng = random.Random(seed)
    frozen, truth = 50.0, 50.0 * shift
    corr = online.OnlineCorrector()
    history = []
    for _ in range(n):
        observed = truth * math.exp(rng.gauss(0, noise))
        history.append(corr.observe(KEY, frozen, observed))
    return corr, history, frozen, truth


def test_converges_after_a_shift_while_frozen_stays_wrong() -> None:
    corr, history, frozen, truth = _run(0.6, 40, 0.03)
    first_good = next(i for i, v in enumerate(history) if abs(v / truth - 1) < 0.05)
    assert first_good < CONVERGE_WITHIN
    assert all(abs(v / truth - 1) < 0.08 for v in history[first_good:])
    assert abs(frozen / truth - 1) > 0.6
    assert corr.drifting(KEY) and corr.drift_at[KEY] <= 3


def test_stable_without_a_shift() -> None:
    corr, history, _, truth = _run(1.0, 200, 0.05)
    assert abs(corr.corrections[KEY]) < 0.05
    assert max(abs(v / truth - 1) for v in history) < 0.1
    assert not corr.drifting(KEY) and KEY not in corr.drift_at


def test_rejects_non_positive_rates() -> None:
    with pytest.raises(ValueError):
        online.OnlineCorrector().observe(KEY, 10.0, 0.0)

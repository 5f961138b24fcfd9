"""Online correction from observed runs, with the source brief's error feedback and a drift check.

Keeps one log-correction per (engine, device class, device) key on top of the frozen model. Each
observation moves it with lr = alpha * (1 + 2e) * w(e), e = normalised error in [0, 1], w = 1.0 /
1.5 / 2.2 for e in [0, 0.3) / [0.3, 0.7) / [0.7, 1]. A two-sided CUSUM on the signed errors flags
drift of the frozen model (its own errors, so the flag stays up while the correction carries it).
Does not refit the base model; state is a small dict that can be saved as JSON.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

BUCKETS = ((0.3, 1.0), (0.7, 1.5), (math.inf, 2.2))


def bucket_weight(e: float) -> float:
    """1.0 / 1.5 / 2.2 for conservative / standard / strong correction."""
    for upper, weight in BUCKETS:
        if e < upper:
            return weight
    return BUCKETS[-1][1]


def normalised_error(predicted: float, observed: float) -> float:
    """|log(observed / predicted)| / log 2, capped at 1 (a 2x miss counts as the maximum)."""
    return min(1.0, abs(math.log(observed / predicted)) / math.log(2.0))


def learning_rate(alpha: float, e: float) -> float:
    """The brief's lr = alpha * (1 + 2e), times the bucket weight."""
    return alpha * (1.0 + 2.0 * e) * bucket_weight(e)


@dataclass
class DriftDetector:
    """Two-sided CUSUM on log errors; `slack` absorbs ordinary noise, `limit` raises the flag."""

    slack: float = 0.05
    limit: float = 0.5
    high: float = 0.0
    low: float = 0.0

    def update(self, log_error: float) -> bool:
        self.high = max(0.0, self.high + log_error - self.slack)
        self.low = max(0.0, self.low - log_error - self.slack)
        return self.drifting

    @property
    def drifting(self) -> bool:
        return self.high > self.limit or self.low > self.limit

    def reset(self) -> None:
        self.high = self.low = 0.0


@dataclass
class OnlineCorrector:
    """Per-key multiplicative correction of one metric (e.g. decode tok/s)."""

    alpha: float = 0.15
    max_step: float = 0.7
    corrections: dict[str, float] = field(default_factory=dict)
    detectors: dict[str, DriftDetector] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    drift_at: dict[str, int] = field(default_factory=dict)  # observation count when first flagged

    def corrected(self, key: str, predicted: float) -> float:
        return predicted * math.exp(self.corrections.get(key, 0.0))

    def observe(self, key: str, predicted: float, observed: float) -> float:
        """Update from one run; returns the new corrected prediction for this key."""
        if predicted <= 0 or observed <= 0:
            raise ValueError(f"rates must be positive, got predicted={predicted}, observed={observed}")
        current = self.corrected(key, predicted)
        err = math.log(observed / current)
        e = normalised_error(current, observed)
        step = max(-self.max_step, min(self.max_step, learning_rate(self.alpha, e) * err))
        self.corrections[key] = self.corrections.get(key, 0.0) + step
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.detectors.setdefault(key, DriftDetector()).update(math.log(observed / predicted)):
            self.drift_at.setdefault(key, self.seen[key])
        return self.corrected(key, predicted)

    def drifting(self, key: str) -> bool:
        det = self.detectors.get(key)
        return bool(det and det.drifting)

    def to_dict(self) -> dict[str, object]:
        return {"alpha": self.alpha, "corrections": dict(self.corrections), "seen": dict(self.seen)}


def key_for(engine: str, device_class: str, device_name: str) -> str:
    return f"{engine}|{device_class}|{device_name.lower()}"

"""Performance-decay predictor: latency, throughput, memory and fit for a model on a device.

Analytic base (bytes and FLOPs per phase, per-engine priors) x a learned residual fitted on public
measurements; pure Python at prediction time (no torch, no numpy, no scikit-learn).
"""
from __future__ import annotations

from tightfit.predictor.api import predict

__all__ = ["predict"]

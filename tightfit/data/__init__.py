"""The measurement dataset: schema (pydantic, versioned), append-only JSONL store with migration
on read, and quality gates (missing rate, PSI). Shared by the bench (writer) and the predictor
(reader); imports no torch, numpy or engine code.
"""
from __future__ import annotations

from tightfit.data.schema import SCHEMA_VERSION, Measurement
from tightfit.data.store import MeasurementStore, flatten, read_measurements

__all__ = ["SCHEMA_VERSION", "Measurement", "MeasurementStore", "flatten", "read_measurements"]

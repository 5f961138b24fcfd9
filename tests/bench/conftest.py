"""Bench tests write nothing outside tmp: the fingerprint cache and the default dataset directory
point into a per-session temporary directory."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def _bench_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("bench")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, _bench_tmp):
    monkeypatch.setenv("TIGHTFIT_CACHE", str(_bench_tmp / "cache"))
    monkeypatch.setenv("TIGHTFIT_DATA_DIR", str(_bench_tmp / "measurements"))

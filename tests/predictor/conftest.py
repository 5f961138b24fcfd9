"""Shared fixtures: a valid scenario row, and a cache directory that never touches $HOME."""
from __future__ import annotations

import copy
from typing import Any

import pytest

ROW: dict[str, Any] = {
    "id": "x1",
    "hardware": {"name": "RTX 3070", "kind": "gpu", "memory_gb": 8, "memory_bandwidth_gbps": 448,
                 "fp16_tflops": 40.6, "device_count": 1, "cpu_cores": None},
    "model": {"name": "Meta-Llama-3-8B", "params_b": 8.03, "n_layers": 32, "hidden_size": 4096,
              "intermediate_size": 14336, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 128256},
    "quant": "Q4_K_M",
    "engine": "llama.cpp",
    "workload": {"prompt_tokens": 512, "gen_tokens": 128, "batch": 1, "context_tokens": 2048},
}


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TIGHTFIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TIGHTFIT_DEVICE_PROFILE", str(tmp_path / "device.json"))


@pytest.fixture
def row() -> dict[str, Any]:
    return copy.deepcopy(ROW)

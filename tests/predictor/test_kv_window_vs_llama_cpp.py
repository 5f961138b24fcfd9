"""The sliding-window K/V the predictor counts for llama.cpp, against llama.cpp itself: Gemma 3
270M (15 of 18 layers on a 512-token window) loaded at two context sizes with the window cache
(`swa_full=False`, the default of llama.cpp's own tools), peak RSS read in a child process.
Needs llama-cpp-python (the benchmark extra, `make llamacpp`); skipped without it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp")

from tightfit.engine.loader.resolve import resolve_model  # noqa: E402
from tightfit.predictor import engines, memory  # noqa: E402
from tightfit.predictor.scenario import parse_row  # noqa: E402

CHILD = r"""
import json, sys
from llama_cpp import Llama
m = Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=2, verbose=False,
          swa_full=sys.argv[3] == "full")
m("The capital of France is", max_tokens=2, temperature=0)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({"peak_kib": int(hwm.split()[1])}))
"""


def _peak_mib(path: str, n_ctx: int, swa: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, path, str(n_ctx), swa], check=True,
                         capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_kib"] / 1024


def _predicted_kv_mib(n_ctx: int) -> float:
    s = parse_row({"id": "k", "hardware": {"name": "here", "kind": "cpu", "memory_gb": 24,
                                            "memory_bandwidth_gbps": 38, "fp16_tflops": 0.2,
                                            "cpu_cores": 2},
                   "model": {"name": "gemma-3-270m"}, "quant": "Q4_K_M", "engine": "llama.cpp",
                   "workload": {"prompt_tokens": 6, "gen_tokens": 2, "context_tokens": n_ctx}})
    prof = engines.profile("llama.cpp", "cpu", "q4_k_m")
    return memory.estimate(s, prof).kv_bytes / 2**20


def test_llama_cpp_window_cache_grows_as_predicted() -> None:
    path = str(resolve_model("gemma3"))
    small, large = _peak_mib(path, 2048, "window"), _peak_mib(path, 32768, "window")
    predicted = _predicted_kv_mib(32768) - _predicted_kv_mib(2048)  # 3 full layers: 90 MiB
    assert predicted == pytest.approx(90, abs=1)  # the 15 windowed layers stay at 1024 cells
    assert large - small == pytest.approx(predicted, rel=0.35)
    # a full-size cache (llama-cpp-python's own default) would have grown ~5x as much
    full = _peak_mib(path, 32768, "full")
    assert full - small > 4 * predicted

"""llama.cpp's own programs as benchmark baselines: where their binaries are, and `llama-bench`
(its standard pp/tg figures, run as llama.cpp's authors run it). `llama-server` is driven as a
backend (`backends/llama_server_backend.py`). No torch here.

The binaries come from `scripts/build-llama-cpp.sh` (`make llamacpp`), which builds them with
native CPU flags into `.llama.cpp/build/bin`; `TIGHTFIT_LLAMA_CPP_DIR` points elsewhere, and
a `llama-bench` / `llama-server` on PATH is the last resort.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tightfit.errors import TightfitError

ENV_DIR = "TIGHTFIT_LLAMA_CPP_DIR"
BUILD_HINT = "build them with `make llamacpp` (about 20 minutes on 2 cores)"


def default_dir() -> Path:
    return Path(__file__).resolve().parents[2] / ".llama.cpp" / "build" / "bin"


def find_binary(name: str) -> Path | None:
    """`name` in $TIGHTFIT_LLAMA_CPP_DIR, else in the project's build, else on PATH."""
    env = os.environ.get(ENV_DIR)
    for d in ([Path(env)] if env else []) + [default_dir()]:
        if (d / name).is_file() and os.access(d / name, os.X_OK):
            return d / name
    found = shutil.which(name)
    return Path(found) if found else None


def require_binary(name: str) -> Path:
    path = find_binary(name)
    if path is None:
        where = os.environ.get(ENV_DIR) or default_dir()
        raise TightfitError(f"llama.cpp's {name} was not found (looked in {where} and on PATH); "
                            f"{BUILD_HINT}, or set {ENV_DIR} to the directory holding it")
    return path


@dataclass(frozen=True)
class BenchFigure:
    test: str  # "pp512" | "tg128"
    tok_s: float
    stddev: float
    repetitions: int


def run_llama_bench(model: Path, threads: int, prompt_tokens: int = 512, gen_tokens: int = 128,
                    repetitions: int = 3, timeout_s: float = 900.0) -> list[BenchFigure]:
    """`llama-bench -p N -n M -t T -r R -o json` on `model`: one figure per test."""
    exe = require_binary("llama-bench")
    cmd = [str(exe), "-m", str(model), "-t", str(threads), "-p", str(prompt_tokens),
           "-n", str(gen_tokens), "-r", str(repetitions), "-o", "json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise TightfitError(f"llama-bench ran over {timeout_s:g} s: {' '.join(cmd)}") from exc
    if proc.returncode != 0:
        raise TightfitError(f"llama-bench failed (exit {proc.returncode}): "
                            f"{proc.stderr.strip()[-400:]}")
    return parse_llama_bench(proc.stdout)


def parse_llama_bench(text: str) -> list[BenchFigure]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TightfitError(f"llama-bench printed no JSON: {text[:200]!r}") from exc
    out = []
    for r in rows:
        n_prompt, n_gen = int(r.get("n_prompt", 0)), int(r.get("n_gen", 0))
        test = f"pp{n_prompt}" if n_gen == 0 else f"tg{n_gen}" if n_prompt == 0 else \
            f"pp{n_prompt}+tg{n_gen}"
        out.append(BenchFigure(test, float(r["avg_ts"]), float(r.get("stddev_ts", 0.0)),
                               len(r.get("samples_ts", [])) or 1))
    return out

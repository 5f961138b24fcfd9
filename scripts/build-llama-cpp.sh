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

echo "== building llama.cpp (libllama, llama-bench, llama-server), $JOBS jobs"
cmake -S "$SRC/vendor/llama.cpp" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build "$WORK/build" -j "$JOBS" --target llama llama-bench llama-server

echo "== installing the llama-cpp-python bindings on that library (no second compile)"
CMAKE_ARGS="-DLLAMA_BUILD=OFF" "$PY" -m pip install "$SRC" -q
"$PY" -m pip install -q diskcache jinja2 numpy typing-extensions
LIBDIR="$("$PY" -c 'import importlib.util,pathlib;print(pathlib.Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib")')"
mkdir -p "$LIBDIR"
for so in "$WORK/build/bin/"lib*.so*; do ln -sf "$so" "$LIBDIR/"; done
"$PY" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'ok')"
echo "== done: $WORK/build/bin"
ls "$WORK/build/bin" | grep -E '^llama-(bench|server)$'

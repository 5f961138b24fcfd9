"""tightfit's fused CPU decode kernels (decode.cpp), compiled once per machine and loaded as
`torch.ops.tightfit.*` for the TorchScript decode stack (engine/scripted.py).

Built with torch's C++ extension builder (ninja, from the `ninja` package if the system has
none, and the system C++ compiler; -O3 -march=native -fopenmp) into a cache directory keyed by
the torch version, the Python version, the CPU's flags and the source: ~30-60 s the first time
(`scripts/setup.sh` does it at install: `python -m tightfit.engine.kernels`), a library load
after. Where no compiler is present or the build fails, `load()` returns False with the reason
logged once, and decode runs on the plain TorchScript stack (same results to float rounding).
`TIGHTFIT_KERNELS=0` turns them off; `TIGHTFIT_CACHE` moves the cache (default
~/.cache/tightfit).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path

import torch

from tightfit.buildcache import cache_root, cpu_key

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("decode.cpp")
NAME = "tightfit_kernels"
_state: dict[str, object] = {}
OPS = ("rms_norm_to", "residual_norm", "rope_write_kv", "decode_attention", "gated_act",
       "int8x2_split", "int8x2_combine")


def loaded() -> bool:
    """True when an earlier `load()` made the ops usable (never builds or loads anything)."""
    return _state.get("ok") is True


def enabled() -> bool:
    return os.environ.get("TIGHTFIT_KERNELS", "1").strip().lower() not in ("0", "false", "no",
                                                                           "off")


def _flags() -> list[str]:
    # -fopenmp: at::parallel_for is inline OpenMP (serial without it); the library then needs
    # libgomp.so.1, which resolves to the copy torch has already loaded (same soname).
    march = os.environ.get("TIGHTFIT_KERNELS_MARCH", "native")
    return ["-O3", "-fopenmp"] + ([f"-march={march}"] if march else [])


def build_dir() -> Path:
    """One directory per (torch, Python, CPU, source and flags): checkouts with the same kernel
    source share one build, and a different source never rebuilds (or races) another's."""
    root = cache_root()
    tag = f"torch{torch.__version__.split('+')[0]}-py{sys.version_info[0]}{sys.version_info[1]}"
    src = hashlib.sha1(SOURCE.read_bytes() + " ".join(_flags()).encode()).hexdigest()[:12]
    return root / "kernels" / f"{tag}-{cpu_key()}-{src}"


def _source_copy(path: Path) -> Path:
    """The source as compiled: a copy inside the build directory, written once. ninja decides
    by modification times, so compiling a checkout's own file would rebuild whenever a fresh
    clone or an edit-and-revert touched it, even with the same content."""
    copy = path / SOURCE.name
    if not copy.exists():
        tmp = path / f".{SOURCE.name}.{os.getpid()}"
        tmp.write_bytes(SOURCE.read_bytes())
        os.replace(tmp, copy)  # atomic: a concurrent loader sees the whole file or none
    return copy


def load(verbose: bool = False) -> bool:
    """Builds (first time) and loads the kernels; True when torch.ops.tightfit.* are usable."""
    if "ok" in _state:
        return bool(_state["ok"])
    ok = False
    if not enabled():
        _state["why"] = "TIGHTFIT_KERNELS=0"
    elif shutil.which(os.environ.get("CXX", "c++")) is None:
        _state["why"] = "no C++ compiler (c++) on PATH"
    else:
        try:
            from torch.utils import cpp_extension

            if shutil.which("ninja") is None:  # the `ninja` package's binary, beside python
                os.environ["PATH"] = (os.path.dirname(sys.executable) + os.pathsep
                                      + os.environ.get("PATH", ""))

            path = build_dir()
            path.mkdir(parents=True, exist_ok=True)
            cpp_extension.load(name=NAME, sources=[str(_source_copy(path))],
                               extra_cflags=_flags(),
                               extra_ldflags=["-fopenmp"],
                               build_directory=str(path), is_python_module=False,
                               verbose=verbose)
            ok = all(hasattr(torch.ops.tightfit, op) for op in OPS)
            if not ok:
                _state["why"] = "library loaded without its ops"
        except Exception as exc:  # compiler error, missing ninja, unwritable cache, ...
            _state["why"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1:]}"
    if not ok:
        log.warning("fused decode kernels unavailable (%s); decode runs on the plain "
                    "TorchScript stack", _state["why"])
    _state["ok"] = ok
    return ok


def why_not() -> str | None:
    """The reason load() failed, or None."""
    return None if _state.get("ok") else _state.get("why")  # type: ignore[return-value]

"""Where tightfit caches what it builds or measures (compiled kernels and the lite library,
the machine fingerprint, fitted predictor models), and what a `-march=native` build depends on.
Torch-free, so that the lite runtime and the predictor can use it."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """`TIGHTFIT_CACHE`, or ~/.cache/tightfit."""
    return Path(os.environ.get("TIGHTFIT_CACHE") or Path.home() / ".cache" / "tightfit")


def cpu_key() -> str:
    """What a -march=native build depends on: the CPU's model and feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(("flags", "model name"))]
        basis = "\n".join(sorted(set(lines)))
    except OSError:
        import platform
        basis = platform.processor() or platform.machine()
    return hashlib.sha1(basis.encode()).hexdigest()[:12]

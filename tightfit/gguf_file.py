"""Reads GGUF files: metadata as plain Python values, tensors as raw quantised blocks (numpy
views of one read-only memory map) plus their type and logical shape.

Parsed here rather than through `gguf.GGUFReader`: that reader builds one numpy view per array
element, which costs 2-12 s on the packaged models' 49k-262k-entry vocabularies (measured);
this sequential parse takes well under a second. Type and block-size tables still come from
the `gguf` package. Dequantisation lives in `dequant.py`. Does not write GGUF files.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from tightfit.errors import ModelFileError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
       6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9
_FLOAT_NP = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
             "I16": np.int16, "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor as stored: `data` holds the raw bytes (uint8) or values (float dtypes).

    `shape` is the logical PyTorch shape (rows, cols), i.e. GGUF's dims reversed.
    """

    name: str
    qtype: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray  # a view of the file's read-only memory map
    offset: int = 0
    file_map: Any = None  # the mmap.mmap behind `data`

    def release(self) -> None:
        """Drops this tensor's file pages from the process's resident set (they are clean and
        re-read on the next access), so a loaded model does not keep the file resident too."""
        if self.file_map is None:
            return
        page = mmap.PAGESIZE
        lo = -(-self.offset // page) * page
        hi = (self.offset + self.data.nbytes) // page * page
        if hi > lo:
            self.file_map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str) -> Any:
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.scalar("<Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar("<I"), self.scalar("<Q")
            if etype in _NP:  # numeric arrays: one vectorised read
                arr = np.frombuffer(self.buf, _NP[etype], count, self.pos)
                self.pos += arr.nbytes
                return arr.tolist()
            return [self.value(etype) for _ in range(count)]
        if vtype not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self.scalar(_SCALARS[vtype])


class GGUFFile:
    """A GGUF file opened read-only (memory-mapped)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileError(f"GGUF file {str(self.path)!r} does not exist")
        try:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
            self._parse()
        except ModelFileError:
            raise
        except Exception as exc:  # struct.error, ValueError, UnicodeError, IndexError ...
            raise ModelFileError(
                f"{str(self.path)!r} is not a readable GGUF file ({type(exc).__name__}: {exc}); "
                "check that it was fully downloaded/assembled") from exc

    def _parse(self) -> None:
        import gguf

        cur = _Cursor(memoryview(self._map))
        if bytes(self._map[:4]) != b"GGUF":
            raise ModelFileError(f"{str(self.path)!r} is not a GGUF file (bad magic bytes)")
        cur.pos = 4
        version, n_tensors, n_kv = cur.scalar("<I"), cur.scalar("<Q"), cur.scalar("<Q")
        if version not in (2, 3):
            raise ModelFileError(f"unsupported GGUF version {version} in {str(self.path)!r}")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = [cur.scalar("<Q") for _ in range(cur.scalar("<I"))]
            infos.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
        align = int(self.metadata.get("general.alignment", 32))
        start = -(-cur.pos // align) * align
        self._tensors = [self._tensor(gguf, start, *info) for info in infos]

    def _tensor(self, gguf: Any, start: int, name: str, dims: list[int], raw_type: int,
                offset: int) -> GGUFTensor:
        qtype = gguf.GGMLQuantizationType(raw_type)
        shape = tuple(int(d) for d in reversed(dims))
        n_elems = int(np.prod(dims)) if dims else 1
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_bytes = n_elems * type_size // block
        lo = start + offset
        if lo + n_bytes > self._map.size:
            raise ModelFileError(
                f"{str(self.path)!r} is truncated: tensor {name!r} ends at byte {lo + n_bytes}, "
                f"file has {self._map.size}")
        raw = self._map[lo:lo + n_bytes]
        if qtype.name in _FLOAT_NP:
            data = raw.view(_FLOAT_NP[qtype.name]).reshape(shape)
        else:
            data = raw.reshape(*shape[:-1], shape[-1] // block * type_size)
        return GGUFTensor(name, qtype, shape, data, lo, self._map._mmap)  # type: ignore[attr-defined]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """Reads `<architecture>.<suffix>`, e.g. arch_get('block_count')."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    def array(self, key: str) -> list[Any] | None:
        """Reads an array field such as tokenizer.ggml.tokens; None if absent."""
        return self.metadata.get(key)

    def tensors(self) -> Iterator[GGUFTensor]:
        return iter(self._tensors)

    def tensor_names(self) -> list[str]:
        return [t.name for t in self._tensors]

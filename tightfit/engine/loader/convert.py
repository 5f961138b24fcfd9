"""Re-types a GGUF file's weights (llama-quantize's job, for the types tightfit's readers take):
any stored type gguf-py can dequantise in, Q4_0 / Q4_1 / Q8_0 / F16 / F32 out, metadata and
tokenizer copied as they are. Torch-free (numpy and gguf-py).

Rules, as llama.cpp's quantizer applies them: 1-D tensors (norms, biases) stay F32; a matrix
whose rows are not whole 32-value blocks is written F16 when the target is a block type; for the
4-bit targets the token embedding (the output head too, when the model ties it) is written Q8_0,
as the packaged default model stores it. Tensors are dequantised, re-typed and written one at a
time, so memory holds one tensor, not the model. Re-typing cannot add precision: a Q4_1 file
written as F16 keeps Q4_1's rounding (it is a speed and format change, not a quality one).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from tightfit.errors import TightfitError

TARGETS = ("Q4_0", "Q4_1", "Q8_0", "F16", "F32")
_FILE_TYPE = {"Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1", "Q8_0": "MOSTLY_Q8_0",
              "F16": "MOSTLY_F16", "F32": "ALL_F32"}
_HIGH_PRECISION = ("token_embd.weight", "output.weight")


def target_type(name: str) -> str:
    """The canonical target name, or a TightfitError naming the choices."""
    t = str(name).strip().upper()
    if t not in TARGETS:
        raise TightfitError(f"cannot convert to {name!r}: choose one of {', '.join(TARGETS)}")
    return t


def _tensor_type(tensor_name: str, shape: tuple[int, ...], target: str) -> str:
    if len(shape) < 2 or target == "F32":
        return "F32"
    if target in ("Q4_0", "Q4_1", "Q8_0") and shape[-1] % 32:
        return "F16"
    if target in ("Q4_0", "Q4_1") and tensor_name in _HIGH_PRECISION:
        return "Q8_0"
    return target


def _retype(data: Any, qtype: Any, out: str) -> Any:
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    x = data if qtype in (T.F32, T.F16) else quants.dequantize(data, qtype)
    x = np.asarray(x, dtype=np.float32)
    if out == "F32":
        return x
    if out == "F16":
        return x.astype(np.float16)
    return quants.quantize(x, T[out])


def convert(src: str | Path, dst: str | Path, target: str) -> dict[str, Any]:
    """Writes `src` re-typed to `target` at `dst` (through a temporary file, so a failed run
    leaves nothing half-written). Returns what it did: tensor counts by output type, bytes."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    target = target_type(target)
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise TightfitError(f"{str(src)!r} is not a file: give a .gguf model file")
    if src.resolve() == dst.resolve():
        raise TightfitError(f"output {str(dst)!r} is the input file: give another path")
    try:
        reader = gguf.GGUFReader(str(src))
    except Exception as exc:  # gguf-py raises bare ValueErrors on foreign files
        raise TightfitError(f"{str(src)!r} is not a readable GGUF file: {exc}") from exc
    arch = reader.get_field("general.architecture")
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    dst.parent.mkdir(parents=True, exist_ok=True)
    plan = []
    for t in reader.tensors:
        shape = tuple(int(v) for v in reversed(t.shape.tolist()))  # rows first, as numpy
        plan.append((t, shape, _tensor_type(t.name, shape, target)))
    counts: dict[str, int] = {}
    try:
        writer = gguf.GGUFWriter(str(tmp), arch.contents() if arch is not None else "llama",
                                 endianess=reader.endianess)
        for field in reader.fields.values():
            if field.name.startswith("GGUF.") or field.name in ("general.architecture",
                                                                 "general.file_type"):
                continue  # the writer adds the header, the architecture and (below) the type
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
        writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPE[target]]))
        for t, shape, out in plan:
            qt = T[out]
            if out in ("F32", "F16"):
                dtype = np.dtype(np.float32 if out == "F32" else np.float16)
                writer.add_tensor_info(t.name, shape, dtype, math.prod(shape) * dtype.itemsize, qt)
            else:
                byte_shape = quants.quant_shape_to_byte_shape(shape, qt)
                writer.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8),
                                       math.prod(byte_shape), qt)
            counts[out] = counts.get(out, 0) + 1
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t, _, out in plan:
            writer.write_tensor_data(_retype(t.data, t.tensor_type, out))
        writer.close()
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    by_type: dict[str, int] = {}
    for t, _, _ in plan:
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_elements)
    return {"input": str(src), "output": str(dst), "target": target, "tensors": counts,
            "source_type": max(by_type, key=by_type.__getitem__),
            "bytes_in": src.stat().st_size, "bytes_out": dst.stat().st_size}

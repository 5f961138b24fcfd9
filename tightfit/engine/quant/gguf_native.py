"""Runs GGUF weights without re-quantising where a fast kernel can express them exactly: 4-bit
blocks (Q4_0, Q4_1, Q4_K; 32-value groups) map onto the int4 kernel's (code - 8) * scale + zero.
Other types follow the `native` policy in `native_weight_format` (not bit-exact for 5-8 bit).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from tightfit.engine.quant.formats import FP32, INT8, WeightFormat
from tightfit.engine.quant.linear import (
    Compute, Int4Linear, Int8Linear, fp32_linear)
from tightfit.engine.quant.reference import INT4_MID, Int4Weights
from tightfit.errors import ModelFileError, UnsupportedModelError

NATIVE_INT4_TYPES: tuple[str, ...] = ("Q4_0", "Q4_1", "Q4_K")
FLOAT_TYPES: tuple[str, ...] = ("F32", "F16", "BF16")
GGUF_GROUP = 32  # Q4_0/Q4_1 blocks and Q4_K sub-blocks both hold 32 consecutive input values
# Bytes per block: Q4_0 = f16 d + 16 B codes; Q4_1 = f16 d, f16 m + 16 B; Q4_K = 256 values as
# f16 d, f16 dmin, 12 B of 6-bit sub-scales/mins, 128 B codes.
_BLOCK = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144)}


def qtype_name(qtype: Any) -> str:
    """Accepts a gguf.GGMLQuantizationType, its integer value, or its name."""
    if isinstance(qtype, str):
        return qtype.upper()
    if hasattr(qtype, "name"):
        return str(qtype.name)
    import gguf

    try:
        return gguf.GGMLQuantizationType(int(qtype)).name
    except ValueError:
        raise UnsupportedModelError(f"unknown GGUF tensor type {qtype!r}") from None


def native_weight_format(qtype: Any) -> WeightFormat:
    """What `native` means for a stored tensor type.

    Q4_0/Q4_1/Q4_K -> int4-g32, converted exactly. F32/F16/BF16 -> fp32 (exact). Every other
    type (Q8_0, Q5_*, Q6_K, ...) -> int8 per output channel, re-quantised from the dequantised
    weight: the int8 kernel has one scale per row, so per-block scales cannot be kept exactly.
    """
    name = qtype_name(qtype)
    if name in NATIVE_INT4_TYPES:
        return WeightFormat("int4", GGUF_GROUP)
    if name in FLOAT_TYPES:
        return FP32
    return INT8


def linear_from_gguf(raw: np.ndarray, qtype: Any, shape: tuple[int, int],
                     bias: torch.Tensor | None = None, row_perm: torch.Tensor | None = None,
                     *, name: str = "", compute: Compute | None = None) -> nn.Module:
    """The `native` policy for one stored projection (see `native_weight_format`).

    raw: the tensor's data as the gguf reader yields it; shape: logical (out, in); row_perm: an
    optional output-row reordering applied to the result (e.g. undoing llama.cpp's Q/K permute).
    """
    fmt = native_weight_format(qtype)
    if fmt.kind == "int4":
        return int4_linear_from_gguf_q4(raw, qtype, shape, bias, row_perm, name=name,
                                        compute=compute)
    from tightfit.engine.loader.dequant import dequantize

    w = dequantize(raw, qtype, tuple(shape), name=name)
    if row_perm is not None:
        w = w[row_perm]
    if fmt.kind == "fp32":
        return fp32_linear(w, bias)
    return Int8Linear.from_float(w, bias, compute=compute)


def int4_linear_from_gguf_q4(raw_blocks: np.ndarray, qtype: Any, shape: tuple[int, int],
                             bias: torch.Tensor | None = None,
                             row_perm: torch.Tensor | None = None, *, name: str = "",
                             compute: Compute | None = None) -> Int4Linear:
    """An Int4Linear (group 32) holding the GGUF tensor's codes unchanged.

    Q4_0 (d * (q - 8)): scale d, zero 0. Q4_1 (d * q + m): scale d, zero m + 8d. Q4_K
    (d*sc * q - dmin*mn per 32-value sub-block): scale d*sc, zero 8*d*sc - dmin*mn. With
    compute="fp32" the result equals the gguf reference weight (bit-exact on the default model);
    the default bf16 compute rounds scale and zero to bf16 (fp16 d loses 3 mantissa bits).
    """
    qw = gguf_int4_weights(raw_blocks, qtype, shape, row_perm, name=name)
    return Int4Linear.from_weights(qw, bias, compute=compute)


def gguf_int4_weights(raw_blocks: np.ndarray, qtype: Any, shape: tuple[int, int],
                      row_perm: torch.Tensor | None = None, *, name: str = "") -> Int4Weights:
    """Decodes Q4_0/Q4_1/Q4_K blocks into int4 codes [out, in], scales and zeros [out, in/32]."""
    qname = qtype_name(qtype)
    if qname not in _BLOCK:
        raise UnsupportedModelError(
            f"GGUF type {qname}{_where(name)} has no exact int4 form; types that do: "
            f"{', '.join(NATIVE_INT4_TYPES)}")
    blocks = _blocks(raw_blocks, qname, shape, name)
    decode = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k}[qname]
    codes, scales, zeros = decode(blocks)
    out_f, in_f = (int(d) for d in shape)
    codes = codes.reshape(out_f, in_f)
    scales = scales.reshape(out_f, in_f // GGUF_GROUP)
    zeros = zeros.reshape(out_f, in_f // GGUF_GROUP)
    if row_perm is not None:
        codes, scales, zeros = codes[row_perm], scales[row_perm], zeros[row_perm]
    return Int4Weights(codes=codes, scales=scales, zeros=zeros, group_size=GGUF_GROUP,
                       in_features=in_f)


def _where(name: str) -> str:
    return f" (tensor {name!r})" if name else ""


def _blocks(raw: np.ndarray, qname: str, shape: tuple[int, int], name: str) -> torch.Tensor:
    """raw bytes -> uint8 [n_blocks, block_bytes], checking the size against `shape`."""
    if len(shape) != 2:
        raise ModelFileError(f"expected a 2-D shape (out, in){_where(name)}, got {tuple(shape)}")
    out_f, in_f = (int(d) for d in shape)
    values, nbytes = _BLOCK[qname]
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if in_f % values or flat.size != out_f * (in_f // values) * nbytes:
        raise ModelFileError(
            f"{qname} tensor{_where(name)} of shape {tuple(shape)} should hold "
            f"{out_f * (in_f // values) * nbytes} bytes in blocks of {values} values per row, "
            f"got {flat.size} bytes; the GGUF file is corrupt or truncated")
    # Copy: the reader's memmap is read-only and torch wants writable memory.
    return torch.from_numpy(flat.copy()).reshape(-1, nbytes)


def _f16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 field at byte `at` of each block, widened (exactly) to fp32, shape [n, 1]."""
    return blocks[:, at:at + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 16] bytes -> [n, 32] codes: the 16 low nibbles, then the 16 high nibbles (ggml order)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def _q4_0(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d = _f16(blocks, 0)
    return _nibbles(blocks[:, 2:18]), d, torch.zeros_like(d)  # d * (q - 8)


def _q4_1(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    return _nibbles(blocks[:, 4:20]), d, m + INT4_MID * d  # d * q + m


def _q4_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, mn = _k_scale_min(blocks[:, 4:16])
    scale = d * sc.to(torch.float32)  # [n, 8]; exact (11-bit mantissa x 6-bit integer)
    zero = INT4_MID * scale - dmin * mn.to(torch.float32)  # value = scale * q - dmin * mn
    # 128 code bytes = 4 chunks of 32 bytes; chunk c holds sub-block 2c in its low nibbles and
    # sub-block 2c + 1 in its high nibbles.
    qs = blocks[:, 16:144].reshape(n, 4, 32)
    codes = torch.stack([qs & 0x0F, qs >> 4], dim=2).reshape(n, 256)
    return codes, scale, zero


def _k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes -> 8 six-bit scales and 8 six-bit mins ([n, 8] each).

    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same
    for mins; bytes 8-11 hold the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high).
    """
    s = packed.reshape(-1, 3, 4)
    a, b, c = s[:, 0], s[:, 1], s[:, 2]
    scales = torch.cat([a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)], dim=1)
    mins = torch.cat([b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)], dim=1)
    return scales, mins

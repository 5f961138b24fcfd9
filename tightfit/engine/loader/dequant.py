"""Dequantises raw GGUF tensor data to torch float32, bit-exact with `gguf.quants.dequantize`.

Covers F32/F16/BF16, the legacy block types (Q4_0..Q8_0) and the K-quants Q2_K..Q6_K; the
IQ*/TQ*/MXFP4 types are not supported. Large tensors are decoded in chunks of blocks.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from tightfit.errors import ModelFileError, UnsupportedModelError

_T = GGMLQuantizationType

# Output values decoded per step. Bounds the integer intermediates (at most ~1 byte per value
# each) to a few MiB; smaller, cache-sized steps measured no faster on this machine.
_CHUNK_VALUES = 1 << 22


# ---------------------------------------------------------------------------------------------
# helpers


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 field at byte `offset` of every block, as float32 of shape (n, 1)."""
    return blocks[:, offset:offset + 2].contiguous().view(torch.float16).to(torch.float32)


_WORD_DTYPES = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


def _fields(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Splits each byte of `x` (..., k) into its 8/bits fields, lowest bits first: (..., 8/bits, k).

    Works on whole little-endian machine words (shift, then mask every byte) and interleaves
    with one stack: much faster in torch than broadcasting a per-field shift over single bytes.
    """
    k = x.shape[-1]
    size, word = next((s, w) for s, w in _WORD_DTYPES if k % s == 0)
    mask = int.from_bytes(bytes([(1 << bits) - 1]) * size, "little")
    w = x.contiguous().view(word)
    parts = [w & mask] + [(w >> shift) & mask for shift in range(bits, 8, bits)]
    return torch.stack(parts, dim=-2).view(torch.uint8)


# byte b -> 8 bytes whose byte i is bit i of b, moved to bit 4 (the Q5_0/Q5_1 high bit).
_BIT4_SPREAD = (
    ((torch.arange(256).view(256, 1) >> torch.arange(8)) & 1).to(torch.uint8).mul_(16)
    .view(torch.int64).view(256)
)


def _k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Decodes the 12-byte Q4_K/Q5_K field into 8 six-bit scales and 8 six-bit mins, (n, 8) each.

    Byte layout (capitals = scale bits, lower case = min bits, sub-blocks a..h / A..H):
      0-3  EEAAAAAA FFBBBBBB GGCCCCCC HHDDDDDD    (top 2 bits: high bits of scales 4-7)
      4-7  eeaaaaaa ffbbbbbb ggcccccc hhdddddd    (top 2 bits: high bits of mins 4-7)
      8-11 eeeeEEEE ffffFFFF ggggGGGG hhhhHHHH    (low 4 bits of scales/mins 4-7)
    """
    s = packed.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    scales = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return scales, mins


# ---------------------------------------------------------------------------------------------
# per-type decoders: `blocks` is (n, type_size) uint8, `out` is (n, block_size) float32.
# The arithmetic order (scale products first, then `q * scale`, then `+ min` / `- min`) mirrors
# gguf.quants so every float32 rounding is identical.


def _q8_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    # [d: f16][32 x int8]
    out.copy_(blocks[:, 2:].view(torch.int8))
    out.mul_(_f16(blocks, 0))


def _q4_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    # [d: f16][16 bytes: value j in the low nibble of byte j, value 16+j in the high nibble]
    q = _fields(blocks[:, 2:], 4).view(torch.int8).sub_(8)
    out.copy_(q.view(out.shape))
    out.mul_(_f16(blocks, 0))


def _q4_1(blocks: torch.Tensor, out: torch.Tensor) -> None:
    # [d: f16][m: f16][16 bytes of nibbles as in Q4_0]; value = d * q + m
    q = _fields(blocks[:, 4:], 4)
    out.copy_(q.view(out.shape))
    out.mul_(_f16(blocks, 0)).add_(_f16(blocks, 2))


def _q5_high(qh: torch.Tensor) -> torch.Tensor:
    # qh is a little-endian uint32: bit j is bit 4 of value j, so byte b holds values 8b..8b+7
    # (bit-major, unlike the K-quants), hence a table lookup rather than _fields.
    return _BIT4_SPREAD[qh.long()].view(torch.uint8).view(-1, 32)


def _q5_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    # [d: f16][qh: 4 bytes][16 bytes of low nibbles as in Q4_0]
    q = _fields(blocks[:, 6:], 4).view(-1, 32).bitwise_or_(_q5_high(blocks[:, 2:6]))
    out.copy_(q.view(torch.int8).sub_(16))
    out.mul_(_f16(blocks, 0))


def _q5_1(blocks: torch.Tensor, out: torch.Tensor) -> None:
    # [d: f16][m: f16][qh: 4 bytes][16 bytes of low nibbles]; value = d * q + m
    q = _fields(blocks[:, 8:], 4).view(-1, 32).bitwise_or_(_q5_high(blocks[:, 4:8]))
    out.copy_(q)
    out.mul_(_f16(blocks, 0)).add_(_f16(blocks, 2))


def _q2_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    # [scales: 16 bytes, low nibble = scale, high = min][qs: 64 bytes][d: f16][dmin: f16]
    # Each 32-byte half of qs holds 128 values: 2-bit field k of byte j is value 32k + j.
    n = blocks.shape[0]
    sc = blocks[:, :16]
    dl = _f16(blocks, 80) * (sc & 0x0F).to(torch.float32)
    ml = _f16(blocks, 82) * (sc >> 4).to(torch.float32)
    q = _fields(blocks[:, 16:80].reshape(n, 2, 32), 2)
    o = out.view(n, 16, 16)
    o.copy_(q.view(n, 16, 16))
    o.mul_(dl.unsqueeze(-1)).sub_(ml.unsqueeze(-1))


def _q3_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    # [hmask: 32 bytes][qs: 64 bytes][scales: 12 bytes][d: f16]
    n = blocks.shape[0]
    # 16 six-bit scales: low 4 bits are the nibbles of bytes 0-7 (low nibbles first), high 2
    # bits are the 2-bit fields of bytes 8-11 (field k of byte j belongs to scale 4k + j).
    low = _fields(blocks[:, 96:104], 4).reshape(n, 16)
    high = _fields(blocks[:, 104:108], 2).reshape(n, 16)
    sc = low.bitwise_or_(high.bitwise_left_shift_(4)).view(torch.int8).sub_(32)
    dl = _f16(blocks, 108) * sc.to(torch.float32)
    # 2 low bits as in Q2_K; bit k of hmask byte j is the third bit of value 32k + j, and a
    # *clear* bit means "subtract 4".
    ql = _fields(blocks[:, 32:96].reshape(n, 2, 32), 2).view(n, 256)
    qh = _fields(blocks[:, :32], 1).view(n, 256)
    q = ql.view(torch.int8).sub_(qh.bitwise_xor_(1).bitwise_left_shift_(2).view(torch.int8))
    o = out.view(n, 16, 16)
    o.copy_(q.view(n, 16, 16))
    o.mul_(dl.unsqueeze(-1))


def _q4_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    # [d: f16][dmin: f16][scales: 12 bytes][qs: 128 bytes]; 8 sub-blocks of 32 values.
    # Each 32-byte group of qs holds two sub-blocks: low nibbles first, then high nibbles.
    n = blocks.shape[0]
    sc, mn = _k_scale_min(blocks[:, 4:16])
    d = _f16(blocks, 0) * sc.to(torch.float32)
    dm = _f16(blocks, 2) * mn.to(torch.float32)
    q = _fields(blocks[:, 16:].reshape(n, 4, 32), 4)
    o = out.view(n, 8, 32)
    o.copy_(q.view(n, 8, 32))
    o.mul_(d.unsqueeze(-1)).sub_(dm.unsqueeze(-1))


def _q5_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    # [d: f16][dmin: f16][scales: 12 bytes][qh: 32 bytes][qs: 128 bytes]
    # Low nibbles as in Q4_K; bit k of qh byte j is bit 4 of value j of sub-block k.
    n = blocks.shape[0]
    sc, mn = _k_scale_min(blocks[:, 4:16])
    d = _f16(blocks, 0) * sc.to(torch.float32)
    dm = _f16(blocks, 2) * mn.to(torch.float32)
    q = _fields(blocks[:, 48:].reshape(n, 4, 32), 4).view(n, 8, 32)
    q.bitwise_or_(_fields(blocks[:, 16:48], 1).bitwise_left_shift_(4))
    o = out.view(n, 8, 32)
    o.copy_(q)
    o.mul_(d.unsqueeze(-1)).sub_(dm.unsqueeze(-1))


def _q6_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    # [ql: 128 bytes][qh: 64 bytes][scales: 16 x int8][d: f16]; 16 sub-blocks of 16 values.
    # Each 128-value half uses 64 ql bytes (low nibbles = values 0-63, high = 64-127) and
    # 32 qh bytes (2-bit field k of byte j = top bits of value 32k + j).
    n = blocks.shape[0]
    dl = _f16(blocks, 208) * blocks[:, 192:208].view(torch.int8).to(torch.float32)
    ql = _fields(blocks[:, :128].reshape(n, 2, 64), 4).view(n, 256)
    qh = _fields(blocks[:, 128:192].reshape(n, 2, 32), 2).view(n, 256)
    q = ql.bitwise_or_(qh.bitwise_left_shift_(4)).view(torch.int8).sub_(32)
    o = out.view(n, 16, 16)
    o.copy_(q.view(n, 16, 16))
    o.mul_(dl.unsqueeze(-1))


_BLOCK_DECODERS: dict[GGMLQuantizationType, Callable[[torch.Tensor, torch.Tensor], None]] = {
    _T.Q8_0: _q8_0,
    _T.Q4_0: _q4_0,
    _T.Q4_1: _q4_1,
    _T.Q5_0: _q5_0,
    _T.Q5_1: _q5_1,
    _T.Q2_K: _q2_k,
    _T.Q3_K: _q3_k,
    _T.Q4_K: _q4_k,
    _T.Q5_K: _q5_k,
    _T.Q6_K: _q6_k,
}

_FLOAT_TYPES = {_T.F32: torch.float32, _T.F16: torch.float16, _T.BF16: torch.bfloat16}

SUPPORTED_TYPES: frozenset[GGMLQuantizationType] = frozenset(_FLOAT_TYPES) | frozenset(
    _BLOCK_DECODERS
)


# ---------------------------------------------------------------------------------------------
# entry point


def _raw_bytes(data: np.ndarray) -> torch.Tensor:
    """A flat uint8 torch view of `data` (no copy; the source may be a read-only memmap)."""
    flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    with warnings.catch_warnings():
        # from_numpy warns on read-only arrays; the decoders never write to their input.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(flat)


def _unsupported(qtype: object, name: str) -> UnsupportedModelError:
    type_name = getattr(qtype, "name", str(qtype))
    where = f" of tensor {name!r}" if name else ""
    supported = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
    return UnsupportedModelError(
        f"tensor type {type_name}{where} is not supported; supported types: {supported}. "
        "Use a GGUF file quantised with one of these types"
    )


def dequantize(
    data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...], *, name: str = ""
) -> torch.Tensor:
    """Decodes one tensor's raw GGUF data into a new float32 tensor of logical shape `shape`.

    `data` is what gguf's reader yields (uint8 blocks, or F32/F16 values); it is never modified.
    Raises UnsupportedModelError for types outside SUPPORTED_TYPES, ModelFileError when the data
    size does not match `shape`.
    """
    try:
        qtype = GGMLQuantizationType(qtype)
    except ValueError:
        raise _unsupported(qtype, name) from None
    if qtype not in SUPPORTED_TYPES:
        raise _unsupported(qtype, name)
    shape = tuple(int(d) for d in shape)
    numel = math.prod(shape)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = _raw_bytes(data)
    where = f"tensor {name!r}" if name else "tensor"
    if numel % block_size != 0:
        raise ModelFileError(
            f"{where} of type {qtype.name} has shape {shape}, whose size is not a multiple of "
            f"the {block_size}-value block; the GGUF file is corrupt"
        )
    if raw.numel() != numel // block_size * type_size:
        raise ModelFileError(
            f"{where} of type {qtype.name} and shape {shape} should hold "
            f"{numel // block_size * type_size} bytes but holds {raw.numel()}; "
            "the GGUF file is corrupt or truncated"
        )

    float_dtype = _FLOAT_TYPES.get(qtype)
    if float_dtype is not None:
        # F16/BF16 -> F32 widening is exact, as in the reference; F32 is copied so the result
        # never aliases the (read-only, memory-mapped) file.
        return raw.view(float_dtype).to(torch.float32, copy=True).view(shape)

    decode = _BLOCK_DECODERS[qtype]
    n_blocks = numel // block_size
    blocks = raw.view(n_blocks, type_size)
    out = torch.empty((n_blocks, block_size), dtype=torch.float32)
    step = max(1, _CHUNK_VALUES // block_size)
    for start in range(0, n_blocks, step):
        decode(blocks[start:start + step], out[start:start + step])
    return out.view(shape)

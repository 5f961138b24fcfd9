"""Plain-torch reference quantisers: int8 per output channel (symmetric) and int4 per group
(asymmetric), in exactly the value convention the fast CPU kernels use. Plain, untuned code: these
define the numbers that the packed modules in `linear.py` must reproduce, and feed the AWQ search.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from tightfit.engine.quant.formats import INT4_GROUP_SIZES, padded_in_features
from tightfit.errors import TightfitError

INT8_QMAX = 127  # symmetric: -127..127, so negating a weight never overflows
INT4_LEVELS = 15  # codes 0..15
INT4_MID = 8  # torch's int4 kernels compute (q - 8) * scale + zero


@dataclass(frozen=True)
class Int8Weights:
    """q: int8 [out, in]; scales: fp32 [out]. Value = q * scale."""

    q: torch.Tensor
    scales: torch.Tensor


@dataclass(frozen=True)
class Int4Weights:
    """codes: uint8 [out, in_padded] in 0..15; scales, zeros: fp32 [out, in_padded / group].

    Value = (code - 8) * scale + zero, the convention of
    `torch.ops.aten._weight_int4pack_mm_for_cpu`. `in_features` is the unpadded input dim: the
    columns beyond it are padding whose codes are arbitrary (the input is zero-padded there).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int
    in_features: int

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[0])


def _as_fp32_2d(weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() != 2:
        raise TightfitError(f"expected a 2-D weight [out, in], got shape {tuple(weight.shape)}")
    return weight.detach().to(device="cpu", dtype=torch.float32)


def quantize_int8(weight: torch.Tensor) -> Int8Weights:
    """Symmetric per-output-channel int8: scale = max|w_row| / 127, q = round(w / scale)."""
    w = _as_fp32_2d(weight)
    absmax = w.abs().amax(dim=1)
    # An all-zero row gets scale 1 (its codes are 0 either way) instead of dividing by zero.
    scales = torch.where(absmax > 0, absmax / INT8_QMAX, torch.ones_like(absmax))
    q = torch.round(w / scales[:, None]).clamp_(-INT8_QMAX, INT8_QMAX).to(torch.int8)
    return Int8Weights(q=q, scales=scales)


def dequantize_int8(qw: Int8Weights) -> torch.Tensor:
    return qw.q.to(torch.float32) * qw.scales[:, None]


def pad_columns(weight: torch.Tensor, in_padded: int) -> torch.Tensor:
    """Pads [out, in] to [out, in_padded] by repeating the last column.

    Repeating (rather than zeros) keeps the last group's min/max those of its real columns, so
    padding never widens that group's range; the padded columns meet zero inputs anyway.
    """
    extra = in_padded - weight.shape[1]
    if extra == 0:
        return weight
    return torch.cat([weight, weight[:, -1:].expand(-1, extra)], dim=1)


def quantize_int4(weight: torch.Tensor, group_size: int, *, pad: bool = True) -> Int4Weights:
    """Asymmetric int4 per group of `group_size` consecutive input columns (round to nearest).

    scale = (max - min) / 15, code = round((w - min) / scale) in 0..15, zero = min + 8 * scale, so
    (code - 8) * scale + zero = min + code * scale. If `in` is not a multiple of `group_size`, pads
    it (see `pad_columns`) when `pad`, else raises TightfitError naming the dimension.
    """
    w = _as_fp32_2d(weight)
    out_f, in_f = w.shape
    in_padded = padded_in_features(in_f, group_size)
    if in_padded != in_f and not pad:
        raise TightfitError(
            f"int4 group size {group_size} does not divide the input dimension {in_f}; group sizes "
            f"that divide it: {_dividing_groups(in_f) or 'none'} (or allow padding to {in_padded})")
    groups = pad_columns(w, in_padded).reshape(out_f, in_padded // group_size, group_size)
    lo, scales = int4_grid(groups)
    codes = torch.round((groups - lo[..., None]) / scales[..., None]).clamp_(0, INT4_LEVELS)
    zeros = lo + INT4_MID * scales
    return Int4Weights(codes=codes.to(torch.uint8).reshape(out_f, in_padded), scales=scales,
                       zeros=zeros, group_size=group_size, in_features=in_f)


def int4_grid(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, scale) of each group of `groups` [out, n_groups, group_size]: the min/max grid
    lo + code * scale, code 0..15, that `quantize_int4` rounds onto."""
    lo = groups.amin(dim=2)
    span = groups.amax(dim=2) - lo
    # A constant group gets scale 1: every code is 0 and the value is exactly `lo`.
    return lo, torch.where(span > 0, span / INT4_LEVELS, torch.ones_like(span))


def dequantize_int4(qw: Int4Weights) -> torch.Tensor:
    """fp32 [out, in] (padding dropped), computed as (code - 8) * scale + zero like the kernel."""
    out_f, in_padded = qw.codes.shape
    g = qw.group_size
    codes = qw.codes.to(torch.float32).reshape(out_f, in_padded // g, g)
    w = (codes - INT4_MID) * qw.scales[..., None] + qw.zeros[..., None]
    return w.reshape(out_f, in_padded)[:, :qw.in_features]


def fake_quantize_int4(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """quantize_int4 then dequantize_int4: the weight the int4 kernel effectively multiplies by."""
    return dequantize_int4(quantize_int4(weight, group_size))


def _dividing_groups(in_features: int) -> str:
    return ", ".join(str(g) for g in INT4_GROUP_SIZES if in_features % g == 0)


def concat_rows(parts: Sequence[Int8Weights] | Sequence[Int4Weights]) -> Int8Weights | Int4Weights:
    """Stacks quantised weights by output rows, e.g. q/k/v or gate/up into one projection.

    Quantisation is per row, so this equals quantising the concatenated fp32 weight; one fused
    kernel call then replaces several (the caller splits the output).
    """
    if not parts:
        raise TightfitError("concat_rows needs at least one weight")
    first = parts[0]
    if isinstance(first, Int8Weights):
        return Int8Weights(q=torch.cat([p.q for p in parts]),  # type: ignore[union-attr]
                           scales=torch.cat([p.scales for p in parts]))
    layouts = {(p.group_size, p.in_features, p.codes.shape[1]) for p in parts}  # type: ignore
    if len(layouts) != 1:
        raise TightfitError(f"cannot stack int4 weights with different layouts "
                            f"(group size, in, in padded): {sorted(layouts)}")
    return Int4Weights(codes=torch.cat([p.codes for p in parts]),
                       scales=torch.cat([p.scales for p in parts]),
                       zeros=torch.cat([p.zeros for p in parts]),
                       group_size=first.group_size, in_features=first.in_features)


def round_bf16(t: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to the nearest bf16 (as the bf16 kernels see them), kept in fp32."""
    return t.to(torch.bfloat16).to(torch.float32)


def reference_linear(x: torch.Tensor, qw: Int8Weights | Int4Weights,
                     bias: torch.Tensor | None = None, *, compute: str = "fp32",
                     input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """What Int8Linear / Int4Linear compute, written with plain fp32 ops.

    compute="bf16" models the fast kernels: input, scales and zeros rounded to bf16, fp32
    accumulation, the product rounded to bf16, then the fp32 bias added. `input_scale` s: the
    weights encode W * s and the input is multiplied by 1/s first.
    """
    bf16 = compute == "bf16"
    x = x.to(torch.float32)
    if input_scale is not None:
        x = x * (1.0 / input_scale.to(torch.float32))
    if bf16:
        x = round_bf16(x)
    if isinstance(qw, Int8Weights):
        scales = round_bf16(qw.scales) if bf16 else qw.scales
        if bf16:  # the int8 kernel scales the integer-weight dot product afterwards
            y = (x @ qw.q.to(torch.float32).t()) * scales
        else:
            y = x @ (qw.q.to(torch.float32) * scales[:, None]).t()
    else:
        if bf16:
            qw = Int4Weights(codes=qw.codes, scales=round_bf16(qw.scales),
                             zeros=round_bf16(qw.zeros), group_size=qw.group_size,
                             in_features=qw.in_features)
        y = x @ dequantize_int4(qw).t()
    if bf16:
        y = round_bf16(y)
    return y if bias is None else y + bias.to(torch.float32)

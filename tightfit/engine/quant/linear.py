"""Drop-in replacements for `nn.Linear` holding weight-only int8 / int4 weights packed once, in the
layout of PyTorch's CPU kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`).
fp32 tensors in and out; nothing is dequantised per call. CPU only.

On x86 those kernels are vectorised for bf16 only (fp32 falls back to scalar code, measured
~20-50x slower), so by default the input is rounded to bf16, scales/zeros are stored in bf16 and
the kernel's bf16 output is widened back to fp32 (fp32 accumulation inside). `compute="fp32"`
keeps everything fp32: bit-for-bit the reference up to summation order, but slow.
"""
from __future__ import annotations

from typing import Any, Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn

from tightfit.engine.quant.formats import (
    INT4_GROUP_SIZES, WeightFormat, padded_out_features, parse_weight_format)
from tightfit.engine.quant.reference import (
    INT4_MID, Int4Weights, Int8Weights, quantize_int4, quantize_int8)
from tightfit.errors import TightfitError

Compute = Literal["bf16", "fp32"]
DEFAULT_COMPUTE: Compute = "bf16"
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

_INT8_MM = torch.ops.aten._weight_int8pack_mm
_INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu
_INT4_PACK = torch.ops.aten._convert_weight_to_int4pack_for_cpu
# The CPU packer ignores innerKTiles; 8 is a value every backend accepts.
_INNER_K_TILES = 8
# Rows quantised/packed per step, to bound transient memory (a 49152 x 576 head would otherwise
# need several fp32-sized temporaries). A multiple of every ISA's packing block (32 or 64 rows),
# so packing in chunks gives the same bytes as packing whole.
_ROW_CHUNK = 4096


def _row_chunks(rows: int) -> list[tuple[int, int]]:
    return [(r, min(r + _ROW_CHUNK, rows)) for r in range(0, rows, _ROW_CHUNK)]


def _check_weight(weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() != 2:
        raise TightfitError(f"expected a 2-D weight [out, in], got shape {tuple(weight.shape)}")
    return weight.detach().to(device="cpu", dtype=torch.float32)


def _optional_buffer(t: torch.Tensor | None, size: int, what: str) -> torch.Tensor | None:
    if t is None:
        return None
    t = t.detach().to(device="cpu", dtype=torch.float32).reshape(-1).contiguous()
    if t.numel() != size:
        raise TightfitError(f"{what} has {t.numel()} values, expected {size}")
    return t


def _inverse_scale(input_scale: torch.Tensor | None, in_features: int) -> torch.Tensor | None:
    s = _optional_buffer(input_scale, in_features, "input_scale")
    if s is None:
        return None
    if not bool(torch.all(torch.isfinite(s) & (s > 0))):
        raise TightfitError("input_scale must be finite and positive")
    return 1.0 / s


def _scale_columns(weight: torch.Tensor, input_scale: torch.Tensor | None) -> torch.Tensor:
    """W * s (per input column): what gets quantised when the module divides its input by s."""
    if input_scale is None:
        return weight
    return weight * input_scale.detach().to(torch.float32).reshape(1, -1)


def _compute_dtype(compute: str) -> torch.dtype:
    if compute not in _DTYPES:
        raise TightfitError(f"unknown compute type {compute!r}; valid: {', '.join(_DTYPES)}")
    return _DTYPES[compute]


class _PackedLinear(nn.Module):
    """Shared plumbing: sizes, compute dtype, optional bias and optional runtime input scaling."""

    in_features: int
    out_features: int

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None,
                 input_scale_inv: torch.Tensor | None, compute: str) -> None:
        super().__init__()
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.compute: str = compute
        self._dtype = _compute_dtype(compute)
        self.register_buffer("bias", _optional_buffer(bias, out_features, "bias"))
        # 1/s for AWQ scales that could not be folded into the previous op: x * (1/s) per call.
        self.register_buffer("input_scale_inv",
                             _optional_buffer(input_scale_inv, in_features, "input_scale_inv"))

    def _alias_buffers(self) -> None:
        """Plain attributes `_c_<name>` for every buffer: nn.Module resolves buffers through
        __getattr__ (~1 us per access), and a decode step makes ~200 of these calls."""
        for name, buf in self._buffers.items():
            object.__setattr__(self, "_c_" + name, buf)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        """Keeps buffer dtypes under model-wide .float() / .half() / .to(dtype): the kernels
        accept only their own dtypes, and a round trip through fp16 would lose bias precision."""
        before = dict(self._buffers)
        result = super()._apply(fn, recurse)
        for name, old in before.items():
            new = self._buffers[name]
            if old is not None and new is not None and new.dtype != old.dtype:
                self._buffers[name] = old.to(new.device)
        self._alias_buffers()
        return result

    def _input_2d(self, x: torch.Tensor) -> torch.Tensor:
        """[..., in] fp32 -> [rows, in] in the compute dtype, input scaling applied."""
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self._c_input_scale_inv is not None:
            x2 = x2 * self._c_input_scale_inv  # in fp32, before any rounding to bf16
        return x2.to(self._dtype)

    def _finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y = y.to(x.dtype)
        if self._c_bias is not None:
            y = y + self._c_bias
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, input_scale={self.input_scale_inv is not None}, "
                f"compute={self.compute}")


ALIGNMENT = 64


def _codes(q: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.codes, q.scales, q.zeros


def aligned(t: torch.Tensor) -> torch.Tensor:
    """t itself if its data starts on a 64-byte boundary, else an aligned copy: PyTorch's int8
    kernel crashes the process on misaligned weights (a row slice of a larger tensor, or a tensor
    read at an arbitrary file offset); fresh allocations are aligned."""
    return t if t.data_ptr() % ALIGNMENT == 0 else t.clone()


class Int8Linear(_PackedLinear):
    """y = x @ (q * scale).T + bias with int8 weights, one scale per output channel."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                 input_scale: torch.Tensor | None = None, *,
                 compute: Compute = DEFAULT_COMPUTE) -> None:
        """q: int8 [out, in]; scales: [out] (stored in the compute dtype). If `input_scale` s is
        given, q/scales encode W * s and the input is divided by s per call (so the module still
        computes x @ W.T)."""
        if q.dtype != torch.int8 or q.dim() != 2:
            raise TightfitError(f"Int8Linear needs an int8 [out, in] tensor, got {q.dtype} "
                                f"{tuple(q.shape)}")
        out_f, in_f = q.shape
        super().__init__(in_f, out_f, bias, _inverse_scale(input_scale, in_f), compute)
        self.register_buffer("weight_int8", aligned(q.contiguous()))
        self.register_buffer("scales", _optional_buffer(scales, out_f, "scales").to(self._dtype))
        self._alias_buffers()

    @classmethod
    def from_weights(cls, qw: Int8Weights, bias: torch.Tensor | None = None,
                     input_scale: torch.Tensor | None = None, *,
                     compute: Compute = DEFAULT_COMPUTE) -> Int8Linear:
        return cls(qw.q, qw.scales, bias, input_scale, compute=compute)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   input_scale: torch.Tensor | None = None, *,
                   compute: Compute = DEFAULT_COMPUTE) -> Int8Linear:
        """Quantises fp32 [out, in] (times `input_scale` per column, if given) per channel."""
        w = _check_weight(weight)
        return cls.from_rows(lambda a, b: _scale_columns(w[a:b], input_scale), tuple(w.shape),
                             bias, input_scale, compute=compute)

    @classmethod
    def from_rows(cls, rows: Callable[[int, int], torch.Tensor], shape: tuple[int, int],
                  bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None, *,
                  compute: Compute = DEFAULT_COMPUTE) -> Int8Linear:
        """As from_float, with the fp32 weight produced a row chunk at a time by `rows(a, b)`
        (already scaled by input_scale): a weight dequantised from a file never exists whole."""
        q = torch.empty(shape, dtype=torch.int8)  # filled in place: no second copy to concat
        scales = torch.empty(shape[0])
        for a, b in _row_chunks(shape[0]):
            part = quantize_int8(rows(a, b))
            q[a:b], scales[a:b] = part.q, part.scales
        return cls(q, scales, bias, input_scale, compute=compute)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = self._input_2d(x)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        return self._finish(_INT8_MM(x2, self._c_weight_int8, self._c_scales), x)


class Int4Linear(_PackedLinear):
    """y = x @ W.T + bias with W = (code - 8) * scale + zero per group of input columns.

    `weight_packed` is in torch's CPU int4 layout, which depends on the CPU's vector ISA (AVX-512
    and AVX2 pack rows in blocks of 64 vs 32): it is kept out of `state_dict` on purpose. Export
    `codes()` with `scales`/`zeros` and rebuild with `from_weights` instead.
    Input dims that are not a multiple of the group size are zero-padded per call (e.g. 576 ->
    640 for group 128); output dims not a multiple of 16 get zero rows that are sliced off.
    """

    def __init__(self, weight_packed: torch.Tensor, scales_and_zeros: torch.Tensor, *,
                 group_size: int, in_features: int, out_features: int,
                 bias: torch.Tensor | None = None, input_scale_inv: torch.Tensor | None = None,
                 compute: Compute = DEFAULT_COMPUTE) -> None:
        """Low-level: takes already-packed tensors. Use `from_float` / `from_weights`."""
        super().__init__(in_features, out_features, bias, input_scale_inv, compute)
        if group_size not in INT4_GROUP_SIZES:
            raise TightfitError(f"int4 group size {group_size} is not supported; valid: "
                                f"{', '.join(map(str, INT4_GROUP_SIZES))}")
        n_padded, half_k = weight_packed.shape
        self.group_size = int(group_size)
        self.in_padded = int(half_k) * 2
        self.out_padded = int(n_padded)
        self._pad_k = self.in_padded - self.in_features
        self.register_buffer("weight_packed", weight_packed, persistent=False)
        self.register_buffer("scales_and_zeros",
                             scales_and_zeros.to(self._dtype).contiguous(), persistent=False)
        self._alias_buffers()

    @classmethod
    def from_weights(cls, qw: Int4Weights, bias: torch.Tensor | None = None,
                     input_scale: torch.Tensor | None = None, *,
                     compute: Compute = DEFAULT_COMPUTE) -> Int4Linear:
        """Packs reference int4 weights (codes/scales/zeros). `input_scale` as in `from_float`."""
        _check_int4_weights(qw)
        packed, sz = _pack_int4(qw.codes, qw.scales, qw.zeros)
        return cls(packed, sz, group_size=qw.group_size, in_features=qw.in_features,
                   out_features=qw.out_features, bias=bias,
                   input_scale_inv=_inverse_scale(input_scale, qw.in_features), compute=compute)

    @classmethod
    def from_float(cls, weight: torch.Tensor, group_size: int, bias: torch.Tensor | None = None,
                   input_scale: torch.Tensor | None = None, *, pad: bool = True,
                   compute: Compute = DEFAULT_COMPUTE) -> Int4Linear:
        """Quantises fp32 [out, in] to int4 (round to nearest per group) and packs it.

        With `input_scale` s (AWQ scales not folded upstream) it quantises W * s and divides the
        input by s per call. `pad=False` raises instead of padding an input dim that the group
        size does not divide.
        """
        w = _check_weight(weight)
        return cls.from_rows(lambda a, b: _scale_columns(w[a:b], input_scale), tuple(w.shape),
                             group_size, bias, input_scale, pad=pad, compute=compute)

    @classmethod
    def from_rows(cls, rows: Callable[[int, int], torch.Tensor], shape: tuple[int, int],
                  group_size: int, bias: torch.Tensor | None = None,
                  input_scale: torch.Tensor | None = None, *, pad: bool = True,
                  compute: Compute = DEFAULT_COMPUTE) -> Int4Linear:
        """As from_float, with the fp32 weight produced a row chunk at a time by `rows(a, b)`."""
        out_f, in_f = shape
        # Quantise and pack chunk by chunk so only one chunk's fp32 rows and int32 codes exist at
        # a time (every chunk but the last is a multiple of 16 rows, so only the last gets
        # padding rows), into tensors allocated once: a list of chunks joined by torch.cat held
        # the packed weight twice (+170 MB of load peak for Gemma 3's 262k-row head).
        n_out = padded_out_features(out_f)
        packed = sz = None
        for a, b in _row_chunks(out_f):
            p, s = _pack_int4(*_codes(quantize_int4(rows(a, b), group_size, pad=pad)))
            if packed is None or sz is None:
                packed = torch.empty((n_out, p.shape[1]), dtype=p.dtype)
                sz = torch.empty((s.shape[0], n_out, s.shape[2]), dtype=s.dtype)
            packed[a:a + p.shape[0]] = p
            sz[:, a:a + s.shape[1]] = s
        assert packed is not None and sz is not None
        return cls(packed, sz, group_size=group_size,
                   in_features=in_f, out_features=out_f, bias=bias,
                   input_scale_inv=_inverse_scale(input_scale, in_f), compute=compute)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = self._input_2d(x)
        if self._pad_k:
            x2 = F.pad(x2, (0, self._pad_k))
        elif not x2.is_contiguous():
            x2 = x2.contiguous()
        y = _INT4_MM(x2, self._c_weight_packed, self.group_size, self._c_scales_and_zeros)
        if self.out_padded != self.out_features:
            y = y[:, :self.out_features]
        return self._finish(y, x)

    def codes(self) -> torch.Tensor:
        """The uint8 codes [out, in_padded] (0..15), recovered from the packed weight.

        Runs the kernel on an identity matrix with scale 1 and zero 8, which yields each code
        exactly (small integers survive bf16); costs one in_padded^2 x out matmul (export only).
        """
        g = self.in_padded // self.group_size
        ident_sz = torch.empty(g, self.out_padded, 2, dtype=self._dtype)
        ident_sz[..., 0] = 1.0
        ident_sz[..., 1] = float(INT4_MID)
        eye = torch.eye(self.in_padded, dtype=self._dtype)
        out = _INT4_MM(eye, self.weight_packed, self.group_size, ident_sz)
        return out.t()[:self.out_features].float().round().to(torch.uint8).contiguous()

    @property
    def scales(self) -> torch.Tensor:
        """fp32 [out, in_padded / group] (as stored: bf16-rounded under the bf16 compute)."""
        return self.scales_and_zeros[:, :self.out_features, 0].t().float().contiguous()

    @property
    def zeros(self) -> torch.Tensor:
        """fp32 [out, in_padded / group] (as stored)."""
        return self.scales_and_zeros[:, :self.out_features, 1].t().float().contiguous()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}, in_padded={self.in_padded}"


def _check_int4_weights(qw: Int4Weights) -> None:
    """Shape/range checks, so weights read from a damaged file fail here with the numbers."""
    if qw.codes.dim() != 2 or qw.codes.dtype != torch.uint8:
        raise TightfitError(f"int4 codes must be uint8 [out, in], got {qw.codes.dtype} "
                            f"{tuple(qw.codes.shape)}")
    n, k = qw.codes.shape
    g = qw.group_size
    if g not in INT4_GROUP_SIZES or k % g or not 0 < qw.in_features <= k or k - qw.in_features >= g:
        raise TightfitError(f"int4 codes of width {k} do not fit group size {g} and "
                            f"{qw.in_features} input features")
    for what, t in (("scales", qw.scales), ("zeros", qw.zeros)):
        if tuple(t.shape) != (n, k // g):
            raise TightfitError(f"int4 {what} have shape {tuple(t.shape)}, expected "
                                f"{(n, k // g)} for group size {g}")
    if n and int(qw.codes.max()) > 15:
        raise TightfitError(f"int4 codes must lie in 0..15, found {int(qw.codes.max())}")


def _pack_int4(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """codes uint8 [n, k] (0..15), scales/zeros [n, k/g] -> (packed uint8 [n', k/2],
    scales_and_zeros fp32 [k/g, n', 2]) with n' = n rounded up to a multiple of 16.

    Padding rows get code 8, scale 1, zero 0, i.e. weight 0. Packing goes `_ROW_CHUNK` rows at a
    time to bound the int32 temporary the packer needs.
    """
    n, k = codes.shape
    if k % 2:
        raise TightfitError(f"int4 input dimension {k} must be even")
    n_out = padded_out_features(n)
    if n_out != n:
        extra = n_out - n
        codes = torch.cat([codes, torch.full((extra, k), INT4_MID, dtype=codes.dtype)])
        scales = torch.cat([scales, torch.ones(extra, scales.shape[1])])
        zeros = torch.cat([zeros, torch.zeros(extra, zeros.shape[1])])
    packed = torch.cat([_INT4_PACK(codes[a:b].to(torch.int32).contiguous(), _INNER_K_TILES)
                        for a, b in _row_chunks(n_out)])
    sz = torch.stack([scales.to(torch.float32), zeros.to(torch.float32)], dim=-1)
    return packed, sz.transpose(0, 1).contiguous()


def fp32_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Linear:
    """An nn.Linear that uses `weight` (fp32 [out, in]) without copying it when already fp32."""
    w = _check_weight(weight).contiguous()
    out_f, in_f = w.shape
    lin = nn.Linear(in_f, out_f, bias=bias is not None, device="meta")
    lin.weight = nn.Parameter(w, requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(_optional_buffer(bias, out_f, "bias"), requires_grad=False)
    return lin


def quantize_linear(weight: torch.Tensor, bias: torch.Tensor | None,
                    fmt: WeightFormat | str, input_scale: torch.Tensor | None = None, *,
                    pad: bool = True, compute: Compute = DEFAULT_COMPUTE) -> nn.Module:
    """The offline transform: fp32 weight [out, in] (+ bias) -> a module computing x @ W.T + b.

    fmt: fp32 -> nn.Linear; int8 -> Int8Linear; int4-gG / int4-awq-gG -> Int4Linear (the AWQ flag
    only records that the caller already applied AWQ scales; this function does not search).
    input_scale: per-input-channel AWQ scales s not folded upstream: W * s is quantised and the
    input is divided by s per call (ignored for fp32, which is exact anyway). If you folded 1/s
    into the previous op, pass W * s as `weight` and no input_scale.
    pad: int4 only; False raises TightfitError when the group size does not divide `in`.
    compute: int8/int4 kernel precision, "bf16" (fast, default) or "fp32" (exact, slow); see the
    module docstring.
    """
    fmt = parse_weight_format(fmt)
    if fmt.kind == "fp32":
        return fp32_linear(weight, bias)
    if fmt.kind == "int8":
        return Int8Linear.from_float(weight, bias, input_scale, compute=compute)
    if fmt.kind == "int4":
        assert fmt.group_size is not None
        return Int4Linear.from_float(weight, fmt.group_size, bias, input_scale, pad=pad,
                                      compute=compute)
    raise TightfitError("weight format 'native' keeps the file's stored blocks: build it from the "
                        "raw tensor with tightfit.engine.quant.gguf_native.linear_from_gguf")

"""Drop-in replacements for `nn.Linear` holding weight-only int8 / int4 weights packed once, in the
layout of PyTorch's CPU kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`).
fp32 tensors in and out; nothing is dequantised per call. CPU only.

On x86 those kernels are vectorised for bf16 only (fp32 falls back to scalar code, measured
~20-50x slower), so by default the input is rounded to bf16, scales/zeros are stored in bf16 and
the kernel's bf16 output is widened back to fp32 (fp32 accumulation inside). `compute="fp32"`
keeps everything fp32: bit-for-bit the reference up to summation order, but slow.

int8 weights have a faster and more precise path, `compute="int8x2"` (the default for Int8Linear
where fbgemm runs): fbgemm's int8 x int8 GEMM (`quantized::linear_dynamic`, int32 accumulation)
with each input row split into two int8 parts, hi + lo, so the activations keep ~15 bits instead
of bf16's 8 (see `int8x2_linear`). 2-3x faster than `_weight_int8pack_mm` at decode sizes.
"""
from __future__ import annotations

import functools
import logging
import warnings
from pathlib import Path
from typing import Any, Callable, List, Literal

import torch
import torch.nn.functional as F
from torch import nn

from tightfit.engine import kernels
from tightfit.engine.quant.formats import (
    INT4_GROUP_SIZES, WeightFormat, padded_out_features, parse_weight_format)
from tightfit.engine.quant.reference import (
    INT4_MID, Int4Weights, Int8Weights, quantize_int4, quantize_int8)
from tightfit.errors import TightfitError

log = logging.getLogger(__name__)

Compute = Literal["bf16", "fp32", "int8x2"]
DEFAULT_COMPUTE: Compute = "bf16"
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "int8x2": torch.float32}
INT8X2 = "int8x2"

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


# --- int8 x (int8 hi + int8 lo) through fbgemm ------------------------------------------------

@functools.lru_cache(maxsize=1)
def int8x2_supported() -> bool:
    """fbgemm's dynamic int8 linear is built into this torch and runs here (x86 builds)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return False
    try:
        packed = _pack_int8x2(torch.ones(8, 8, dtype=torch.int8), torch.ones(8))
        y = int8x2_linear(torch.ones(1, 8), packed, _levels())
    except Exception as exc:  # noqa: BLE001 - any failure means "not here"
        log.info("fbgemm int8 GEMM unavailable (%s); int8 weights use _weight_int8pack_mm", exc)
        return False
    return bool(torch.allclose(y, torch.full((1, 8), 8.0), rtol=1e-5, atol=0.0))


def default_int8_compute() -> Compute:
    return INT8X2 if int8x2_supported() else DEFAULT_COMPUTE


def _int8_compute(compute: Compute | None) -> Compute:
    """The kernel an Int8Linear runs: `compute`, or this machine's default when None or when
    int8x2 is asked for where fbgemm is missing."""
    if compute is None or (compute == INT8X2 and not int8x2_supported()):
        return default_int8_compute()
    return compute


@functools.lru_cache(maxsize=1)
def _reduce_range() -> bool:
    """fbgemm's u8 x s8 kernels without VNNI sum byte pairs into int16, which can saturate with
    full-range 8-bit inputs; PyTorch's answer is 7-bit activations ("reduce_range"). With
    AVX512-VNNI / AVX-VNNI the products accumulate in int32 and all 8 bits are safe."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return not ("avx512_vnni" in flags or "avx_vnni" in flags)


def _levels() -> float:
    """Quantisation steps across [-1, 1] that fbgemm uses for the normalised rows: 255 (8-bit)
    or 127 (7-bit, reduce_range)."""
    return 127.0 if _reduce_range() else 255.0


# fbgemm packs from a whole quantized tensor, so a weight exists twice while it is packed: weights
# are packed in row blocks of at most this many bytes (Gemma 3's 262k-row int8 head: 168 MB, six
# blocks; one block alone put +165 MiB on its load peak). Each block is one more GEMM call a step.
PACK_BLOCK_BYTES = 32 << 20


def _pack_int8x2(q: torch.Tensor, scales: torch.Tensor) -> list[Any]:
    """fbgemm's packed form of int8 [out, in] per-channel weights (see `_pack_int8x2_rows`)."""
    return _pack_int8x2_rows(lambda a, b: (q[a:b], scales[a:b]), tuple(q.shape))


def _pack_block_rows(in_features: int) -> int:
    rows = max(1, PACK_BLOCK_BYTES // (in_features + 2))
    return max(_ROW_CHUNK, rows // _ROW_CHUNK * _ROW_CHUNK)


def _pack_int8x2_rows(rows: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]],
                      shape: tuple[int, int]) -> list[Any]:
    """Packs int8 codes and per-row scales produced a row chunk at a time by `rows(a, b)` into
    fbgemm's layout, in output-row blocks of <= PACK_BLOCK_BYTES, each with two all-zero input
    columns for the +1 / -1 anchors of `int8x2_linear`.

    The codes are written straight into the storage of the quantized tensor fbgemm packs from,
    and only fbgemm's packed copy is kept: load transient = one block, steady state = 1x the
    int8 weight. `Int8Linear.codes` unpacks them again."""
    out_f, in_f = shape
    step = _pack_block_rows(in_f)
    blocks = []
    for lo in range(0, out_f, step):
        n = min(step, out_f - lo)
        scales64 = torch.zeros(n, dtype=torch.float64)
        with warnings.catch_warnings():  # quantized tensors are deprecated upstream; torch pinned
            warnings.simplefilter("ignore")
            qw = torch._empty_per_channel_affine_quantized(
                (n, in_f + 2), scales=scales64, zero_points=torch.zeros(n, dtype=torch.long),
                axis=0, dtype=torch.qint8)
            # an int8 view of the same bytes; the quantizer holds `scales64` itself (no copy)
            codes = torch.empty(0, dtype=torch.int8).set_(
                qw.untyped_storage(), qw.storage_offset(), (n, in_f + 2), (in_f + 2, 1))
            codes[:, in_f:] = 0
            for a, b in _row_chunks(n):
                codes[a:b, :in_f], scales64[a:b] = rows(lo + a, lo + b)
            blocks.append(torch.ops.quantized.linear_prepack(qw, None))
        del qw, codes
    return blocks


def int8x2_linear(x: torch.Tensor, packed: List[torch.classes.quantized.LinearPackedParamsBase],
                  levels: float, row_block: int = 256) -> torch.Tensor:
    """x [M, in] fp32 @ W.T for fbgemm-packed int8 W (`_pack_int8x2_rows`: output-row blocks),
    as two int8 GEMM rows per input row:

    * each row is divided by its max |x| (a), so it lies in [-1, 1];
    * hi = that row rounded to fbgemm's grid (steps of 2/levels), lo = what rounding lost,
      divided by its own max (b, so that it too lies on codes -127..127);
    * two anchor columns hold +1 and -1 (their weights are zero), so fbgemm's per-tensor
      min/max is exactly [-1, 1] whatever the other rows hold: hi is quantised without error,
      and each row's result does not depend on which rows share the batch;
    * y = a * (W hi) + a * b * (W lo).

    Activations keep ~15 significant bits (bf16 keeps 8), the weights their int8 codes, int32
    accumulation inside. Inputs of more than `row_block` rows go through in blocks of rows (the
    same numbers: rows are independent): two int8 rows and an fp32 output row per input row
    would otherwise double the transient of a long prefill (1536 x 3072 outputs: 38 MB, not 19). TorchScript compiles this function as it is
    (engine/scripted.py).
    """
    m = x.size(0)
    if m <= row_block:
        return _int8x2_rows(x, packed, levels)
    outs: List[torch.Tensor] = []
    for r in range(0, m, row_block):
        outs.append(_int8x2_rows(x[r:r + row_block], packed, levels))
    return torch.cat(outs)


def _int8x2_rows(x: torch.Tensor, packed: List[torch.classes.quantized.LinearPackedParamsBase],
                 levels: float) -> torch.Tensor:
    m, k = x.size(0), x.size(1)
    half = levels / 2.0
    top = float(int(half))  # the largest code both fbgemm zero points (127.5 -> 127 or 128) hold
    a = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    xn = x / a
    hi = torch.round(xn * half).clamp_(-top, top).div_(half)
    lo = xn - hi
    # scaled so its largest value lands on code +-top too (fbgemm's grid holds -128..127 around
    # its zero point, not +-127.5)
    b = lo.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) * (half / top)
    z = torch.empty(2 * m, k + 2, dtype=x.dtype)
    z[:m, :k] = hi
    z[m:, :k] = lo / b
    z[:, k] = 1.0
    z[:, k + 1] = -1.0
    y = int8x2_gemm(z, packed, levels)
    return torch.addcmul(y[:m] * a, y[m:], a * b)


def int8x2_fused_linear(x: torch.Tensor,
                        packed: List[torch.classes.quantized.LinearPackedParamsBase],
                        levels: float, row_block: int = 256) -> torch.Tensor:
    """`int8x2_linear` with the activation split and the join of the two results as one fused
    op each (engine/kernels/decode.cpp, rows shared out across threads): the same formulas in
    the same order, bit-identical results, ~15 fewer ATen ops a matmul. Needs the kernels
    loaded (`tightfit.engine.kernels.load()`); TorchScript compiles it only then."""
    m = x.size(0)
    if m <= row_block:  # a decode step: one split, one GEMM, one join
        return _int8x2_fused_rows(x.contiguous(), packed, levels)
    outs: List[torch.Tensor] = []
    for r in range(0, m, row_block):
        outs.append(_int8x2_fused_rows(x[r:r + row_block].contiguous(), packed, levels))
    return torch.cat(outs)


def _int8x2_fused_rows(x: torch.Tensor,
                       packed: List[torch.classes.quantized.LinearPackedParamsBase],
                       levels: float) -> torch.Tensor:
    z, a, ab = torch.ops.tightfit.int8x2_split(x, levels)
    return torch.ops.tightfit.int8x2_combine(int8x2_gemm(z, packed, levels), a, ab)


def int8x2_gemm(z: torch.Tensor, packed: List[torch.classes.quantized.LinearPackedParamsBase],
                levels: float) -> torch.Tensor:
    """fbgemm's int8 GEMM of the split rows z [2m, in+2] with every packed output-row block."""
    reduce_range = levels < 200.0
    if len(packed) == 1:
        return torch.ops.quantized.linear_dynamic(z, packed[0], reduce_range)
    ys: List[torch.Tensor] = []
    for p in packed:
        ys.append(torch.ops.quantized.linear_dynamic(z, p, reduce_range))
    return torch.cat(ys, dim=1)


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
    """y = x @ (q * scale).T + bias with int8 weights, one scale per output channel.

    compute="int8x2" (the default where fbgemm runs, `default_int8_compute`): the weights live
    only in fbgemm's packed layout and the input goes through `int8x2_linear`; "bf16" / "fp32":
    `_weight_int8pack_mm` on the `weight_int8` buffer. `codes()` gives the int8 codes either way.
    """

    def __init__(self, q: torch.Tensor | None, scales: torch.Tensor,
                 bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None, *,
                 compute: Compute | None = None,
                 packed: tuple[list[Any], tuple[int, int]] | None = None
                 ) -> None:
        """q: int8 [out, in]; scales: [out] (stored in the compute dtype). If `input_scale` s is
        given, q/scales encode W * s and the input is divided by s per call (so the module still
        computes x @ W.T). compute=None: `default_int8_compute()`; "int8x2" where fbgemm is
        missing falls back to "bf16". `packed` (from_rows): (fbgemm packed weight, shape) in
        place of q, under int8x2 only."""
        if packed is None and (q is None or q.dtype != torch.int8 or q.dim() != 2):
            raise TightfitError(f"Int8Linear needs an int8 [out, in] tensor, got "
                                f"{None if q is None else (q.dtype, tuple(q.shape))}")
        compute = _int8_compute(compute)
        if packed is not None and compute != INT8X2:
            raise TightfitError(f"a packed int8 weight needs compute 'int8x2', got {compute!r}")
        out_f, in_f = packed[1] if packed is not None else q.shape  # type: ignore[union-attr]
        super().__init__(in_f, out_f, bias, _inverse_scale(input_scale, in_f), compute)
        scales = _optional_buffer(scales, out_f, "scales")
        self.packed: Any = None
        self.pad_k = 0
        if compute == INT8X2:
            self.packed = packed[0] if packed is not None else _pack_int8x2(q, scales)
            self.levels = _levels()
            self.register_buffer("weight_int8", None)
        else:
            # _weight_int8pack_mm crashes the process when in is not a multiple of 16 (measured:
            # 200 and 232 crash, 192/208/224/240 run): zero columns up to the next multiple
            self.pad_k = -in_f % 16
            if self.pad_k:
                q = F.pad(q, (0, self.pad_k))
            self.register_buffer("weight_int8", aligned(q.contiguous()))
        self.register_buffer("scales", scales.to(self._dtype))
        self._alias_buffers()

    @classmethod
    def from_weights(cls, qw: Int8Weights, bias: torch.Tensor | None = None,
                     input_scale: torch.Tensor | None = None, *,
                     compute: Compute | None = None) -> Int8Linear:
        return cls(qw.q, qw.scales, bias, input_scale, compute=compute)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   input_scale: torch.Tensor | None = None, *,
                   compute: Compute | None = None) -> Int8Linear:
        """Quantises fp32 [out, in] (times `input_scale` per column, if given) per channel."""
        w = _check_weight(weight)
        return cls.from_rows(lambda a, b: _scale_columns(w[a:b], input_scale), tuple(w.shape),
                             bias, input_scale, compute=compute)

    @classmethod
    def from_rows(cls, rows: Callable[[int, int], torch.Tensor], shape: tuple[int, int],
                  bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None, *,
                  compute: Compute | None = None) -> Int8Linear:
        """As from_float, with the fp32 weight produced a row chunk at a time by `rows(a, b)`
        (already scaled by input_scale): a weight dequantised from a file never exists whole."""
        scales = torch.empty(shape[0])
        if _int8_compute(compute) == INT8X2:
            def part(a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
                p = quantize_int8(rows(a, b))
                scales[a:b] = p.scales
                return p.q, p.scales

            packed = _pack_int8x2_rows(part, shape)  # codes go straight into fbgemm's input
            return cls(None, scales, bias, input_scale, compute=INT8X2, packed=(packed, shape))
        q = torch.empty(shape, dtype=torch.int8)  # filled in place: no second copy to concat
        for a, b in _row_chunks(shape[0]):
            part8 = quantize_int8(rows(a, b))
            q[a:b], scales[a:b] = part8.q, part8.scales
        return cls(q, scales, bias, input_scale, compute=compute)

    def codes(self) -> torch.Tensor:
        """The int8 codes [out, in] (unpacked from fbgemm's layout under int8x2: export only)."""
        if self.weight_int8 is not None:
            return self.weight_int8[:, :self.in_features].contiguous()
        return torch.cat([torch.ops.quantized.linear_unpack(p)[0].int_repr()[:, :self.in_features]
                          for p in self.packed])

    @property
    def packed_nbytes(self) -> int:
        """Bytes held outside the module's buffers (fbgemm's packed weight, ~1 per weight)."""
        # codes with the two anchor columns, plus fbgemm's per-row column offset, scale and zero
        return 0 if self.packed is None else self.out_features * (self.in_features + 2 + 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = self._input_2d(x)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        if self.packed is not None:
            y = (int8x2_fused_linear(x2, self.packed, self.levels) if kernels.loaded()
                 else int8x2_linear(x2, self.packed, self.levels))
        else:
            if self.pad_k:
                x2 = F.pad(x2, (0, self.pad_k))
            y = _INT8_MM(x2, self._c_weight_int8, self._c_scales)
        return self._finish(y, x)


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
                 compute: Compute | None = None) -> None:
        """Low-level: takes already-packed tensors. Use `from_float` / `from_weights`."""
        compute = compute or DEFAULT_COMPUTE
        if compute == INT8X2:
            raise TightfitError("compute 'int8x2' runs int8 weights only; int4 weights take "
                                "'bf16' or 'fp32'")
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
                     compute: Compute | None = None) -> Int4Linear:
        """Packs reference int4 weights (codes/scales/zeros). `input_scale` as in `from_float`."""
        _check_int4_weights(qw)
        packed, sz = _pack_int4(qw.codes, qw.scales, qw.zeros)
        return cls(packed, sz, group_size=qw.group_size, in_features=qw.in_features,
                   out_features=qw.out_features, bias=bias,
                   input_scale_inv=_inverse_scale(input_scale, qw.in_features), compute=compute)

    @classmethod
    def from_float(cls, weight: torch.Tensor, group_size: int, bias: torch.Tensor | None = None,
                   input_scale: torch.Tensor | None = None, *, pad: bool = True,
                   compute: Compute | None = None) -> Int4Linear:
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
                  compute: Compute | None = None) -> Int4Linear:
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
                    pad: bool = True, compute: Compute | None = None) -> nn.Module:
    """The offline transform: fp32 weight [out, in] (+ bias) -> a module computing x @ W.T + b.

    fmt: fp32 -> nn.Linear; int8 -> Int8Linear; int4-gG / int4-awq-gG -> Int4Linear (the AWQ flag
    only records that the caller already applied AWQ scales; this function does not search).
    input_scale: per-input-channel AWQ scales s not folded upstream: W * s is quantised and the
    input is divided by s per call (ignored for fp32, which is exact anyway). If you folded 1/s
    into the previous op, pass W * s as `weight` and no input_scale.
    pad: int4 only; False raises TightfitError when the group size does not divide `in`.
    compute: kernel precision, None for each kernel's default (int8: "int8x2" where fbgemm runs,
    else "bf16"; int4: "bf16"), "bf16" or "fp32" (exact, slow); see the module docstring.
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


def held_bytes(model: nn.Module, skip_suffixes: tuple[str, ...] = ()) -> int:
    """Bytes of weights a model holds: every distinct tensor storage among its parameters,
    buffers and plain tensor attributes, plus the fbgemm-packed int8 weights that live outside
    tensors (`Int8Linear.packed_nbytes`). Named tensors ending in `skip_suffixes` are left out
    (e.g. rotary tables, sized by the context rather than the weights)."""
    seen: set[int] = set()
    total = 0
    named = list(model.named_parameters()) + list(model.named_buffers())
    tensors = [t for n, t in named if not n.endswith(skip_suffixes)]
    tensors += [v for m in model.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)]
    for t in tensors:
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total + sum(getattr(m, "packed_nbytes", 0) for m in model.modules())

"""Weight-format names used across tightfit (`fp32`, `int8`, `int4-g64`, `int4-awq-g128`, `native`)
and the bytes each costs per weight. Pure Python (no torch import), so the CLI and the memory
predictor can use it cheaply.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from tightfit.errors import TightfitError

Kind = Literal["fp32", "int8", "int4", "native"]

# Group sizes tightfit offers for int4. torch's CPU int4 kernel also accepts 256, left out because
# it is not in the project's precision menu.
INT4_GROUP_SIZES: tuple[int, ...] = (32, 64, 128)
# Per-group scale + zero, and per-row int8 scale, in bf16: the dtype of the fast kernels' default
# bf16 compute (see linear.py). The exact fp32 compute stores them in fp32, twice these figures.
INT4_GROUP_OVERHEAD_BYTES = 4
INT8_ROW_OVERHEAD_BYTES = 2

VALID_FORMATS: tuple[str, ...] = (
    "native", "fp32", "int8",
    *(f"int4-g{g}" for g in INT4_GROUP_SIZES),
    *(f"int4-awq-g{g}" for g in INT4_GROUP_SIZES),
)

_INT4_RE = re.compile(r"int4-(awq-)?g(\d+)")


@dataclass(frozen=True)
class WeightFormat:
    """How one projection's weight is stored.

    kind: "fp32" | "int8" (per output channel, symmetric) | "int4" (asymmetric, groups along the
    input dim) | "native" (keep the file's stored format where a fast kernel can run it exactly;
    see `gguf_native.native_weight_format`).
    group_size: int4 only. awq: int4 only; weights were scaled by an activation-aware search.
    """

    kind: Kind
    group_size: int | None = None
    awq: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("fp32", "int8", "int4", "native"):
            raise TightfitError(f"unknown weight kind {self.kind!r}; valid: fp32, int8, int4, native")
        if self.kind == "int4":
            if self.group_size not in INT4_GROUP_SIZES:
                raise TightfitError(
                    f"int4 group size {self.group_size!r} is not supported; valid: "
                    f"{', '.join(map(str, INT4_GROUP_SIZES))}")
        elif self.group_size is not None or self.awq:
            raise TightfitError(f"weight kind {self.kind!r} takes no group size or AWQ flag")

    @property
    def name(self) -> str:
        """The canonical name, which `parse_weight_format` maps back to this object."""
        if self.kind == "int4":
            return f"int4-{'awq-' if self.awq else ''}g{self.group_size}"
        return self.kind

    def __str__(self) -> str:
        return self.name

    def bytes_per_weight(self, in_features: int | None = None) -> float:
        """Bytes per weight as stored by tightfit's modules, scales included.

        With `in_features`, per-row overhead and int4 padding of the input dim are counted exactly;
        without it, the nominal figure (int8: 1.0, int4-gG: 0.5 + 4/G). `native` depends on the
        file's tensor type: resolve it first.
        """
        if self.kind == "native":
            raise TightfitError("'native' has no fixed size: resolve it against the stored tensor "
                                "type first (gguf_native.native_weight_format)")
        if in_features is None:
            return {"fp32": 4.0, "int8": 1.0}.get(
                self.kind, 0.5 + INT4_GROUP_OVERHEAD_BYTES / (self.group_size or 1))
        return _row_nbytes(self, in_features) / in_features


FP32 = WeightFormat("fp32")
INT8 = WeightFormat("int8")
NATIVE = WeightFormat("native")


def parse_weight_format(name: str | WeightFormat) -> WeightFormat:
    """`"int4-awq-g64"` -> WeightFormat("int4", 64, awq=True). Case and surrounding blanks are
    ignored. Raises TightfitError naming the value and listing the valid names."""
    if isinstance(name, WeightFormat):
        return name
    key = str(name).strip().lower()
    if key in ("fp32", "int8", "native"):
        return WeightFormat(key)  # type: ignore[arg-type]
    m = _INT4_RE.fullmatch(key)
    if m and int(m.group(2)) in INT4_GROUP_SIZES:
        return WeightFormat("int4", int(m.group(2)), awq=m.group(1) is not None)
    hint = ""
    if m:
        hint = (f" (group size {m.group(2)} is not offered; int4 groups: "
                f"{', '.join(map(str, INT4_GROUP_SIZES))})")
    raise TightfitError(
        f"unknown weight format {name!r}{hint}; valid formats: {', '.join(VALID_FORMATS)}")


def padded_in_features(in_features: int, group_size: int) -> int:
    """The input dim rounded up to a whole number of groups: int4 pads K with zeros (e.g. 576 ->
    640 for group 128), since the kernel needs K divisible by the group size."""
    return math.ceil(in_features / group_size) * group_size


# torch's CPU int4 packer needs N (output features) divisible by 16; other N get zero rows.
INT4_N_MULTIPLE = 16


def padded_out_features(out_features: int) -> int:
    return math.ceil(out_features / INT4_N_MULTIPLE) * INT4_N_MULTIPLE


def weight_nbytes(fmt: WeightFormat | str, out_features: int, in_features: int) -> int:
    """Exact bytes the weight of an (out, in) projection occupies in tightfit's module for `fmt`
    (packed codes + scales/zeros, padding included; bias and input scales not counted)."""
    fmt = parse_weight_format(fmt)
    rows = padded_out_features(out_features) if fmt.kind == "int4" else out_features
    return rows * _row_nbytes(fmt, in_features)


def _row_nbytes(fmt: WeightFormat, in_features: int) -> int:
    if fmt.kind == "fp32":
        return 4 * in_features
    if fmt.kind == "int8":
        return in_features + INT8_ROW_OVERHEAD_BYTES
    if fmt.kind == "int4":
        assert fmt.group_size is not None
        k = padded_in_features(in_features, fmt.group_size)
        return k // 2 + (k // fmt.group_size) * INT4_GROUP_OVERHEAD_BYTES
    raise TightfitError("'native' has no fixed size: resolve it against the stored tensor type "
                        "first (gguf_native.native_weight_format)")

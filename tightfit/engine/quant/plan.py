"""Precision plans: which weight format each projection gets, per layer, and the linear
factory that builds the model's projections from a plan.

A plan file (JSON or YAML) looks like:
    default: int4-g64
    rules:                      # glob on projection names; the last matching rule wins
      lm_head: int8
      gate_proj: fp32           # a bare projection name applies to every layer
      "layers.0.*": int8
Projection names: layers.N.{q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj}, lm_head.
Projections that share an input (q/k/v, gate/up) are fused into one kernel call when they get
the same format, and run side by side otherwise.
"""
from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tightfit.engine.quant.formats import WeightFormat, parse_weight_format
from tightfit.errors import TightfitError

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_names(num_layers: int) -> list[str]:
    return [f"layers.{i}.{p}" for i in range(num_layers) for p in PROJECTIONS] + ["lm_head"]


def _matches(name: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, f"layers.*.{pattern}")


@dataclass(frozen=True)
class PrecisionPlan:
    default: WeightFormat
    rules: tuple[tuple[str, WeightFormat], ...] = ()
    source: str = ""

    @classmethod
    def uniform(cls, name: str) -> PrecisionPlan:
        return cls(parse_weight_format(name), (), name)

    @classmethod
    def parse(cls, spec: str | Path) -> PrecisionPlan:
        """A format name, or the path of a plan file."""
        text = str(spec)
        if text.endswith((".json", ".yaml", ".yml")) or Path(text).is_file():
            return cls.from_file(Path(text))
        return cls.uniform(text)

    @classmethod
    def from_file(cls, path: Path) -> PrecisionPlan:
        if not path.is_file():
            raise TightfitError(f"precision plan {str(path)!r} does not exist")
        try:
            if path.suffix == ".json":
                data = json.loads(path.read_text())
            else:
                import yaml

                data = yaml.safe_load(path.read_text())
        except Exception as exc:
            raise TightfitError(f"cannot read precision plan {str(path)!r}: {exc}") from exc
        if not isinstance(data, dict) or "default" not in data:
            raise TightfitError(
                f"precision plan {str(path)!r} must be a mapping with a 'default' format "
                "and optional 'rules' {pattern: format}")
        rules = data.get("rules") or {}
        if not isinstance(rules, dict):
            raise TightfitError(f"'rules' in {str(path)!r} must map patterns to formats")
        parsed = tuple((str(k), parse_weight_format(str(v))) for k, v in rules.items())
        return cls(parse_weight_format(str(data["default"])), parsed, str(path))

    def format_for(self, name: str) -> WeightFormat:
        fmt = self.default
        for pattern, f in self.rules:
            if _matches(name, pattern):
                fmt = f
        return fmt

    def validate(self, num_layers: int) -> None:
        """Every rule must name at least one projection of this model."""
        names = projection_names(num_layers)
        for pattern, _ in self.rules:
            if not any(_matches(n, pattern) for n in names):
                raise TightfitError(
                    f"precision plan rule {pattern!r} matches no projection of this "
                    f"{num_layers}-layer model; names look like 'layers.3.q_proj', 'gate_proj', "
                    "'lm_head'")

    @property
    def is_fp32(self) -> bool:
        return self.default.kind == "fp32" and all(f.kind == "fp32" for _, f in self.rules)

    @property
    def uses_awq(self) -> bool:
        return self.default.awq or any(f.awq for _, f in self.rules)


class SplitLinear(nn.Module):
    """Projections of one input in different formats: run each, concatenate the outputs."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


class PlanLinearFactory:
    """LinearFactory for DecoderModel: builds each (possibly fused) projection per the plan.

    Weights arrive as fp32 tensors or, when loading `native`, as NativeTensor (GGUF blocks):
    4-bit GGUF blocks become int4-g32 exactly; other stored types follow the native policy."""

    def __init__(self, plan: PrecisionPlan) -> None:
        self.plan = plan

    def __call__(self, names: list[str], weights: list[Any], biases: list[torch.Tensor] | None
                 ) -> nn.Module:
        fmts = [self._resolve(self.plan.format_for(n), w) for n, w in zip(names, weights)]
        if len(set(fmts)) > 1:
            return SplitLinear([self([n], [w], None if biases is None else [b])
                                for n, w, b in zip(names, weights, biases or [None] * len(names))])
        return self._build(fmts[0], weights, _cat(biases))

    @staticmethod
    def _resolve(fmt: WeightFormat, weight: Any) -> WeightFormat:
        if fmt.kind != "native":
            return fmt
        from tightfit.engine.quant.gguf_native import native_weight_format

        if isinstance(weight, torch.Tensor):
            return parse_weight_format("fp32")
        return native_weight_format(weight.tensor.qtype)

    def _build(self, fmt: WeightFormat, weights: list[Any], bias: torch.Tensor | None) -> nn.Module:
        from tightfit.engine.quant.gguf_native import gguf_int4_weights
        from tightfit.engine.quant.gptq import QuantizedWeight
        from tightfit.engine.quant.linear import Int4Linear, fp32_linear, quantize_linear
        from tightfit.engine.quant.reference import concat_rows, quantize_int4

        if any(isinstance(w, QuantizedWeight) for w in weights):
            # Rounded already (GPTQ): pack these codes as they are; a fused partner in the same
            # format that was not pre-rounded gets plain rounding.
            if fmt.kind != "int4" or any(w.q.group_size != fmt.group_size for w in weights
                                         if isinstance(w, QuantizedWeight)):
                raise TightfitError(f"pre-rounded int4 weights cannot be built as {fmt.name}")
            assert fmt.group_size is not None
            parts = [w.q if isinstance(w, QuantizedWeight) else
                     quantize_int4(w if isinstance(w, torch.Tensor) else w.dequantize(),
                                   fmt.group_size) for w in weights]
            return Int4Linear.from_weights(concat_rows(parts), bias)
        native = [w for w in weights if not isinstance(w, torch.Tensor)]
        if fmt.kind == "int4" and fmt.group_size == 32 and len(native) == len(weights) and all(
                w.qtype_name in ("Q4_0", "Q4_1", "Q4_K") for w in native):
            parts = [gguf_int4_weights(w.tensor.data, w.tensor.qtype, w.tensor.shape, w.perm,
                                       name=w.tensor.name) for w in native]
            for w in native:
                w.tensor.release()
            return Int4Linear.from_weights(concat_rows(parts), bias)
        if len(weights) == 1 and native and fmt.kind in ("int8", "int4") and len(
                native[0].tensor.shape) == 2:
            return _from_native_rows(native[0], fmt, bias)
        dense = [w if isinstance(w, torch.Tensor) else w.dequantize() for w in weights]
        w = dense[0] if len(dense) == 1 else torch.cat(dense)
        if fmt.kind == "fp32":
            return fp32_linear(w, bias)
        return quantize_linear(w, bias, fmt)


def _from_native_rows(w: Any, fmt: WeightFormat, bias: torch.Tensor | None) -> nn.Module:
    """Re-quantises stored blocks a row chunk at a time: the fp32 weight never exists whole
    (for a 262k-row output head that is 670 MB of load-time peak avoided)."""
    from tightfit.engine.quant.linear import Int4Linear, Int8Linear

    shape = tuple(w.tensor.shape)
    if fmt.kind == "int8":
        out: nn.Module = Int8Linear.from_rows(w.rows, shape, bias)
    else:
        assert fmt.group_size is not None
        out = Int4Linear.from_rows(w.rows, shape, fmt.group_size, bias)
    w.tensor.release()
    return out


def _cat(biases: list[torch.Tensor] | None) -> torch.Tensor | None:
    if biases is None:
        return None
    return biases[0] if len(biases) == 1 else torch.cat(biases)

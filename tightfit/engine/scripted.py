"""Decode steps through TorchScript: the layers, final norm and output head of a decode-only step
run as one scripted module, so the small ops of each layer are dispatched by TorchScript's C++
interpreter instead of Python.

Why: with 4-bit weights, single-stream decode of the default model spends more time outside the
matmuls than in them (docs/performance.md). Scripting costs about a second at engine start and
no memory beyond the interpreter (the scripted modules hold the model's own tensors), unlike
`torch.compile` (minutes of compile, ~270 MiB). It is the default (`LLM(scripted_decode=True)`;
`--no-script` turns it off).

Two stacks:
* the fused stack (`_FStack`, default where engine/kernels builds): per layer the four
  projections and five fused C++ ops (norm + cast, rotary + KV write, paged attention without a
  gather copy, residual + norm, gated activation) instead of ~40 ATen ops. Agrees with the eager
  modules to float rounding (tests/engine/test_scripted.py); `--no-fused` /
  `LLM(fused_kernels=False)` turns it off. Models with side-by-side projections (precision
  plans mixing formats in one fused matmul) use the plain stack.
* the plain stack (`_Stack`): the eager modules' ATen ops, op for op (same kernels, same order:
  logits bit-identical). Rotary is applied to q and k in one call when the model has no QK-norm
  (elementwise, so identical).
Only decode-only steps with fast attention and an fp32 KV cache take either path, and only for
models built from the layer types below (fp32, int8 and int4 linears, fused or side by side);
anything else runs eagerly.

(No `from __future__ import annotations` here: TorchScript reads the `Final` class annotations
at runtime.)
"""
import logging
import warnings
from typing import Any, Final, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from tightfit.engine.attention import AttentionMetadata, gather_blocks
from tightfit.engine.models.layers import apply_rotary, rms_norm
from tightfit.engine.quant.linear import int8x2_fused_linear, int8x2_linear

log = logging.getLogger(__name__)
_ATTR = "_tightfit_scripted_decode"
KIND_DENSE, KIND_INT8, KIND_INT4 = 0, 1, 2  # _Linear.kind


class Unsupported(Exception):
    """The model holds a module the scripted path does not reproduce; decode stays eager."""


def _packed_mm(x2: torch.Tensor, kind: int, weight: torch.Tensor, scales: torch.Tensor,
               group: int, out_features: int, out_padded: int) -> torch.Tensor:
    """The int8 (bf16 kernel) / int4 weight-only matmul on an input already in the kernel's
    dtype and padded width; the output trimmed to the real out_features (both stacks)."""
    if kind == 1:  # KIND_INT8
        return torch.ops.aten._weight_int8pack_mm(x2, weight, scales)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, weight, group, scales)
    if out_padded != out_features:
        y = y[:, :out_features]
    return y


class _Linear(nn.Module):
    """One DenseLinear / nn.Linear / Int8Linear / Int4Linear, reading the same tensors."""

    kind: Final[int]
    group: Final[int]
    out_features: Final[int]
    out_padded: Final[int]
    pad_k: Final[int]

    def __init__(self, src: nn.Module) -> None:
        super().__init__()
        from tightfit.engine.models.transformer import DenseLinear
        from tightfit.engine.quant.linear import Int4Linear, Int8Linear

        inv = None
        group = pad_k = 0
        if isinstance(src, (DenseLinear, nn.Linear)):
            kind, weight, scales = KIND_DENSE, src.weight.detach(), torch.empty(0)
            out_f = out_padded = int(src.weight.shape[0])
        elif isinstance(src, Int8Linear):  # bf16 / fp32 kernel (int8x2: _Int8x2)
            kind, weight, scales = KIND_INT8, src.weight_int8, src.scales
            out_f = out_padded = src.out_features
            inv, pad_k = src.input_scale_inv, src.pad_k
        elif isinstance(src, Int4Linear):
            kind, weight, scales = KIND_INT4, src.weight_packed, src.scales_and_zeros
            out_f, out_padded = src.out_features, src.out_padded
            group, pad_k, inv = src.group_size, src.in_padded - src.in_features, \
                src.input_scale_inv
        else:
            raise Unsupported(type(src).__name__)
        bias = src.bias.detach() if src.bias is not None else None
        self.kind, self.group, self.pad_k = kind, int(group), int(pad_k)
        self.out_features, self.out_padded = int(out_f), int(out_padded)
        self.weight = weight
        self.scales = scales
        self.bias = bias
        self.input_scale_inv = inv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == 0:  # KIND_DENSE
            return F.linear(x, self.weight, self.bias)
        inv = self.input_scale_inv
        if inv is not None:
            x = x * inv
        scales = self.scales
        x2 = x.to(scales.dtype)
        if self.pad_k > 0:
            x2 = F.pad(x2, [0, self.pad_k])
        else:
            x2 = x2.contiguous()
        y = _packed_mm(x2, self.kind, self.weight, scales, self.group, self.out_features,
                       self.out_padded).to(x.dtype)
        bias = self.bias
        if bias is not None:
            y = y + bias
        return y


class _Int8x2(nn.Module):
    """Int8Linear under compute="int8x2": fbgemm's packed weight, `int8x2_linear`."""

    levels: Final[float]
    out_features: Final[int]
    packed: List[torch.classes.quantized.LinearPackedParamsBase]

    def __init__(self, src: nn.Module) -> None:
        super().__init__()
        self.packed = list(src.packed)
        self.levels = float(src.levels)
        self.out_features = int(src.out_features)
        self.bias = src.bias.detach() if src.bias is not None else None
        self.input_scale_inv = src.input_scale_inv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv = self.input_scale_inv
        if inv is not None:
            x = x * inv
        y = int8x2_linear(x.contiguous(), self.packed, self.levels)
        bias = self.bias
        if bias is not None:
            y = y + bias
        return y


class _Split(nn.Module):
    """SplitLinear: projections of one input in different formats, outputs concatenated."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs: List[torch.Tensor] = []
        for p in self.parts:
            outs.append(p(x))
        return torch.cat(outs, dim=-1)


def _linear(src: nn.Module) -> nn.Module:
    from tightfit.engine.quant.linear import Int8Linear
    from tightfit.engine.quant.plan import SplitLinear

    if isinstance(src, SplitLinear):
        return _Split([_linear(p) for p in src.parts])
    if isinstance(src, Int8Linear) and src.packed is not None:
        return _Int8x2(src)
    return _Linear(src)


class _Layer(nn.Module):
    n_heads: Final[int]
    n_kv: Final[int]
    head_dim: Final[int]
    half: Final[int]
    inter: Final[int]
    gelu: Final[bool]
    local_rope: Final[bool]
    sliding: Final[bool]
    scale: Final[float]
    eps: Final[float]

    def __init__(self, layer: nn.Module, local_rope: bool) -> None:
        super().__init__()
        a = layer.attn
        if a.rotary.half * 2 != a.head_dim:
            raise Unsupported("rotary dimension")
        self.qkv, self.o = _linear(a.qkv), _linear(a.o)
        self.gate_up, self.down = _linear(layer.mlp.gate_up), _linear(layer.mlp.down)
        norms = {"attn_norm": layer.attn_norm, "ffn_norm": layer.ffn_norm,
                 "post_attn_norm": getattr(layer, "post_attn_norm", None),
                 "post_ffn_norm": getattr(layer, "post_ffn_norm", None),
                 "q_norm": a.q_norm, "k_norm": a.k_norm}
        eps = {n.eps for n in norms.values() if n is not None}
        if len(eps) != 1:
            raise Unsupported("norms with different eps")
        self.eps = float(eps.pop())
        for name, norm in norms.items():
            setattr(self, name, None if norm is None else norm.weight.detach())
        self.n_heads, self.n_kv, self.head_dim = a.n_heads, a.n_kv, a.head_dim
        self.half = a.rotary.half
        self.inter = layer.mlp.intermediate
        self.gelu = layer.mlp.act != "silu"
        self.local_rope = local_rope
        self.sliding = a.window is not None
        self.scale = float(a.scale)

    def forward(self, x: torch.Tensor, cos_g: torch.Tensor, sin_g: torch.Tensor,
                cos_l: torch.Tensor, sin_l: torch.Tensor, slot_mapping: torch.Tensor,
                starts: List[int], batches: List[int], kv_blocks: List[torch.Tensor],
                kv_len: List[int],
                masks: List[Optional[torch.Tensor]], sliding_masks: List[Optional[torch.Tensor]],
                k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        cos, sin = (cos_l, sin_l) if self.local_rope else (cos_g, sin_g)
        qkv = self.qkv(rms_norm(x, self.attn_norm, self.eps))
        nq, nk = H * D, Hkv * D
        q_norm, k_norm = self.q_norm, self.k_norm
        if q_norm is not None and k_norm is not None:
            q = apply_rotary(rms_norm(qkv[:, :nq].view(t, H, D), q_norm, self.eps), cos, sin,
                             self.half)
            k = apply_rotary(rms_norm(qkv[:, nq:nq + nk].view(t, Hkv, D), k_norm, self.eps),
                             cos, sin, self.half)
        else:  # q and k are adjacent in qkv: rotate both in one call
            qk = apply_rotary(qkv[:, :nq + nk].view(t, H + Hkv, D), cos, sin, self.half)
            q, k = qk[:, :H], qk[:, H:]
        v = qkv[:, nq + nk:].reshape(t, Hkv, D)
        flat_k = k_cache.view(-1, Hkv, D)
        flat_v = v_cache.view(-1, Hkv, D)
        flat_k.index_copy_(0, slot_mapping, k)
        flat_v.index_copy_(0, slot_mapping, v)
        if len(starts) == 1:
            o = self._attend(q, k_cache, v_cache, kv_blocks[0], kv_len[0], masks[0],
                             sliding_masks[0], batches[0]).reshape(t, H * D)
        else:
            out = torch.empty(t, H, D, dtype=q.dtype)
            for i in range(len(starts)):
                s, b = starts[i], batches[i]
                out[s:s + b] = self._attend(q[s:s + b], k_cache, v_cache, kv_blocks[i],
                                            kv_len[i], masks[i], sliding_masks[i], b)
            o = out.reshape(t, H * D)
        h = self.o(o)
        post_attn = self.post_attn_norm
        if post_attn is not None:
            h = rms_norm(h, post_attn, self.eps)
        x = x + h
        gu = self.gate_up(rms_norm(x, self.ffn_norm, self.eps))
        gate, up = gu[:, :self.inter], gu[:, self.inter:]
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        h = self.down(act * up)
        post_ffn = self.post_ffn_norm
        if post_ffn is not None:
            h = rms_norm(h, post_ffn, self.eps)
        return x + h

    def _attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                blocks: torch.Tensor, length: int, mask: Optional[torch.Tensor],
                sliding_mask: Optional[torch.Tensor], batch: int) -> torch.Tensor:
        """q [B, H, D] (one query each) -> [B, H, D], as attention.fast_attention's decode case."""
        qg = q.view(batch, 1, self.n_heads, self.head_dim).transpose(1, 2)
        kg = gather_blocks(k_cache, blocks, length).transpose(1, 2)
        vg = gather_blocks(v_cache, blocks, length).transpose(1, 2)
        if self.sliding and sliding_mask is not None:
            mask = sliding_mask
        o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, scale=self.scale,
                                           enable_gqa=True)
        return o.transpose(1, 2).reshape(batch, self.n_heads, self.head_dim)


class _Stack(nn.Module):
    eps: Final[float]
    softcap: Final[float]

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        local = model.rotaries[1] if len(model.rotaries) > 1 else None
        self.layers = nn.ModuleList(_Layer(layer, layer.attn.rotary is local)
                                    for layer in model.layers)
        self.norm = model.norm.weight.detach()
        self.eps = float(model.norm.eps)
        self.head = _linear(model.lm_head)
        self.softcap = float(model.cfg.final_logit_softcap or 0.0)

    def forward(self, x: torch.Tensor, cos_g: torch.Tensor, sin_g: torch.Tensor,
                cos_l: torch.Tensor, sin_l: torch.Tensor, slot_mapping: torch.Tensor,
                starts: List[int], batches: List[int], kv_blocks: List[torch.Tensor],
                kv_len: List[int],
                masks: List[Optional[torch.Tensor]], sliding_masks: List[Optional[torch.Tensor]],
                k_caches: List[torch.Tensor], v_caches: List[torch.Tensor],
                rows: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, cos_g, sin_g, cos_l, sin_l, slot_mapping, starts, batches, kv_blocks,
                      kv_len, masks, sliding_masks, k_caches[i], v_caches[i])
        x = x[rows]
        logits = self.head(rms_norm(x, self.norm, self.eps))
        if self.softcap > 0.0:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


KIND_INT8X2 = 3  # _FLinear.kind


class _FLinear(nn.Module):
    """A projection for the fused stack: takes its input in the dtype its kernel wants (bf16 for
    the int4 and bf16-int8 kernels, fp32 otherwise; the op before it writes that dtype) and
    returns the kernel's output uncast (the op after it reads either). With activation-aware
    input scales (AWQ) it takes fp32 and scales before rounding, as Int4Linear does."""

    kind: Final[int]
    group: Final[int]
    out_features: Final[int]
    out_padded: Final[int]
    pad_k: Final[int]
    in_bf16: Final[bool]
    levels: Final[float]
    packed: List[torch.classes.quantized.LinearPackedParamsBase]

    def __init__(self, src: nn.Module) -> None:
        super().__init__()
        from tightfit.engine.quant.linear import Int8Linear
        from tightfit.engine.quant.plan import SplitLinear

        if isinstance(src, SplitLinear):
            raise Unsupported("side-by-side projections")
        self.packed = []
        self.levels = 0.0
        if isinstance(src, Int8Linear) and src.packed is not None:
            self.kind, self.group, self.pad_k = KIND_INT8X2, 0, 0
            self.out_features = self.out_padded = int(src.out_features)
            self.packed, self.levels = list(src.packed), float(src.levels)
            self.weight, self.scales = torch.empty(0), torch.empty(0)
            self.bias = src.bias.detach() if src.bias is not None else None
        else:
            plain = _Linear(src)  # reads the same tensors, validates the type
            self.kind, self.group, self.pad_k = plain.kind, plain.group, plain.pad_k
            self.out_features, self.out_padded = plain.out_features, plain.out_padded
            self.weight, self.scales, self.bias = plain.weight, plain.scales, plain.bias
        inv = getattr(src, "input_scale_inv", None)
        self.input_scale_inv = inv.detach() if inv is not None else None
        self.in_bf16 = (self.kind in (KIND_INT8, KIND_INT4) and self.scales.dtype == torch.bfloat16
                        and inv is None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv = self.input_scale_inv
        if inv is not None:  # fp32 in (in_bf16 is False), scaled before any rounding
            x = x * inv
        if self.kind == 0:  # KIND_DENSE
            return F.linear(x, self.weight, self.bias)
        if self.kind == 3:  # KIND_INT8X2
            y = int8x2_fused_linear(x, self.packed, self.levels)
        else:
            x2 = x.to(self.scales.dtype)
            if self.pad_k > 0:
                x2 = F.pad(x2, [0, self.pad_k])
            y = _packed_mm(x2, self.kind, self.weight, self.scales, self.group,
                           self.out_features, self.out_padded)
        bias = self.bias
        if bias is not None:
            y = y.float() + bias
        return y


class _FLayer(nn.Module):
    """One decoder layer on the fused kernels (kernels/decode.cpp): 4 projections and 5 fused
    ops. Takes the residual stream x and x already normed for its q/k/v projection; returns the
    new stream and it normed for whatever comes next (the next layer, or the output head)."""

    n_heads: Final[int]
    n_kv: Final[int]
    inter: Final[int]
    gelu: Final[bool]
    local_rope: Final[bool]
    window: Final[int]
    scale: Final[float]
    eps: Final[float]
    next_bf16: Final[bool]

    def __init__(self, layer: nn.Module, local_rope: bool) -> None:
        super().__init__()
        plain = _Layer(layer, local_rope)  # the same checks and tensors as the plain stack
        a = layer.attn
        self.qkv, self.o = _FLinear(a.qkv), _FLinear(a.o)
        self.gate_up, self.down = _FLinear(layer.mlp.gate_up), _FLinear(layer.mlp.down)
        self.attn_norm, self.ffn_norm = plain.attn_norm, plain.ffn_norm
        self.post_attn_norm, self.post_ffn_norm = plain.post_attn_norm, plain.post_ffn_norm
        self.q_norm, self.k_norm = plain.q_norm, plain.k_norm
        # what comes next: set by _FStack (the next layer's attn norm, or the final norm)
        self.next_norm, self.next_bf16 = self.attn_norm, False
        self.n_heads, self.n_kv, self.inter = plain.n_heads, plain.n_kv, plain.inter
        self.gelu, self.local_rope, self.scale, self.eps = (plain.gelu, plain.local_rope,
                                                            plain.scale, plain.eps)
        self.window = int(a.window) if a.window is not None else 0

    def forward(self, x: torch.Tensor, normed: torch.Tensor, cos_g: torch.Tensor,
                sin_g: torch.Tensor, cos_l: torch.Tensor, sin_l: torch.Tensor,
                slot_mapping: torch.Tensor, positions: torch.Tensor, starts: List[int],
                kv_blocks: List[torch.Tensor], k_cache: torch.Tensor, v_cache: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        cos, sin = (cos_l, sin_l) if self.local_rope else (cos_g, sin_g)
        qkv = self.qkv(normed)
        q = torch.ops.tightfit.rope_write_kv(qkv, cos, sin, slot_mapping, k_cache, v_cache,
                                             self.n_heads, self.n_kv, self.q_norm, self.k_norm,
                                             self.eps)
        a = torch.ops.tightfit.decode_attention(q, k_cache, v_cache, positions, starts,
                                                kv_blocks, self.window, self.scale,
                                                self.o.in_bf16)
        x, h = torch.ops.tightfit.residual_norm(x, self.o(a), self.post_attn_norm,
                                                self.ffn_norm, self.eps, self.gate_up.in_bf16)
        a = torch.ops.tightfit.gated_act(self.gate_up(h), self.inter, self.gelu,
                                         self.down.in_bf16)
        return torch.ops.tightfit.residual_norm(x, self.down(a), self.post_ffn_norm,
                                                self.next_norm, self.eps, self.next_bf16)


class _FStack(nn.Module):
    eps: Final[float]
    softcap: Final[float]
    first_bf16: Final[bool]

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if model.norm.weight.device.type != "cpu":
            raise Unsupported("the fused kernels are CPU only")
        if float(model.norm.eps) != float(model.layers[0].attn_norm.eps):
            raise Unsupported("final norm eps differs from the layers'")
        local = model.rotaries[1] if len(model.rotaries) > 1 else None
        self.head = _FLinear(model.lm_head)
        layers = [_FLayer(layer, layer.attn.rotary is local) for layer in model.layers]
        for layer, nxt in zip(layers, layers[1:]):
            layer.next_norm, layer.next_bf16 = nxt.attn_norm, nxt.qkv.in_bf16
        layers[-1].next_norm = model.norm.weight.detach()
        layers[-1].next_bf16 = self.head.in_bf16
        self.layers = nn.ModuleList(layers)
        self.first_norm = layers[0].attn_norm
        self.first_bf16 = layers[0].qkv.in_bf16
        self.eps = float(model.norm.eps)
        self.softcap = float(model.cfg.final_logit_softcap or 0.0)

    def forward(self, x: torch.Tensor, cos_g: torch.Tensor, sin_g: torch.Tensor,
                cos_l: torch.Tensor, sin_l: torch.Tensor, slot_mapping: torch.Tensor,
                positions: torch.Tensor, starts: List[int], kv_blocks: List[torch.Tensor],
                k_caches: List[torch.Tensor], v_caches: List[torch.Tensor],
                rows: torch.Tensor) -> torch.Tensor:
        normed = torch.ops.tightfit.rms_norm_to(x, self.first_norm, self.eps, self.first_bf16)
        for i, layer in enumerate(self.layers):
            x, normed = layer(x, normed, cos_g, sin_g, cos_l, sin_l, slot_mapping, positions,
                              starts, kv_blocks, k_caches[i], v_caches[i])
        logits = self.head(normed[rows]).float()
        if self.softcap > 0.0:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


class ScriptedDecode:
    """The scripted decode stack of one model (shared by every engine on its weights): on the
    fused kernels (kernels/decode.cpp) where they load and the model's layers allow, else the
    plain stack (ATen ops only)."""

    def __init__(self, model: nn.Module, fused: bool) -> None:
        self.model = model
        self.rotaries = list(model.rotaries)
        self.fused = fused
        self.fn = torch.jit.script(_FStack(model) if fused else _Stack(model))

    @classmethod
    def for_model(cls, model: nn.Module, fused: bool = True) -> "ScriptedDecode | None":
        """The model's scripted stack, built once per variant; None when the model holds a module
        the scripted path does not reproduce (decode then stays eager). fused=True takes the
        fused kernels where they load and the model allows, else the plain stack."""
        from tightfit.engine import kernels

        built = model.__dict__.setdefault(_ATTR, {})  # not a submodule: no state_dict entry
        want = [True, False] if fused and kernels.load() else [False]
        for variant in want:
            found = built.get(variant)
            if found is None:
                try:
                    with warnings.catch_warnings():
                        # torch.jit.script is deprecated in favour of torch.compile /
                        # torch.export, which cost minutes of compile here (engine/compiled.py);
                        # it still works, and if a future torch drops it, decode stays eager.
                        warnings.simplefilter("ignore", DeprecationWarning)
                        found = cls(model, variant)
                except Unsupported as exc:
                    if variant:
                        log.info("fused decode kernels not used for this model (%s)", exc)
                    found = False
                except Exception as exc:  # TorchScript missing or unable to script
                    log.warning("scripted decode%s unavailable (%s: %s)",
                                " (fused)" if variant else "", type(exc).__name__, exc)
                    found = False
                built[variant] = found
            if found:
                return found
        return None

    @staticmethod
    def eligible(meta: AttentionMetadata, kv_caches: list[tuple[Any, Any]]) -> bool:
        """A decode-only step reading the paged cache (any number of length buckets), with an
        fp32 KV cache and no study hook."""
        return (meta.attend is None and isinstance(kv_caches[0][0], torch.Tensor)
                and all(g.q_len == 1 and g.kv_blocks is not None for g in meta.groups))

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor
                 ) -> torch.Tensor:
        tables = [r.tables(positions, None) for r in self.rotaries]
        (cos_g, sin_g), (cos_l, sin_l) = tables[0], tables[-1]
        groups = meta.groups
        # The plain interpreter: the profiling executor's specialised plans bought nothing here
        # and held ~26 MiB more RSS (varying context lengths keep re-specialising them).
        with torch.jit.optimized_execution(False):
            x = self.model.embed_tokens(input_ids)
            if self.fused:
                return self.fn(x, cos_g, sin_g, cos_l, sin_l, meta.slot_mapping, positions,
                               [g.token_start for g in groups], [g.kv_blocks for g in groups],
                               [k for k, _ in kv_caches], [v for _, v in kv_caches], rows)
            return self.fn(x, cos_g, sin_g, cos_l, sin_l,
                           meta.slot_mapping, [g.token_start for g in groups],
                           [g.batch for g in groups], [g.kv_blocks for g in groups],
                           [g.kv_len for g in groups],
                           [g.mask for g in groups], [g.sliding_mask for g in groups],
                           [k for k, _ in kv_caches], [v for _, v in kv_caches], rows)

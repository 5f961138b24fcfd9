"""Builds a DecoderModel whose `int4-awq-*` projections were scaled by an activation-aware search
(AWQ) on calibration text, layer by layer; every other projection follows the precision plan.

Per layer: run the fp32 layer on the calibration hidden states and capture the inputs of each
linear group (q/k/v: attention-norm output; o: attention output; gate/up: FFN-norm output; down:
act(gate) * up); search scales s for the groups holding AWQ projections; fold 1/s upstream
(q/k/v -> attention norm, gate/up -> FFN norm, down -> rows of up, o -> rows of v when every query
head has its own KV head) or, where no exact fold exists (o under GQA, an upstream op kept
`native`), divide the input by s at run time (Int4Linear's input_scale); search each weight
group's quantisation range (all but q/k; asymmetric `gram_search_range` by default); quantise
per the plan (int4: GPTQ error feedback on that grid, its damping chosen per projection on
held-out calibration sequences, aimed at the fp32 layer's output); then push the calibration
states through the QUANTISED layer, so later layers are calibrated on the activations they will
really see. The output head gets the same scaling
(folded into the final norm; searched on a seeded subset of vocabulary rows) but no range
search: on a 49k-262k-row head it would cost minutes.

Calibration (default 64 sequences x 512 tokens, seeded): non-overlapping windows of the
`pydoc_data.topics` corpus drawn from AFTER the perplexity protocol's evaluation windows
(scoring.py), so calibration never sees the text perplexity is measured on. Memory: one layer's
fp32 weights plus the captured inputs (~0.5 GB at the default size) at a time. ~12 minutes on
the default model with one busy core; the results (scales, ranges) are cached under
~/.cache/tightfit/awq/ (or $TIGHTFIT_CACHE_DIR/awq/), keyed by a hash of the weights, the plan
and the calibration settings, and a cached build only folds, clips and quantises (seconds).
Limits: a group mixing AWQ group sizes searches with its first member's group size.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from tightfit.config import ModelConfig
from tightfit.engine.attention import AttentionGroup, AttentionMetadata
from tightfit.engine.models.layers import RMSNorm, Rotary
from tightfit.engine.models.transformer import DecoderLayer, DecoderModel, dense_factory
from tightfit.engine.quant.awq import apply_clip, search_clip
from tightfit.engine.quant.awq_cache import cache_key, cache_path, read_cache, write_cache
from tightfit.engine.quant.awq_search import apply_range, gram_search_range, gram_search_scales
from tightfit.engine.quant.formats import WeightFormat
from tightfit.engine.quant.gptq import (
    GramSplit, QuantizedWeight, apply_map, asymmetric_map, gptq_int4_select, pack_codes,
    with_codes)
from tightfit.engine.quant.linear import Int4Linear, Int8Linear
from tightfit.engine.quant.plan import PlanLinearFactory, PrecisionPlan, SplitLinear
from tightfit.engine.quant.reference import concat_rows, quantize_int4, quantize_int8
from tightfit.errors import TightfitError

log = logging.getLogger("tightfit.awq")

# Sequences per forward chunk during calibration: bounds the attention scores and MLP temporaries.
_CHUNK_SEQUENCES = 8
# Output-head search: a seeded subset of vocabulary rows and tokens keeps it to seconds.
_HEAD_SEARCH_ROWS = 4096
_HEAD_SEARCH_TOKENS = 1024
# Tokens for the symmetric per-group clip search (the paper's setting is of this order).
_CLIP_TOKENS = 512
_ATTN_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
_NO_CLIP = ("q_proj", "k_proj")  # their error is amplified by the softmax (AWQ paper)
_CLIP_METHODS = ("range", "symmetric", "none")
_GPTQ_INPUTS = ("fp32", "quantized", "asymmetric")
# The asymmetric target estimates an [in, in] cross-covariance: with fewer calibration tokens
# than this many per input it overfits them (4 x 256 tokens made the default model's perplexity
# 45.6 against 25.4 for plain rounding), so such groups round for the fp32 inputs instead.
_ASYMMETRIC_TOKENS_PER_INPUT = 4


@dataclass(frozen=True)
class CalibrationSettings:
    """sequences x tokens calibration windows, drawn with `seed`; `search_tokens` per scale-search
    loss; `n_grid` + 1 exponents alpha tried. `clip`: per-group range search after scaling:
    "range" (asymmetric, `gram_search_range`), "symmetric" (awq.search_clip, the paper's) or
    "none". `gptq`: round the int4 codes with GPTQ error feedback (gptq.py) on the grid the
    scaling and range search chose, instead of to nearest; `gptq_damp`: its damping candidates,
    chosen per projection by the output error on every `gptq_holdout`-th calibration sequence
    (rounded on the others; one candidate or `gptq_holdout` 0: no choice); `gptq_inputs`: the
    inputs each linear group after the first is rounded for: "fp32" (the fp32 layer's), "quantized"
    (those of the layer whose earlier groups are already rounded, GPTQ's "true sequential") or
    "asymmetric" (those, with the target the fp32 layer's output: gptq.asymmetric_map;
    a group with fewer than 4 calibration tokens per input falls back to "fp32")."""

    sequences: int = 64
    tokens: int = 512
    seed: int = 0
    search_tokens: int = 4096
    n_grid: int = 20
    clip: str = "range"
    gptq: bool = True
    gptq_damp: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3)
    gptq_holdout: int = 8
    gptq_inputs: str = "asymmetric"

    def __post_init__(self) -> None:
        if self.sequences < 1 or self.tokens < 2 or self.search_tokens < 1 or self.n_grid < 1:
            raise TightfitError(f"invalid AWQ calibration settings {self}")
        if not self.gptq_damp or any(not 0 < d < 10 for d in self.gptq_damp):
            raise TightfitError(f"GPTQ damping candidates must be in (0, 10), got "
                                f"{self.gptq_damp}")
        if self.gptq_inputs not in _GPTQ_INPUTS:
            raise TightfitError(f"unknown GPTQ inputs {self.gptq_inputs!r}; valid: "
                                f"{', '.join(_GPTQ_INPUTS)}")
        if self.gptq_holdout < 0:
            raise TightfitError(f"gptq_holdout must be >= 0, got {self.gptq_holdout}")
        if self.clip not in _CLIP_METHODS:
            raise TightfitError(f"unknown AWQ clip method {self.clip!r}; valid: "
                                f"{', '.join(_CLIP_METHODS)}")


DEFAULT_CALIBRATION = CalibrationSettings()


@dataclass(frozen=True)
class _Group:
    """Projections sharing one input, where the input is captured, and what feeds it."""

    key: str  # "qkv" | "o" | "gate_up" | "down"
    members: tuple[str, ...]
    hook: str  # DecoderLayer submodule whose input is captured
    upstream: str  # HF name of the norm weight, or the projection whose rows feed the input


def _groups(cfg: ModelConfig) -> tuple[_Group, ...]:
    ffn_norm = "pre_feedforward_layernorm" if cfg.sandwich_norm else "post_attention_layernorm"
    return (_Group("qkv", ("q_proj", "k_proj", "v_proj"), "attn.qkv", "input_layernorm"),
            _Group("o", ("o_proj",), "attn.o", "v_proj"),
            _Group("gate_up", ("gate_proj", "up_proj"), "mlp.gate_up", ffn_norm),
            _Group("down", ("down_proj",), "mlp.down", "up_proj"))


def _wname(layer: int, proj: str, kind: str = "weight") -> str:
    return f"layers.{layer}.{'self_attn' if proj in _ATTN_PROJ else 'mlp'}.{proj}.{kind}"


def _dense(w: Any) -> torch.Tensor:
    return w if isinstance(w, torch.Tensor) else w.dequantize()


@dataclass
class _LayerWeights:
    """One layer's tensors as popped (fp32 or NativeTensor); folded/clipped ones become fp32.
    `runtime`: projection name -> scales divided out of the input at run time."""

    index: int
    tensors: dict[str, Any]
    runtime: dict[str, torch.Tensor] = field(default_factory=dict)
    # Scaled weights before the range search clipped them: GPTQ's target (the grid is clipped).
    unclipped: dict[str, torch.Tensor] = field(default_factory=dict)

    def current(self, name: str) -> torch.Tensor:
        return _dense(self.tensors[name])

    def proj_name(self, proj: str) -> str:
        return f"layers.{self.index}.{proj}"


# -- public entry point ----------------------------------------------------------------------

def build_awq_model(cfg: ModelConfig, weights: dict[str, Any], plan: PrecisionPlan,
                    tokenizer: Any, settings: CalibrationSettings | None = None) -> DecoderModel:
    """The model for `plan` with AWQ applied to its int4-awq projections (see the module doc).

    `weights` is consumed (popped) like DecoderModel does. Uses the cached search for these
    weights/plan/settings when present, else calibrates (minutes on the default model) and
    writes the cache.
    """
    settings = settings or DEFAULT_CALIBRATION
    key = cache_key(weights, plan, settings)
    path = cache_path(key, plan)
    cached = read_cache(path, key)
    t0 = time.perf_counter()
    if cached is None:
        log.info("AWQ calibration: %d x %d tokens, cache %s", settings.sequences,
                 settings.tokens, path)
        model, found = _Builder(cfg, weights, plan, settings, tokenizer).build()
        elapsed = time.perf_counter() - t0
        write_cache(path, {"key": key, "search": found, "seconds": elapsed})
        log.info("AWQ calibration took %.1f s", elapsed)
    else:
        model, _ = _Builder(cfg, weights, plan, settings, None, cached["search"]).build()
        log.info("AWQ from cache %s in %.1f s", path, time.perf_counter() - t0)
    return model


# -- the layer-by-layer builder ---------------------------------------------------------------

class _Builder:
    """Calibrates (tokenizer given) or replays a cached search (`search` given)."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, Any], plan: PrecisionPlan,
                 settings: CalibrationSettings, tokenizer: Any,
                 search: dict[str, Any] | None = None) -> None:
        self.cfg, self.weights, self.plan, self.settings = cfg, weights, plan, settings
        self.tokenizer = tokenizer
        self.search: dict[str, Any] = search if search is not None else {"layers": []}
        self.calibrating = search is None
        self.prebuilt: dict[tuple[str, ...], nn.Module] = {}
        self.final: dict[str, Any] = {}

    def build(self) -> tuple[DecoderModel, dict[str, Any]]:
        embed = self.weights.pop("embed_tokens.weight")
        self.final["embed_tokens.weight"] = embed
        hidden = self._embed_calibration(embed) if self.calibrating else None
        ropes = _ropes(self.cfg, self.settings.tokens)
        for i in range(self.cfg.num_layers):
            hidden = self._layer(i, hidden, ropes[self.cfg.is_sliding(i)])
        self._head(embed, hidden)
        model = DecoderModel(self.cfg, self.final, _Prebuilt(self.prebuilt))
        return model, self.search

    # -- calibration input

    def _embed_calibration(self, embed: Any) -> list[torch.Tensor]:
        ids = calibration_ids(self.tokenizer, self.settings)
        if isinstance(embed, torch.Tensor):
            table: nn.Module = nn.Embedding.from_pretrained(embed)
        else:
            from tightfit.engine.quant.embedding import QuantizedEmbedding

            table = QuantizedEmbedding(embed)
        chunks = []
        with torch.inference_mode():
            for c in ids.split(_CHUNK_SEQUENCES):
                x = table(c.reshape(-1))
                if self.cfg.embed_scale != 1.0:  # as DecoderModel.forward scales it
                    x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
                chunks.append(x)
        return chunks

    # -- one layer

    def _layer(self, i: int, hidden: list[torch.Tensor] | None, rope: Rotary
               ) -> list[torch.Tensor] | None:
        prefix = f"layers.{i}."
        lw = _LayerWeights(i, {k: self.weights.pop(k) for k in [k for k in self.weights
                                                               if k.startswith(prefix)]})
        t0 = time.perf_counter()
        if not self.calibrating:
            self._replay_layer(lw, self.search["layers"][i])
        elif hidden is not None and self._has_awq(i):
            self.search["layers"].append(
                self._search_layer(lw, self._capture(lw, hidden, rope), hidden, rope))
        else:
            self.search["layers"].append({"scales": {}, "clip": {}})
        layer = DecoderLayer(self.cfg, i, dict(lw.tensors), self._recording_factory(lw), rope)
        if hidden is not None:
            # Later layers (or the head) still calibrate: feed them this quantised layer's output.
            needed = self._head_awq() or any(self._has_awq(j)
                                             for j in range(i + 1, self.cfg.num_layers))
            hidden = _run_layer(layer, hidden, self.cfg, self.settings.tokens) if needed else None
        self._keep_non_linear(lw)
        log.log(logging.INFO if self.calibrating else logging.DEBUG, "AWQ layer %d done in %.1f s",
                i, time.perf_counter() - t0)
        return hidden

    def _capture(self, lw: _LayerWeights, hidden: list[torch.Tensor], rope: Rotary
                 ) -> dict[str, torch.Tensor]:
        """Inputs of every linear group of the fp32 layer, [tokens, in] each."""
        fp32 = {k: _dense(v) for k, v in lw.tensors.items()}
        layer = DecoderLayer(self.cfg, lw.index, fp32, dense_factory, rope)
        seen: dict[str, list[torch.Tensor]] = {g.hook: [] for g in _groups(self.cfg)}
        handles = [layer.get_submodule(h).register_forward_pre_hook(
            lambda _m, args, h=h: seen[h].append(args[0].detach())) for h in seen]
        try:
            _run_layer(layer, hidden, self.cfg, self.settings.tokens)
        finally:
            for handle in handles:
                handle.remove()
        return {h: torch.cat(xs) for h, xs in seen.items()}

    def _has_awq(self, layer: int) -> bool:
        return any(self.plan.format_for(f"layers.{layer}.{p}").awq
                   for g in _groups(self.cfg) for p in g.members)

    def _head_awq(self) -> bool:
        return self.plan.format_for("lm_head").awq

    def _awq_members(self, lw: _LayerWeights, group: _Group) -> list[str]:
        return [m for m in group.members if self.plan.format_for(lw.proj_name(m)).awq]

    def _search_layer(self, lw: _LayerWeights, inputs: dict[str, torch.Tensor],
                      hidden: list[torch.Tensor], rope: Rotary) -> dict[str, Any]:
        found: dict[str, Any] = {"scales": {}, "clip": {}}
        for group in _groups(self.cfg):
            members = self._awq_members(lw, group)
            if not members:
                continue
            x = inputs[group.hook]
            gsize = self._group_size(lw, members[0])
            res = gram_search_scales([lw.current(_wname(lw.index, m)) for m in members], x,
                                     gsize, n_grid=self.settings.n_grid,
                                     max_tokens=self.settings.search_tokens,
                                     seed=self.settings.seed + lw.index)
            found["scales"][group.key] = res.scales
            log.debug("layer %d %s: alpha %.2f, loss %.3g (round-to-nearest %.3g)", lw.index,
                      group.key, res.alpha, res.loss, res.rtn_loss)
            self._apply_scales(lw, group, res.scales)
            for m in members:
                if self.settings.clip == "none" or m in _NO_CLIP:
                    continue
                name = _wname(lw.index, m)
                found["clip"][m] = self._search_clip(lw.current(name), x / res.scales,
                                                     self._group_size(lw, m), lw.index)
                lw.unclipped[name] = lw.current(name)
                self._apply_clip(lw, m, found["clip"][m])
        if self.settings.gptq:
            found["gptq"], found["gptq_damp"] = self._gptq_layer(lw, inputs, found["scales"],
                                                                 hidden, rope)
        return found

    def _gptq_layer(self, lw: _LayerWeights, inputs: dict[str, torch.Tensor],
                    scales: dict[str, torch.Tensor], hidden: list[torch.Tensor], rope: Rotary
                    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Rounds every AWQ projection of the layer with GPTQ, once all scales are folded (a
        later group's fold rescales an earlier group's rows), on the grid of its final weight.
        Groups go in forward order; unless `gptq_inputs` is "fp32" each group after the first
        takes its inputs from the layer as quantised so far."""
        packed: dict[str, torch.Tensor] = {}
        damps: dict[str, float] = {}
        for n, group in enumerate(_groups(self.cfg)):
            members = self._awq_members(lw, group)
            if not members:
                continue
            x_ref = inputs[group.hook] / scales[group.key]
            x = x_ref
            mode = self.settings.gptq_inputs
            if mode == "asymmetric" and (x_ref.shape[0] <
                                         _ASYMMETRIC_TOKENS_PER_INPUT * x_ref.shape[1]):
                log.info("layer %d %s: %d calibration tokens for %d inputs, too few for "
                         "asymmetric GPTQ targets; rounding for the fp32 inputs", lw.index,
                         group.key, x_ref.shape[0], x_ref.shape[1])
                mode = "fp32"
            captured = bool(n) and mode != "fp32"
            if captured:
                x = self._capture_quantized(lw, group.hook, hidden, rope)
                if lw.proj_name(members[0]) in lw.runtime:  # else the fold already scaled it
                    x = x / scales[group.key]
            grams = GramSplit.of(x, None, self.settings.tokens, self.settings.gptq_holdout)
            # One map for the whole group (its members share the input).
            to_fp32_output = (asymmetric_map(x_ref, x, grams.all)
                              if captured and mode == "asymmetric" else None)
            for m in members:
                name = _wname(lw.index, m)
                grid = lw.current(name)
                target = lw.unclipped.pop(name, grid)
                if to_fp32_output is not None:
                    target = apply_map(target, to_fp32_output)
                q, damps[m] = gptq_int4_select(target, grams,
                                               self._group_size(lw, m), grid_weight=grid,
                                               damps=self.settings.gptq_damp)
                packed[m] = pack_codes(q)
                lw.tensors[name] = QuantizedWeight(q)
        log.debug("layer %d GPTQ damping: %s", lw.index, damps)
        return packed, damps

    def _capture_quantized(self, lw: _LayerWeights, hook: str, hidden: list[torch.Tensor],
                           rope: Rotary) -> torch.Tensor:
        """The input of `hook` in the layer built from its current tensors (projections GPTQ
        has rounded keep their codes; the rest are rounded to nearest, which does not matter:
        only what runs before `hook` shapes its input). Each chunk stops at the hook."""
        layer = DecoderLayer(self.cfg, lw.index, dict(lw.tensors),
                             _AWQFactory(self.plan, lw.runtime), rope)
        seen: list[torch.Tensor] = []

        def grab(_m: nn.Module, args: tuple[Any, ...]) -> None:
            seen.append(args[0].detach())
            raise _Captured

        handle = layer.get_submodule(hook).register_forward_pre_hook(grab)
        try:
            for h in hidden:
                try:
                    _run_layer(layer, [h], self.cfg, self.settings.tokens)
                except _Captured:
                    pass
        finally:
            handle.remove()
        return torch.cat(seen)

    def _search_clip(self, w: torch.Tensor, x: torch.Tensor, group_size: int, layer: int
                     ) -> torch.Tensor:
        seed = self.settings.seed + layer
        if self.settings.clip == "range":
            return gram_search_range(w, x, group_size, max_tokens=self.settings.search_tokens,
                                     seed=seed)
        return search_clip(w, x, group_size, max_tokens=_CLIP_TOKENS, seed=seed)

    def _apply_clip(self, lw: _LayerWeights, proj: str, limits: torch.Tensor) -> None:
        """[out, groups, 2] limits are a range search's (lo, hi); [out, groups] a symmetric max."""
        name, size = _wname(lw.index, proj), self._group_size(lw, proj)
        apply = apply_range if limits.dim() == 3 else apply_clip
        lw.tensors[name] = apply(lw.current(name), limits, size)

    def _replay_layer(self, lw: _LayerWeights, found: dict[str, Any]) -> None:
        for group in _groups(self.cfg):
            if group.key in found["scales"]:
                self._apply_scales(lw, group, found["scales"][group.key])
                for m in self._awq_members(lw, group):
                    if m in found["clip"]:
                        self._apply_clip(lw, m, found["clip"][m])
        for m, packed in found.get("gptq", {}).items():
            name = _wname(lw.index, m)
            lw.tensors[name] = QuantizedWeight(
                with_codes(lw.current(name), self._group_size(lw, m), packed))

    def _group_size(self, lw: _LayerWeights, proj: str) -> int:
        size = self.plan.format_for(lw.proj_name(proj)).group_size
        assert size is not None
        return size

    def _apply_scales(self, lw: _LayerWeights, group: _Group, s: torch.Tensor) -> None:
        """Multiplies the group's weights by s and divides s out upstream (or at run time)."""
        i = lw.index
        target = self._fold_target(lw, group)
        awq = self._awq_members(lw, group)
        if target is None:  # no exact fold: only the AWQ members see x / s, at run time
            for m in awq:
                lw.tensors[_wname(i, m)] = lw.current(_wname(i, m)) * s
                lw.runtime[lw.proj_name(m)] = s
            return
        for m in group.members:
            lw.tensors[_wname(i, m)] = lw.current(_wname(i, m)) * s
        if group.upstream in ("v_proj", "up_proj"):  # the previous linear's output rows
            rows = _wname(i, group.upstream)
            lw.tensors[rows] = lw.current(rows) / s[:, None]
            if rows in lw.unclipped:
                lw.unclipped[rows] = lw.unclipped[rows] / s[:, None]
            bias = _wname(i, group.upstream, "bias")
            if bias in lw.tensors:
                lw.tensors[bias] = lw.current(bias) / s
        else:
            norm = f"layers.{i}.{group.upstream}.weight"
            lw.tensors[norm] = lw.current(norm) / s

    def _fold_target(self, lw: _LayerWeights, group: _Group) -> str | None:
        """The upstream op that can absorb 1/s exactly, or None (then scale at run time)."""
        fmt = lambda p: self.plan.format_for(lw.proj_name(p))  # noqa: E731
        if group.upstream in ("v_proj", "up_proj"):
            if fmt(group.upstream).kind == "native":
                return None  # its stored blocks are kept as they are
            if group.key == "o" and self.cfg.num_heads != self.cfg.num_kv_heads:
                return None  # one v channel feeds several o inputs that want different scales
            return group.upstream
        if any(fmt(m).kind == "native" for m in group.members):
            return None  # a native member would see x / s without W * s
        return group.upstream

    def _recording_factory(self, lw: _LayerWeights) -> Callable[..., nn.Module]:
        base = _AWQFactory(self.plan, lw.runtime)

        def make(names: list[str], ws: list[Any], biases: list[torch.Tensor] | None) -> nn.Module:
            module = base(names, ws, biases)
            self.prebuilt[tuple(names)] = module
            return module
        return make

    def _keep_non_linear(self, lw: _LayerWeights) -> None:
        """Norms go to the final model; linear weights become placeholders (already built)."""
        for name, value in lw.tensors.items():
            is_linear = any(name.startswith(_wname(lw.index, p).rsplit(".", 1)[0] + ".")
                            for g in _groups(self.cfg) for p in g.members)
            self.final[name] = None if is_linear else value
        lw.tensors.clear()

    # -- output head

    def _head(self, embed: Any, hidden: list[torch.Tensor] | None) -> None:
        head_obj = self.weights.pop("lm_head.weight", None)
        tied = head_obj is None
        head_obj = embed if tied else head_obj
        norm_w = self.weights.pop("norm.weight")
        fmt = self.plan.format_for("lm_head")
        if fmt.awq:
            assert fmt.group_size is not None
            x = self._head_inputs(norm_w, hidden)
            s = self._head_scales(head_obj, x)
            norm_w = norm_w / s
            head_obj = _dense(head_obj) * s
            if self.settings.gptq:
                if x is not None:
                    grams = GramSplit.of(x, s, self.settings.tokens, self.settings.gptq_holdout)
                    q, damp = gptq_int4_select(head_obj, grams, fmt.group_size,
                                               damps=self.settings.gptq_damp)
                    self.search["head_gptq"] = pack_codes(q)
                    self.search["head_gptq_damp"] = damp
                    log.debug("head GPTQ damping: %s", damp)
                else:
                    q = with_codes(head_obj, fmt.group_size, self.search["head_gptq"])
                head_obj = QuantizedWeight(q)
        self.final["norm.weight"] = norm_w
        if not tied:
            self.final["lm_head.weight"] = None
        self.prebuilt[("lm_head",)] = _AWQFactory(self.plan, {})(["lm_head"], [head_obj], None)
        if self.weights:
            raise TightfitError(f"unused weights: {sorted(self.weights)[:8]}")

    def _head_inputs(self, norm_w: torch.Tensor, hidden: list[torch.Tensor] | None
                     ) -> torch.Tensor | None:
        """The head's calibration inputs (final-norm outputs), or None when replaying."""
        if not self.calibrating:
            return None
        assert hidden is not None
        norm = RMSNorm(norm_w, self.cfg.rms_eps)
        with torch.inference_mode():
            return torch.cat([norm(h) for h in hidden])

    def _head_scales(self, head_obj: Any, x: torch.Tensor | None) -> torch.Tensor:
        if x is None:
            return self.search["head"]
        fmt = self.plan.format_for("lm_head")
        assert fmt.group_size is not None
        w = _dense(head_obj)
        gen = torch.Generator().manual_seed(self.settings.seed)
        rows = torch.randperm(w.shape[0], generator=gen)[:_HEAD_SEARCH_ROWS].sort().values
        res = gram_search_scales([w[rows]], x, fmt.group_size, n_grid=self.settings.n_grid,
                                 max_tokens=min(_HEAD_SEARCH_TOKENS, self.settings.search_tokens),
                                 seed=self.settings.seed)
        self.search["head"] = res.scales
        log.debug("head: alpha %.2f, loss %.3g (round-to-nearest %.3g)", res.alpha, res.loss,
                  res.rtn_loss)
        return res.scales


class _Captured(Exception):
    """Raised by a capture hook to stop the layer once the input it wants is recorded."""


# -- linear factories ------------------------------------------------------------------------

class _AWQFactory:
    """PlanLinearFactory, plus AWQ members whose input is divided by s at run time: those get
    weights already multiplied by s (and clipped), quantised as given."""

    def __init__(self, plan: PrecisionPlan, runtime: dict[str, torch.Tensor]) -> None:
        self.plan = plan
        self.runtime = runtime
        self.base = PlanLinearFactory(plan)

    def __call__(self, names: list[str], weights: list[Any], biases: list[torch.Tensor] | None
                 ) -> nn.Module:
        if not any(n in self.runtime for n in names):
            return self.base(names, weights, biases)
        bs = biases or [None] * len(names)
        fmts = {self.plan.format_for(n) for n in names}
        if len(fmts) == 1 and all(n in self.runtime for n in names):
            b = None if biases is None else torch.cat(biases)
            s = self.runtime[names[0]]
            if all(isinstance(x, QuantizedWeight) for x in weights):
                return Int4Linear.from_weights(concat_rows([x.q for x in weights]), b,
                                               input_scale=s)
            w = torch.cat([_dense(x) for x in weights])
            return _scaled_module(w, b, fmts.pop(), s)
        return SplitLinear([self([n], [w], None if b is None else [b])
                            for n, w, b in zip(names, weights, bs)])


def _scaled_module(weight: torch.Tensor, bias: torch.Tensor | None, fmt: WeightFormat,
                   s: torch.Tensor) -> nn.Module:
    """weight already holds W * s: quantise it as is and let the module divide x by s."""
    if fmt.kind == "int4":
        assert fmt.group_size is not None
        return Int4Linear.from_weights(quantize_int4(weight, fmt.group_size), bias, input_scale=s)
    if fmt.kind == "int8":
        return Int8Linear.from_weights(quantize_int8(weight), bias, input_scale=s)
    raise TightfitError(f"run-time AWQ scales need an int4/int8 format, got {fmt.name}")


class _Prebuilt:
    """LinearFactory for the final DecoderModel: hands out the modules built during the pass."""

    def __init__(self, modules: dict[tuple[str, ...], nn.Module]) -> None:
        self.modules = modules

    def __call__(self, names: list[str], weights: list[Any], biases: Any) -> nn.Module:
        return self.modules.pop(tuple(names))


# -- calibration data and forward ------------------------------------------------------------

def calibration_ids(tokenizer: Any, settings: CalibrationSettings) -> torch.Tensor:
    """[sequences, tokens] ids: seeded non-overlapping windows of the corpus after the
    evaluation windows of the perplexity protocol."""
    from tightfit.engine.scoring import DEFAULT_WINDOWS, WINDOW_TOKENS, corpus_text

    if tokenizer is None:
        raise TightfitError("AWQ calibration needs the model's tokenizer")
    ids = tokenizer.encode(corpus_text(), add_special_tokens=False)
    rest = torch.tensor(ids[DEFAULT_WINDOWS * WINDOW_TOKENS:], dtype=torch.long)
    n_windows = rest.numel() // settings.tokens
    if n_windows < settings.sequences:
        raise TightfitError(f"the calibration corpus holds {n_windows} windows of "
                            f"{settings.tokens} tokens, fewer than the {settings.sequences} asked")
    windows = rest[:n_windows * settings.tokens].view(n_windows, settings.tokens)
    gen = torch.Generator().manual_seed(settings.seed)
    pick = torch.randperm(n_windows, generator=gen)[:settings.sequences].sort().values
    return windows[pick]


def _ropes(cfg: ModelConfig, tokens: int) -> dict[bool, Rotary]:
    """Rotary tables for positions < tokens (same values as the model's longer tables)."""
    rope = Rotary(cfg.head_dim, cfg.rope_theta, tokens)
    local = Rotary(cfg.head_dim, cfg.rope_local_theta, tokens) if cfg.rope_local_theta else rope
    return {False: rope, True: local}


def _chunk_meta(cfg: ModelConfig, batch: int, tokens: int) -> AttentionMetadata:
    """Metadata for `batch` fresh sequences of `tokens` tokens each (causal, own K/V only)."""
    mask = sliding = None
    if cfg.sliding_window and tokens > cfg.sliding_window:
        pos = torch.arange(tokens)
        causal = pos[None, :] <= pos[:, None]
        mask = causal.view(1, 1, tokens, tokens)
        sliding = (causal & (pos[:, None] - pos[None, :] < cfg.sliding_window)).view(
            1, 1, tokens, tokens)
    group = AttentionGroup(0, batch, tokens, None, mask, sliding)
    return AttentionMetadata(slot_mapping=torch.arange(batch * tokens), groups=[group])


def _run_layer(layer: nn.Module, hidden: list[torch.Tensor], cfg: ModelConfig, tokens: int
               ) -> list[torch.Tensor]:
    """The layer applied to each chunk of calibration states ([batch * tokens, hidden] each)."""
    out = []
    with torch.inference_mode():
        for h in hidden:
            batch = h.shape[0] // tokens
            meta = _chunk_meta(cfg, batch, tokens)
            positions = torch.arange(tokens).repeat(batch)
            shape = (1, batch * tokens, cfg.num_kv_heads, cfg.head_dim)
            kv = (torch.empty(shape), torch.empty(shape))  # written, then read back by attention
            out.append(layer(h, positions, meta, kv, "fast"))
    return out

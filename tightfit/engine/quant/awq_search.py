"""Gram-matrix forms of AWQ's searches (used by awq_model's layer-by-layer build): the scale
exponent alpha per input-channel group, and each weight group's quantisation range, both scored
by the output error on calibration inputs without materialising X @ W for every candidate."""
from __future__ import annotations

import torch

from tightfit.engine.quant.awq import AWQScaleResult, activation_mean_abs, scales_for_alpha
from tightfit.engine.quant.formats import padded_in_features
from tightfit.engine.quant.reference import (
    INT4_LEVELS, fake_quantize_int4, pad_columns, quantize_int4)
from tightfit.errors import TightfitError

def gram_search_scales(weights: list[torch.Tensor], x: torch.Tensor, group_size: int, *,
                       n_grid: int = 20, max_tokens: int = 4096, seed: int = 0) -> AWQScaleResult:
    """awq.search_scales' grid search over alpha, with the loss computed from the weight error
    and (when there are more tokens than inputs) the inputs' Gram matrix.

    With E = Q(W * s) / s - W (the weight error seen from the unscaled input) the loss
    mean((x/s) @ Q(W*s).T - x @ W.T)^2 equals sum(E @ C * E) / (tokens * out) for C = X.T @ X:
    one [out, in] x [in, in] product per alpha instead of [tokens, in] x [in, out] (2-4x fewer
    flops at equal tokens for these shapes, and no cancellation between two large outputs).
    mean|x| uses every token, C at most `max_tokens` tokens drawn with `seed`.
    """
    w = torch.cat([wi.detach().to(torch.float32) for wi in weights])
    x2 = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
    if w.shape[1] != x2.shape[1]:
        raise TightfitError(f"weights take {w.shape[1]} inputs, activations have {x2.shape[1]}")
    x_mean = activation_mean_abs(x2)
    if x2.shape[0] > max_tokens:
        gen = torch.Generator().manual_seed(seed)
        x2 = x2[torch.randperm(x2.shape[0], generator=gen)[:max_tokens].sort().values]
    n, k = x2.shape
    # The Gram form costs out * in^2 per alpha, the per-token form tokens * in * out: with
    # fewer tokens than inputs (small calibration sets) the per-token form is cheaper.
    gram = (x2.t() @ x2) / n if n > k else None
    alphas = tuple(i / n_grid for i in range(n_grid + 1))
    losses = []
    for alpha in alphas:
        s = scales_for_alpha(x_mean, alpha)
        err = fake_quantize_int4(w * s, group_size) / s - w
        total = (err @ gram * err).sum() if gram is not None else (x2 @ err.t()).pow(2).sum() / n
        losses.append(float(total) / w.shape[0])
    best = min(range(len(alphas)), key=losses.__getitem__)
    return AWQScaleResult(scales=scales_for_alpha(x_mean, alphas[best]), alpha=alphas[best],
                          alphas=alphas, losses=tuple(losses))


# Shrink fractions tried on each side of a group's [min, max] by the range search.
_RANGE_SHRINK = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3)


def gram_search_range(weight: torch.Tensor, x: torch.Tensor, group_size: int, *,
                      shrink: tuple[float, ...] = _RANGE_SHRINK, max_tokens: int = 4096,
                      seed: int = 0) -> torch.Tensor:
    """Per (row, group) quantisation range [lo, hi] minimising that group's share of the output
    error, e C_g e^T with e = Q(clamp(w, lo, hi)) - w and C_g the group's block of X.T @ X.

    The asymmetric counterpart of awq.search_clip (which shrinks +-max|w| symmetrically around 0,
    a poor fit for min/max int4 on groups not centred on 0), scored on up to `max_tokens` tokens
    through the Gram blocks. (0, 0) = plain min/max is a candidate, so on the calibration tokens
    no group gets worse. Returns fp32 [out, in_padded / group, 2]; apply with `apply_range`.
    """
    w = weight.detach().to(torch.float32)
    out_f, in_f = w.shape
    k = padded_in_features(in_f, group_size)
    groups = pad_columns(w, k).reshape(out_f, k // group_size, group_size)
    xs = x.detach().reshape(-1, in_f).to(torch.float32)
    if xs.shape[0] > max_tokens:
        gen = torch.Generator().manual_seed(seed)
        xs = xs[torch.randperm(xs.shape[0], generator=gen)[:max_tokens]]
    xs = torch.nn.functional.pad(xs, (0, k - in_f)).reshape(xs.shape[0], -1, group_size)
    gram = torch.einsum("ngk,ngl->gkl", xs, xs) / xs.shape[0]  # [groups, g, g]
    lo0, hi0 = groups.amin(dim=2), groups.amax(dim=2)
    span = hi0 - lo0
    best = torch.stack([lo0, hi0], dim=-1)
    best_err = torch.full_like(lo0, float("inf"))
    for a in shrink:
        for b in shrink:
            lo, hi = lo0 + a * span, hi0 - b * span
            q = _fake_quantize_range(groups, lo, hi)
            err = q - groups
            # [groups, out, g] @ [groups, g, g]: each group's error through its own Gram block.
            loss = (torch.bmm(err.transpose(0, 1), gram).transpose(0, 1) * err).sum(dim=2)
            better = loss < best_err
            best_err = torch.where(better, loss, best_err)
            best = torch.where(better[..., None], torch.stack([lo, hi], dim=-1), best)
    return best


def _fake_quantize_range(groups: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor
                         ) -> torch.Tensor:
    """What quantize_int4 + dequantize_int4 give for groups clamped to [lo, hi]."""
    span = hi - lo
    scale = torch.where(span > 0, span / INT4_LEVELS, torch.ones_like(span))[..., None]
    clamped = torch.minimum(torch.maximum(groups, lo[..., None]), hi[..., None])
    codes = torch.round((clamped - lo[..., None]) / scale).clamp_(0, INT4_LEVELS)
    return lo[..., None] + codes * scale


def apply_range(weight: torch.Tensor, limits: torch.Tensor, group_size: int) -> torch.Tensor:
    """Clamps each (row, group) of `weight` [out, in] to limits[..., 0] .. limits[..., 1]."""
    in_f = weight.shape[1]
    lo = limits[..., 0].repeat_interleave(group_size, dim=1)[:, :in_f]
    hi = limits[..., 1].repeat_interleave(group_size, dim=1)[:, :in_f]
    return torch.minimum(torch.maximum(weight, lo), hi)

"""Activation-aware weight quantisation (AWQ, Lin et al. 2023) for int4: searches per-input-channel
scales s for linears sharing one input, and optionally per-group weight clipping. Pure functions
on fp32 tensors, deterministic for a given seed; the caller folds 1/s into the op feeding them.

Flow for one group (e.g. q/k/v after the attention norm, x = that norm's output):
    res = search_scales([wq, wk, wv], x, group_size=64)
    norm_w = fold_into_norm(norm_w, res.scales); wq, wk, wv = (w * res.scales for w in ...)
    (optional) wq = apply_clip(wq, search_clip(wq, x / res.scales, 64), 64); ... then quantise.
The paper clips every projection except q/k (their errors are amplified by the softmax).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from tightfit.engine.quant.formats import padded_in_features
from tightfit.engine.quant.reference import fake_quantize_int4, pad_columns
from tightfit.errors import TightfitError

# Scales are floored here so a dead input channel (mean |x| = 0) never yields s = 0.
_MIN_SCALE = 1e-4


@dataclass(frozen=True)
class AWQScaleResult:
    """scales: fp32 [in], normalised so sqrt(max * min) = 1. alpha: the exponent chosen.
    losses[i]: output MSE at alphas[i]; losses[0] (alpha 0, s = 1) is plain round-to-nearest."""

    scales: torch.Tensor
    alpha: float
    alphas: tuple[float, ...]
    losses: tuple[float, ...]

    @property
    def loss(self) -> float:
        return min(self.losses)

    @property
    def rtn_loss(self) -> float:
        return self.losses[0]


def activation_mean_abs(x: torch.Tensor) -> torch.Tensor:
    """Mean |x| per input channel over all tokens: [..., in] -> [in]."""
    return x.detach().reshape(-1, x.shape[-1]).to(torch.float32).abs().mean(dim=0)


def scales_for_alpha(x_mean_abs: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = mean|x|^alpha, normalised by sqrt(max * min) so that W * s keeps a similar range."""
    s = x_mean_abs.pow(alpha).clamp(min=_MIN_SCALE)
    return s / (s.max() * s.min()).sqrt()


def search_scales(weights: Sequence[torch.Tensor], x: torch.Tensor, group_size: int, *,
                  n_grid: int = 20, max_tokens: int = 2048, seed: int = 0) -> AWQScaleResult:
    """Grid-searches alpha in {0, 1/n_grid, ..., 1} for s = mean|x|^alpha minimising
    mean((x @ W.T - (x / s) @ Q(W * s).T)^2) over all `weights` (each [out_i, in], same input).

    Q is round-to-nearest int4 with `group_size` (input dim padded as in the int4 module).
    x: calibration activations [..., in]; mean|x| uses every token, the loss at most `max_tokens`
    tokens drawn with `seed`. alpha = 0 (plain RTN) is in the grid, so on the calibration tokens
    the result is never worse than RTN.
    """
    w = _concat_weights(weights, x.shape[-1])
    x_mean = activation_mean_abs(x)
    xs = _sample_tokens(x, max_tokens, seed)
    reference = xs @ w.t()
    alphas = tuple(i / n_grid for i in range(n_grid + 1))
    losses = []
    for alpha in alphas:
        s = scales_for_alpha(x_mean, alpha)
        w_q = fake_quantize_int4(w * s, group_size)
        losses.append(float(((xs / s) @ w_q.t() - reference).pow(2).mean()))
    best = min(range(len(alphas)), key=losses.__getitem__)
    return AWQScaleResult(scales=scales_for_alpha(x_mean, alphas[best]), alpha=alphas[best],
                          alphas=alphas, losses=tuple(losses))


def search_clip(weight: torch.Tensor, x: torch.Tensor, group_size: int, *, n_grid: int = 20,
                max_shrink: float = 0.5, max_tokens: int = 512, seed: int = 0,
                row_chunk: int = 256) -> torch.Tensor:
    """Per (output row, group) clipping threshold minimising that group's share of the output
    error: tries max|w_group| * (1 - i / n_grid) for i < max_shrink * n_grid.

    Returns max_abs fp32 [out, in_padded / group_size] for `apply_clip`. Pass the weight and input
    as they will be quantised (i.e. after AWQ scaling: W * s and x / s).
    """
    w = pad_columns(_check_2d(weight), padded_in_features(weight.shape[1], group_size))
    out_f, k_padded = w.shape
    n_groups = k_padded // group_size
    xs = _sample_tokens(x, max_tokens, seed)
    xs = torch.nn.functional.pad(xs, (0, k_padded - xs.shape[1])).reshape(-1, n_groups, group_size)
    best_max = torch.empty(out_f, n_groups)
    # Rows in chunks: the per-group partial outputs are [rows, tokens, groups].
    for a in range(0, out_f, row_chunk):
        wg = w[a:a + row_chunk].reshape(-1, n_groups, group_size)
        reference = torch.einsum("tgk,ngk->ntg", xs, wg)
        org_max = wg.abs().amax(dim=2, keepdim=True)
        best_err = torch.full(org_max.shape[:2], float("inf"))
        chunk_best = org_max[..., 0].clone()
        for i in range(max(1, int(max_shrink * n_grid))):
            max_val = org_max * (1 - i / n_grid)
            clipped = torch.maximum(torch.minimum(wg, max_val), -max_val)
            q = fake_quantize_int4(clipped.reshape(wg.shape[0], k_padded), group_size)
            out = torch.einsum("tgk,ngk->ntg", xs, q.reshape(wg.shape))
            err = (out - reference).pow(2).mean(dim=1)
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            chunk_best = torch.where(better, max_val[..., 0], chunk_best)
        best_max[a:a + row_chunk] = chunk_best
    return best_max


def apply_clip(weight: torch.Tensor, max_abs: torch.Tensor, group_size: int) -> torch.Tensor:
    """Clamps each (row, group) of `weight` [out, in] to [-max_abs, max_abs]; returns a new tensor."""
    w = _check_2d(weight)
    out_f, in_f = w.shape
    k_padded = padded_in_features(in_f, group_size)
    if tuple(max_abs.shape) != (out_f, k_padded // group_size):
        raise TightfitError(f"max_abs has shape {tuple(max_abs.shape)}, expected "
                            f"{(out_f, k_padded // group_size)} for weight {(out_f, in_f)}")
    limit = max_abs.repeat_interleave(group_size, dim=1)[:, :in_f]
    return torch.maximum(torch.minimum(w, limit), -limit)


def fold_into_norm(norm_weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The norm weight that makes the norm output x / s (the input the scaled weights expect)."""
    return norm_weight / scales


def fold_into_rows(weight: torch.Tensor, bias: torch.Tensor | None, scales: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """For a previous linear whose output feeds the scaled group linearly (v -> o without GQA
    sharing, up -> down through act(gate) * up): divide its output rows (and bias) by s."""
    return weight / scales[:, None], None if bias is None else bias / scales


def _check_2d(weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() != 2:
        raise TightfitError(f"expected a 2-D weight [out, in], got shape {tuple(weight.shape)}")
    return weight.detach().to(torch.float32)


def _concat_weights(weights: Sequence[torch.Tensor], in_features: int) -> torch.Tensor:
    if not weights:
        raise TightfitError("search_scales needs at least one weight")
    ws = [_check_2d(w) for w in weights]
    bad = [tuple(w.shape) for w in ws if w.shape[1] != in_features]
    if bad:
        raise TightfitError(f"weights {bad} do not take the activations' {in_features} inputs")
    # Quantisation is per row, so quantising the concatenation equals quantising each weight.
    return torch.cat(ws)


def _sample_tokens(x: torch.Tensor, max_tokens: int, seed: int) -> torch.Tensor:
    x2 = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
    if x2.shape[0] <= max_tokens:
        return x2
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randperm(x2.shape[0], generator=gen)[:max_tokens].sort().values
    return x2[idx]

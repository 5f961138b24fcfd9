"""Error feedback across columns for int4 rounding (GPTQ, Frantar et al. 2022), on a fixed grid.

Round-to-nearest rounds each weight on its own. GPTQ rounds the input columns one at a time and
pushes each column's rounding error onto the columns not yet rounded, weighted by the inverse of
the inputs' Gram matrix H = X.T @ X / n, so that the layer's OUTPUT error ||X W.T - X Q.T|| is
what gets minimised rather than the weight error. Here it runs after AWQ's scaling and range
search, on their grid: every (row, group) keeps the scale and zero that plain int4 rounding of
the (scaled, range-clipped) weight would get ("static groups"), so the result is an ordinary
`Int4Weights` for the same kernels, same size, and only the codes change.

Columns go in order of decreasing H diagonal (act order: the inputs carrying most energy are
rounded first, while the most columns remain to absorb their error); the fixed grid makes that
order free. Lazy block updates (128 columns) keep the rank-1 updates inside a cache-sized block.
Cost per projection: one Cholesky of [in, in] and `in` column steps over [out, <=128].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tightfit.engine.quant.formats import padded_in_features
from tightfit.engine.quant.reference import (
    INT4_LEVELS, INT4_MID, Int4Weights, dequantize_int4, int4_grid, pad_columns)
from tightfit.errors import TightfitError

# Damping added to H's diagonal, as a fraction of its mean (the paper's default): keeps the
# inverse well conditioned when calibration inputs leave some directions unexplored.
DEFAULT_DAMP = 0.01
_BLOCK = 128


def gram_matrix(x: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
    """H = X.T @ X / n in fp64 for inputs x [..., in]; with `scales` s, of x / s (the input an
    AWQ-scaled weight W * s sees)."""
    x2 = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
    if x2.shape[0] == 0:
        raise TightfitError("GPTQ needs at least one calibration token")
    if scales is not None:
        x2 = x2 / scales.to(torch.float32)
    h = torch.zeros(x2.shape[1], x2.shape[1], dtype=torch.float64)
    for chunk in x2.split(8192):  # fp32 products, fp64 accumulation across chunks
        h += (chunk.t() @ chunk).to(torch.float64)
    return h / x2.shape[0]


def gptq_int4(weight: torch.Tensor, gram: torch.Tensor, group_size: int, *,
              grid_weight: torch.Tensor | None = None, damp: float = DEFAULT_DAMP,
              act_order: bool = True) -> Int4Weights:
    """int4 codes for `weight` [out, in] minimising the output error on inputs with Gram matrix
    `gram` [in, in] (see `gram_matrix`).

    The grid per (row, group of `group_size` inputs) is min/max of `grid_weight` (default
    `weight`), exactly as `quantize_int4` would choose it; pass the range-clipped weight there and
    the unclipped one as `weight` so the clipping error is compensated too. Input dims that are
    not a multiple of the group size are padded like `quantize_int4` does (padding meets zero
    inputs).
    """
    w = weight.detach().to(torch.float32)
    if w.dim() != 2:
        raise TightfitError(f"expected a 2-D weight [out, in], got shape {tuple(w.shape)}")
    out_f, in_f = w.shape
    if tuple(gram.shape) != (in_f, in_f):
        raise TightfitError(f"Gram matrix of shape {tuple(gram.shape)} does not match a weight "
                            f"with {in_f} inputs")
    grid = w if grid_weight is None else grid_weight.detach().to(torch.float32)
    if grid.shape != w.shape:
        raise TightfitError(f"grid weight shape {tuple(grid.shape)} != weight {tuple(w.shape)}")
    groups, lo, scales = _grid(grid, group_size)
    k = groups.shape[1] * group_size

    h = torch.zeros(k, k, dtype=torch.float64)
    h[:in_f, :in_f] = gram.to(torch.float64)
    diag = torch.diagonal(h)
    dead = diag <= 0  # padding and inputs never seen: nothing to compensate through them
    diag[dead] = 1.0
    diag += damp * float(diag[~dead].mean()) if bool((~dead).any()) else 0.0
    w = pad_columns(w, k).clone()
    w[:, dead] = groups.reshape(out_f, k)[:, dead]  # rounds with no error to pass on

    perm = torch.argsort(torch.diagonal(h), descending=True) if act_order else torch.arange(k)
    h = h[perm][:, perm]
    w = w[:, perm]
    col_group = perm // group_size
    lo_col, scale_col = lo[:, col_group], scales[:, col_group]
    u = _inverse_cholesky_upper(h)

    codes = torch.empty(out_f, k, dtype=torch.uint8)
    for i1 in range(0, k, _BLOCK):
        i2 = min(i1 + _BLOCK, k)
        w1 = w[:, i1:i2]  # a view: updated in place
        err1 = torch.empty(out_f, i2 - i1)
        u1 = u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col, lo_c, sc = w1[:, i], lo_col[:, i1 + i], scale_col[:, i1 + i]
            c = torch.round((col - lo_c) / sc).clamp_(0, INT4_LEVELS)
            codes[:, i1 + i] = c.to(torch.uint8)
            e = (col - (lo_c + c * sc)) / u1[i, i]
            w1[:, i:] -= e[:, None] * u1[i, i:][None, :]
            err1[:, i] = e
        if i2 < k:
            w[:, i2:] -= err1 @ u[i1:i2, i2:]
    codes = codes[:, torch.argsort(perm)]
    return Int4Weights(codes=codes, scales=scales, zeros=lo + INT4_MID * scales,
                       group_size=group_size, in_features=in_f)


def output_error(weight: torch.Tensor, q: Int4Weights, gram: torch.Tensor) -> float:
    """Mean squared output error tr(dW H dW.T) / out of codes `q` against `weight` [out, in] on
    inputs with Gram matrix `gram` (the quantity GPTQ minimises on its own inputs)."""
    dw = dequantize_int4(q) - weight.detach().to(torch.float32)
    return float(((dw @ gram.to(torch.float32)) * dw).sum(dtype=torch.float64)) / dw.shape[0]


def asymmetric_map(x_ref: torch.Tensor, x_q: torch.Tensor, gram_q: torch.Tensor | None = None,
                   *, damp: float = DEFAULT_DAMP) -> torch.Tensor:
    """M [in, in] such that W M, fed the inputs the quantised model really produces (`x_q`),
    best reproduces the fp32 outputs `x_ref @ W.T` for any weight W (least squares, `damp`
    ridge): M = C (H_q + d I)^-1 with C = x_ref.T x_q / n and H_q = x_q.T x_q / n (`gram_q`, if
    the caller has it). One map serves every projection fed the same input; rounding W M
    (`apply_map`) with GPTQ on H_q then minimises ||x_q Q.T - x_ref W.T||, the layer's error
    measured against the fp32 output rather than against the same weight on perturbed inputs
    ("asymmetric calibration")."""
    xr = x_ref.detach().reshape(-1, x_ref.shape[-1]).to(torch.float32)
    xq = x_q.detach().reshape(-1, x_q.shape[-1]).to(torch.float32)
    if xr.shape != xq.shape:
        raise TightfitError(f"reference inputs {tuple(xr.shape)} and quantised-model inputs "
                            f"{tuple(xq.shape)} must hold the same tokens")
    h = (gram_matrix(xq) if gram_q is None else gram_q).to(torch.float64).clone()
    c = torch.zeros_like(h)
    for a, b in zip(xr.split(8192), xq.split(8192)):  # fp32 products, fp64 accumulation
        c += (a.t() @ b).to(torch.float64)
    c /= xr.shape[0]
    h += torch.eye(h.shape[0], dtype=torch.float64) * (
        damp * float(torch.diagonal(h).mean()) + 1e-12)
    return torch.linalg.solve(h, c.t()).t()  # C H^-1 (H symmetric positive definite)


def apply_map(weight: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """W M in fp32 (the product in fp64, as the map was solved)."""
    return (weight.detach().to(torch.float64) @ m).to(torch.float32)


@dataclass(frozen=True)
class GramSplit:
    """Gram matrices of one input: `all` calibration tokens, and a split into `fit` (the rest)
    and `held` (every n-th calibration sequence) for choosing the damping on tokens GPTQ did not
    see. `fit`/`held` are None when no choice is to be made."""

    all: torch.Tensor
    fit: torch.Tensor | None = None
    held: torch.Tensor | None = None

    @staticmethod
    def of(x: torch.Tensor, scales: torch.Tensor | None, tokens: int, every: int) -> GramSplit:
        """x [sequences * tokens, in], whole sequences in order; `every` 0 = no split. With a
        split, `all` is the token-weighted mean of `fit` and `held` (no third pass over x)."""
        seqs = x.shape[0] // tokens
        if every < 2 or seqs < 2 or seqs * tokens != x.shape[0]:
            return GramSplit(gram_matrix(x, scales))
        held = torch.zeros(seqs, dtype=torch.bool)
        held[every - 1::every] = True
        if not bool(held.any()):
            held[-1] = True
        xs = x.reshape(seqs, tokens, -1)
        fit, out = gram_matrix(xs[~held], scales), gram_matrix(xs[held], scales)
        n_held = int(held.sum())
        return GramSplit((fit * (seqs - n_held) + out * n_held) / seqs, fit, out)


def gptq_int4_select(weight: torch.Tensor, grams: GramSplit, group_size: int, *,
                     grid_weight: torch.Tensor | None = None,
                     damps: tuple[float, ...] = (DEFAULT_DAMP,)) -> tuple[Int4Weights, float]:
    """`gptq_int4` with the damping chosen among `damps`: each candidate rounds on the `fit`
    tokens and is scored by its output error on the `held` ones; the winner is then rounded on
    all tokens. One candidate (or no split) rounds on all tokens at once. Returns (codes, damp).

    Damping is GPTQ's regulariser: too little and the error feedback fits the calibration
    tokens' Gram matrix (directions the text barely explores get large corrections), too much and
    it falls back towards plain rounding. Which amount is right differs between models and
    projections, so it is chosen on text the rounding did not see."""
    if not damps:
        raise TightfitError("GPTQ needs at least one damping value")
    best = damps[0]
    if len(damps) > 1 and grams.fit is not None and grams.held is not None:
        errors = {d: output_error(weight, gptq_int4(weight, grams.fit, group_size,
                                                    grid_weight=grid_weight, damp=d), grams.held)
                  for d in damps}
        best = min(errors, key=errors.__getitem__)
    return gptq_int4(weight, grams.all, group_size, grid_weight=grid_weight, damp=best), best


def _grid(grid_weight: torch.Tensor, group_size: int
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The padded groups [out, n_groups, group_size] of `grid_weight` and their (lo, scale)."""
    out_f, in_f = grid_weight.shape
    k = padded_in_features(in_f, group_size)
    groups = pad_columns(grid_weight, k).reshape(out_f, k // group_size, group_size)
    return (groups, *int4_grid(groups))


def _inverse_cholesky_upper(h: torch.Tensor) -> torch.Tensor:
    """Upper Cholesky factor of H^-1 (fp64 maths, fp32 result), adding damping until H is
    positive definite."""
    eye = torch.eye(h.shape[0], dtype=torch.float64)
    extra = 0.0
    for _ in range(8):
        chol, info = torch.linalg.cholesky_ex(h + extra * eye)
        if int(info) == 0:
            inv = torch.cholesky_inverse(chol)
            return torch.linalg.cholesky(inv, upper=True).to(torch.float32)
        extra = max(extra * 10, 1e-6 * float(torch.diagonal(h).mean()))
    raise TightfitError("GPTQ: the calibration inputs' Gram matrix is not positive definite even "
                        "after damping; calibrate on more tokens")


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight already rounded (by GPTQ) in a layer's tensor dict: the linear factories build
    its module from these codes as they are instead of rounding the weight again."""

    q: Int4Weights

    def dequantize(self) -> torch.Tensor:
        return dequantize_int4(self.q)


def pack_codes(q: Int4Weights) -> torch.Tensor:
    """The codes two to a byte (what the AWQ cache stores; the grid is recomputed on replay)."""
    c = q.codes
    return c[:, 0::2] | (c[:, 1::2] << 4)


def with_codes(grid_weight: torch.Tensor, group_size: int, packed: torch.Tensor) -> Int4Weights:
    """Rebuilds `gptq_int4`'s result from `pack_codes` output and the grid weight it used."""
    groups, lo, scales = _grid(grid_weight.detach().to(torch.float32), group_size)
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=2).reshape(packed.shape[0], -1)
    return Int4Weights(codes=codes, scales=scales, zeros=lo + INT4_MID * scales,
                       group_size=group_size, in_features=int(grid_weight.shape[1]))

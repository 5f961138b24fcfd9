"""Building blocks shared by the decoder models: RMSNorm, rotary embeddings, gated MLP.

Linear layers are passed in ready-made (fp32 or quantised drop-ins), so these modules never
decide a weight format.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight (also compiled into the TorchScript decode stack,
    engine/scripted.py, so both paths compute it term for term alike)."""
    var = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(var + eps))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor,
                 half: int) -> torch.Tensor:
    """Rotate-half RoPE with the signed sine table (see Rotary); shared with scripted.py."""
    return x * cos + x.roll(half, -1) * sin_signed


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight. Gemma's (1 + w) is folded into `weight` at load."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


INITIAL_ROPE_ROWS = 4096


class Rotary(nn.Module):
    """NeoX-style rotary embedding (rotate-half) with a precomputed cos/sin table.

    rotate_half(x) * sin == roll(x, D/2) * sin_signed, with sin_signed = [-sin_lo, sin_hi]: one
    roll instead of two slices, a negation and a concatenation (bit-identical: only signs move).
    The table rows for a step's positions are looked up once per step and rotary module (in
    `cache`, the step's AttentionMetadata.rope), not once per layer and tensor.
    """

    def __init__(self, head_dim: int, base: float, max_position: int) -> None:
        super().__init__()
        self.inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float()
                                        / head_dim))
        self.half = head_dim // 2
        self.max_position = max_position
        self.key = float(base)  # distinguishes the global and local tables of one model
        self._build(min(max_position, INITIAL_ROPE_ROWS))

    def _build(self, rows: int) -> None:
        freqs = torch.outer(torch.arange(rows, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        sin = emb.sin()
        sin[:, :self.half] = -sin[:, :self.half]
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin_signed", sin, persistent=False)

    def ensure(self, positions: int) -> None:
        """Tables cover positions 0..positions-1 (at most the model's maximum): they start at
        INITIAL_ROPE_ROWS rows, since a table for the full context of a 32k-position model
        holds 64 MB per base (Gemma 3 has two) that a 2k-token deployment never reads. The
        engine ensures its max_model_len at start; eager calls grow the tables on demand."""
        rows = int(self.cos.shape[0])
        if positions > rows and rows < self.max_position:
            self._build(min(self.max_position, max(positions, 2 * rows)))

    def tables(self, positions: torch.Tensor, cache: dict[float, tuple[torch.Tensor, ...]] | None
               ) -> tuple[torch.Tensor, ...]:
        found = cache.get(self.key) if cache is not None else None
        if found is None:
            if positions.numel() and not torch.compiler.is_compiling():
                self.ensure(int(positions.max()) + 1)
            found = (self.cos[positions].unsqueeze(1), self.sin_signed[positions].unsqueeze(1))
            if cache is not None:
                cache[self.key] = found
        return found

    def forward(self, x: torch.Tensor, positions: torch.Tensor,
                cache: dict[float, tuple[torch.Tensor, ...]] | None = None) -> torch.Tensor:
        """x [T, H, D], positions [T]."""
        cos, sin = self.tables(positions, cache)
        return apply_rotary(x, cos, sin, self.half)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(self, gate_up: nn.Module, down: nn.Module, intermediate: int, act: str) -> None:
        super().__init__()
        self.gate_up = gate_up
        self.down = down
        self.intermediate = intermediate
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gu = self.gate_up(x)
        gate, up = gu[..., :self.intermediate], gu[..., self.intermediate:]
        if self.act == "silu":
            h = F.silu(gate)
        else:
            h = F.gelu(gate, approximate="tanh")
        return self.down(h * up)

"""Building blocks shared by the decoder models: RMSNorm, rotary embeddings, gated MLP.

Linear layers are passed in ready-made (fp32 or quantised drop-ins), so these modules never
decide a weight format.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight. Gemma's (1 + w) is folded into `weight` at load."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


class Rotary(nn.Module):
    """NeoX-style rotary embedding (rotate-half) with a precomputed cos/sin table."""

    def __init__(self, head_dim: int, base: float, max_position: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float()
                                   / head_dim))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, H, D], positions [T]."""
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


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

"""Token eviction for the KV cache: which cached tokens to keep when a sequence may hold only a
fraction r (the retention ratio) of its tokens. Policies are swappable classes behind one
`select(positions, scores, budget)`: attention sinks plus a recent window (StreamingLLM-style)
and heavy hitters by accumulated attention mass plus a recent window (H2O-style).

`simulate_eviction` replays the token-by-token process over one sequence and returns, for every
query, the set of keys it may see (a mask): the reference that the study scores. Not wired into
the paged engine yet (freeing evicted blocks needs holes in block tables; see
`evictable_blocks` for the part that is ready). int8 KV storage lives in engine/attention.py.
"""
from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import torch

from tightfit.errors import TightfitError


class EvictionPolicy(Protocol):
    name: str
    needs_scores: bool  # True: select() reads accumulated attention mass per cached token
    min_tokens: int  # never evict below this many tokens (keeps sinks alive while r x n is tiny)

    def select(self, positions: torch.Tensor, scores: torch.Tensor | None,
               budget: int) -> torch.Tensor:
        """Indices into `positions` (ascending, the newest last) of the tokens to keep: all of
        them when they fit, else exactly `budget`, ascending, the newest always among them."""
        ...


class SinkRecentPolicy:
    """The first `sinks` tokens (attention sinks) plus the most recent ones."""

    name = "sink-recent"
    needs_scores = False

    def __init__(self, sinks: int = 4) -> None:
        if sinks < 0:
            raise TightfitError(f"sinks must be >= 0, got {sinks}")
        self.sinks = sinks
        self.min_tokens = sinks + 1

    def select(self, positions: torch.Tensor, scores: torch.Tensor | None,
               budget: int) -> torch.Tensor:
        n = len(positions)
        if n <= budget:
            return torch.arange(n)
        sinks = min(self.sinks, budget - 1)  # at least the newest token stays
        return torch.cat([torch.arange(sinks), torch.arange(n - (budget - sinks), n)])


class HeavyHitterPolicy:
    """A recent window of ceil(recent_frac x budget) tokens (at least the newest), the rest of
    the budget to the older tokens with the most accumulated attention (ties: the earlier).
    min_tokens defaults to 5, the same floor as sink-recent with 4 sinks (equal memory)."""

    name = "heavy-hitter"
    needs_scores = True

    def __init__(self, recent_frac: float = 0.5, min_tokens: int = 5) -> None:
        if not 0.0 <= recent_frac <= 1.0:
            raise TightfitError(f"recent_frac must be in [0, 1], got {recent_frac}")
        if min_tokens < 1:
            raise TightfitError(f"min_tokens must be >= 1, got {min_tokens}")
        self.recent_frac = recent_frac
        self.min_tokens = min_tokens

    def select(self, positions: torch.Tensor, scores: torch.Tensor | None,
               budget: int) -> torch.Tensor:
        n = len(positions)
        if n <= budget:
            return torch.arange(n)
        assert scores is not None and len(scores) == n
        recent = min(budget, max(1, math.ceil(budget * self.recent_frac - 1e-9)))
        older = n - recent
        order = torch.sort(scores[:older], descending=True, stable=True).indices
        heavy = torch.sort(order[:budget - recent]).values
        return torch.cat([heavy, torch.arange(older, n)])


POLICIES: dict[str, type] = {"sink-recent": SinkRecentPolicy, "heavy-hitter": HeavyHitterPolicy}


def make_policy(name: str, **options: float) -> EvictionPolicy:
    """A policy by name ("sink-recent" or "heavy-hitter") with its options."""
    if name not in POLICIES:
        raise TightfitError(f"unknown eviction policy {name!r}: use one of {', '.join(POLICIES)}")
    return POLICIES[name](**options)


def check_ratio(ratio: float) -> float:
    if not 0.0 < ratio <= 1.0:
        raise TightfitError(f"retention ratio must be in (0, 1], got {ratio}")
    return ratio


def retention_budget(ratio: float, num_tokens: int, min_tokens: int = 1) -> int:
    """Tokens a sequence of num_tokens may keep at retention ratio r: floor(r x n), but never
    fewer than min(n, min_tokens) (and at least 1)."""
    budget = math.floor(check_ratio(ratio) * num_tokens + 1e-9)
    return max(1, budget, min(num_tokens, min_tokens))


def simulate_eviction(logits: torch.Tensor, policy: EvictionPolicy, ratio: float
                      ) -> torch.Tensor:
    """Replays eviction over one sequence. logits: [H, T, T] pre-softmax attention scores (the
    heads of one layer; row t = query t). Step t adds token t to the cache, evicts down to
    retention_budget(r, t + 1, policy.min_tokens) with the policy (scores: the attention mass
    each cached token has received so far, summed over heads), then lets query t attend to
    what is kept.
    Returns mask [T, T] bool: mask[t, j] = query t sees key j. One kept set per layer, shared
    by its heads (KV memory is per token)."""
    t_len = logits.shape[-1]
    mask = torch.zeros(t_len, t_len, dtype=torch.bool)
    # The per-step softmax runs in numpy: tiny torch ops pay thread wake-ups (ms each on a
    # loaded host with >1 thread), numpy's do not.
    rows = logits.detach().to(torch.float64).numpy() if policy.needs_scores else None
    mass = torch.zeros(t_len, dtype=torch.float64)
    kept = torch.empty(0, dtype=torch.long)
    for t in range(t_len):
        kept = torch.cat([kept, torch.tensor([t])])
        budget = retention_budget(ratio, t + 1, policy.min_tokens)
        if len(kept) > budget:
            kept = kept[policy.select(kept, mass[kept] if rows is not None else None, budget)]
        mask[t, kept] = True
        if rows is not None:
            mass.numpy()[kept.numpy()] += softmax_mass(rows[:, t, kept.numpy()])
    return mask


def softmax_mass(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of [H, n] scores, summed over heads -> [n]."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).sum(axis=0)


def evictable_blocks(kept_positions: list[int], num_tokens: int, block_size: int) -> list[int]:
    """Logical block indices (into a sequence's block table) that hold no kept token: the
    blocks a paged engine could give back after eviction."""
    live = {p // block_size for p in kept_positions}
    return [b for b in range(-(-num_tokens // block_size)) if b not in live]

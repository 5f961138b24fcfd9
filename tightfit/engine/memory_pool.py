"""The priority-aware KV memory pool: the block pool's capacity split into length tiers with
quotas (a flood of long requests cannot starve short ones), borrowing from idle tiers, a swap
area for preempted sequences, and the preemption cost rule.

Pure Python bookkeeping over BlockPool (no tensors; the runner copies swapped blocks). Shared
prefix blocks are counted against every tier that holds them (an over-estimate, never under).
"""
from __future__ import annotations

from dataclasses import dataclass

from tightfit.engine.block_pool import BlockPool
from tightfit.errors import RequestError, TightfitError


@dataclass(frozen=True)
class Tier:
    name: str
    max_len: int  # longest sequence (prompt + output tokens) this tier serves
    share: float  # fraction of the KV blocks reserved for it

    def __post_init__(self) -> None:
        if self.max_len < 1:
            raise TightfitError(f"tier {self.name!r}: max_len must be >= 1, got {self.max_len}")
        if not 0 < self.share <= 1:
            raise TightfitError(f"tier {self.name!r}: share must be in (0, 1], got {self.share}")


DEFAULT_TIERS = (Tier("short", 512, 0.5), Tier("long", 2048, 0.5))


class SwapArea:
    """Free list of swap-slot ids (one slot holds one KV block of every layer)."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        assert n <= len(self._free), "swap area overcommitted"
        return [self._free.pop() for _ in range(n)]

    def give_back(self, slots: list[int]) -> None:
        self._free.extend(reversed(slots))


class MemoryPool:
    def __init__(self, pool: BlockPool, tiers: tuple[Tier, ...] = DEFAULT_TIERS,
                 swap_slots: int = 0) -> None:
        if not tiers:
            raise TightfitError("at least one length tier is needed")
        self.pool = pool
        self.tiers = tuple(sorted(tiers, key=lambda t: t.max_len))
        total = sum(t.share for t in self.tiers)
        self.quota = [int(pool.num_blocks * t.share / total) for t in self.tiers]
        self.quota[-1] += pool.num_blocks - sum(self.quota)
        self.used = [0] * len(self.tiers)
        self.swap = SwapArea(swap_slots)

    @property
    def max_len(self) -> int:
        return self.tiers[-1].max_len

    def tier_for(self, total_len: int) -> int:
        """The smallest tier that holds a sequence of total_len tokens."""
        for i, t in enumerate(self.tiers):
            if total_len <= t.max_len:
                return i
        raise RequestError(
            f"request needs up to {total_len} tokens (prompt + max_tokens) but the longest "
            f"length tier holds {self.max_len}: shorten the prompt, lower max_tokens, or raise "
            "--max-model-len")

    def available(self, tier: int, busy: set[int]) -> int:
        """Blocks tier `tier` may take now: free blocks minus the unused quota that other busy
        tiers are owed (idle tiers' quota can be borrowed)."""
        owed = sum(max(0, self.quota[u] - self.used[u]) for u in busy if u != tier)
        return self.pool.num_free - owed

    def over_quota(self, tier: int) -> bool:
        return self.used[tier] > self.quota[tier]

    def take(self, tier: int, n: int) -> list[int]:
        ids = self.pool.allocate(n)
        self.used[tier] += n
        return ids

    def adopt(self, tier: int, n: int) -> None:
        """Counts n shared prefix blocks (already referenced) against the tier."""
        self.used[tier] += n

    def release(self, tier: int, block_ids: list[int]) -> None:
        self.pool.free(block_ids)
        self.used[tier] -= len(block_ids)

    def usage_by_tier(self) -> dict[str, float]:
        return {t.name: (self.used[i] / self.quota[i] if self.quota[i] else 0.0)
                for i, t in enumerate(self.tiers)}


@dataclass
class PreemptionCostModel:
    """Recompute costs re-prefilling the sequence's computed tokens; swap costs moving its
    blocks out and back. Both rates are running averages of what the engine measured."""

    prefill_s_per_token: float = 2e-3
    swap_bytes_per_s: float = 1e9
    block_bytes: int = 1

    def recompute_s(self, computed_tokens: int) -> float:
        return computed_tokens * self.prefill_s_per_token

    def swap_s(self, num_blocks: int) -> float:
        return 2 * num_blocks * self.block_bytes / self.swap_bytes_per_s

    def prefer_swap(self, computed_tokens: int, num_blocks: int) -> bool:
        return self.swap_s(num_blocks) < self.recompute_s(computed_tokens)

    def observe_prefill(self, seconds: float, tokens: int) -> None:
        if tokens >= 16:
            self.prefill_s_per_token = 0.8 * self.prefill_s_per_token + 0.2 * seconds / tokens

    def observe_swap(self, seconds: float, nbytes: int) -> None:
        if nbytes and seconds > 0:
            self.swap_bytes_per_s = 0.8 * self.swap_bytes_per_s + 0.2 * nbytes / seconds

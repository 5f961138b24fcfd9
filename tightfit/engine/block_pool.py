"""Pure-Python owner of the paged KV cache's blocks: a free list in LRU order, reference counts,
and a prefix cache of full, computed blocks keyed by a chain hash of their tokens.

A freed block keeps its hash and contents until it is handed out again, so a repeated prefix
(a system prompt, the previous turn of a chat) is found without recomputation. Imports no
torch; knows nothing about tensors, only block ids.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] = ()
    freed_at: float = 0.0  # when its last reference was dropped (for idle reclaim)


def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """Hash of a full block given its predecessor's hash: equal iff the whole prefix is equal
    (up to collisions, which `match_prefix` rules out by comparing tokens)."""
    return hash((parent, tuple(tokens)))


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks, least recently freed first: allocation evicts from the front.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_hit_tokens = 0
        self.prefix_query_tokens = 0
        self.evicted_blocks = 0  # cached contents dropped to make room (LRU under pressure)
        self.reclaimed_idle_blocks = 0  # cached contents dropped for being idle past the TTL

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def usage(self) -> float:
        """Fraction of blocks held by live sequences (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, n: int) -> list[int]:
        """Takes n fresh blocks (evicting cached contents, oldest first)."""
        if n > self.num_free:
            raise RuntimeError(f"asked for {n} blocks, {self.num_free} free")
        ids = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                self._uncache(block)
                self.evicted_blocks += 1
            block.ref_count = 1
            ids.append(block_id)
        return ids

    def free(self, block_ids: Sequence[int]) -> None:
        """Drops one reference from each block; tail blocks are freed first so that they are
        also evicted first (a prefix outlives its continuations)."""
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"double free of block {block_id}"
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                block.freed_at = time.monotonic()

    def _uncache(self, block: Block) -> None:
        if self._cached.get(block.block_hash) == block.block_id:  # type: ignore[arg-type]
            del self._cached[block.block_hash]  # type: ignore[arg-type]
        block.block_hash, block.token_ids = None, ()

    def reclaim_idle(self, ttl_s: float, now: float | None = None) -> int:
        """Forgets cached prefixes whose blocks have been free for longer than ttl_s (idle
        conversations); returns how many. Free blocks are scanned oldest first."""
        now = time.monotonic() if now is None else now
        n = 0
        for block_id in self._free:
            block = self.blocks[block_id]
            if now - block.freed_at < ttl_s:
                break
            if block.block_hash is not None:
                self._uncache(block)
                n += 1
        self.reclaimed_idle_blocks += n
        return n

    def match_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """Finds cached full blocks that hold a prefix of `token_ids`, leaving at least one
        token uncomputed (its logits are needed). Takes a reference on each block found.

        Returns (block ids, their chain hashes)."""
        if not self.enable_prefix_caching:
            return [], []
        bs = self.block_size
        usable = (len(token_ids) - 1) // bs
        ids: list[int] = []
        hashes: list[int] = []
        parent: int | None = None
        for i in range(usable):
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            h = chain_hash(parent, tokens)
            block_id = self._cached.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            ids.append(block_id)
            hashes.append(h)
            parent = h
        for block_id in ids:
            self._touch(block_id)
        self.prefix_query_tokens += len(token_ids)
        self.prefix_hit_tokens += len(ids) * bs
        return ids, hashes

    def _touch(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def cache_block(self, block_id: int, parent: int | None, tokens: Sequence[int]) -> int:
        """Registers a full, computed block under its chain hash; returns the hash. If an equal
        block is cached already, the existing entry is kept (both hold the same K/V)."""
        assert len(tokens) == self.block_size
        h = chain_hash(parent, tokens)
        block = self.blocks[block_id]
        if self.enable_prefix_caching and h not in self._cached:
            self._cached[h] = block_id
            block.block_hash, block.token_ids = h, tuple(tokens)
        return h

    def num_cached_blocks(self) -> int:
        return len(self._cached)

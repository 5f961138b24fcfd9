"""Exact-value tests of the block pool: which block ids, in which order, with which counts."""
import pytest

from tightfit.engine.block_pool import BlockPool


def test_allocate_takes_lowest_free_ids_in_order():
    pool = BlockPool(num_blocks=6, block_size=4)
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(3) == [2, 3, 4]
    assert pool.num_free == 1
    assert [b.ref_count for b in pool.blocks] == [1, 1, 1, 1, 1, 0]


def test_free_returns_tail_first_and_reuses_in_lru_order():
    pool = BlockPool(num_blocks=4, block_size=4)
    a = pool.allocate(3)
    pool.free(a)
    # freed in reverse: 2, 1, 0 appended after the never-used block 3
    assert pool.allocate(4) == [3, 2, 1, 0]


def test_over_allocation_raises_and_double_free_asserts():
    pool = BlockPool(num_blocks=2, block_size=4)
    with pytest.raises(RuntimeError):
        pool.allocate(3)
    ids = pool.allocate(1)
    pool.free(ids)
    with pytest.raises(AssertionError):
        pool.free(ids)


def test_prefix_cache_hit_shares_blocks_and_counts_refs():
    pool = BlockPool(num_blocks=8, block_size=4)
    tokens = list(range(10))  # two full blocks + 2 tokens
    a = pool.allocate(3)
    h0 = pool.cache_block(a[0], None, tokens[0:4])
    pool.cache_block(a[1], h0, tokens[4:8])
    ids, hashes = pool.match_prefix(tokens + [99])
    assert ids == a[:2]
    assert len(hashes) == 2 and hashes[0] == h0
    assert [pool.blocks[i].ref_count for i in a] == [2, 2, 1]
    assert pool.prefix_hit_tokens == 8


def test_prefix_match_leaves_last_token_to_compute():
    pool = BlockPool(num_blocks=4, block_size=4)
    tokens = list(range(8))
    a = pool.allocate(2)
    h0 = pool.cache_block(a[0], None, tokens[:4])
    pool.cache_block(a[1], h0, tokens[4:])
    ids, _ = pool.match_prefix(tokens)  # exactly two blocks long: only the first is usable
    assert ids == [a[0]]


def test_freed_cached_block_is_reused_until_evicted():
    pool = BlockPool(num_blocks=3, block_size=2)
    a = pool.allocate(1)
    pool.cache_block(a[0], None, [7, 8])
    pool.free(a)
    assert pool.num_free == 3 and pool.num_cached_blocks() == 1
    ids, _ = pool.match_prefix([7, 8, 9])
    assert ids == a and pool.num_free == 2
    pool.free(ids)
    # allocation order: 1, 2 (never used), then 0 (cached) is evicted last
    assert pool.allocate(2) == [1, 2]
    assert pool.num_cached_blocks() == 1
    assert pool.allocate(1) == [0]
    assert pool.num_cached_blocks() == 0
    assert pool.match_prefix([7, 8, 9]) == ([], [])


def test_different_prefix_same_block_tokens_do_not_match():
    pool = BlockPool(num_blocks=4, block_size=2)
    a = pool.allocate(2)
    h0 = pool.cache_block(a[0], None, [1, 2])
    pool.cache_block(a[1], h0, [3, 4])
    ids, _ = pool.match_prefix([9, 9, 3, 4, 5])
    assert ids == []


def test_prefix_caching_disabled():
    pool = BlockPool(num_blocks=4, block_size=2, enable_prefix_caching=False)
    a = pool.allocate(1)
    pool.cache_block(a[0], None, [1, 2])
    assert pool.match_prefix([1, 2, 3]) == ([], [])

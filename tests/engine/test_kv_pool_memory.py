"""The KV pool's tensors (attention.make_kv_cache): unwritten slots read as exactly 0 (block
gathers read the unwritten tail of a sequence's last block as masked padding, and masked NaN
would still poison attention), and an idle pool costs address space, not resident memory."""
from __future__ import annotations

import torch

from tightfit.engine.attention import gather_blocks, make_kv_cache


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20


def test_unwritten_slots_read_as_zero_in_both_formats():
    for dtype in ("fp32", "int8"):
        cache = make_kv_cache((64, 16, 3, 64), dtype)
        cache[5] = torch.full((16, 3, 64), 2.0)  # int8 caches quantise on write
        blocks = torch.tensor([[5, 9], [9, 0]])
        got = gather_blocks(cache, blocks, 20)
        assert got.shape == (2, 20, 3, 64)
        assert torch.allclose(got[0, :16], torch.full((16, 3, 64), 2.0))
        assert torch.equal(got[0, 16:], torch.zeros(4, 3, 64))
        assert torch.equal(got[1], torch.zeros(20, 3, 64))


def test_an_idle_pool_is_not_resident():
    before = _rss_mib()
    caches = [make_kv_cache((2048, 16, 3, 64)) for _ in range(8)]  # 8 x 24 MiB
    assert _rss_mib() - before < 16
    caches[0][0, 0] = 1.0  # a write makes only its page resident
    assert _rss_mib() - before < 16

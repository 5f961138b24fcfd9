"""Next-token choice for the lite runtime, in numpy: greedy, or temperature / top-k / top-p with
one generator per request (the same seed gives the same text on this runtime; the torch engine
draws from torch's generator, so seeded samples differ between the two)."""
from __future__ import annotations

import numpy as np

from tightfit.engine.request import Sequence


class Sampler:
    def __init__(self) -> None:
        self._rngs: dict[str, np.random.Generator] = {}

    def release(self, request_id: str) -> None:
        self._rngs.pop(request_id, None)

    def sample(self, seqs: list[Sequence], logits: np.ndarray) -> list[int]:
        out = logits.argmax(axis=-1).tolist()
        for i, seq in enumerate(seqs):
            if not seq.params.greedy:
                out[i] = self._sample_one(seq, logits[i])
        return out

    def _sample_one(self, seq: Sequence, logits: np.ndarray) -> int:
        p = seq.params
        rng = self._rngs.get(seq.request_id)
        if rng is None:
            rng = self._rngs[seq.request_id] = np.random.default_rng(p.seed)
        z = logits.astype(np.float64)
        with np.errstate(over="ignore"):  # from the maximum down: a tiny temperature gives the
            z = (z - z.max()) / p.temperature  # others -inf, not an overflow to inf - inf = nan
        if p.top_k and p.top_k < z.size:
            kth = np.partition(z, -p.top_k)[-p.top_k]
            z = np.where(z < kth, -np.inf, z)
        probs = np.exp(z)
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            sorted_p = probs[order]
            # keep the smallest prefix whose mass reaches top_p (always at least one token)
            drop = (np.cumsum(sorted_p) - sorted_p) >= p.top_p
            sorted_p[drop] = 0.0
            probs = np.zeros_like(probs)
            probs[order] = sorted_p
            probs /= probs.sum()
        return int(rng.choice(probs.size, p=probs))

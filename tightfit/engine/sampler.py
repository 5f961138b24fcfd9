"""Chooses the next token per sequence: greedy (batched argmax), or temperature / top-k / top-p
with a per-request torch.Generator so the same seed gives the same text."""
from __future__ import annotations

import torch

from tightfit.engine.request import Sequence


class Sampler:
    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, seq: Sequence) -> torch.Generator:
        g = self._generators.get(seq.request_id)
        if g is None:
            g = torch.Generator()
            if seq.params.seed is not None:
                g.manual_seed(seq.params.seed)
            else:
                g.seed()
            self._generators[seq.request_id] = g
        return g

    def sample(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        out = logits.argmax(dim=-1).tolist()
        for i, seq in enumerate(seqs):
            if not seq.params.greedy:
                out[i] = self._sample_one(seq, logits[i])
        return out

    def _sample_one(self, seq: Sequence, logits: torch.Tensor) -> int:
        p = seq.params
        # in float64 and from the maximum down: a tiny temperature (1e-45 passes validation)
        # then sends the others to -inf instead of overflowing to inf - inf = nan
        logits = logits.double()
        logits = (logits - logits.max()) / p.temperature
        if p.top_k and p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            # keep the smallest prefix whose mass reaches top_p (always at least one token)
            drop = (sorted_p.cumsum(0) - sorted_p) >= p.top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=self._generator(seq)).item())

"""Teacher-forced scoring of token sequences: logits at every position, per-token negative
log-likelihood and top-1 predictions, plus the project's fixed perplexity protocol.

Protocol (so figures compare across the project): corpus = the `pydoc_data.topics.topics` values
joined by blank lines ("\\n\\n") in sorted-key order, tokenised once without special tokens; the
first N non-overlapping windows of 512 tokens; in each window every position but the last predicts
the next token (511 predictions per window, no BOS inserted); perplexity = exp(mean NLL).

Runs one window at a time through the engine's own runner metadata and KV cache (the same code
path as serving), so it scores exactly what `LLM.generate` would compute. Not a batch evaluator:
one sequence per forward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from tightfit.errors import TightfitError

WINDOW_TOKENS = 512
DEFAULT_WINDOWS = 16


@dataclass(frozen=True)
class TokenScores:
    """nll: fp64 [n - 1], -log p(ids[i + 1] | ids[:i + 1]); top1: int64 [n - 1], argmax at i."""

    nll: torch.Tensor
    top1: torch.Tensor


def window_logits(llm: Any, ids: Sequence[int]) -> torch.Tensor:
    """Logits [n, vocab] at every position of `ids` (one prefill through the engine's runner)."""
    from tightfit.engine.request import Sequence as EngineSequence
    from tightfit.engine.sampling_params import SamplingParams
    from tightfit.engine.scheduler import ScheduledSeq, SchedulerOutput

    ids = list(ids)
    if not ids:
        raise TightfitError("cannot score an empty token sequence")
    eng = llm.engine
    if len(ids) > eng.kv_capacity_tokens:
        raise TightfitError(f"a window of {len(ids)} tokens does not fit the KV cache "
                            f"({eng.kv_capacity_tokens} tokens); raise kv_cache_memory")
    seq = EngineSequence("score", ids, SamplingParams())
    seq.block_table = eng.pool.allocate(eng.pool.blocks_needed(len(ids)))
    try:
        runner = eng.runner
        input_ids, positions, meta, _ = runner.prepare(SchedulerOutput([ScheduledSeq(seq, len(ids), 0)]))
        with torch.inference_mode():
            return llm.loaded.model(input_ids, positions, meta, runner.kv_caches,
                                    torch.arange(len(ids)), runner.attention)
    finally:
        eng.pool.free(seq.block_table)


def score_tokens(llm: Any, ids: Sequence[int]) -> TokenScores:
    """Per-position NLL of the next token and the model's top-1 prediction, for one window."""
    if len(ids) < 2:
        raise TightfitError("scoring needs at least 2 tokens (one prediction)")
    logits = window_logits(llm, ids)[:-1].to(torch.float64)
    target = torch.tensor(list(ids)[1:], dtype=torch.long)
    nll = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    return TokenScores(nll=nll, top1=logits.argmax(dim=-1))


def corpus_text() -> str:
    """The protocol's corpus: pydoc_data.topics values, sorted by key, joined by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def corpus_windows(tokenizer: Any, windows: int = DEFAULT_WINDOWS,
                   window_tokens: int = WINDOW_TOKENS) -> list[list[int]]:
    """The first `windows` non-overlapping windows of `window_tokens` tokens of the corpus."""
    if windows < 1 or window_tokens < 2:
        raise TightfitError(f"need at least 1 window of at least 2 tokens, got {windows} x "
                            f"{window_tokens}")
    ids = tokenizer.encode(corpus_text(), add_special_tokens=False)
    if len(ids) < windows * window_tokens:
        raise TightfitError(f"the corpus has {len(ids)} tokens, fewer than {windows} windows of "
                            f"{window_tokens}")
    return [ids[i * window_tokens:(i + 1) * window_tokens] for i in range(windows)]


def perplexity(nll: torch.Tensor) -> float:
    """exp(mean NLL) over all predicted tokens."""
    return math.exp(float(nll.to(torch.float64).mean()))

"""Teacher-forced scoring: all-position logits agree with the engine's own last-token logits, the
protocol's windows are fixed, and perplexity is exp(mean NLL)."""
from __future__ import annotations

import math

import pytest
import torch

from tightfit.engine.scoring import (
    WINDOW_TOKENS, corpus_text, corpus_windows, perplexity, score_tokens, window_logits)
from tightfit.errors import TightfitError


def _engine_last_logits(llm, ids: list[int]) -> torch.Tensor:
    from tightfit import SamplingParams
    from tightfit.engine.request import Sequence
    from tightfit.engine.scheduler import ScheduledSeq, SchedulerOutput

    eng = llm.engine
    seq = Sequence("probe", ids, SamplingParams())
    seq.block_table = eng.pool.allocate(eng.pool.blocks_needed(len(ids)))
    try:
        _, logits = eng.runner.execute(SchedulerOutput([ScheduledSeq(seq, len(ids), 0)]))
    finally:
        eng.pool.free(seq.block_table)
    return logits[0]


def test_corpus_and_windows_are_fixed(default_llm) -> None:
    text = corpus_text()
    assert text.startswith(text.split("\n\n")[0]) and len(text) > 400_000
    windows = corpus_windows(default_llm.tokenizer, 3)
    assert [len(w) for w in windows] == [WINDOW_TOKENS] * 3
    ids = default_llm.tokenizer.encode(text, add_special_tokens=False)
    assert windows[2] == ids[2 * WINDOW_TOKENS:3 * WINDOW_TOKENS]
    with pytest.raises(TightfitError, match="1 window"):
        corpus_windows(default_llm.tokenizer, 0)


def test_every_position_matches_the_engine(default_llm) -> None:
    ids = corpus_windows(default_llm.tokenizer, 1)[0][:64]
    logits = window_logits(default_llm, ids)
    assert logits.shape == (64, default_llm.loaded.config.vocab_size)
    for n in (1, 30, 64):  # a prefix's last logits = the full pass at that position (causal)
        torch.testing.assert_close(logits[n - 1], _engine_last_logits(default_llm, ids[:n]),
                                   rtol=1e-4, atol=1e-4)


def test_nll_and_perplexity(default_llm) -> None:
    ids = corpus_windows(default_llm.tokenizer, 1)[0][:64]
    scores = score_tokens(default_llm, ids)
    logits = window_logits(default_llm, ids)
    assert scores.nll.shape == scores.top1.shape == (63,)
    expected = -torch.log_softmax(logits[5].double(), -1)[ids[6]]
    assert math.isclose(float(scores.nll[5]), float(expected), rel_tol=1e-6)
    assert torch.equal(scores.top1, logits[:-1].argmax(-1))
    assert 2 < perplexity(scores.nll) < 100
    assert perplexity(torch.zeros(3)) == 1.0
    with pytest.raises(TightfitError):
        score_tokens(default_llm, ids[:1])

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
from typing import Any, Callable, Sequence

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
    from tightfit.lite.engine import LiteLLM

    if isinstance(llm, LiteLLM):  # one forward call into a free slot, all rows out
        n = len(ids)
        slot = llm.engine.pool.free[-1]
        try:
            return torch.from_numpy(llm.model.forward(ids, [slot] * n, range(n), range(n)))
        finally:
            llm.model.release(slot)
    eng = llm.engine
    if len(ids) > eng.kv_capacity_tokens:
        raise TightfitError(f"a window of {len(ids)} tokens does not fit the KV cache "
                            f"({eng.kv_capacity_tokens} tokens); raise kv_cache_memory")
    seq = EngineSequence("score", ids, SamplingParams())
    seq.block_table = eng.pool.allocate(eng.pool.blocks_needed(len(ids)))
    try:
        runner = eng.runner
        step = SchedulerOutput([ScheduledSeq(seq, len(ids), 0)])
        input_ids, positions, meta, _ = runner.prepare(step)
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


@dataclass(frozen=True)
class FormatResult:
    """One weight format on the protocol. top1_agreement: share of positions whose argmax equals
    the fp32 model's (1.0 for fp32 itself)."""

    quant: str
    perplexity: float
    top1_agreement: float
    tokens: int
    load_s: float
    eval_s: float

    def delta_pct(self, reference: float) -> float:
        return 100.0 * (self.perplexity / reference - 1.0)


def compare_formats(model: str | None, quants: Sequence[str], windows: int = DEFAULT_WINDOWS,
                    num_threads: int | None = None,
                    on_result: Callable[[FormatResult], None] | None = None
                    ) -> list[FormatResult]:
    """fp32 first (the reference for top-1 agreement), then each of `quants`, one model in
    memory at a time. A quant ending in `.tfq` names a quantised file (of the same model) to
    load instead; "lite" is the file's own weights on the lite runtime (tightfit.lite: int8
    activations, half K/V). `on_result` sees each result as soon as it is measured."""
    import time

    from tightfit import LLM

    reference_top1: list[torch.Tensor] = []
    results: list[FormatResult] = []
    order = ["fp32"] + [q for q in quants if q != "fp32"]
    tokens_of: list[list[int]] | None = None
    for quant in order:
        t0 = time.perf_counter()
        if quant.endswith(".tfq"):  # a file written by `tightfit quantize`: it is the model
            llm = LLM(quant, num_threads=num_threads)
        elif quant == "lite":
            from tightfit.lite import LiteLLM

            llm = LiteLLM(model, num_threads=num_threads, max_model_len=WINDOW_TOKENS,
                          max_num_seqs=1)
        else:
            llm = LLM(model, quant=quant, num_threads=num_threads)
        load_s = time.perf_counter() - t0
        tokens_of = tokens_of or corpus_windows(llm.tokenizer, windows)
        nll, agree = [], 0
        t0 = time.perf_counter()
        for i, ids in enumerate(tokens_of):
            scores = score_tokens(llm, ids)
            nll.append(scores.nll)
            if quant == "fp32":
                reference_top1.append(scores.top1)
            agree += int((scores.top1 == reference_top1[i]).sum())
        all_nll = torch.cat(nll)
        result = FormatResult(quant, perplexity(all_nll), agree / all_nll.numel(),
                              all_nll.numel(), load_s, time.perf_counter() - t0)
        results.append(result)
        if on_result:
            on_result(result)
        del llm
    return results

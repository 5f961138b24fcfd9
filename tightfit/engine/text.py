"""A request's life outside the model, shared by the torch engine (engine.py) and the lite
runtime (tightfit.lite): its admission checks and state (`new_request`), incremental
detokenising that holds back a tail which may start a stop string, the decision whether a new
token ends the request, and the output a step returns. Torch-free."""
from __future__ import annotations

import uuid
from collections.abc import Container
from typing import Any

from tightfit.engine.request import RequestOutput, Sequence
from tightfit.engine.sampling_params import SamplingParams
from tightfit.errors import RequestError


def new_request(tokenizer: Any, prompt: str | list[int], params: SamplingParams | None,
                request_id: str | None, priority: int, arrival_index: int, in_use: Container[str],
                vocab_size: int, window: int, window_detail: str, window_fix: str
                ) -> tuple[Sequence, TextState]:
    """Encodes and checks a prompt (not empty, shorter than the `window` a sequence may fill,
    token ids in the vocabulary, an unused request id); returns the sequence and its text
    state. `window_detail` / `window_fix` name the engine's own limits in the error."""
    params = params or SamplingParams()
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise RequestError("the prompt is empty: give at least one token")
    if len(ids) >= window:
        raise RequestError(f"prompt has {len(ids)} tokens but the context window is {window} "
                           f"tokens ({window_detail}): shorten the prompt or {window_fix}")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
    rid = request_id or uuid.uuid4().hex
    if rid in in_use:
        raise RequestError(f"request id {rid!r} is already in use")
    seq = Sequence(rid, ids, params, priority, arrival_index,
                   prompt if isinstance(prompt, str) else None)
    state = TextState(tokenizer.incremental_decoder(skip_special_tokens=params.skip_special_tokens),
                      tuple(params.stop))
    return seq, state


class TextState:
    """Incremental text of one request, holding back a tail that may start a stop string."""

    def __init__(self, decoder: Any, stops: tuple[str, ...]) -> None:
        self.decoder = decoder
        self.stops = stops
        self.text = ""
        self.emitted = 0

    def push(self, token_id: int | None) -> tuple[str, bool]:
        """Adds a token (None = flush at the end); returns (safe delta, hit a stop string)."""
        self.text += self.decoder.push(token_id) if token_id is not None else self.decoder.flush()
        for stop in self.stops:
            at = self.text.find(stop, max(0, self.emitted - len(stop)))
            if at != -1:
                self.text = self.text[:at]
                return self._emit(len(self.text)), True
        hold = 0
        if token_id is not None:
            for stop in self.stops:
                for k in range(min(len(stop) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(stop[:k]):
                        hold = max(hold, k)
                        break
        return self._emit(len(self.text) - hold), False

    def _emit(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        delta = self.text[self.emitted:upto]
        self.emitted = upto
        return delta


def next_token_finish(seq: Sequence, token: int, now: float, state: TextState,
                      stop_token_ids: frozenset[int], max_model_len: int) -> tuple[str, str | None]:
    """Appends `token` to `seq` and its text; returns (text delta, finish reason or None)."""
    seq.token_ids.append(token)
    if seq.metrics.first_token_time is None:
        seq.metrics.first_token_time = now
    p = seq.params
    reason = None
    stop_token = (not p.ignore_eos and token in stop_token_ids) or token in p.stop_token_ids
    if stop_token:
        delta, _ = state.push(None)
        reason = "stop"
    else:
        delta, hit = state.push(token)
        if hit:
            reason = "stop"
        elif len(seq.output_token_ids) >= p.max_tokens or seq.num_tokens >= max_model_len:
            delta += state.push(None)[0]
            reason = "length"
    if reason is not None:
        seq.metrics.finished_time = now
    return delta, reason


def request_output(seq: Sequence, state: TextState, token: int, delta: str,
                   reason: str | None) -> RequestOutput:
    """What a step returns for `seq` after `token`."""
    return RequestOutput(
        request_id=seq.request_id, prompt=seq.prompt, prompt_token_ids=seq.prompt_token_ids,
        text=state.text, token_ids=list(seq.output_token_ids), finished=reason is not None,
        finish_reason=reason, delta_text=delta, delta_token_ids=[token],
        num_cached_tokens=seq.num_cached_tokens, metrics=seq.metrics)

"""Per-request text and stop conditions, shared by the torch engine (engine.py) and the lite
runtime (tightfit.lite): incremental detokenising that holds back a tail which may start a stop
string, and the decision whether a new token ends the request. Torch-free."""
from __future__ import annotations

from typing import Any

from tightfit.engine.request import RequestOutput, Sequence


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

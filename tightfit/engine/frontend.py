"""The offline entry point's request methods (`generate`, `stream`, `chat_prompt`), written
against the engine interface alone (`add_request` / `step` / `abort`), so that the torch
engine's `LLM` and the lite runtime's `LiteLLM` share them. Torch-free."""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

from tightfit.engine.request import RequestOutput
from tightfit.engine.sampling_params import SamplingParams
from tightfit.errors import TightfitError


class GenerateMixin:
    engine: Any
    tokenizer: Any

    def generate(self, prompts: str | Sequence[str] | Sequence[list[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 priorities: Sequence[int] | None = None,
                 on_output: Callable[[RequestOutput], None] | None = None) -> list[RequestOutput]:
        """Runs all prompts to completion; `on_output` sees every streamed delta."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        plist = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise TightfitError(f"got {len(plist)} sampling params for {len(prompts)} prompts")
        ids = [self.engine.add_request(p, sp, priority=(priorities[i] if priorities else 0))
               for i, (p, sp) in enumerate(zip(prompts, plist))]
        final: dict[str, RequestOutput] = {}
        try:
            while len(final) < len(ids):
                for out in self.engine.step():
                    if on_output:
                        on_output(out)
                    if out.finished:
                        final[out.request_id] = out
        except BaseException:
            for rid in ids:
                self.engine.abort(rid)
            raise
        return [final[rid] for rid in ids]

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None
               ) -> Iterator[RequestOutput]:
        """Yields the deltas of one request as they are produced."""
        rid = self.engine.add_request(prompt, params)
        try:
            while True:
                for out in self.engine.step():
                    if out.request_id == rid:
                        yield out
                        if out.finished:
                            return
        finally:
            self.engine.abort(rid)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Renders messages with the model's chat template and tokenises them."""
        return self.tokenizer.encode(self.tokenizer.apply_chat_template(messages),
                                     add_special_tokens=False)

"""From a validated HTTP request to a `Job`: prompts as token ids, one `SamplingParams` per
choice, and the checks OpenAI clients expect before any work starts (unsupported fields,
context window, `n` bounds). Raises `APIError` (4xx) naming the field."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tightfit.engine.sampling_params import SamplingParams
from tightfit.errors import TightfitError
from tightfit.server import protocol as P
from tightfit.server.errors import APIError, param_of

if TYPE_CHECKING:
    from tightfit.server.serving import ServingContext

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True)
class Job:
    chat: bool
    prompts: list[list[int]]
    params: list[SamplingParams]  # one per choice, prompt-major: choice i uses prompt i // n
    n: int
    priority: int
    stream: bool
    include_usage: bool

    @property
    def prompt_param(self) -> str:
        return "messages" if self.chat else "prompt"

    def seqs(self) -> list[tuple[list[int], SamplingParams]]:
        return [(self.prompts[i // self.n], p) for i, p in enumerate(self.params)]


def completion_job(ctx: ServingContext, req: P.CompletionRequest) -> Job:
    _unsupported({
        "echo": req.echo, "suffix": bool(req.suffix), "logprobs": bool(req.logprobs),
        "best_of": req.best_of not in (None, req.n), **_common_unsupported(req)})
    prompts = [_encode(ctx, p) for p in _prompt_list(req.prompt)]
    return _job(ctx, req, prompts, chat=False,
                max_tokens=req.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS)


def chat_job(ctx: ServingContext, req: P.ChatCompletionRequest) -> Job:
    fmt = (req.response_format or {}).get("type", "text")
    _unsupported({"logprobs": bool(req.logprobs), "top_logprobs": bool(req.top_logprobs),
                  "tools": bool(req.tools), "response_format": fmt != "text",
                  **_common_unsupported(req)})
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    try:
        ids = ctx.tokenizer.encode_chat(messages)
    except Exception as exc:  # template errors of any kind are the request's fault
        raise APIError(400, f"messages could not be rendered with the model's chat template: "
                       f"{exc}", param="messages") from exc
    max_tokens = req.max_completion_tokens or req.max_tokens
    return _job(ctx, req, [ids], chat=True, max_tokens=max_tokens)


def _common_unsupported(req: Any) -> dict[str, bool]:
    return {"presence_penalty": bool(req.presence_penalty),
            "frequency_penalty": bool(req.frequency_penalty), "logit_bias": bool(req.logit_bias)}


def _unsupported(flags: dict[str, bool]) -> None:
    for name, used in flags.items():
        if used:
            raise APIError(400, f"{name} is not supported by this server: leave it out",
                           param=name, code="unsupported_parameter")


def _prompt_list(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    return list(prompt)


def _encode(ctx: ServingContext, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, list):
        return prompt
    try:
        ids = ctx.tokenizer.encode(prompt)
    except Exception as exc:
        raise APIError(400, f"prompt could not be tokenized: {exc}", param="prompt") from exc
    if not ids:
        raise APIError(400, "prompt is empty: give at least one token of text", param="prompt")
    return list(ids)


def _job(ctx: ServingContext, req: Any, prompts: list[list[int]], chat: bool,
         max_tokens: int | None) -> Job:
    sequences = len(prompts) * req.n
    if req.n > ctx.config.max_n:
        raise APIError(400, f"n={req.n} is more than this server allows ({ctx.config.max_n})",
                       param="n")
    if sequences > ctx.loop.capacity:
        raise APIError(400, f"this request needs {sequences} sequences (prompts x n) but the "
                       f"server holds at most {ctx.loop.capacity}", param="n")
    param = "messages" if chat else "prompt"
    params = []
    for ids in prompts:
        budget = _check_context(ctx, len(ids), max_tokens, param)
        params += [_params(req, budget, i) for i in range(req.n)]
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return Job(chat=chat, prompts=prompts, params=params, n=req.n, priority=req.priority,
               stream=req.stream, include_usage=include_usage)


def _check_context(ctx: ServingContext, prompt_len: int, max_tokens: int | None,
                   param: str) -> int:
    """Returns max_tokens (defaulting to the rest of the context) once prompt + output fit."""
    limit = ctx.context_len
    if prompt_len >= limit:
        raise APIError(400, f"the {param} has {prompt_len} tokens but this model's context is "
                       f"{limit} tokens: shorten it", param=param, code="context_length_exceeded")
    if max_tokens is None:
        return limit - prompt_len
    if prompt_len + max_tokens > limit:
        raise APIError(400, f"max_tokens={max_tokens} plus the {prompt_len} tokens of the "
                       f"{param} exceed this model's context of {limit} tokens: ask for at most "
                       f"{limit - prompt_len}", param="max_tokens",
                       code="context_length_exceeded")
    return max_tokens


def _params(req: Any, max_tokens: int, choice: int) -> SamplingParams:
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=max(0, req.top_k or 0),
            seed=None if req.seed is None else req.seed + choice, stop=stop,
            ignore_eos=req.ignore_eos)
    except TightfitError as exc:
        raise APIError(400, str(exc), param=param_of(str(exc))) from exc

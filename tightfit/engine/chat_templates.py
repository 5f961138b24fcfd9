"""Renders chat templates (Jinja2, sandboxed, HF-compatible environment) and holds the built-in
templates used when a model file carries none. Renders text only; tokenising is the tokenizer's job.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tightfit.errors import ModelFileError, RequestError

# Gemma 1-3 chat format. Gemma has no system role: a system message is prepended to the first
# user turn, separated by a blank line. The assistant role is called "model".
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<start_of_turn>model\n' }}"
    "{%- endif -%}"
)

# ChatML (<|im_start|>role ... <|im_end|>): the fallback for template-less models.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- endif -%}"
)

_GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})


def builtin_template(architecture: str) -> str:
    """The template to use for `architecture` when the model file has none."""
    return GEMMA_TEMPLATE if architecture.lower() in _GEMMA_ARCHITECTURES else CHATML_TEMPLATE


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes '<', '>' and '&', which would corrupt prompts; HF overrides
    # it the same way, so templates written for HF render identically here.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(template: str) -> jinja2.Template:
    """Compiles `template` in the environment HF uses (trim_blocks, lstrip_blocks, loopcontrols)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ModelFileError(f"the model's chat template is not valid Jinja (line {exc.lineno}: "
                             f"{exc.message}); pass a corrected template") from exc


def render_template(template: str, messages: list[dict[str, Any]], add_generation_prompt: bool,
                    **variables: Any) -> str:
    """Renders `template`; `raise_exception` in it or a bad message becomes RequestError."""
    compiled = compile_template(template)
    try:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               **variables)
    except jinja2.TemplateError as exc:
        raise RequestError(f"the chat template rejected the conversation: {exc}") from exc
    except (TypeError, KeyError, IndexError) as exc:
        raise RequestError(f"the chat template could not render the conversation "
                           f"({type(exc).__name__}: {exc}); check the messages' roles and "
                           f"contents") from exc

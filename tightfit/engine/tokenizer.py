"""Text <-> token ids for GGUF models (byte-level BPE and SentencePiece-style BPE vocabularies) and
HF tokenizer.json directories, built on the `tokenizers` library; also chat templates and
streaming-safe decoding. Unigram (T5) and WordPiece vocabularies in GGUF files are not supported.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _Backend

from tightfit.engine.chat_templates import builtin_template, render_template
from tightfit.engine.loader.gguf import GGUFFile
from tightfit.errors import ModelFileError, RequestError, UnsupportedModelError

log = logging.getLogger(__name__)

# llama.cpp token types (tokenizer.ggml.token_type).
_CONTROL = 3
_USER_DEFINED = 4

_SPIECE_SPACE = "\u2581"  # SentencePiece's visible space, "▁"

# Text of tokens that end a turn; they stop generation when the vocabulary marks them special.
_END_OF_TURN_TEXTS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                      "<|endoftext|>", "<|end_of_text|>")

# Pre-tokenizer split patterns of byte-level BPE vocabularies, keyed by tokenizer.ggml.pre. They
# reproduce the regexes the vocabularies were trained with (as llama.cpp applies them).
_LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLIT_PATTERNS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"),
                    _LLAMA3_PATTERN),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2_PATTERN),
}
# Vocabularies trained with every digit isolated before the GPT-2 regex runs.
_DIGIT_SPLIT_PRES = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell",
                               "exaone", "minerva"})
# Vocabularies that use the plain GPT-2 regex.
_GPT2_PRES = frozenset({"", "default", "gpt2", "gpt-2", "mpt", "olmo", "jais"})

_GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3"})

_MAX_CHAR_BYTES = 4  # longest UTF-8 sequence


class Tokenizer:
    """Encodes, decodes and renders chats for one model.

    Build with `from_gguf` or `from_pretrained_dir`. `encode` adds BOS when the model wants one,
    unless the text already starts with the BOS token (as chat templates such as Gemma's write
    it), so `encode(apply_chat_template(...))` never yields a doubled BOS; `encode_chat` does both.
    """

    def __init__(self, backend: _Backend, *, bos_token_id: int | None, eos_token_id: int | None,
                 add_bos_token: bool, add_eos_token: bool = False,
                 chat_template: str | None, architecture: str = "",
                 extra_stop_ids: Iterable[int] = (), vocab_size: int | None = None) -> None:
        self._backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.add_bos_token = add_bos_token and bos_token_id is not None
        self.add_eos_token = add_eos_token and eos_token_id is not None
        self.architecture = architecture
        self.vocab_size: int = vocab_size or backend.get_vocab_size(with_added_tokens=True)
        # Without a template of its own the model gets the built-in one for its architecture.
        self.has_own_chat_template = bool(chat_template)
        self.chat_template: str = chat_template or builtin_template(architecture)
        self._special_ids = frozenset(i for i, tok in backend.get_added_tokens_decoder().items()
                                      if tok.special)
        self.stop_token_ids: frozenset[int] = self._find_stop_ids(extra_stop_ids)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, gguf_file: GGUFFile) -> Tokenizer:
        """Builds the tokenizer a GGUF file describes (tokenizer.ggml.* metadata)."""
        meta = gguf_file.metadata
        kind = meta.get("tokenizer.ggml.model")
        tokens = gguf_file.array("tokenizer.ggml.tokens")
        if not tokens:
            raise ModelFileError(f"{str(gguf_file.path)!r} has no tokenizer.ggml.tokens; it does "
                                 "not carry a tokenizer")
        types = _checked_array(gguf_file, "tokenizer.ggml.token_type", len(tokens))
        architecture = gguf_file.architecture
        backend, vocab = _gguf_backend(gguf_file, kind, tokens)
        special_ids = [meta.get(f"tokenizer.ggml.{name}_token_id")
                       for name in ("bos", "eos", "unknown", "padding")]
        _add_gguf_added_tokens(backend, vocab, tokens, types, byte_level=kind == "gpt2",
                               fallback_special_ids=[i for i in special_ids if i is not None])
        # llama.cpp adds BOS to SentencePiece vocabularies unless the file says otherwise.
        add_bos = meta.get("tokenizer.ggml.add_bos_token", kind == "llama")
        extra_stops = [meta.get(f"tokenizer.ggml.{name}_token_id") for name in ("eot", "eom")]
        return cls(backend, bos_token_id=_opt_int(meta.get("tokenizer.ggml.bos_token_id")),
                   eos_token_id=_opt_int(meta.get("tokenizer.ggml.eos_token_id")),
                   add_bos_token=bool(add_bos),
                   add_eos_token=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
                   chat_template=meta.get("tokenizer.chat_template"), architecture=architecture,
                   extra_stop_ids=[i for i in extra_stops if i is not None],
                   vocab_size=len(tokens))

    @classmethod
    def from_pretrained_dir(cls, path: str | Path) -> Tokenizer:
        """Loads an HF-layout directory: tokenizer.json plus, when present, tokenizer_config.json,
        chat_template.jinja / chat_template.json, config.json and generation_config.json."""
        root = Path(path).expanduser()
        tokenizer_json = root / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise ModelFileError(f"{str(root)!r} has no tokenizer.json (only the fast-tokenizer "
                                 "format is supported; convert tokenizer.model with HF first)")
        try:
            backend = _Backend.from_file(str(tokenizer_json))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
            raise ModelFileError(f"{str(tokenizer_json)!r} is not a readable tokenizer.json "
                                 f"({exc})") from exc
        config = _read_json(root / "tokenizer_config.json")
        bos_id = _special_id(backend, config.get("bos_token"))
        eos_id = _special_id(backend, config.get("eos_token"))
        add_bos = config.get("add_bos_token")
        if add_bos is None:  # no flag: follow what tokenizer.json's post-processor does
            add_bos = bos_id is not None and _post_processor_adds(backend, bos_id)
        model_config = _read_json(root / "config.json")
        generation = _read_json(root / "generation_config.json")
        extra_stops = (_as_id_list(generation.get("eos_token_id"))
                       + _as_id_list(model_config.get("eos_token_id")))
        if eos_id is None and extra_stops:
            eos_id = extra_stops[0]
        return cls(backend, bos_token_id=bos_id, eos_token_id=eos_id, add_bos_token=bool(add_bos),
                   add_eos_token=bool(config.get("add_eos_token", False)),
                   chat_template=_read_dir_chat_template(root, config),
                   architecture=str(model_config.get("model_type", "")),
                   extra_stop_ids=extra_stops)

    # -- encoding / decoding ------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Special-token text such as "<|im_start|>" becomes its single id.

        With add_special_tokens, BOS is prepended when the model wants it and the text does not
        already start with it; EOS is appended only for models that ask for it.
        """
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if not add_special_tokens:
            return ids
        if self.add_bos_token and (not ids or ids[0] != self.bos_token_id):
            ids.insert(0, self.bos_token_id)
        if self.add_eos_token:
            ids.append(self.eos_token_id)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def incremental_decoder(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        return IncrementalDecoder(self, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def is_special(self, token_id: int) -> bool:
        """True for control tokens (those `decode(skip_special_tokens=True)` drops)."""
        return token_id in self._special_ids

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_token_id is None else self._backend.id_to_token(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_token_id is None else self._backend.id_to_token(self.eos_token_id)

    @property
    def backend(self) -> _Backend:
        """The underlying `tokenizers.Tokenizer` (for batch encoding or inspection)."""
        return self._backend

    # -- chat ---------------------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            add_generation_prompt: bool = True, **variables: Any) -> str:
        """Renders `messages` ([{"role", "content"}, ...]) with the model's chat template.

        Content given as OpenAI-style parts ([{"type": "text", "text": ...}]) is joined into one
        string first. Extra keyword arguments become template variables (e.g. tools=...).
        """
        specials = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or ""}
        return render_template(self.chat_template, _normalise_messages(messages),
                               add_generation_prompt, **{**specials, **variables})

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    **variables: Any) -> list[int]:
        """Token ids of the rendered chat, with exactly one BOS when the model wants one."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, **variables))

    # -- internals ----------------------------------------------------------------------------

    def _find_stop_ids(self, extra: Iterable[int]) -> frozenset[int]:
        stops = {i for i in extra if 0 <= i < self.vocab_size}
        if self.eos_token_id is not None:
            stops.add(self.eos_token_id)
        for text in _END_OF_TURN_TEXTS:
            token_id = self._backend.token_to_id(text)
            # Only a special token ends a turn; a plain vocabulary entry is ordinary text.
            if token_id is not None and token_id in self._special_ids:
                stops.add(token_id)
        return frozenset(stops)


class IncrementalDecoder:
    """Turns a stream of token ids into printable text deltas.

    A delta never ends inside a UTF-8 character (byte-level or byte-fallback pieces are held
    back until complete), and the concatenated deltas plus `flush()` equal
    `tokenizer.decode(all_ids)`. Text is re-decoded over a short window only, so cost per token
    stays constant.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._decode = tokenizer.decode
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._start = 0            # window = self._ids[self._start:]
        self._window_text = ""     # decoded text of the window that has been emitted
        self._emitted_len = 0      # characters emitted in total
        self._held = 0             # tokens pushed since text was last emitted

    @property
    def token_ids(self) -> list[int]:
        return list(self._ids)

    def push(self, token_id: int) -> str:
        """Adds one token; returns the text it completes (often '', e.g. mid-character)."""
        self._ids.append(token_id)
        self._held += 1
        text = self._decode(self._ids[self._start:], skip_special_tokens=self._skip)
        # U+FFFD at the end means an incomplete UTF-8 sequence: wait for the next bytes. A
        # character has at most 4 bytes, so after more held tokens than that it is really invalid.
        incomplete = text.endswith("\ufffd") and self._held <= _MAX_CHAR_BYTES
        if incomplete or not text.startswith(self._window_text):
            return ""
        self._held = 0
        delta = text[len(self._window_text):]
        self._window_text = text
        self._emitted_len += len(delta)
        self._slide()
        return delta

    def flush(self) -> str:
        """Returns whatever is still held back (e.g. an incomplete character at the end)."""
        full = self._decode(self._ids, skip_special_tokens=self._skip)
        rest = full[self._emitted_len:]
        self._emitted_len = len(full)
        self._start, self._window_text, self._held = len(self._ids), "", 0
        return rest

    def _slide(self) -> None:
        # Restart the window at the newest token when that token decodes cleanly on its own:
        # decoders that treat the first token specially (leading-space strip, Metaspace) then
        # affect only text that was already emitted, in both the window and its extension.
        last = self._ids[-1]
        alone = self._decode([last], skip_special_tokens=self._skip)
        if alone and not alone.endswith("\ufffd") and self._window_text.endswith(alone):
            self._start = len(self._ids) - 1
            self._window_text = alone


# -- building backends from GGUF metadata ----------------------------------------------------


def _gguf_backend(gguf_file: GGUFFile, kind: Any,
                  tokens: list[str]) -> tuple[_Backend, dict[str, int]]:
    """The BPE backend for tokenizer.ggml.model `kind`, and its vocabulary."""
    meta = gguf_file.metadata
    merges = gguf_file.array("tokenizer.ggml.merges")
    if kind == "gpt2":
        return _byte_level_backend(tokens, merges or [], str(meta.get("tokenizer.ggml.pre", "")))
    if kind != "llama":
        raise UnsupportedModelError(
            f"{str(gguf_file.path)!r} has tokenizer.ggml.model={kind!r}; supported are 'gpt2' "
            "(byte-level BPE) and 'llama' (SentencePiece BPE)")
    gemma = gguf_file.architecture in _GEMMA_ARCHITECTURES
    # Scores only rank merges, and only where the file has none and is not Gemma.
    scores = None if merges or gemma else _checked_array(gguf_file, "tokenizer.ggml.scores",
                                                         len(tokens))
    if not (merges or gemma or scores):
        raise ModelFileError(f"{str(gguf_file.path)!r} has neither tokenizer.ggml.merges nor "
                             "tokenizer.ggml.scores; its merges cannot be rebuilt")
    return _sentencepiece_backend(
        tokens, merges, scores, gemma=gemma,
        add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
        unk_id=meta.get("tokenizer.ggml.unknown_token_id"))


def _byte_level_backend(tokens: list[str], merges: list[str],
                        pre: str) -> tuple[_Backend, dict[str, int]]:
    """Byte-level BPE (GPT-2 style) with the pre-tokenizer of `pre` (tokenizer.ggml.pre); also
    returns the vocabulary as the BPE model spells it."""
    alphabet = _byte_alphabet()
    charset = set(alphabet)
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        # Some converters store tokens as raw text; the BPE model needs the byte-level spelling.
        if not set(token) <= charset:
            token = "".join(alphabet[b] for b in token.encode("utf-8"))
        vocab[token] = index
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = _Backend(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    backend.pre_tokenizer = _byte_level_pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    return backend, vocab


def _byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLIT_PRES:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _SPLIT_PATTERNS:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_PATTERNS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    if pre not in _GPT2_PRES:
        log.warning("unknown tokenizer.ggml.pre %r; using the GPT-2 split, which may tokenise "
                    "some text differently from the original tokenizer", pre)
    return byte_level


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in character for each byte value (index = byte)."""
    # Printable Latin-1 bytes stand for themselves; the rest map to code points from 256 up.
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    kept = set(keep)
    chars, extra = [], 0
    for byte in range(256):
        if byte in kept:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def _sentencepiece_backend(tokens: list[str], merges: list[str] | None,
                           scores: list[float] | None, *, gemma: bool, add_space_prefix: bool,
                           unk_id: int | None) -> tuple[_Backend, dict[str, int]]:
    """SentencePiece-style BPE with byte fallback (Llama, Gemma); also returns the vocabulary as
    the BPE model spells it. Without merges in the file they are rebuilt from the vocabulary."""
    if gemma:
        # Gemma files spell whitespace-only tokens with real spaces, but text reaches the model
        # with spaces already turned into "▁"; respell so such tokens (and merges) can match.
        tokens = [_SPIECE_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {token: index for index, token in enumerate(tokens)}
    if merges:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        # Gemma's scores do not follow its merge order but its token order does.
        pairs = _merges_by_token_order(tokens, vocab) if gemma else _merges_by_score(
            tokens, scores or [], vocab)
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    backend = _Backend(models.BPE(vocab=vocab, merges=pairs, unk_token=unk, fuse_unk=True,
                                  byte_fallback=True))
    steps = [decoders.Replace(_SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        # SentencePiece's dummy prefix, as Llama 2's tokenizer.json and llama.cpp apply it: "▁"
        # before every run of text (also one that starts with a space, and after each special
        # token). The decoder removes the first one again.
        backend.normalizer = normalizers.Sequence([normalizers.Prepend(_SPIECE_SPACE),
                                                   normalizers.Replace(" ", _SPIECE_SPACE)])
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    else:
        backend.normalizer = normalizers.Replace(" ", _SPIECE_SPACE)
    backend.decoder = decoders.Sequence(steps)
    return backend, vocab


def _merges_by_token_order(tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a token into two vocabulary entries, ranked by the token's position, and for
    one token longest left part first (the order HF's converter produces)."""
    pairs: list[tuple[str, str]] = []
    append = pairs.append
    for index, token in enumerate(tokens):
        if vocab[token] != index:  # a duplicate spelling: only its last id is reachable
            continue
        for cut in range(len(token) - 1, 0, -1):
            right = token[cut:]
            if right in vocab:
                left = token[:cut]
                if left in vocab:
                    append((left, right))
    return pairs


def _merges_by_score(tokens: list[str], scores: list[float],
                     vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Merges implied by a SentencePiece vocabulary: a split of token t into two vocabulary
    entries ranks by t's score (higher first), then longer left, then longer right part."""
    score_of = dict(zip(tokens, scores))
    ranked = []
    for token, score in score_of.items():
        splits = [(token[:cut], token[cut:]) for cut in range(1, len(token))
                  if token[:cut] in vocab and token[cut:] in vocab]
        splits.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        ranked.extend((score, left, right) for left, right in splits)
    ranked.sort(key=lambda item: (item[0], len(item[1]), len(item[2])), reverse=True)
    return [(left, right) for _, left, right in ranked]


def _add_gguf_added_tokens(backend: _Backend, vocab: dict[str, int], tokens: list[str],
                           types: list[int] | None, *, byte_level: bool,
                           fallback_special_ids: list[int]) -> None:
    """Registers control tokens as special and user-defined tokens as plain added tokens, so
    their text in the input is matched whole instead of being cut into pieces. A user-defined
    token is added only under the spelling the BPE model knows it by."""
    if types is None:  # old files without token types: at least keep BOS/EOS/UNK/PAD whole
        types = [0] * len(tokens)
        for token_id in fallback_special_ids:
            if 0 <= token_id < len(types):
                types[token_id] = _CONTROL
    charset = set(_byte_alphabet()) if byte_level else None
    control, user = [], []
    for token, kind in zip(tokens, types):
        if kind == _CONTROL and (charset is None or set(token) <= charset):
            # A "control" token outside the byte alphabet is a converter mislabel: its id
            # holds a byte-level spelling, not this text.
            control.append(AddedToken(token, normalized=False, special=True))
        elif kind == _USER_DEFINED and token in vocab:
            user.append(AddedToken(token, normalized=False, special=False))
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)


# -- small helpers ---------------------------------------------------------------------------


def _checked_array(gguf_file: GGUFFile, key: str, length: int) -> list[Any] | None:
    values = gguf_file.array(key)
    if values is not None and len(values) != length:
        raise ModelFileError(f"{str(gguf_file.path)!r}: {key} has {len(values)} entries but "
                             f"tokenizer.ggml.tokens has {length}; the file is inconsistent")
    return values


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _normalise_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise RequestError(f"messages must be a list of {{'role', 'content'}} dicts, "
                           f"got {type(messages).__name__}")
    out = []
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"message {position} must be a dict with a string 'role', "
                               f"got {message!r}")
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(_text_part(part, position) for part in content)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise RequestError(f"message {position} has content of type "
                               f"{type(content).__name__}; expected a string or text parts")
        out.append({**message, "content": content})
    return out


def _text_part(part: Any, position: int) -> str:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return part["text"]
    raise RequestError(f"message {position} has a content part {part!r}; only "
                       "{'type': 'text', 'text': ...} parts are supported")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{str(path)!r} is not valid JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}


def _read_dir_chat_template(root: Path, config: dict[str, Any]) -> str | None:
    # transformers >= 4.43 may write the template to its own file instead of the config.
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = _read_json(root / "chat_template.json").get("chat_template") or config.get(
        "chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _special_id(backend: _Backend, token: Any) -> int | None:
    if isinstance(token, dict):  # serialised AddedToken
        token = token.get("content")
    return backend.token_to_id(token) if isinstance(token, str) else None


def _post_processor_adds(backend: _Backend, token_id: int) -> bool:
    with_specials = backend.encode("a", add_special_tokens=True).ids
    return bool(with_specials) and with_specials[0] == token_id


def _as_id_list(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []

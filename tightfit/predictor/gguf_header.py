"""A local GGUF file as a predictor input: the model's shape and its tensors' stored sizes, read
from the file's header and tensor table; no weight is read.

A row that names a file (`"model": {"path": ".../Qwen2.5-14B-Instruct-Q4_K_M.gguf"}`) gets the
shape llama.cpp will load and the bytes the file holds, where a name alone gets the table's shape
and the preset's average bits. What a header does not say (which layers attend to a window, what
a hybrid's other layers run, a recurrent layer's state) comes from the architecture table when
the file's name finds its family there, else from the keys llama.cpp's loader reads for it.

Read with `tightfit.gguf_file` (the engine's torch-free reader, ~0.5 s for Gemma 3 270M's
262,144-token vocabulary, where gguf's GGUFReader takes ~11 s).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tightfit.predictor import architectures, formats

# a hybrid's non-attention layers by llama.cpp architecture (ModelSpec.mixer)
_ARCH_MIXER = {
    "granitehybrid": "mamba2", "nemotron_h": "mamba2", "nemotron_h_moe": "mamba2",
    "mamba2": "mamba2", "qwen3next": "gated_deltanet", "qwen35": "gated_deltanet",
    "qwen35moe": "gated_deltanet", "kimi-linear": "gated_deltanet", "lfm2": "short_conv",
    "lfm2moe": "short_conv", "jamba": "mamba", "mamba": "mamba", "plamo2": "mamba",
    "falcon-h1": architectures.PARALLEL_HYBRID,
}
# tensors a token looks up rather than multiplies, kept apart from the decoder's average
_TOKEN_EMBD, _OUTPUT, _PER_LAYER = "token_embd.weight", "output.weight", \
    "per_layer_token_embd.weight"


@dataclass(frozen=True)
class GGUFModel:
    path: str
    arch: str
    name: str                  # what the architecture table is asked for the family's traits
    quant: str | None          # the preset `general.file_type` names, formats' spelling
    spec: architectures.ModelSpec
    decoder_bits: float        # stored bits a weight averages outside the embedding tables
    token_embd_bits: float
    head_bits: float           # the output head's (a tied file: the token embedding's)
    traits_from_table: bool    # window / hybrid traits came from the table


class GGUFHeaderError(ValueError):
    """The file is missing, not a GGUF file, or lacks a key the shape needs."""


def _ints(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _first(value: Any, default: int) -> int:
    """A header value's first integer (a per-layer list's first layer), or `default`."""
    return (_ints(value) or [default])[0]


def _quant_name(file_type: Any) -> str | None:
    """`general.file_type` (llama.cpp's llama_ftype) as formats spells the preset."""
    import gguf

    try:
        name = gguf.LlamaFileType(int(file_type)).name
    except (TypeError, ValueError):
        return None
    name = name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()
    name = {"f32": "fp32", "f16": "fp16", "mxfp4_moe": "mxfp4"}.get(name, name)
    return name if formats.is_known(name) else None


def read(path: str | Path) -> GGUFModel:
    """The model a GGUF file holds; GGUFHeaderError says what is wrong with the file."""
    from tightfit.errors import ModelFileError
    from tightfit.gguf_file import GGUFFile

    p = Path(path).expanduser()
    if not p.is_file():
        raise GGUFHeaderError(f"no file at {str(p)!r}")
    try:
        reader = GGUFFile(p)
    except ModelFileError as exc:
        raise GGUFHeaderError(str(exc)) from None
    arch = reader.get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFHeaderError(f"{str(p)!r} names no general.architecture")

    key = reader.arch_get

    elems: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    shapes: dict[str, list[int]] = {}
    experts = total = 0
    fused_qkv = False
    for t in reader.tensors():
        n, b = math.prod(t.shape), int(t.data.nbytes)
        total += n
        group = t.name if t.name in (_TOKEN_EMBD, _OUTPUT, _PER_LAYER) else "decoder"
        elems[group] = elems.get(group, 0) + n
        nbytes[group] = nbytes.get(group, 0) + b
        shapes[t.name] = [int(x) for x in t.shape]  # rows first: (vocab, hidden)
        if "_exps" in t.name:
            experts += n
        fused_qkv = fused_qkv or t.name.endswith("attn_qkv.weight")
    layers = _ints(key("block_count"))
    hidden = _ints(key("embedding_length"))
    heads = [h for h in _ints(key("attention.head_count")) if h > 0]
    if not layers or not hidden or not heads or _TOKEN_EMBD not in shapes:
        raise GGUFHeaderError(f"{str(p)!r} ({arch}) lacks the block count, width, head count or "
                              "token embedding a shape needs")
    n_layers, width = layers[0], hidden[0]
    kv_per_layer = _ints(key("attention.head_count_kv")) or [max(heads)]
    kv_heads = max(kv_per_layer) or max(heads)
    # a per-layer list with zeros: the layers without K/V run something else (a hybrid)
    attn_layers = sum(1 for h in kv_per_layer if h > 0) if len(kv_per_layer) > 1 else 0
    interval = _ints(key("full_attention_interval"))
    if not attn_layers and interval and interval[0] > 1:
        attn_layers = n_layers // interval[0]
    head_dim = _first(key("attention.key_length"), width // max(heads))
    window, swa = _window(key, n_layers)
    full_kv = None
    swa_dim = _first(key("attention.key_length_swa"), 0)
    if sum(swa) and swa_dim > 0:  # window layers with K/V heads of their own (Gemma 4)
        per_layer = kv_per_layer if len(kv_per_layer) == n_layers else kv_per_layer[:1] * n_layers
        kv_swa = max(h for h, w in zip(per_layer, swa) if w) or kv_heads
        kv_full = max((h for h, w in zip(per_layer, swa) if not w), default=kv_swa) or kv_swa
        full_kv = kv_full * head_dim / (kv_swa * swa_dim)
        kv_heads, head_dim = kv_swa, swa_dim
    mla = _first(key("attention.kv_lora_rank"), 0)
    if mla > 0:  # MLA as llama.cpp caches it: the latent + the rope part, V a view of K
        rope = _first(key("rope.dimension_count"), 64)
        kv_heads, head_dim = 1, (mla + rope) // 2
    n_expert = _first(key("expert_count"), 0)
    used = _first(key("expert_used_count"), 0)
    ffn = [f for f in _ints(key("feed_forward_length")) if f > 0]
    expert_ffn = _first(key("expert_feed_forward_length"), 0)
    inter = expert_ffn if n_expert > 1 and expert_ffn > 0 else (max(ffn) if ffn else 4 * width)
    active = total - (experts * (1 - used / n_expert) if n_expert > 1 and used > 0 else 0)
    vocab = shapes[_TOKEN_EMBD][0] if len(shapes[_TOKEN_EMBD]) > 1 else 0

    name = p.name
    table = None
    for candidate in (p.name, f"{reader.get('general.basename') or ''}-"
                      f"{reader.get('general.size_label') or ''}",
                      str(reader.get("general.name") or "")):
        table = architectures.lookup(candidate) if candidate.strip("-") else None
        if table is not None:
            name = candidate
            break
    spec = architectures.ModelSpec(
        name=name, params_b=total / 1e9, active_params_b=active / 1e9, n_layers=n_layers,
        hidden_size=width, n_heads=max(heads), n_kv_heads=kv_heads, vocab_size=vocab,
        intermediate_size=inter, head_dim=head_dim, tied_embeddings=_OUTPUT not in shapes,
        expert_params_b=experts / 1e9 if experts else None,
        per_layer_embed_params_b=elems.get(_PER_LAYER, 0) / 1e9, fused_qkv=fused_qkv,
        kv_shared_layers=_first(key("attention.shared_kv_layers"), 0),
        trained_context=_first(key("context_length"), 0))
    if table is not None:  # the family's traits; the numbers are the file's
        spec = with_traits(spec, table, attn_layers)
    else:
        spec = _hybrid_from_arch(spec, arch, attn_layers, key)
    if sum(swa):  # a window the header lays out layer by layer is the file's own
        spec = replace(spec, sliding_window=window, sliding_layers=sum(swa),
                       full_kv_scale=full_kv if full_kv is not None else spec.full_kv_scale)

    def bits(group: str) -> float:
        return 8.0 * nbytes[group] / elems[group] if elems.get(group) else 0.0

    embd_bits = bits(_TOKEN_EMBD)
    return GGUFModel(str(p), arch, name, _quant_name(reader.get("general.file_type")), spec,
                     bits("decoder"), embd_bits, bits(_OUTPUT) or embd_bits,
                     table is not None)


def with_traits(spec: architectures.ModelSpec, table: architectures.ModelSpec,
                 attn_layers: int) -> architectures.ModelSpec:
    """The table's window, hybrid and loop traits on the file's numbers (the header's count
    of attending layers where it gives one)."""
    return replace(spec, sliding_window=table.sliding_window,
                   sliding_layers=min(table.sliding_layers, spec.n_layers),
                   full_kv_scale=table.full_kv_scale,
                   kv_shared_layers=spec.kv_shared_layers or table.kv_shared_layers,
                   attention_layers=min(attn_layers or table.attention_layers, spec.n_layers),
                   state_bytes_per_layer=table.state_bytes_per_layer, mixer=table.mixer,
                   layer_loops=table.layer_loops)


def _window(key: Any, n_layers: int) -> tuple[int, list[bool]]:
    """The header's window and which layers use it: a per-layer list
    (`attention.sliding_window_pattern`, Gemma 4's), or every Nth layer full; none without."""
    window = _first(key("attention.sliding_window"), 0)
    pattern = key("attention.sliding_window_pattern")
    if window <= 0 or pattern is None:
        return window, [False] * n_layers
    if isinstance(pattern, (list, tuple)):
        flags = [bool(v) for v in pattern][:n_layers]
        return window, flags + [False] * (n_layers - len(flags))
    every = _first(pattern, 0)
    return window, [every > 1 and (i + 1) % every != 0 for i in range(n_layers)]


def _hybrid_from_arch(spec: architectures.ModelSpec, arch: str, attn_layers: int,
                      key: Any) -> architectures.ModelSpec:
    """A family the table does not know: a hybrid's layers by its llama.cpp architecture, where
    the header says which layers attend, and their recurrent state from its `ssm.*` keys
    (Mamba / Mamba-2 d_state and inner width, Gated DeltaNet's heads; a short convolution's
    few KB not counted)."""
    mixer = _ARCH_MIXER.get(arch, "")
    if mixer and mixer != architectures.PARALLEL_HYBRID and not 0 < attn_layers < spec.n_layers:
        mixer = ""  # no way to tell which layers attend: taken as all
    d_state = _first(key("ssm.state_size"), 0)
    inner = _first(key("ssm.inner_size"), 0)
    groups = _first(key("ssm.group_count"), 1) or 1
    conv = _first(key("ssm.conv_kernel"), 4) or 4
    heads = _first(key("ssm.time_step_rank"), 0)
    state = 0.0
    if mixer == "gated_deltanet" and d_state and inner and heads:
        state = architectures.gated_deltanet_state(heads, groups, d_state, inner // heads, conv)
    elif mixer in ("mamba", "mamba2") and d_state and inner:
        state = architectures.mamba_state(spec.hidden_size, d_state, mixer == "mamba2",
                                          inner / spec.hidden_size, groups, conv)
    return replace(spec, attention_layers=attn_layers if mixer else 0, mixer=mixer,
                   state_bytes_per_layer=state if mixer else 0.0)

"""Weight and KV-cache storage formats: bits per weight as actually stored, and name parsing.

Figures are storage sizes (block scales included), not compute precision. In BITS_PER_WEIGHT a
mixed GGUF preset (Q4_K_M, Q5_K_M, ...) is its average over a typical 7B file; for a model of
known shape `mixed_preset_bits` types each tensor group as llama-quantize does. Does not read
files: `native` needs the caller to name the real format.
"""
from __future__ import annotations

import re
from typing import Any

from tightfit.errors import TightfitError

# Stored bits per weight. GGUF block formats: (block bytes * 8) / block weights.
BITS_PER_WEIGHT: dict[str, float] = {
    "fp32": 32.0, "f32": 32.0, "fp16": 16.0, "f16": 16.0, "bf16": 16.0,
    "q8_0": 8.5, "q8_1": 9.0, "q6_k": 6.5625, "q5_0": 5.5, "q5_1": 6.0,
    "q5_k": 5.5, "q5_k_s": 5.54, "q5_k_m": 5.69, "q4_0": 4.5, "q4_1": 5.0,
    "q4_k": 4.5, "q4_k_s": 4.58, "q4_k_m": 4.85, "q4_k_l": 5.1, "q4_k_xl": 5.0,
    "q3_k": 3.4375, "q3_k_s": 3.5, "q3_k_m": 3.91, "q3_k_l": 4.27,
    "q2_k": 2.625, "q2_k_s": 2.9, "q2_k_m": 3.35, "q2_k_xl": 3.2,
    "iq4_nl": 4.5, "iq4_xs": 4.25, "iq3_s": 3.44, "iq3_m": 3.66, "iq3_xxs": 3.06,
    "iq2_xxs": 2.06, "iq2_xs": 2.31, "iq2_s": 2.5, "iq2_m": 2.7, "iq1_s": 1.56, "iq1_m": 1.75,
    "tq1_0": 1.69, "tq2_0": 2.06,
    "mxfp4": 4.25, "nvfp4": 4.5, "mxfp8": 8.25, "fp8": 8.0,
    # tightfit's own names (int8: per-row fp32 scale is negligible; int4: asymmetric, a bf16
    # scale and a bf16 zero point a group, as Int4Linear stores them).
    "int8": 8.0, "int4-g32": 5.0, "int4-g64": 4.5, "int4-g128": 4.25,
    "int4-awq-g32": 5.0, "int4-awq-g64": 4.5, "int4-awq-g128": 4.25,
    # Other engines' names seen in the measurement tables.
    "4bit": 4.5, "8bit": 8.5, "awq": 4.25, "awq-int4": 4.25, "gptq": 4.25, "int4": 4.25,
    # bitsandbytes 4-bit (HF Transformers' load_in_4bit): 4 bits + an fp32 absmax per 64 values
    "nf4": 4.5, "fp4": 4.5,
}

# Formats HF Transformers keeps quantised in memory: bitsandbytes 4-/8-bit, GPTQ and AWQ int4
# checkpoints, fp8 checkpoints. It quantises the decoder's linear layers only (the embedding and
# the output head stay in the compute dtype). A GGUF file it dequantises into float tensors.
HF_HELD_QUANTISED = frozenset({"4bit", "nf4", "fp4", "8bit", "int8", "int4", "gptq", "awq",
                               "awq-int4", "fp8"})

# Bytes per stored KV element.
KV_BYTES: dict[str, float] = {
    "fp32": 4.0, "f32": 4.0, "fp16": 2.0, "f16": 2.0, "bf16": 2.0,
    "q8_0": 1.0625, "q4_0": 0.5625, "q4_1": 0.625, "q5_0": 0.6875, "q5_1": 0.75,
    "int8": 1.0, "fp8": 1.0, "int4": 0.5625,
}

# Float weight formats: an engine multiplies them in a float GEMV / GEMM (torch, BLAS) or, in
# ggml-style engines, in its own float SIMD loops; every other format goes through block or
# integer dot-product kernels.
HALF_FLOATS = ("f16", "fp16", "bf16")
FLOAT_WEIGHTS = ("f32", "fp32") + HALF_FLOATS
_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}
_GGUF_IN_NAME = re.compile(
    r"(?:^|[-_.:])((?:UD-)?(?:I?Q\d(?:_[0-9A-Z]+)*|F16|BF16|F32|MXFP4|NVFP4|MXFP8))(?=$|[-_.])",
    re.IGNORECASE,
)


def normalise(name: str) -> str:
    """Lower-case canonical spelling of a format name (`Q4_K_M` -> `q4_k_m`)."""
    key = name.strip().lower().replace(" ", "")
    key = key[3:] if key.startswith("ud-") else key
    return _ALIASES.get(key, key)


def bits_per_weight(name: str) -> float:
    """Stored bits per weight of a format; TightfitError names the value if unknown."""
    key = normalise(name)
    if key == "native":
        raise TightfitError(
            "quant 'native' depends on the model file; give the stored format instead "
            "(for example 'Q4_1' or 'Q4_K_M')"
        )
    if key not in BITS_PER_WEIGHT:
        raise TightfitError(
            f"unknown quant {name!r}; use one of {', '.join(sorted(_public_names()))}"
        )
    return BITS_PER_WEIGHT[key]


# llama.cpp's quantizer (`tensor_type_fallback` in llama-quant.cpp) stores a tensor whose rows
# are not a whole number of 256-weight blocks in a 32-block type instead: Q4_K -> Q5_0, Q5_K ->
# Q5_1, Q6_K -> Q8_0, Q2_K / Q3_K -> Q4_0, the 256-block IQ types -> IQ4_NL. The bits the
# affected tensors of a preset take then (Q4_K_M / Q5_K_M: their Q6_K tensors go to Q8_0 too).
_K_FALLBACK_BITS: dict[str, float] = {
    "q4_k": 5.5, "q4_k_s": 5.5, "q4_k_m": 5.6, "q4_k_l": 5.8, "q4_k_xl": 5.7,
    "q5_k": 6.0, "q5_k_s": 6.0, "q5_k_m": 6.1, "q6_k": 8.5,
    "q3_k": 4.5, "q3_k_s": 4.5, "q3_k_m": 4.5, "q3_k_l": 4.6,
    "q2_k": 4.5, "q2_k_s": 4.5, "q2_k_m": 4.5, "q2_k_xl": 4.5,
    "iq4_xs": 4.5, "iq3_s": 4.5, "iq3_m": 4.5, "iq3_xxs": 4.5, "iq2_xxs": 4.5, "iq2_xs": 4.5,
    "iq2_s": 4.5, "iq2_m": 4.5, "iq1_s": 4.5, "iq1_m": 4.5,
}


# llama-quantize's types for a preset's two vocabulary-sized tensors (llama_tensor_get_type):
# the output head, or a tied token embedding (which is the head), at Q6_K; at Q8_0 where a row
# (the hidden size) is not a whole number of 256-weight blocks (SmolLM2 135M: 576, Gemma 3
# 270M: 640; both files here hold Q8_0) or the preset is Q8_0; at Q5_K in the 1-2-bit presets.
# An untied token embedding, only looked up, stays at the preset's base type (Q4_K in Q4_K_M;
# Q2_K / IQ3_S / Q4_K in the presets below), with the 32-block fallback on such rows.
_HEAD_Q6_K, _HEAD_Q8_0, _HEAD_Q5_K = 6.5625, 8.5, 5.5
_Q5_K_HEAD_PRESETS = frozenset({"iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq2_s", "iq2_m", "iq1_m"})
_EMBD_TYPE_OF_PRESET = {"iq2_xxs": "q2_k", "iq2_xs": "q2_k", "iq1_s": "q2_k", "iq1_m": "q2_k",
                        "iq2_s": "iq3_s", "iq2_m": "iq3_s", "iq3_xxs": "iq3_s",
                        "tq1_0": "q4_k", "tq2_0": "q4_k"}


def gguf_head_bits(preset: str, bits: float, hidden: int) -> float:
    """Bits of a GGUF preset's output head (`bits`: the preset's own on this model)."""
    if bits >= _HEAD_Q8_0 or hidden % 256:
        return max(bits, _HEAD_Q8_0)
    return _HEAD_Q5_K if normalise(preset) in _Q5_K_HEAD_PRESETS else max(bits, _HEAD_Q6_K)


def gguf_token_embd_bits(preset: str, bits: float, hidden: int) -> float:
    """Bits of a GGUF preset's untied token embedding: its base type (`Q4_K_M` -> Q4_K)."""
    key = normalise(preset)
    base = _EMBD_TYPE_OF_PRESET.get(key) or re.sub(r"(_k)_(?:s|m|l|xl)$", r"\1", key)
    if hidden % 256 and base in _K_FALLBACK_BITS:
        return _K_FALLBACK_BITS[base]
    return BITS_PER_WEIGHT.get(base, bits)


def shape_fallback_share(hidden: int, q_out: int, kv_out: int, inter: int) -> float:
    """Share of a decoder layer's weights in tensors whose rows (input features) are not a
    multiple of 256: Q, K, V, gate and up read `hidden` features, the output projection
    `q_out`, down `inter`."""
    reads_hidden = hidden * (q_out + 2 * kv_out + 2 * inter)
    reads_q, reads_inter = q_out * hidden, inter * hidden
    total = reads_hidden + reads_q + reads_inter
    affected = (reads_hidden * (hidden % 256 != 0) + reads_q * (q_out % 256 != 0)
                + reads_inter * (inter % 256 != 0))
    return affected / total if total else 0.0


def bits_for_shape(name: str, bits: float, share: float) -> float:
    """Average stored bits of a GGUF preset once `share` of the weights take the quantizer's
    32-block fallback (Gemma 3 270M Q4_K_M, hidden 640: 65% of the body in Q5_0 / Q8_0, 5.43
    bits a weight in the file against the preset's 4.85)."""
    fallback = _K_FALLBACK_BITS.get(normalise(name))
    if fallback is None or share <= 0 or fallback <= bits:
        return bits
    return bits + share * (fallback - bits)


# llama-quantize's K-quant presets (llama_tensor_get_type in the vendored llama-quant.cpp) do
# not store every decoder weight in the preset's base type. attn_v (and the tensors typed as
# it: a fused attn_qkv, MLA's attn_kv_b), ffn_down and attn_output take other types by layer:
# Q4_K_M / Q5_K_M put attn_v and ffn_down in Q6_K in the layers use_more_bits picks (about
# half); Q3_K_M puts attn_v in Q5_K in the first 2 layers and Q4_K after, ffn_down in Q5_K in
# the first 1/16 and Q4_K after, attn_output in Q4_K; and so on below. What a preset averages
# therefore depends on the model: a grouped-query model's small V gives Qwen2.5-14B Q4_K_M
# 4.79 bits a decoder weight, where the preset's 7B average (4.85) counts the embedding and an
# MHA model's V. (Left out: Falcon's own rules, Llama 70B's attn_v at Q5_K, 8-expert models'
# attn_v / attn_k at Q8_0, and the IQ presets, whose types depend on an importance matrix.)
_K_TYPES = {"q2_k": 2.625, "q3_k": 3.4375, "q4_k": 4.5, "q5_k": 5.5, "q6_k": 6.5625}
# the 32-block type llama-quantize stores a tensor in when its rows are not whole 256-weight
# blocks (tensor_type_fallback)
_BLOCK_FALLBACK = {"q2_k": 4.5, "q3_k": 4.5, "q4_k": 5.5, "q5_k": 6.0, "q6_k": 8.5}


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# preset: (base type, attn_v's type for layer i of n at a GQA ratio, ffn_down's type for layer
# i of n, attn_output's type)
_PresetRule = tuple[str, Any, Any, str | None]
_K_PRESETS: dict[str, _PresetRule] = {
    "q2_k": ("q2_k", lambda i, n, gqa: "q4_k" if gqa >= 4 else "q3_k",
             lambda i, n: "q3_k", "q3_k"),
    "q2_k_s": ("q2_k", lambda i, n, gqa: "q4_k" if gqa >= 4 else "q2_k",
               lambda i, n: "q4_k" if i < n // 8 else "q2_k", None),
    "q3_k_s": ("q3_k", None, None, None),
    "q3_k_m": ("q3_k", lambda i, n, gqa: "q5_k" if i < 2 else "q4_k",
               lambda i, n: "q5_k" if i < n // 16 else "q4_k", "q4_k"),
    "q3_k_l": ("q3_k", lambda i, n, gqa: "q5_k", lambda i, n: "q5_k", "q5_k"),
    "q4_k_s": ("q4_k", lambda i, n, gqa: "q5_k" if i < 4 else "q4_k",
               lambda i, n: "q5_k" if i < n // 8 else "q4_k", None),
    "q4_k_m": ("q4_k", lambda i, n, gqa: "q6_k" if _use_more_bits(i, n) else "q4_k",
               lambda i, n: "q6_k" if _use_more_bits(i, n) else "q4_k", None),
    "q5_k_s": ("q5_k", None, None, None),
    "q5_k_m": ("q5_k", lambda i, n, gqa: "q6_k" if _use_more_bits(i, n) else "q5_k",
               lambda i, n: "q6_k" if _use_more_bits(i, n) else "q5_k", None),
}


def more_bits_share(n_layers: int) -> float:
    """Share of `n_layers` layers that llama-quantize's use_more_bits picks: the first and last
    eighth, and every third layer between."""
    if n_layers <= 0:
        return 0.0
    return sum(1 for i in range(n_layers) if _use_more_bits(i, n_layers)) / n_layers


def mixed_preset_bits(preset: str, hidden: int, q_out: int, kv_out: int, inter: int,
                      layers: int, attn_layers: int, body_params: float,
                      other_params: float = 0.0, fallback: bool = True,
                      fused_qkv: bool = False, gqa: float = 1.0) -> float | None:
    """Average stored bits of the decoder weights (all but the token embedding and the output
    head) of a K-quant preset's file of this shape, tensor group by group (`_K_PRESETS`); None
    for another format. `body_params`: those weights' count; `other_params`: of them, a
    hybrid's recurrent mixers (at the base type); the FFN is the rest. `fallback`: the widths
    are the model's own, so a width off the 256 block takes the 32-block type. `gqa`: query
    heads per K/V head (Q2_K's attn_v)."""
    rule = _K_PRESETS.get(normalise(preset))
    if rule is None or body_params <= 0 or layers <= 0:
        return None
    base, v_rule, down_rule, o_type = rule

    def one(t: str, width: int) -> float:
        return _BLOCK_FALLBACK[t] if fallback and width % 256 else _K_TYPES[t]

    def by_layer(pick: Any, n: int, width: int, *extra: float) -> float:
        if pick is None or n <= 0:
            return one(base, width)
        return sum(one(pick(i, n, *extra), width) for i in range(n)) / n

    attn_layers = min(attn_layers, layers)
    v_bits = by_layer(v_rule, attn_layers, hidden, gqa)
    if fused_qkv:  # one attn_qkv tensor, typed as attn_v
        groups = [(attn_layers * hidden * (q_out + 2 * kv_out), v_bits)]
    else:  # (parameters, bits)
        groups = [(attn_layers * hidden * (q_out + kv_out), one(base, hidden)),
                  (attn_layers * hidden * kv_out, v_bits)]
    groups.append((attn_layers * q_out * hidden, one(o_type or base, q_out)))
    attn = sum(p for p, _ in groups)
    other = min(max(other_params, 0.0), max(body_params - attn, 0.0))
    ffn = max(body_params - attn - other, 0.0)
    groups += [
        (other, one(base, hidden)),
        (2.0 / 3.0 * ffn, one(base, hidden)),  # gated FFNs: gate, up, down of one size
        (ffn / 3.0, by_layer(down_rule, layers, inter)),
    ]
    total = sum(p for p, _ in groups)
    return sum(p * b for p, b in groups) / total if total > 0 else None


def kv_bytes(name: str) -> float:
    """Bytes per stored KV element for a KV dtype name."""
    key = normalise(name)
    if key not in KV_BYTES:
        raise TightfitError(f"unknown kv_dtype {name!r}; use one of {', '.join(sorted(KV_BYTES))}")
    return KV_BYTES[key]


def is_known(name: str) -> bool:
    return normalise(name) in BITS_PER_WEIGHT


# A GGUF preset with its token embedding and output head kept in a float type, as
# `llama-quantize --token-embedding-type f16 --output-tensor-type f16` writes them and files
# name them (`gemma-2-9b-it-Q4_K_M-fp16.gguf`; the preset alone keeps them at Q6_K / Q8_0).
EMBED_TAG_BITS = {"f16": 16.0, "fp16": 16.0, "bf16": 16.0, "f32": 32.0, "fp32": 32.0}
_PRESET_TAGGED = r"(?P<base>(?:ud-)?i?q\d(?:_[0-9a-z]+)*)[-_.](?P<tag>fp16|f16|bf16|fp32|f32)$"
_EMBED_TAG = re.compile(_PRESET_TAGGED, re.IGNORECASE)
_EMBED_TAG_IN_NAME = re.compile(r"(?:^|[-_.])" + _PRESET_TAGGED, re.IGNORECASE)


def split_embed_tag(name: str) -> tuple[str, float | None]:
    """`Q4_K_M-f16` -> (`q4_k_m`, 16.0): a block preset with its embedding and head in a float
    type; any other name -> (name, None)."""
    m = _EMBED_TAG.fullmatch(name.strip())
    if m is None:
        return name, None
    return m.group("base").lower(), EMBED_TAG_BITS[m.group("tag").lower()]


def _stem(filename: str) -> str:
    return re.sub(r"\.gguf$", "", filename.rsplit("/", 1)[-1], flags=re.IGNORECASE)


def embed_bits_from_filename(filename: str) -> float | None:
    """Bits of the embedding and head where a GGUF file name tags them after the preset."""
    m = _EMBED_TAG_IN_NAME.search(_stem(filename))
    return EMBED_TAG_BITS[m.group("tag").lower()] if m else None


def quant_from_filename(filename: str) -> str | None:
    """The GGUF format named in a file name (`...-Q4_K_M.gguf` -> `q4_k_m`), if any."""
    stem = _stem(filename)
    found = [m.group(1) for m in _GGUF_IN_NAME.finditer(stem)]
    for cand in reversed(found):
        key = normalise(cand)
        if key in BITS_PER_WEIGHT:
            return key
    return None


def _public_names() -> list[str]:
    gguf = [k for k in BITS_PER_WEIGHT
            if k.startswith(("q", "iq", "tq", "mx", "nv")) or k in ("f16", "f32", "bf16")]
    return [k.upper() for k in gguf] + [k for k in BITS_PER_WEIGHT if k not in gguf]

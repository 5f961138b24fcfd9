"""Model shapes: a small table of known architectures, and a parser for model/file names.

A name such as `Qwen3-30B-A3B-Instruct-Q4_K_M.gguf` gives total and active parameters; layer and
width counts come from the table when the family is known, otherwise from a size-based estimate
(good to a few percent for weight bytes, rougher for KV size). Returns None when no size is found.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer; `active_params_b` < `params_b` for mixtures of experts."""

    name: str
    params_b: float
    active_params_b: float
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    intermediate_size: int
    head_dim: int
    shape_known: bool = True
    tied_embeddings: bool | None = None  # output head shares the token embedding; None: guess
    expert_params_b: float | None = None  # parameters in the routed experts (MoE), if known
    # per-layer embeddings (Gemma 3n / Gemma 4 "E" models): a [vocab, layers x 256] table of
    # which each token reads one row (llama.cpp: ggml_get_rows); in params_b, never multiplied
    per_layer_embed_params_b: float = 0.0
    # local attention: `sliding_layers` of the layers attend to the last `sliding_window`
    # tokens only (Gemma 2/3/4, gpt-oss, Command R7B; Llama 4's 8192-token chunks as a window)
    sliding_window: int = 0
    sliding_layers: int = 0
    # hybrids: only this many layers attend and cache K/V (0: all); the others keep a fixed
    # recurrent or convolution state (LFM2, Granite 4.0-H, Qwen3-Next, Qwen3.5) ...
    attention_layers: int = 0
    # ... of this many bytes a sequence in each such layer (llama.cpp holds it in f32, one per
    # sequence slot; 0: not counted, as for LFM2's ~16 KB convolution caches)
    state_bytes_per_layer: float = 0.0
    # looped transformers (Nanbeige4.2): every token runs the stored layers this many times,
    # each pass with K/V of its own. `n_layers` counts the layers a token passes through
    # (stored layers x loops); the weights are stored once and read once a pass.
    layer_loops: int = 1
    # what a hybrid's non-attention layers run (a RECURRENT_OPS key), or PARALLEL_HYBRID for
    # layers that run attention and a Mamba-2 mixer side by side (Falcon-H1); "" for none
    mixer: str = ""
    # Q, K and V in one tensor (Phi-3 / Phi-4's attn_qkv in GGUF), which llama-quantize types
    # as it types a separate V (formats.mixed_preset_bits)
    fused_qkv: bool = False
    # K/V elements a token takes in a full-attention layer against a window layer's, where they
    # differ (Gemma 4's full layers: fewer K/V heads of twice the size); 1 for every other model
    full_kv_scale: float = 1.0
    # the last layers that attend to an earlier layer's K/V and hold none of their own (Gemma 3n
    # / Gemma 4 E: llama.cpp's n_layer_kv_from_start); 0 for every other model
    kv_shared_layers: int = 0
    # positions the model was trained for: a file read's (GGUF `context_length`, HF
    # `max_position_embeddings`), or the table's for some families (_TRAINED_CONTEXT); 0: unknown
    trained_context: int = 0

    @property
    def layer_ops(self) -> float:
        """Graph operations a layer runs in a decode step, on average over the layers, relative
        to an attention + FFN layer (RECURRENT_OPS): what a step's per-layer costs (a CPU thread
        pool's barriers, kernel launches) scale with."""
        if not self.mixer:
            return 1.0
        if self.mixer == PARALLEL_HYBRID:
            return PARALLEL_HYBRID_OPS
        attn = self.kv_layers
        return (attn + (self.n_layers - attn) * mixer_ops(self.mixer)) / max(self.n_layers, 1)

    @property
    def kv_layers(self) -> int:
        """Layers that attend and cache K/V (a hybrid's attention layers, else all)."""
        return min(self.attention_layers or self.n_layers, self.n_layers)

    @property
    def window_layers(self) -> int:
        """Of `kv_layers`, those attending to a sliding window (0 without a window)."""
        return min(self.sliding_layers, self.kv_layers) if self.sliding_window > 0 else 0

    @property
    def is_moe(self) -> bool:
        return self.active_params_b < 0.9 * self.params_b

    @property
    def embedding_params(self) -> float:
        return float(self.vocab_size * self.hidden_size)

    def table_params(self) -> float:
        """One embedding table's parameters (vocab x hidden), capped for inconsistent shapes: a
        tied embedding can be most of a small model (63% of Gemma 3 270M), two untied ones at
        most all of it."""
        cap = 0.8 if self.ties_embeddings else 0.5
        return min(self.embedding_params, cap * self.params_b * 1e9)

    @property
    def ties_embeddings(self) -> bool:
        """Small models share the embedding with the output head (SmolLM2, Gemma 3, Qwen2.5 up
        to 3B, Llama 3.2 1B/3B), large ones do not (Llama 3 8B, Qwen2.5 7B); unless told, the
        guess is "tied when the embedding is at least 9% of the parameters"."""
        if self.tied_embeddings is not None:
            return self.tied_embeddings
        return self.embedding_params >= 0.09 * self.params_b * 1e9

    @property
    def recurrent_state_bytes(self) -> float:
        """Bytes of recurrent (SSM / linear-attention / convolution) state one sequence holds."""
        return self.state_bytes_per_layer * (self.n_layers - self.kv_layers)

    def kv_elements_per_token(self) -> int:
        """K and V elements stored per token, all layers, at a window layer's size where full
        layers differ (`full_kv_scale`, applied by memory.kv_tokens)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim


def _m(name: str, p: float, layers: int, hidden: int, heads: int, kv: int, vocab: int,
       inter: int, active: float | None = None, head_dim: int | None = None,
       experts: float | None = None, ple: float = 0.0, tied: bool | None = None,
       swa: tuple[int, int] = (0, 0), attn: int = 0, state: float = 0.0,
       mixer: str = "", qkv: bool = False, full_kv: float = 1.0,
       kv_shared: int = 0) -> ModelSpec:
    return ModelSpec(name, p, active if active is not None else p, layers, hidden, heads, kv,
                     vocab, inter, head_dim or hidden // heads, tied_embeddings=tied,
                     expert_params_b=experts, per_layer_embed_params_b=ple,
                     sliding_window=swa[0], sliding_layers=swa[1], attention_layers=attn,
                     state_bytes_per_layer=state, mixer=mixer, fused_qkv=qkv,
                     full_kv_scale=full_kv, kv_shared_layers=kv_shared)


# Graph operations of a hybrid's recurrent layer (its mixer, norm and FFN) relative to the
# same model's attention + FFN layer, counted in llama.cpp's own graphs: the vendored sources'
# test-llama-archs writes a small model of every architecture; copies of its layers, 2 and 10
# deep, each loaded by llama-bench with GGML_SCHED_DEBUG=2, which lists the graph's nodes
# (attention / FFN biases and scale tensors that the test models carry and published models do
# not, taken out; 2026-12-07, docs/predictor.md "Graph operations of a recurrent layer").
# Counted are the nodes that run: ggml skips views, reshapes and permutes (no barrier, no
# launch). Nodes a layer: Granite 4.0-H Mamba-2 36 vs its attention 21; Qwen3.5 Gated DeltaNet
# 41 vs 26; Jamba Mamba 39 vs 17; PLaMo-2 Mamba 43 vs 24; LFM2 short convolution 21 vs 23;
# Falcon-H1, whose every layer runs attention and a Mamba-2 mixer side by side, 46 against a
# Llama layer's 19. A CPU thread pool meets at a barrier after every such node, and a GPU
# backend without graph replay launches a kernel for each.
RECURRENT_OPS = {"mamba2": 1.7, "gated_deltanet": 1.6, "mamba": 2.3, "short_conv": 0.9}
PARALLEL_HYBRID = "attention+mamba2"
PARALLEL_HYBRID_OPS = 2.4  # Falcon-H1: every layer both
MIXERS = tuple(RECURRENT_OPS) + (PARALLEL_HYBRID,)


def mixer_ops(mixer: str) -> float:
    """Graph operations of a layer running `mixer` (a MIXERS entry), relative to an attention
    + FFN layer."""
    return PARALLEL_HYBRID_OPS if mixer == PARALLEL_HYBRID else RECURRENT_OPS[mixer]


# Recurrent state a sequence holds in one layer, f32 as llama.cpp keeps it (its r/s tensors):
# the recurrence's matrix state plus the short convolution's last (kernel - 1) inputs.
def gated_deltanet_state(value_heads: int, key_heads: int = 16, key_dim: int = 128,
                         value_dim: int = 128, conv: int = 4) -> float:
    """Gated DeltaNet (Qwen3-Next, Qwen3.5): a key_dim x value_dim matrix per value head; the
    convolution runs over Q, K and V."""
    channels = 2 * key_heads * key_dim + value_heads * value_dim
    return 4.0 * (value_heads * key_dim * value_dim + (conv - 1) * channels)


def mamba_state(hidden: int, d_state: int, mamba2: bool = True, expand: float = 2,
                groups: int = 1, conv: int = 4) -> float:
    """Mamba-2 (Granite 4.0-H: d_state 128) and Mamba (Jamba: 16): d_state values per inner
    channel (expand x hidden); Mamba-2's convolution also runs over its B and C groups."""
    inner = expand * hidden
    conv_channels = inner + (2 * groups * d_state if mamba2 else 0)
    return 4.0 * (inner * d_state + (conv - 1) * conv_channels)


# Public configuration values of common open models (parameters in billions, embeddings included;
# tied=True where the config ties the embedding to the head and the size guess,
# ModelSpec.ties_embeddings, would say untied: Gemma at every size, SmolLM2 1.7B, SmolLM3).
KNOWN: dict[str, ModelSpec] = {s.name: s for s in [
    _m("llama-2-7b", 6.74, 32, 4096, 32, 32, 32000, 11008),
    _m("llama-2-13b", 13.0, 40, 5120, 40, 40, 32000, 13824),
    _m("llama-2-70b", 69.0, 80, 8192, 64, 8, 32000, 28672),
    _m("codellama-34b", 33.7, 48, 8192, 64, 8, 32000, 22016),
    _m("llama-3-8b", 8.03, 32, 4096, 32, 8, 128256, 14336),
    _m("llama-3.1-8b", 8.03, 32, 4096, 32, 8, 128256, 14336),
    _m("llama-3-70b", 70.6, 80, 8192, 64, 8, 128256, 28672),
    _m("llama-3.1-70b", 70.6, 80, 8192, 64, 8, 128256, 28672),
    _m("llama-3.3-70b", 70.6, 80, 8192, 64, 8, 128256, 28672),
    _m("llama-3.1-405b", 406.0, 126, 16384, 128, 8, 128256, 53248),
    _m("llama-3.2-1b", 1.24, 16, 2048, 32, 8, 128256, 8192),
    _m("llama-3.2-3b", 3.21, 28, 3072, 24, 8, 128256, 8192),
    _m("tinyllama-1.1b", 1.10, 22, 2048, 32, 4, 32000, 5632),
    _m("smollm2-135m", 0.135, 30, 576, 9, 3, 49152, 1536),
    _m("smollm2-360m", 0.362, 32, 960, 15, 5, 49152, 2560),
    _m("smollm2-1.7b", 1.71, 24, 2048, 32, 32, 49152, 8192, tied=True),
    _m("smollm3-3b", 3.08, 36, 2048, 16, 4, 128256, 11008, tied=True),
    _m("qwen2.5-0.5b", 0.49, 24, 896, 14, 2, 151936, 4864),
    _m("qwen2.5-1.5b", 1.54, 28, 1536, 12, 2, 151936, 8960),
    _m("qwen2.5-3b", 3.09, 36, 2048, 16, 2, 151936, 11008),
    _m("qwen2.5-7b", 7.62, 28, 3584, 28, 4, 152064, 18944),
    _m("qwen2.5-14b", 14.8, 48, 5120, 40, 8, 152064, 13824),
    _m("qwen2.5-32b", 32.8, 64, 5120, 40, 8, 152064, 27648),
    _m("qwen2.5-72b", 72.7, 80, 8192, 64, 8, 152064, 29568),
    _m("qwen1.5-14b", 14.2, 40, 5120, 40, 40, 152064, 13696),
    _m("qwen3-0.6b", 0.60, 28, 1024, 16, 8, 151936, 3072, head_dim=128),
    _m("qwen3-1.7b", 1.72, 28, 2048, 16, 8, 151936, 6144, head_dim=128),
    _m("qwen3-4b", 4.02, 36, 2560, 32, 8, 151936, 9728, head_dim=128),
    _m("qwen3-8b", 8.19, 36, 4096, 32, 8, 151936, 12288),
    _m("qwen3-14b", 14.8, 40, 5120, 40, 8, 151936, 17408),
    _m("qwen3-32b", 32.8, 64, 5120, 64, 8, 151936, 25600, head_dim=128),
    _m("qwen3-30b-a3b", 30.5, 48, 2048, 32, 4, 151936, 768, active=3.3, head_dim=128),
    # 3 Gated DeltaNet layers to 1 attention
    _m("qwen3-coder-next", 80.0, 48, 2048, 16, 2, 151936, 512, active=3.0, head_dim=256,
       attn=12, state=gated_deltanet_state(32), mixer="gated_deltanet"),
    # Qwen3.5 (text model; the same 3:1 Gated DeltaNet / gated-attention schedule, head_dim
    # 256, a 248,320-entry vocabulary). Parameters counted from the configs: 0.8B 0.75e9 with
    # its tied embedding (254M of it), 9B 8.95e9 with an untied one.
    # Gated DeltaNet value heads (16 key heads of 128 at every size): 0.8B 16, 9B and 35B-A3B 32,
    # 27B 48.
    _m("qwen3.5-0.8b", 0.75, 24, 1024, 8, 2, 248320, 3584, head_dim=256, tied=True, attn=6,
       state=gated_deltanet_state(16), mixer="gated_deltanet"),
    _m("qwen3.5-9b", 8.95, 32, 4096, 16, 4, 248320, 12288, head_dim=256, tied=False, attn=8,
       state=gated_deltanet_state(32), mixer="gated_deltanet"),
    _m("qwen3.5-27b", 27.0, 64, 5120, 24, 4, 248320, 17408, head_dim=256, tied=False,
       attn=16, state=gated_deltanet_state(48), mixer="gated_deltanet"),
    _m("qwen3.5-35b-a3b", 35.0, 40, 2048, 16, 2, 248320, 512, active=3.0, head_dim=256,
       tied=False, attn=10, state=gated_deltanet_state(32),
       mixer="gated_deltanet"),  # 256 experts of 512, 8 a token
    # the first Gemma (no window; the 2B with one K/V head)
    _m("gemma-1-2b", 2.51, 18, 2048, 8, 1, 256000, 16384, head_dim=256, tied=True),
    _m("gemma-1-7b", 8.54, 28, 3072, 16, 16, 256000, 24576, head_dim=256, tied=True),
    _m("gemma-2-2b", 2.61, 26, 2304, 8, 4, 256000, 9216, head_dim=256, tied=True, swa=(4096, 13)),
    _m("gemma-2-9b", 9.24, 42, 3584, 16, 8, 256000, 14336, head_dim=256, tied=True,
       swa=(4096, 21)),
    _m("gemma-2-27b", 27.2, 46, 4608, 32, 16, 256000, 36864, head_dim=128, tied=True,
       swa=(4096, 23)),
    _m("gemma-3-270m", 0.268, 18, 640, 4, 1, 262144, 2048, head_dim=256, tied=True, swa=(512, 15)),
    _m("gemma-3-1b", 1.00, 26, 1152, 4, 1, 262144, 6912, head_dim=256, tied=True, swa=(512, 22)),
    _m("gemma-3-4b", 3.88, 34, 2560, 8, 4, 262208, 10240, head_dim=256, tied=True, swa=(1024, 29)),
    _m("gemma-3-12b", 12.2, 48, 3840, 16, 8, 262208, 15360, head_dim=256, tied=True,
       swa=(1024, 40)),
    _m("gemma-3-27b", 27.4, 62, 5376, 32, 16, 262208, 21504, head_dim=128, tied=True,
       swa=(1024, 52)),
    # "E" models: their last layers attend to an earlier layer's K/V and hold none (kv_shared:
    # Gemma 3n's first 20 layers hold K/V in llama.cpp's gemma3n.cpp; Gemma 4 E2B / E4B share
    # 20 / 18 by their configs). Per-layer embeddings of 262144 x (layers x 256), one row
    # looked up a token (ple; Gemma 3n E2B 2.01B, E4B 2.35B). Gemma 3n is left without the
    # per-layer table: its two measured rows
    # (llama.cpp, M4 Pro and RX 7900 XT) stream the bytes it needs with the table looked up at
    # 0.42 / 0.25 of peak bandwidth, Gemma 4 E4B at 0.58 / 0.38 on the same machines (its
    # AltUp / LAuReL blocks, not modelled, cost the time); counting the table as streamed
    # stands in for that. Its attention pattern is not modelled either (no window here).
    _m("gemma-3n-e2b", 4.5, 30, 2048, 8, 2, 262400, 8192, head_dim=256, tied=True,
       kv_shared=10),
    _m("gemma-3n-e4b", 6.9, 35, 2048, 8, 2, 262400, 16384, head_dim=256, tied=True,
       kv_shared=15),
    # Gemma 4 E2B / E4B: 2.3B / 4.5B "effective" (without embeddings), 5.1B / 8B with them;
    # layers as llama.cpp's gemma4 loader types them (35, 42); 5 of 6 layers on a 512-token
    # window (the config's default pattern)
    _m("gemma-4-e2b", 5.1, 35, 1536, 8, 1, 262144, 12288, head_dim=256, ple=2.35, tied=True,
       swa=(512, 29), kv_shared=20),
    _m("gemma-4-e4b", 8.0, 42, 2560, 8, 2, 262144, 10240, head_dim=256, ple=2.82, tied=True,
       swa=(512, 35), kv_shared=18),
    # Gemma 4 12B / 26B-A4B / 31B by their published configs: 5 of 6 layers on a 1024-token
    # window with K/V heads of 256; the full-attention layers have fewer K/V heads of 512 (12B
    # 1, 26B 2, 31B 4; K = V, both taken as held): full_kv = their K/V a token against a window
    # layer's. The 26B-A4B: 128 experts of 704 (8 a token) beside a dense FFN of 2112 in every
    # layer. Parameters summed from those shapes (11.9B, 25.2B, 30.7B).
    _m("gemma-4-12b", 11.9, 48, 3840, 16, 8, 262144, 15360, head_dim=256, tied=True,
       swa=(1024, 40), full_kv=0.25),
    _m("gemma-4-26b-a4b", 25.2, 30, 2816, 16, 8, 262144, 704, active=3.8, head_dim=256,
       tied=True, experts=22.84, swa=(1024, 25), full_kv=0.5),
    _m("gemma-4-31b", 30.7, 60, 5376, 32, 16, 262144, 21504, head_dim=256, tied=True,
       swa=(1024, 50), full_kv=0.5),
    _m("phi-3-mini", 3.82, 32, 3072, 32, 32, 32064, 8192, qkv=True),
    _m("phi-3.5-mini", 3.82, 32, 3072, 32, 32, 32064, 8192, qkv=True),
    # 16 experts of 6400, two a token
    _m("phi-3.5-moe", 41.9, 32, 4096, 32, 8, 32064, 6400, active=6.6, experts=40.3),
    _m("phi-3-medium", 14.0, 40, 5120, 40, 10, 32064, 17920, qkv=True),
    _m("phi-4", 14.7, 40, 5120, 40, 10, 100352, 17920, qkv=True),
    _m("phi-4-mini", 3.84, 32, 3072, 24, 8, 200064, 8192, qkv=True),
    _m("mistral-7b", 7.25, 32, 4096, 32, 8, 32768, 14336),
    _m("mistral-nemo", 12.2, 40, 5120, 32, 8, 131072, 14336, head_dim=128),
    _m("mistral-small-24b", 23.6, 40, 5120, 32, 8, 131072, 32768, head_dim=128),
    _m("mistral-large-123b", 123.0, 88, 12288, 96, 8, 32768, 28672),
    _m("ministral-8b", 8.02, 36, 4096, 32, 8, 131072, 12288),
    _m("codestral-22b", 22.2, 56, 6144, 48, 8, 32768, 16384),
    # MLA as llama.cpp caches it (512 + 64 values a layer and token), as DeepSeek V3 below
    _m("deepseek-coder-v2-lite", 15.7, 27, 2048, 16, 1, 102400, 1408, active=2.4, head_dim=288),
    # routed experts: layers x experts x 3 matrices of 2880 x 2880 (32 experts / 128 experts)
    _m("gpt-oss-20b", 20.9, 24, 2880, 64, 8, 201088, 2880, active=3.6, head_dim=64,
       experts=19.11, swa=(128, 12)),
    _m("gpt-oss-120b", 117.0, 36, 2880, 64, 8, 201088, 2880, active=5.1, head_dim=64,
       experts=114.66, swa=(128, 18)),
    # mixtures of experts (intermediate = one expert's width)
    _m("mixtral-8x7b", 46.7, 32, 4096, 32, 8, 32000, 14336, active=12.9, experts=45.1),
    _m("mixtral-8x22b", 140.6, 56, 6144, 48, 8, 32768, 16384, active=39.1, experts=135.3),
    _m("llama-4-scout-17b-16e", 108.6, 48, 5120, 40, 8, 202048, 8192, active=17.2, swa=(8192, 36)),
    _m("llama-4-maverick-17b-128e", 401.6, 48, 5120, 40, 8, 202048, 8192, active=17.2,
       swa=(8192, 36)),
    _m("qwen3-235b-a22b", 235.1, 94, 4096, 64, 4, 151936, 1536, active=22.2, head_dim=128),
    _m("glm-4.5-air", 106.9, 46, 4096, 96, 8, 151552, 1408, active=12.0, head_dim=128),
    _m("glm-4.5", 355.0, 92, 5120, 96, 8, 151552, 1536, active=32.0, head_dim=128),
    # DeepSeek V3 / R1 and Kimi K2 attend through MLA: llama.cpp caches 512 + 64 values per layer
    # and token (V is a view of K), written here as one KV head of 288
    _m("deepseek-v3", 671.0, 61, 7168, 128, 1, 129280, 2048, active=37.0, head_dim=288),
    _m("kimi-k2", 1026.0, 61, 7168, 64, 1, 163840, 2048, active=32.6, head_dim=288),
    _m("falcon3-1b", 1.67, 18, 2048, 8, 4, 131072, 8192, head_dim=256),
    _m("falcon3-3b", 3.23, 22, 3072, 12, 4, 131072, 9216, head_dim=256),
    _m("falcon3-7b", 7.46, 28, 3072, 12, 4, 131072, 23040, head_dim=256),
    _m("falcon3-10b", 10.3, 40, 3072, 12, 4, 131072, 23040, head_dim=256),
    _m("granite-3.1-8b", 8.17, 40, 4096, 32, 8, 49155, 12800),
    _m("granite-3.1-1b-a400m", 1.33, 24, 1024, 16, 8, 49155, 512, active=0.4),
    _m("granite-3.1-3b-a800m", 3.3, 32, 1536, 24, 8, 49155, 512, active=0.8),
    _m("granite-4.0-h-small", 32.0, 40, 4096, 32, 8, 100352, 1536, active=9.0,
       attn=4, state=mamba_state(4096, 128), mixer="mamba2"),  # 36 Mamba-2 layers
    # Granite 4.0-H Nano: 4 attention layers (12 query heads, 4 K/V) among 40 (1B) or 32 (350M),
    # the rest Mamba-2 (48 heads, d_state 128), a shared 100,352-entry embedding; ~1.5B and
    # ~340M parameters counted from these shapes (the "1B" is its name, not its size).
    _m("granite-4.0-h-1b", 1.46, 40, 1536, 12, 4, 100352, 4096, tied=True, attn=4,
       state=mamba_state(1536, 128), mixer="mamba2"),
    _m("granite-4.0-h-350m", 0.34, 32, 768, 12, 4, 100352, 2048, head_dim=64, tied=True,
       attn=4, state=mamba_state(768, 128), mixer="mamba2"),
    _m("internlm3-8b", 8.8, 48, 4096, 32, 2, 128512, 10240),
    _m("yi-1.5-6b", 6.06, 32, 4096, 32, 4, 64000, 11008),
    _m("yi-1.5-9b", 8.83, 48, 4096, 32, 4, 64000, 11008),
    _m("yi-1.5-34b", 34.4, 60, 7168, 56, 8, 64000, 20480),
    _m("glm-4-9b", 9.4, 40, 4096, 32, 2, 151552, 13696),
    _m("olmo-2-7b", 7.30, 32, 4096, 32, 32, 100352, 11008),
    _m("olmo-2-13b", 13.7, 40, 5120, 40, 40, 100352, 13824),
    _m("olmo-2-32b", 32.2, 64, 5120, 40, 8, 100352, 27648),
    _m("exaone-3.5-7.8b", 7.82, 32, 4096, 32, 8, 102400, 14336),
    _m("aya-expanse-8b", 8.03, 32, 4096, 32, 8, 256000, 14336),
    _m("aya-expanse-32b", 32.3, 40, 8192, 64, 8, 256000, 24576),
    _m("c4ai-command-r7b", 8.03, 32, 4096, 32, 8, 256000, 14336, swa=(4096, 24)),
    # Command R (08-2024) and R+: Cohere ties the 256k-entry embedding to the head
    _m("c4ai-command-r-32b", 32.3, 40, 8192, 64, 8, 256000, 24576, tied=True),
    _m("c4ai-command-r-plus", 104.0, 64, 12288, 96, 8, 256000, 33792, tied=True),
    # LFM2 / LFM2.5 (hybrid: 6 to 8 of the layers attend, the rest are short convolutions)
    _m("lfm2-350m", 0.354, 16, 1024, 16, 8, 65536, 4608, attn=6, mixer="short_conv"),
    _m("lfm2-700m", 0.742, 16, 1536, 24, 8, 65536, 6912, attn=6, mixer="short_conv"),
    _m("lfm2-1.2b", 1.17, 16, 2048, 32, 8, 65536, 8192, attn=6, mixer="short_conv"),
    _m("lfm2-2.6b", 2.57, 30, 2048, 32, 8, 65536, 10752, tied=True, attn=8, mixer="short_conv"),
    _m("lfm2-8b-a1b", 8.3, 24, 2048, 32, 8, 65536, 1792, active=1.5, attn=6, mixer="short_conv"),
    _m("ernie-4.5-21b-a3b", 21.8, 28, 2560, 20, 4, 103424, 1536, active=3.0),
    _m("ernie-4.5-0.3b", 0.36, 18, 1024, 16, 2, 103424, 3072),
    _m("phi-4-reasoning-plus", 14.7, 40, 5120, 40, 10, 100352, 17920,
       qkv=True),
    _m("mistral-small-3.2-24b", 23.6, 40, 5120, 32, 8, 131072, 32768, head_dim=128),
    _m("magistral-small", 23.6, 40, 5120, 32, 8, 131072, 32768, head_dim=128),
    _m("devstral-small", 23.6, 40, 5120, 32, 8, 131072, 32768, head_dim=128),
]}

# Trained contexts (config.json's max_position_embeddings) of the families above whose value is
# one for every size and checked: SmolLM2 8,192 and Gemma 3 270M 32,768 as their packaged GGUF
# files say (`context_length`); the others as their model cards and configs publish them.
# Other entries leave it unknown (0); a model file read gives its own.
_TRAINED_CONTEXT = {
    "llama-2-": 4096, "codellama-34b": 16384, "llama-3-": 8192, "llama-3.1-": 131072,
    "llama-3.2-": 131072, "llama-3.3-": 131072, "tinyllama-": 2048, "smollm2-": 8192,
    "gemma-1-": 8192, "gemma-2-": 8192, "gemma-3-270m": 32768, "gemma-3-1b": 32768,
    "gemma-3-4b": 131072, "gemma-3-12b": 131072, "gemma-3-27b": 131072, "gemma-3n-": 32768,
    "phi-3.5-mini": 131072, "phi-3.5-moe": 131072, "phi-4-mini": 131072, "phi-4": 16384,
    "phi-4-reasoning-plus": 32768, "mistral-7b": 32768, "mixtral-8x7b": 32768,
    "mixtral-8x22b": 65536, "gpt-oss-": 131072, "deepseek-v3": 163840,
}
KNOWN = {k: next((replace(s, trained_context=_TRAINED_CONTEXT[p]) for p in
                  sorted(_TRAINED_CONTEXT, key=len, reverse=True) if k.startswith(p)), s)
         for k, s in KNOWN.items()}

# Name fragments -> table key, checked in order after normalisation (longest first matters).
_FAMILY_HINTS: list[tuple[str, str]] = [
    ("deepseek-coder-v2-lite", "deepseek-coder-v2-lite"), ("gpt-oss-20b", "gpt-oss-20b"),
    ("gpt-oss-120b", "gpt-oss-120b"), ("gpt-oss:20b", "gpt-oss-20b"),
    ("phi-3.5-mini", "phi-3.5-mini"), ("phi-3-mini", "phi-3-mini"), ("phi-3-medium", "phi-3-medium"),
    ("phi-4-mini", "phi-4-mini"), ("phi-4-reasoning", "phi-4-reasoning-plus"), ("phi-4", "phi-4"),
    ("mistral-nemo", "mistral-nemo"), ("magistral-small", "magistral-small"),
    ("devstral-small", "devstral-small"), ("granite-4.0-h-small", "granite-4.0-h-small"),
    ("command-r7b", "c4ai-command-r7b"), ("qwen3-coder-next", "qwen3-coder-next"),
    ("command-r-plus", "c4ai-command-r-plus"), ("command-r-08-2024", "c4ai-command-r-32b"),
    ("qwq-32b", "qwen2.5-32b"), ("distill-llama-70b", "llama-3.1-70b"),
    ("phi-3.5-moe", "phi-3.5-moe"), ("granite-3.2-8b", "granite-3.1-8b"),
    ("distill-qwen-32b", "qwen2.5-32b"), ("mistral-large", "mistral-large-123b"),
    # the first Gemma, whose "gemma-2b" is not Gemma 2's 2B
    ("gemma-2b", "gemma-1-2b"), ("gemma-7b", "gemma-1-7b"), ("gemma-1.1-2b", "gemma-1-2b"),
    ("gemma-1.1-7b", "gemma-1-7b"),
    ("granite-3.3-8b", "granite-3.1-8b"), ("zephyr-7b", "mistral-7b"),
    ("llama-2-7b", "llama-2-7b"), ("llama2-7b", "llama-2-7b"),
    ("distill-qwen-1.5b", "qwen2.5-1.5b"), ("distill-qwen-7b", "qwen2.5-7b"),
    ("distill-qwen-14b", "qwen2.5-14b"), ("distill-llama-8b", "llama-3.1-8b"),
    ("qwen3-coder-30b-a3b", "qwen3-30b-a3b"), ("deepseek-r1:7b", "qwen2.5-7b"),
    ("qwen3-next-80b-a3b", "qwen3-coder-next"), ("llama-4-scout", "llama-4-scout-17b-16e"),
    ("llama-4-maverick", "llama-4-maverick-17b-128e"), ("deepseek-r1:671b", "deepseek-v3"),
    ("glm-4.5-air", "glm-4.5-air"), ("glm-4.6", "glm-4.5"),
    ("gemma-3n-e4b", "gemma-3n-e4b"), ("gemma-3n-e2b", "gemma-3n-e2b"),
    ("gemma-4-e4b", "gemma-4-e4b"), ("gemma-4-e2b", "gemma-4-e2b"),
    # ollama's tags (name:size), where the size alone would miss the family or its experts
    ("llama4:scout", "llama-4-scout-17b-16e"), ("llama4:maverick", "llama-4-maverick-17b-128e"),
    ("qwen3-coder:30b", "qwen3-30b-a3b"), ("deepseek-coder-v2:16b", "deepseek-coder-v2-lite"),
    ("qwen3:30b", "qwen3-30b-a3b"), ("qwen3:235b", "qwen3-235b-a22b"),
    ("qwen3.5:35b", "qwen3.5-35b-a3b"),
    ("deepseek-r1:1.5b", "qwen2.5-1.5b"), ("deepseek-r1:8b", "qwen3-8b"),
    ("deepseek-r1:14b", "qwen2.5-14b"), ("deepseek-r1:32b", "qwen2.5-32b"),
    ("deepseek-r1:70b", "llama-3.3-70b"), ("gemma3n:e4b", "gemma-3n-e4b"),
    ("gemma3n:e2b", "gemma-3n-e2b"), ("gemma4:e4b", "gemma-4-e4b"), ("gemma4:e2b", "gemma-4-e2b"),
    ("gemma4:26b", "gemma-4-26b-a4b"),
    ("phi4-mini", "phi-4-mini"), ("phi4:", "phi-4"),
    ("phi3:mini", "phi-3-mini"), ("phi3.5", "phi-3.5-mini"), ("phi3:medium", "phi-3-medium"),
    # A multimodal model's GGUF holds its language model; the audio / vision towers its name's
    # size counts go in a projector file (llama.cpp's mmproj) that decode never reads.
    # LFM2 / LFM2.5-Audio-1.5B: "Parameters (LM only) 1.2B" on an LFM2(.5)-1.2B backbone, a
    # 115M FastConformer encoder and an audio detokenizer (model cards). Qwen3-VL and
    # Qwen3-Omni's thinker: the Qwen3 language model of that size (Qwen3-VL-2B's is Qwen3-1.7B's
    # shape: 28 x 2048, 16 / 8 heads, tied).
    ("lfm2-audio-1.5b", "lfm2-1.2b"), ("lfm2.5-audio-1.5b", "lfm2-1.2b"),
    ("qwen3-omni-30b-a3b", "qwen3-30b-a3b"), ("qwen3-vl-30b-a3b", "qwen3-30b-a3b"),
    ("qwen3-vl-2b", "qwen3-1.7b"), ("qwen3vl-2b", "qwen3-1.7b"), ("qwen3-vl-4b", "qwen3-4b"),
    ("qwen3vl-4b", "qwen3-4b"), ("qwen3-vl-8b", "qwen3-8b"), ("qwen3vl-8b", "qwen3-8b"),
    ("qwen3-vl-32b", "qwen3-32b"), ("qwen3vl-32b", "qwen3-32b"),
    ("qwen3-vl-235b-a22b", "qwen3-235b-a22b"),
]
# Hybrid families not in the table at every size, and how many layers make one attention layer
# in their published designs (the rest carry a recurrent state): Qwen3.5 and Qwen3-Next 1 in 4
# (Gated DeltaNet; full_attention_interval 4 in every published config; without it a 128k
# context counted 4x the K/V), Granite 4.0-H 1 in 10 (Mamba-2; the table's 32B has 4 of 40),
# Jamba 1 in 8 (Mamba), Kimi Linear 1 in 4 (KDA).
# The state of each other layer by the family's published configs at other sizes (hidden ->
# bytes): Qwen3.5 / Qwen3-Next 32 value heads in most (2B-122B), Granite 4.0-H Mamba-2 with
# d_state 128 (350M, 1B, Micro, Small), Jamba Mamba with d_state 16, Kimi Linear's KDA heads
# as Gated DeltaNet's.
_HYBRID_FAMILIES = (("qwen3.5", 4, lambda h: gated_deltanet_state(32), "gated_deltanet"),
                    ("qwen3-next", 4, lambda h: gated_deltanet_state(32), "gated_deltanet"),
                    ("granite-4.0-h", 10, lambda h: mamba_state(h, 128), "mamba2"),
                    ("jamba", 8, lambda h: mamba_state(h, 16, mamba2=False), "mamba"),
                    ("kimi-linear", 4, lambda h: gated_deltanet_state(32), "gated_deltanet"))
# Parallel hybrids: every layer attends and runs a Mamba-2 mixer beside it (Falcon-H1); their
# K/V is a dense model's, their layers run PARALLEL_HYBRID_OPS times the operations.
_PARALLEL_HYBRIDS = ("falcon-h1",)
# Looped transformers: (name fragment, passes a token makes through the stored layers).
# Nanbeige4.2-3B reuses its 22 stored layers twice (num_loops 2, 44 layers deep, K/V kept for
# all 44: the public llama.cpp port's release notes; its model code aliases logical layer
# i + j x 22 to stored layer i).
_LOOPED_FAMILIES = (("nanbeige4.2", 2),)
# Later versions that keep an earlier family's shapes at the same sizes (LFM2.5 = LFM2's).
# Qwen2 and Qwen2.5 share their shapes at every size both have (0.5B, 1.5B, 7B, 72B)
_SAME_SHAPES = {"lfm2.5": "lfm2", "qwen2-": "qwen2.5-"}
# Whole names (after clean_name) that name a table entry without its size.
_EXACT_NAMES = {"deepseek-r1": "deepseek-v3", "deepseek-r1-0528": "deepseek-v3",
                "deepseek-v3.1": "deepseek-v3", "deepseek-v3-0324": "deepseek-v3"}


def estimate_shape(name: str, params_b: float, active_b: float | None = None) -> ModelSpec:
    """A typical dense shape for a parameter count (used when the family is not in the table)."""
    p = max(params_b, 0.01)
    dense = active_b if active_b is not None else p
    hidden = int(64 * round(math.sqrt(dense * 1e9 / (12 * _layers_for(dense) * 1.0)) / 64)) or 64
    layers = _layers_for(dense)
    heads = max(1, hidden // 128)
    kv = max(1, min(8, heads // 4))
    vocab = 128000 if dense >= 0.5 else 50000
    return ModelSpec(name, p, dense, layers, hidden, heads, kv, vocab, 4 * hidden, 128,
                     shape_known=False)


def _layers_for(params_b: float) -> int:
    # Fitted by eye to common dense models: 0.1B->24, 1B->20, 7B->32, 14B->40, 32B->64, 70B->80.
    return int(min(96, max(16, round(18 + 14 * math.log10(max(params_b, 0.1)) ** 2
                                     + 10 * math.log10(max(params_b, 0.1))))))


_SIZE = re.compile(r"(?<![0-9a-z.])(\d+(?:[._]\d+)?)([bm])(?=$|[-_ .:/]|a\d)", re.IGNORECASE)
_ACTIVE = re.compile(r"(?:^|[-_ .:/]|\d[bB])a(\d+(?:[._]\d+)?)([bm])(?=$|[-_ .:/])", re.IGNORECASE)
_EFFECTIVE = re.compile(r"(?:^|[-_ .:/])e(\d+(?:\.\d+)?)b(?=$|[-_ .:/])", re.IGNORECASE)
_MOE = re.compile(r"(?:^|[-_ .:/])(\d+)x(\d+(?:\.\d+)?)b(?=$|[-_ .:/])", re.IGNORECASE)


def clean_name(raw: str) -> str:
    """Lower-case model name without path, extension, organisation prefix or quant suffix."""
    s = raw.strip().rsplit("/", 1)[-1]
    s = re.sub(r"\.gguf$", "", s, flags=re.IGNORECASE)
    s = re.sub(r"[-_.:](?:ud-)?(?:i?q\d(?:_[0-9a-z]+)*|f16|bf16|f32|mxfp4|nvfp4)(?:-fp16)?$", "",
               s, flags=re.IGNORECASE)
    return s.lower()


def _num(text: str, unit: str) -> float:
    value = float(text.replace("_", "."))
    return value / 1000.0 if unit.lower() == "m" else value


def parse_sizes(name: str) -> tuple[float | None, float | None]:
    """(total, active) billions of parameters stated in a name; either may be None."""
    s = clean_name(name)
    moe = _MOE.search(s)
    if moe:  # "8x7B": Mixtral's naming, two experts of N a token; ~3.5% of it shared
        n = int(moe.group(1))
        total = n * float(moe.group(2)) * 0.8
        return total, (total * (0.035 + 0.965 * min(2, n) / n) if n > 2 else None)
    active = _ACTIVE.search(s)
    act = _num(active.group(1), active.group(2)) if active else None
    eff = _EFFECTIVE.search(s)
    if eff:  # "E4B" = 4B effective; runtimes still stream the per-layer embeddings (~1.7x)
        e = float(eff.group(1))
        return e * 1.7, None
    sizes = [_num(m.group(1), m.group(2)) for m in _SIZE.finditer(s)]
    if act is not None:
        sizes = [x for x in sizes if abs(x - act) > 1e-9] or sizes
    return (max(sizes) if sizes else None), act


# a context named in a model's name: "-4k-", "-128k", "-16K", "gradient-1048k"
_CONTEXT_TAG = re.compile(r"(?:^|[-_.])(\d{1,4})k(?=$|[-_.])")


def lookup(name: str) -> ModelSpec | None:
    """ModelSpec for a model or GGUF file name, or None when no size can be derived."""
    s = clean_name(name)
    key = _table_key(s)
    if key:
        spec = replace(KNOWN[key], name=s)
        tag = _CONTEXT_TAG.search(s)  # a variant named by its context ("phi-3-mini-128k")
        return replace(spec, trained_context=int(tag.group(1)) * 1024) if tag else spec
    total, active = parse_sizes(s)
    if total is None:
        return None
    spec = estimate_shape(s, total, active)
    if "gemma" in s:  # Gemma ties its 262k-entry token embedding to the head at every size
        spec = replace(spec, vocab_size=262144, tied_embeddings=True)
    for family, every, state, mixer in _HYBRID_FAMILIES:
        if family in s:  # a hybrid family at a size not in the table
            spec = replace(spec, attention_layers=max(1, spec.n_layers // every),
                           state_bytes_per_layer=state(spec.hidden_size), mixer=mixer)
    if any(family in s for family in _PARALLEL_HYBRIDS):
        spec = replace(spec, mixer=PARALLEL_HYBRID)
    if "qwen3.5" in s or "qwen3-next" in s:
        # a Qwen3.5 / Qwen3-Next size not in the table (2B, 4B, 122B-A10B, 397B-A17B): every
        # published config of the family has 256-wide heads, 2-4 of them for K/V, and Qwen3.5 a
        # 248,320-entry vocabulary.
        spec = replace(spec, head_dim=256, n_kv_heads=min(spec.n_kv_heads, 4),
                       vocab_size=248320 if "qwen3.5" in s else spec.vocab_size)
    for family, loops in _LOOPED_FAMILIES:
        if family in s:  # the size estimate's layers are the stored ones
            spec = replace(spec, n_layers=spec.n_layers * loops, layer_loops=loops)
    eff = _EFFECTIVE.search(s)
    if eff:  # of the 1.7x, ~1.25x is streamed (Gemma 3n / 4: 1.14x-1.37x), the rest looked up
        spec = replace(spec, per_layer_embed_params_b=0.45 * float(eff.group(1)))
    return spec


def _table_key(s: str) -> str | None:
    if s in _EXACT_NAMES:
        return _EXACT_NAMES[s]
    for frag, key in _FAMILY_HINTS:
        if frag in s:
            return key
    named = s
    for later, same in _SAME_SHAPES.items():
        named = named.replace(later, same)
    dashed = named.replace(":", "-")  # ollama: "mixtral:8x7b"
    for key, spec in KNOWN.items():  # a mixture of experts by its whole name ("glm-4.5")
        if spec.is_moe and key in dashed:
            return key
    total, active = parse_sizes(s)
    if total is None:
        return None
    for key, spec in KNOWN.items():
        if not spec.is_moe and _family_in(key.rsplit("-", 1)[0], named) and \
                _size_matches(key, total, active):
            return key
    return None


def _family_in(family: str, s: str) -> bool:
    """The family's name in `s`, not as the start of a longer version ("qwen3" is not in
    "qwen3.5-4b": Qwen3.5's 4B is a hybrid, not Qwen3's 4B)."""
    return any(re.search(re.escape(f) + r"(?![.\d])", t) for f, t in
               ((family, s), (family.replace("-", ""), s.replace("-", ""))))


def _size_matches(key: str, total: float, active: float | None) -> bool:
    if active is not None:
        return False
    tag = key.rsplit("-", 1)[1]
    size = _num(tag[:-1], tag[-1]) if tag[-1] in "bm" and tag[:-1].replace(".", "").isdigit() else None
    return size is not None and abs(size - total) / size < 0.05

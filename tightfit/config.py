"""Frozen, typed configuration for the engine, one dataclass per concern, validated once.

Each component receives only its own sub-config. Sizes are in tokens or bytes (named so).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from tightfit.errors import TightfitError


def default_threads() -> int:
    """The CPUs this process may run on (its affinity where the OS has one): the default thread
    count of the engines and the machine fingerprint's logical CPUs."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else (os.cpu_count() or 1))

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_bytes(value: int | float | str) -> int:
    """Parses a byte count: 123, 1.5e9, "512MiB", "1.5GiB", "2GB"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise TightfitError(f"byte size must be positive, got {value!r}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise TightfitError(
            f"cannot read byte size {value!r}: use a number of bytes or e.g. '512MiB', '1.5GiB'"
        )
    n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if n <= 0:
        raise TightfitError(f"byte size must be positive, got {value!r}")
    return int(n)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture numbers of a decoder-only transformer (read from GGUF or config.json)."""

    architecture: str  # "llama" (Llama 2/3, SmolLM2, Qwen2-style) or "gemma3"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    qkv_bias: bool = False
    hidden_act: str = "silu"  # "silu" or "gelu_tanh"
    # Gemma 3 specifics.
    rope_local_theta: float | None = None  # RoPE base on sliding-window layers
    sliding_window: int | None = None
    sliding_window_pattern: int = 0  # every Nth layer is global; 0 = all global
    sliding_layers: tuple[int, ...] | None = None  # explicit sliding layers (overrides pattern)
    qk_norm: bool = False
    sandwich_norm: bool = False  # post-attention and pre/post-feed-forward norms
    embed_scale: float = 1.0
    query_pre_attn_scalar: float | None = None
    final_logit_softcap: float | None = None
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)
    name: str = ""

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise TightfitError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise TightfitError(f"unsupported activation {self.hidden_act!r}")

    def is_sliding(self, layer: int) -> bool:
        if not self.sliding_window:
            return False
        if self.sliding_layers is not None:
            return layer in self.sliding_layers
        if not self.sliding_window_pattern:
            return False
        return (layer + 1) % self.sliding_window_pattern != 0

    @property
    def has_sliding_layers(self) -> bool:
        return any(self.is_sliding(i) for i in range(self.num_layers))

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


KV_DTYPES = ("fp32", "int8")


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: fixed-size blocks of `block_size` tokens from one shared pool."""

    block_size: int = 16
    kv_cache_bytes: int = 256 * 1024**2
    num_blocks: int | None = None  # overrides kv_cache_bytes when set
    enable_prefix_caching: bool = True
    # Length tiers as (name, max tokens, share of blocks); the last tier stretches to
    # max_model_len. One tier = a single shared pool.
    tiers: tuple[tuple[str, int, float], ...] = (("short", 512, 0.5), ("long", 2048, 0.5))
    swap_bytes: int = 256 * 1024**2  # disk-backed swap area for preempted sequences; 0 = off
    idle_ttl_s: float | None = 600.0  # cached prefixes idle this long are forgotten
    length_grouping: bool = True  # batch decode attention by context-length bucket
    kv_dtype: str = "fp32"  # "fp32", or "int8" (per-token, per-head fp32 scales, symmetric absmax)

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise TightfitError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise TightfitError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.kv_dtype not in KV_DTYPES:
            raise TightfitError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, "
                                f"got {self.kv_dtype!r}")

    def kv_bytes_per_token(self, model: ModelConfig) -> int:
        """Real bytes one token occupies in this cache, all layers, K and V (int8: the codes
        plus one fp32 scale per head)."""
        if self.kv_dtype == "int8":
            return 2 * model.num_layers * model.num_kv_heads * (model.head_dim + 4)
        return model.kv_bytes_per_token(4)


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits per engine step."""

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512  # also the prefill chunk size
    # Prefill chunk of background requests (priority > 0): a more important request arriving
    # meanwhile waits out at most one such short step. Chunks of 64 cost fp32 prefill ~30% of
    # its rate here (none for int4 weights); set it to max_num_batched_tokens to turn this off.
    background_chunk_tokens: int = 32
    max_model_len: int = 2048
    max_waiting: int = 1024  # requests queued beyond this are refused ("queue full")
    aging_s: float = 10.0  # a waiting request's priority improves by 1 per aging_s waited
    max_preemptions: int = 3  # a request preempted this often is no longer picked as victim
    preemption_mode: str = "auto"  # "auto" (cost rule), "recompute" or "swap"

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "max_waiting",
                     "background_chunk_tokens"):
            if getattr(self, name) < 1:
                raise TightfitError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.preemption_mode not in ("auto", "recompute", "swap"):
            raise TightfitError(f"preemption_mode must be auto, recompute or swap, got "
                                f"{self.preemption_mode!r}")


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = CacheConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    attention: str = "fast"  # "fast" (batched gather + SDPA) or "reference" (plain torch)
    num_threads: int | None = None
    compile_decode: bool = False  # decode-only steps through torch.compile (engine/compiled.py)
    scripted_decode: bool = True  # decode-only steps through TorchScript (engine/scripted.py)
    fused_kernels: bool = True  # ... on the fused C++ decode kernels (engine/kernels/)

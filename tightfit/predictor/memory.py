"""Peak memory per engine: weights (as stored or as dequantised) + KV + compute buffers + runtime,
and where it goes (device or host) when a discrete GPU is too small.

Calibrated against the three reference peak-RSS figures in DESIGN.md only; treat as +-15%.
"""
from __future__ import annotations

from dataclasses import dataclass

from tightfit.predictor import formats
from tightfit.predictor.engines import EngineProfile
from tightfit.predictor.scenario import Scenario

MB = 2.0 ** 20
GB = 2.0 ** 30  # memory sizes in the contract are GiB, as vendors and operating systems count them
# Share of memory an engine can really use: macOS caps GPU working sets near 3/4 of RAM.
_USABLE = {"apple": 0.75, "unified_soc": 0.9, "cpu": 0.9, "discrete_gpu": 1.0}
_HF_LOAD_TRANSIENT = 0.25  # extra copy held while dequantising GGUF tensors at load time


@dataclass(frozen=True)
class MemoryEstimate:
    weights_bytes: float
    kv_bytes: float
    buffers_bytes: float
    runtime_bytes: float
    peak_bytes: float          # everything the deployment needs, device side if it all fit
    capacity_bytes: float      # usable memory of the device(s)
    device_fraction: float     # share of weights+KV placed on the device(s) (1.0 = all)
    host_bytes: float          # bytes placed in host RAM by offload
    fits_on_device: bool
    fits: bool | None          # None when the host RAM needed for offload is unknown


def compute_dtype_bytes(s: Scenario) -> float:
    if s.quant in ("fp32", "f32") or s.device.device_class == "cpu":
        return 4.0
    return 2.0


_EMBED_MIN_BITS = 6.5625  # llama.cpp quant presets keep token embedding / output head at Q6_K or more


def weight_bytes(s: Scenario, prof: EngineProfile) -> float:
    """Bytes of all weights as the engine holds them (GGUF presets: embedding at >= Q6_K)."""
    total = s.model.params_b * 1e9
    if prof.dequantises:
        return total * compute_dtype_bytes(s)
    embed = min(total / 2, float(s.model.vocab_size * s.model.hidden_size))
    gguf = s.quant.startswith(("q", "iq", "tq"))
    embed_bits = max(s.bits_per_weight, _EMBED_MIN_BITS) if gguf else s.bits_per_weight
    return ((total - embed) * s.bits_per_weight + embed * embed_bits) / 8


def active_weight_bytes(s: Scenario, prof: EngineProfile) -> float:
    """Weight bytes streamed in one decode step (MoE: the experts the batch touches)."""
    m = s.model
    b = s.workload.batch
    active = min(m.params_b, m.active_params_b * (1 + 0.5 * (b - 1))) if m.is_moe else m.params_b
    return weight_bytes(s, prof) * active / m.params_b


def kv_bytes_per_token(s: Scenario) -> float:
    dtype = s.workload.kv_dtype or ("fp16" if compute_dtype_bytes(s) == 2.0 else "fp32")
    if s.engine == "llama.cpp" and not s.workload.kv_dtype:
        dtype = "f16"
    return s.model.kv_elements_per_token() * formats.kv_bytes(dtype)


def buffer_bytes(s: Scenario) -> float:
    m, w = s.model, s.workload
    # llama.cpp reserves its compute buffer for a full micro-batch at start-up.
    ubatch = min(w.context_tokens, 512) if s.engine == "llama.cpp" else max(w.prompt_tokens, 1)
    per_token = 4 * m.hidden_size + 2 * m.intermediate_size + m.n_heads * min(w.context_tokens, 4096)
    return 4.0 * w.batch * ubatch * per_token + 4.0 * w.batch * m.vocab_size


def estimate(s: Scenario, prof: EngineProfile) -> MemoryEstimate:
    weights = weight_bytes(s, prof)
    kv = kv_bytes_per_token(s) * s.workload.context_tokens * s.workload.batch
    buffers = buffer_bytes(s)
    gpu = s.device.device_class == "discrete_gpu"
    runtime = (prof.device_runtime_mb * s.device.device_count if gpu else prof.host_runtime_mb) * MB
    transient = _HF_LOAD_TRANSIENT * weights if prof.dequantises else 0.0
    peak = weights + kv + buffers + runtime + transient
    capacity = s.device.memory_gb * GB * s.device.device_count * _USABLE[s.device.device_class]
    fits_dev = peak <= capacity
    frac, host = 1.0, 0.0
    # llama.cpp shrinks its context to the request before it moves layers off the device.
    kv_min = kv if s.engine != "llama.cpp" else kv * min(
        1.0, (s.workload.prompt_tokens + s.workload.gen_tokens) / max(s.workload.context_tokens, 1))
    if not fits_dev and gpu:
        room = max(capacity - buffers - runtime - transient, 0.0)
        frac = min(1.0, room / max(weights + kv_min, 1.0))
        host = (1 - frac) * (weights + kv_min)
    fits = _fits(s, fits_dev, gpu, host, prof)
    return MemoryEstimate(weights, kv, buffers, runtime, peak, capacity, frac, host, fits_dev, fits)


def _fits(s: Scenario, fits_dev: bool, gpu: bool, host: float, prof: EngineProfile) -> bool | None:
    if fits_dev:
        return True
    if not gpu:
        return False
    if s.device.host_memory_gb is None:
        return None
    host_need = host + prof.host_runtime_mb * MB
    return host_need <= s.device.host_memory_gb * GB * _USABLE["cpu"]

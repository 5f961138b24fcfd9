"""Analytic base: time per decode step and per prompt from bytes moved and FLOPs, with engine priors.

Components (seconds) stay separate so attribution falls out: memory bandwidth, compute, fixed
overhead, offload transfer. Memory-vs-compute overlap uses a smooth max (p-norm, p=3). No learning.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tightfit.predictor import memory
from tightfit.predictor.engines import EngineProfile, for_scenario, keeps_quantised, profile
from tightfit.predictor.formats import FLOAT_WEIGHTS
from tightfit.predictor.memory import MemoryEstimate
from tightfit.predictor.scenario import Scenario

_P = 3.0
# llama.cpp's decode kernels on a CPU overlap their weight reads with their arithmetic more for
# float weights than for blocks. Timed on this EPYC at one thread (llama-bench, the default
# model, 2026-12-07 01:42-01:44 UTC, "Graph operations of a recurrent layer"): Q8_0's step is
# its reads at the copy rate plus its arithmetic at its in-cache kernel rate (12.6 ms, measured
# 12.5: p ~1), F16's near their p = 3 norm (13.4 ms, the sum 21). The base's terms are
# effective rates (its compute terms 1.3-1.35x, its read terms ~1.1x those components), on
# which the sweep's rows read F16 at 0.84-0.88 of measured on both CPUs with p = 3 and the
# block formats at 0.88-1.26; p = 8 for float weights puts F16 at 0.92-0.95 and leaves the
# blocks, and p = 2 for the blocks as well moved the llmfit CPU's Q4_K_M rows 9.2% -> 11.2%.
# Decode held out by device (one-off folds, 2026-12-07 05:12-05:25 UTC): 10.21% -> 10.03%
# (this machine's llama.cpp rows 8.8 / 13.4% -> 7.5 / 11.9% at 1 / 2 threads, the Xeon's 9.9%
# -> 9.3%; p = 2 for the blocks too: 10.11%).
FLOAT_OVERLAP_P = 8.0
_HOST_EFF = 0.55        # fraction of host DRAM bandwidth llama.cpp's CPU layers reach
_LINK_EFF = 0.8         # fraction of PCIe bandwidth reached streaming weights
_HOP_S = 1.5e-4         # per device boundary per step (activation copy + sync)


@dataclass(frozen=True)
class Phase:
    """Time components of one phase; `total` combines them."""

    mem_s: float
    comp_s: float
    overhead_s: float
    offload_s: float
    # how far reads and arithmetic overlap: the p of the p-norm (large: the slower one alone;
    # 1: their sum). `_P` but for llama.cpp's float decode kernels on a CPU (`overlap_p`)
    p: float = _P

    @property
    def roof_s(self) -> float:
        return (self.mem_s ** self.p + self.comp_s ** self.p) ** (1 / self.p)

    @property
    def total(self) -> float:
        return self.roof_s + self.overhead_s + self.offload_s

    def shares(self) -> dict[str, float]:
        """Share of the phase's time per cause; sums to 1."""
        denom = self.mem_s ** self.p + self.comp_s ** self.p
        roof = self.roof_s
        mem = roof * (self.mem_s ** self.p / denom) if denom > 0 else 0.0
        parts = {"memory_bandwidth": mem, "compute": roof - mem,
                 "overhead": self.overhead_s, "offload_transfer": self.offload_s}
        tot = sum(parts.values()) or 1.0
        return {k: v / tot for k, v in parts.items()}


@dataclass(frozen=True)
class Breakdown:
    decode: Phase            # one decode step of the whole batch
    prefill: Phase           # the whole prompt of the whole batch
    request_overhead_s: float
    memory: MemoryEstimate
    bytes_per_step: float
    flops_per_step: float
    prefill_flops: float


def kernel_scale(s: Scenario, phase: str) -> float:
    """How much faster (> 1) or slower an engine's CPU matrix kernels run on this device than
    its fp32 GEMM rate says (DeviceSpec.kernel_rel), for the kernels that are hand-written SIMD
    code: llama.cpp's and the lite runtime's in every format and phase, and tightfit's fused
    decode kernels for block and integer weights (tightfit/engine/kernels). 1 for the
    libraries' kernels (torch's float GEMV / GEMM, fbgemm's int8 GEMM behind tightfit's
    prompts), off a CPU, and on a CPU with no kernel rate measured.
    Two 2-core VMs: the Xeon's kernel / GEMM share is 0.47 of the EPYC's, and its llama.cpp,
    lite and tightfit int8 decode at one thread ran at 0.38-0.61 of the EPYC's while its GEMM
    probe was 1.21x the EPYC's. Held out by machine, tightfit's prefill scaled too read 27.4%
    MAPE, unscaled 22.6% (docs/predictor.md, "A kernel probe")."""
    d = s.device
    if d.device_class != "cpu" or d.kernel_gflops is None:
        return 1.0
    if s.engine in ("llama.cpp", "tightfit-lite") or (
            phase == "decode" and s.engine == "tightfit" and s.quant.lower() not in FLOAT_WEIGHTS):
        return d.kernel_rel
    return 1.0


def stream_scale(s: Scenario) -> float:
    """How much faster (> 1) or slower llama.cpp's and the lite runtime's kernels stream weights
    on this CPU than its copy rate says (DeviceSpec.stream_rel), in every phase; 1 for the other
    engines, off a CPU, and on a CPU with no streaming share measured. The Xeon VM's lite
    kernel streams 0.34 of a copy, the EPYC's 0.98, and the Xeon's llama.cpp and lite decode
    read F16 / Q8_0 weights at 4.6-6.7 GB/s against a ~20 GB/s copy. tightfit's integer decode
    is not scaled: scaled, held out by machine, its EPYC and Xeon rows swapped sides (0.87-0.93
    and 0.94-1.22 of measured speed -> 1.28-1.44 and 0.60-0.80; docs/predictor.md, "A
    streaming probe")."""
    return s.device.stream_rel if s.engine in ("llama.cpp", "tightfit-lite") else 1.0


# fbgemm's int8 product, which tightfit's int8 decode runs (two activation rows a token,
# quant/linear.int8x2_linear), gains from more threads on large matrices only. Component
# measurement on the Xeon VM (30 distinct int8 matrices of one shape a pass, one token, 1 vs 2
# threads alternating, best of 3 medians, two rounds, 2026-12-06 16:02 and 16:06 UTC;
# docs/predictor.md "Thread gain of fbgemm's small products"): a second thread gained
# 0.73-1.10x on 0.33-0.55 MB matrices, 1.14-1.36x at 0.66-0.88 MB, 1.49-1.87x at 0.98-2.6 MB,
# and 1.70-1.97x at 17-134 MB (one matrix), against the copy's 1.84. As a share of the copy's
# gain: ~0 below 0.5 MB, rising with log size to ~1 at 2 MB.
FBGEMM_THREADED_MB = (0.5, 2.0)


# MKL, behind torch's float products on x86 CPUs, keeps a product of a few activation rows on
# one thread on an AMD CPU (pytorch/pytorch#96643, "SGEMV is using 1 single core on AMD CPUs").
# Component measurement on the EPYC VM (F.linear fp32, 60 matrices of 1536 x 576 and 6-8 of 4096
# x 4096, best of 5, 1 vs 2 threads, two one-off scripts, 2026-12-07 22:59 and 23:02 UTC): 1 row
# 11.3-11.5 vs 11.4-11.6 GB/s; 4096 x 4096 20.4-20.8 vs 18.8-20.6 in the first, 16.3 vs 19.6 in
# the second; 2 and 4 rows no gain, 8 rows 1.35x, 16 rows 1.45x. The bench's rows agree: tightfit's
# fp32 decode of the default model 20.7 tok/s at one thread, 19.8 at two (the Xeon VM: 21.1,
# 38.1), Gemma 3 270M 11.2 and 11.2 (Xeon 12.1, 20.1).
MKL_ONE_THREAD_ROWS = 8


def mkl_one_thread(s: Scenario) -> bool:
    """A decode step whose float products MKL keeps on one thread: torch's fp32 weights
    (tightfit's fp32 path; HF's fp32 checkpoints and the GGUF files it dequantises to fp32) at
    fewer than MKL_ONE_THREAD_ROWS sequences on an AMD CPU (DeviceSpec.amd_cpu)."""
    if not s.device.amd_cpu or s.workload.batch >= MKL_ONE_THREAD_ROWS:
        return False
    if s.engine == "tightfit":
        return s.quant.lower() in ("fp32", "f32")
    if s.engine == "hf-transformers":
        prof = profile(s.engine, s.device.device_class)
        return memory.compute_dtype_bytes(s) == 4.0 and not keeps_quantised(prof, s.quant)
    return False


def thread_efficiency(s: Scenario) -> float:
    """The share (0-1) of the extra rate more threads give the analytic base (the copy's gain in
    the memory term, the thread count in the compute term) that an engine's decode products
    get: 0 where MKL keeps them on one thread (`mkl_one_thread`); for tightfit's int8 decode on
    a CPU, the byte-weighted share over the model's matrices (`FBGEMM_THREADED_MB`: 0 at 0.5
    MB, 1 from 2 MB, linear in log size between), with each layer's fused products (q/k/v,
    output, gate/up, down) and the output head; 1 elsewhere. The default model's matrices are
    0.33-1.77 MB (0.66 with its 28 MB head), Gemma 3 270M's 0.66-2.6 (0.90 with its 168 MB
    head); an 8B model's are all larger than 2 MB."""
    if mkl_one_thread(s):
        return 0.0
    if s.engine != "tightfit" or s.device.device_class != "cpu" or s.quant.lower() != "int8":
        return 1.0
    m = s.model
    lo, hi = FBGEMM_THREADED_MB
    q, kv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    sizes = [(m.hidden_size * (q + 2 * kv), m.n_layers), (q * m.hidden_size, m.n_layers),
             (2 * m.intermediate_size * m.hidden_size, m.n_layers),
             (m.intermediate_size * m.hidden_size, m.n_layers), (m.embedding_params, 1)]
    total = sum(b * n for b, n in sizes)
    if total <= 0:
        return 1.0

    def share(nbytes: float) -> float:
        return min(1.0, max(0.0, math.log(max(nbytes, 1.0) / 1e6 / lo) / math.log(hi / lo)))

    return sum(b * n * share(b) for b, n in sizes) / total


def decode_phase(s: Scenario, prof: EngineProfile, mem: MemoryEstimate) -> tuple[Phase, float, float]:
    m, w, d = s.model, s.workload, s.device
    ctx = w.prompt_tokens + w.gen_tokens / 2
    # K/V read, and a hybrid's recurrent state read and written back
    kv_read = memory.kv_bytes(s, prof, ctx, read=True) + 2 * memory.state_bytes(s, held=False)
    weights = memory.active_weight_bytes(s, prof)
    step_bytes = weights + kv_read
    # the bytes as the engine's time sees them: an MoE's experts stream at moe_bw_rel
    timed_bytes = weights / (prof.moe_bw_rel if m.is_moe else 1.0) + kv_read
    # attention over the positions read (a sliding-window layer's window where the engine
    # holds or reads only that: memory.kv_tokens)
    keys = memory.kv_tokens(s, prof, ctx, read=True)
    attn_flops = w.batch * 4.0 * m.n_layers * keys * m.n_heads * m.head_dim
    # every parameter a token meets is a multiply-add, but for an untied embedding's lookup
    # (a looped model's layers once a pass: memory.params_read_per_token)
    flops = w.batch * 2 * memory.params_read_per_token(s) + attn_flops
    # the share of the step's bytes read from host RAM (llama.cpp's experts-first placement:
    # only the routed experts held there, memory.host_read_share); the rest is the device's
    host = memory.host_read_share(s, prof, mem, timed_bytes)
    f = 1.0 - host
    # what more threads add, to the copy rate and to the matrix rate, less the share an
    # engine's products do not get (thread_efficiency: tightfit's int8 on small matrices)
    eff = thread_efficiency(s)
    threads = max(_cpu_threads(s), 1)
    bw_gain = 1.0 + eff * (d.threads_bandwidth_gain - 1.0)
    comp_gain = (1.0 + eff * (threads - 1)) / threads
    mem_s = f * timed_bytes / (d.bandwidth_gbps * bw_gain * 1e9 * prof.bw_eff * stream_scale(s))
    # attention's FLOPs run at the engine's attn_rel of its matrix rate, the rate without the
    # weights' format factor: they multiply the f16 K/V whatever the weights' format
    attn_eff = profile(s.engine, d.device_class).decode_comp_eff * prof.attn_rel
    comp_s = f * ((flops - attn_flops) / prof.decode_comp_eff + attn_flops / attn_eff) / (
        d.fp16_tflops * comp_gain * 1e12 * kernel_scale(s, "decode"))
    off = _offload_decode(s, prof, timed_bytes, mem, host)  # the CPU's layers are MoE layers too
    # per-layer costs follow the graph operations a layer runs (a hybrid's recurrent layers run
    # more than an attention layer: ModelSpec.layer_ops)
    ovh = _layer_overhead_s(prof, s) * m.n_layers * m.layer_ops + prof.step_overhead_s + \
        _HOP_S * (d.device_count - 1)
    return Phase(mem_s, comp_s, ovh, off, overlap_p(s)), step_bytes, flops


def overlap_p(s: Scenario) -> float:
    """The p-norm's p of a decode step (Phase.p): `FLOAT_OVERLAP_P` for llama.cpp's float
    weights on a CPU, `_P` elsewhere."""
    if s.engine == "llama.cpp" and s.device.device_class == "cpu" \
            and s.quant.lower() in FLOAT_WEIGHTS:
        return FLOAT_OVERLAP_P
    return _P


def _layer_overhead_s(prof: EngineProfile, s: Scenario) -> float:
    """What a layer costs a decode step beyond its bytes and FLOPs: the engine's per-layer cost,
    plus, on a CPU, its thread pool's barriers, which grow with the threads that meet at them.
    A prompt call meets the same barriers, but they are ~0.1% of its time (0.6 ms against
    ~0.5 s for 512 tokens of SmolLM2-135M at two threads) and prefill's base leaves them out:
    counted there, prefill held out by model went 16.5% -> 19.4% and TTFT 17.5% -> 31.3%
    through screening alone (`tightfit predictor evaluate`, 2026-12-06 05:05-05:14 UTC)."""
    return prof.layer_overhead_s + prof.sync_s_per_thread_layer * _cpu_threads(s)


def _cpu_threads(s: Scenario) -> int:
    """The threads a CPU run uses (its device's cores); 0 off a CPU."""
    return (s.device.cpu_cores or s.device.compute_units) if s.device.device_class == "cpu" else 0


def _offload_decode(s: Scenario, prof: EngineProfile, step_bytes: float, mem: MemoryEstimate,
                    host: float) -> float:
    """Seconds a decode step spends on what is not on the device: `host` of `step_bytes` read
    from host RAM by a layer-split engine, or the host's weights over the link."""
    rest = 1.0 - mem.device_fraction
    if rest <= 0:
        return 0.0
    d = s.device
    if prof.offload == "layer_split":
        return host * step_bytes / (d.host_bandwidth_gbps * 1e9 * _HOST_EFF) + _HOP_S
    return rest * memory.weight_bytes(s, prof) / (d.link_gbps * 1e9 * _LINK_EFF)


def prefill_phase(s: Scenario, prof: EngineProfile, mem: MemoryEstimate) -> tuple[Phase, float]:
    m, w, d = s.model, s.workload, s.device
    p = max(w.prompt_tokens, 0)
    if p == 0:
        return Phase(0.0, 0.0, 0.0, 0.0), 0.0
    # The output head runs for the last position only (llama.cpp, tightfit, the lite runtime
    # and HF's generate all ask for the last token's logits), and an untied embedding is only
    # looked up: in Gemma 3 270M the head is 63% of the parameters.
    head = memory.embedding_params(s)
    body = max(m.active_params_b * 1e9 - head - memory.lookup_only_params(s), 0.0) * m.layer_loops
    # causal attention: p/2 keys a query on average; fewer on a windowed layer where the prompt
    # runs in calls against a window cache (llama.cpp: memory.kv_tokens), not where it runs in
    # one masked call (HF)
    keys = memory.kv_tokens(s, prof, p / 2) if prof.prompt_chunk else p / 2
    attn = 4.0 * m.n_layers * p * keys * m.n_heads * m.head_dim
    flops = w.batch * (2 * body * p + 2 * head + attn)
    # llama.cpp and the lite runtime run a prompt in calls of <= 512 tokens, each reading the
    # weights once, a batch's prompts packed together into the calls; the torch engine's
    # chunks are counted in its efficiency instead
    ubatches = math.ceil(w.batch * p / prof.prompt_chunk) if prof.chunk_reads_weights else 1
    weights = memory.weight_bytes(s, prof)
    streamed = (memory.streamed_weight_bytes(s, prof) - memory.lookup_only_bytes(s, prof)) * \
        memory.loop_read_factor(s)
    mem_s = mem.device_fraction * streamed * ubatches / (
        d.bandwidth_gbps * d.threads_bandwidth_gain * 1e9 * prof.bw_eff * stream_scale(s))
    comp_s = flops / (d.fp16_tflops * 1e12 * prof.comp_eff * kernel_scale(s, "prefill"))
    off = (1 - mem.device_fraction) * weights * ubatches / (d.link_gbps * 1e9 * _LINK_EFF)
    ovh = ubatches * (prof.step_overhead_s + prof.layer_overhead_s * m.n_layers * m.layer_ops)
    return Phase(mem_s, comp_s, ovh, off), flops


def analyse(s: Scenario) -> Breakdown:
    """The analytic base for one scenario."""
    prof = for_scenario(s)
    mem = memory.estimate(s, prof)
    dec, step_bytes, step_flops = decode_phase(s, prof, mem)
    pre, pre_flops = prefill_phase(s, prof, mem)
    return Breakdown(dec, pre, prof.request_overhead_s, mem, step_bytes, step_flops, pre_flops)


def naive_decode_tok_s(s: Scenario) -> float:
    """The naive baseline: peak bandwidth / stored weight bytes, nothing else."""
    return s.device.bandwidth_gbps * 1e9 / (s.model.active_params_b * 1e9 * s.bits_per_weight / 8)


def naive_prefill_tok_s(s: Scenario) -> float:
    """The naive baseline for prompts: peak matrix rate / (2 x active parameters)."""
    return s.device.fp16_tflops * 1e12 / (2e9 * s.model.active_params_b)

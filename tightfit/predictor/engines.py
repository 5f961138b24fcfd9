"""Per-engine priors: how each runtime stores weights and KV, what it costs per step, how it offloads.

These are starting values from public figures and this project's reference measurements; the
learned residual (models.py) corrects them per engine and device class from measured data.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tightfit.predictor.formats import HF_HELD_QUANTISED
from tightfit.predictor.hardware import COPY_OF_PEAK

if TYPE_CHECKING:
    from tightfit.predictor.scenario import Scenario

ENGINES = ("llama.cpp", "tightfit", "hf-transformers", "tightfit-lite")
# the lite runtime (tightfit/lite) reads these stored formats only, on the CPU
LITE_QUANTS = ("q4_0", "q4_1", "q8_0", "f16", "f32", "fp32")
# MLX (mlx-lm) is predicted as llama.cpp on Metal with MLX's own storage: the formats it runs
MLX_ENGINES = ("mlx", "mlx-lm", "mlx_lm")
MLX_QUANTS = ("4bit", "8bit", "mxfp4", "bf16", "fp16", "f16")
_ALIASES = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "llama_cpp": "llama.cpp",
            "lite": "tightfit-lite", "tightfit_lite": "tightfit-lite",
            "ollama": "llama.cpp", "hf": "hf-transformers", "transformers": "hf-transformers",
            "huggingface": "hf-transformers", **{e: "llama.cpp" for e in MLX_ENGINES}}


@dataclass(frozen=True)
class EngineProfile:
    """Priors for one engine on one device class. Times in seconds, sizes in MB."""

    bw_eff: float            # fraction of rated bandwidth reached streaming weights in decode
    comp_eff: float          # fraction of peak matrix rate reached in prefill
    decode_comp_eff: float   # fraction of peak matrix rate reached in decode (dequantising GEMV)
    step_overhead_s: float   # fixed cost of one decode step (launches, sampling, sync)
    layer_overhead_s: float  # extra cost per layer per step
    request_overhead_s: float  # tokenisation, scheduling, first-sample cost per request
    host_runtime_mb: float   # process baseline in RAM
    device_runtime_mb: float  # context/driver memory held on an accelerator
    dequantises: bool        # loads quantised weights into a float compute dtype
    offload: str             # "layer_split" (CPU runs its layers) | "stream" (weights cross the link)
    tokenizer_bytes_per_token: float = 0.0  # host memory of the loaded tokenizer per vocab entry
    load_transient_mb: float = 0.0  # loader's fixed extra at its worst moment
    load_transient_share: float = 0.0  # ... plus this share of the largest tensor (embedding)
    attn_rel: float = 1.0  # decode attention's FLOP rate as a fraction of the matrix rate
    kv_dtype: str | None = None  # KV cache dtype unless the workload names one (None: compute)
    prompt_chunk: int = 0    # prompts run in calls of at most this many tokens (0: all at once)
    chunk_reads_weights: bool = False  # ... each call streaming the weights again
    reserves_chunk: bool = False  # compute buffer reserved for a full chunk of the context
    head_copy: bool = False  # holds the output head again in its compute format (tied or not)
    device_margin_mb: float = 0.0  # memory it leaves free on each discrete GPU when placing layers
    moe_bw_rel: float = 1.0  # share of bw_eff its decode reaches on a mixture-of-experts model
    # K/V a sliding-window layer keeps: None = the whole context (no window cache); else the
    # window plus this many tokens (llama.cpp: one prompt call, n_ubatch; HF: none)
    kv_window_extra: int | None = None
    # a decode step reads only the window's K/V on a sliding-window layer even where the cache
    # holds every position (tightfit's fused CPU decode attention: decode.cpp starts each
    # row at max(0, len - window))
    decode_reads_window: bool = False
    # a prompt call's attention scores (heads x positions a token) held in the compute buffer;
    # none with flash attention, which llama.cpp turns on by default where the backend has it
    score_buffer: bool = True
    # a CPU thread pool's barriers after a layer's graph nodes: seconds a layer, per thread
    # that meets at them (roofline adds it x the threads the run uses)
    sync_s_per_thread_layer: float = 0.0
    # a mixture of experts too large for the GPU keeps attention, K/V and the dense parts on
    # the card and puts routed-expert tensors in host RAM first (llama.cpp's `--fit`)
    experts_to_host: bool = False
    # a decode step of two or more sequences pays a whole further single-stream step for the
    # first further one before the prompt rate takes over (core.batched_step): llama.cpp on a
    # CPU, whose products leave their matrix-vector path from two columns
    batch_whole_first_step: bool = False
    # (most columns its matrix-vector kernels take, the tile of columns its matrix-matrix
    # kernel computes whole): a decode step of more sequences than the first is charged the
    # FLOPs of whole tiles (core.batch_columns); None: the batch as it is
    batch_tile: tuple[int, int] | None = None
    # a decode step of several sequences multiplies each block of weights by all of them in one
    # pass over the weights, so the further sequences' arithmetic overlaps the step's reads as
    # a single step's does (the p-norm: core.batched_step); False: added after the step (a
    # library whose few-column products run as passes, or kernels not measured in batches)
    batch_one_pass: bool = False


# llama.cpp on Metal: a product of more than 8 columns goes to the matrix-matrix kernel
# (ggml-metal-ops.cpp, `ggml_metal_op_mul_mat_use_mm`: ne11 > 8), which computes tiles of 32
# columns (ggml-metal-device.cpp: nr1 = 32 without the tensor API). llama.cpp's public
# llama-batched-bench table for an M2 Ultra (docs/examples/batched-bench.jsonl): 16 sequences
# stepped in 95-96% of the time of 32 on every model (Qwen2.5-Coder-7B Q8_0 49.8 vs 52.4 ms,
# Gemma 3 4B 37.7 vs 40.6).
METAL_BATCH_TILE = (8, 32)


def keeps_quantised(prof: EngineProfile, quant: str) -> bool:
    """An engine that dequantises GGUF files (HF Transformers) keeps bitsandbytes, GPTQ, AWQ
    and fp8 weights quantised (formats.HF_HELD_QUANTISED)."""
    return prof.dequantises and quant in HF_HELD_QUANTISED


def canonical_engine(name: str) -> str | None:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in ENGINES else None


def profile(engine: str, device_class: str, quant: str | None = None) -> EngineProfile:
    """Priors for an engine (canonical name) on a device class, and where it matters the
    stored format (`quant`, lower case)."""
    base = _profile(engine, device_class)
    if engine in ("llama.cpp", "tightfit-lite") and device_class == "cpu" \
            and quant in _GGML_CPU_DECODE_RATE:
        base = replace(base, decode_comp_eff=base.decode_comp_eff * _GGML_CPU_DECODE_RATE[quant])
    if engine == "llama.cpp" and device_class == "cpu" and quant is not None:
        base = replace(base, comp_eff=_ggml_cpu_prompt_eff(quant))
    if engine == "llama.cpp" and device_class == "cpu" and quant == "q4_0":
        # ggml's CPU backend repacks Q4_0 weights at load into interleaved rows for its
        # matrix kernels (its "CPU_REPACK" buffer). Measured on this machine, llama-cpp-python
        # on the default model as stored (Q4_1) and re-typed to Q4_0, alternating, 2 threads,
        # 128-token prompt (2026-12-04 19:00 UTC, two rounds): prefill 285-313 vs 749-861
        # tok/s (2.4-3.0x: `_ggml_cpu_prompt_eff`), decode 115-120 vs 144-154 (1.26-1.29x).
        return replace(base, decode_comp_eff=base.decode_comp_eff * 1.3)
    if engine == "tightfit" and device_class == "cpu" and quant in ("f32", "fp32"):
        # its fp32 weights go through torch's matrix-vector product, not the packed kernels:
        # the bench rows of 2026-12-05 stream 10.6-11.8 GB/s on both models at one thread and
        # at two alike, 0.7-0.8x what its int8 kernel streams (14-18 GB/s) on the same machine.
        # Without it the residual bent its bits-per-weight terms for these rows, which then
        # put llama.cpp's F16 rows too slow as well (docs/predictor.md).
        return replace(base, bw_eff=base.bw_eff * 0.7)
    if engine == "tightfit-lite" and quant in _LITE_PROMPT_RATE:
        return replace(base, comp_eff=base.comp_eff * _LITE_PROMPT_RATE[quant])
    return base


# llama.cpp's CPU decode attention without flash attention (`-fa off`, llama-cpp-python's
# default): 0.6 of the matrix rate, where its profile has the tools' default, on (0.35)
_CPU_ATTN_REL_NO_FLASH = 0.6


def for_scenario(s: Scenario) -> EngineProfile:
    """`profile` for a scenario: its engine, device class and stored format, and the workload's
    engine settings (llama.cpp's flash attention, `Workload.flash_attn`)."""
    prof = profile(s.engine, s.device.device_class, s.quant)
    if s.engine == "llama.cpp" and s.workload.flash_attn is False:
        cpu = s.device.device_class == "cpu"
        return replace(prof, score_buffer=True,
                       attn_rel=_CPU_ATTN_REL_NO_FLASH if cpu else prof.attn_rel)
    return prof


# ggml-style decode (llama.cpp, the lite runtime) on a CPU by stored format, relative to the block
# formats: F16 weights are widened to f32 and multiplied against f32 activations, the blocks' ints
# against int8 ones. Component measurement (the lite runtime's tf_linear, one token, a 4096 x 4096
# matrix held in the L3 cache so that compute and not DRAM sets the rate, best of 5, 2026-12-05
# 09:26 UTC, two rounds): one thread F16 33.7-35.9 GFLOP/s, Q4_0 52.1-52.2, Q4_1 48.0-48.2,
# Q8_0 55.6 (0.65-0.7). Its decode was predicted as if memory-bound at one thread, so the base
# gained 1.09-1.10x from a second thread where llama.cpp's F16 rows gained 1.27x and the lite
# runtime's 1.44x; held out by thread count they read -0.33 and +0.22 in log space
# (docs/predictor.md).
_GGML_CPU_DECODE_RATE = {"f16": 0.65}

# llama.cpp's prompt kernels on a CPU by stored format (its ggml-cpu sources, x86 with AVX2, as
# vendored in llama-cpp-python 0.3.36): Q4_0, Q4_K, IQ4_NL and MXFP4 weights are repacked at load
# into interleaved rows for tiled int8 kernels (repack.cpp), and F32/F16/BF16, Q8_0, Q4_0, Q5_0
# and IQ4_NL go to llamafile's tiled GEMM (sgemm.cpp); every other block type (Q4_1, Q5_1, Q2_K,
# Q3_K, Q5_K, Q6_K, the IQ2/IQ3 types, IQ4_XS) takes the generic per-row dot product. The levels,
# as fractions of the machine's fp32 GEMM probe, from this machine's llama.cpp rows against the
# analytic base (median of 1- and 2-thread rows, 2026-12-05 dataset, so in-sample: no other CPU
# has prompt rows): Q4_1 (generic) 0.35, Q4_0 0.81, Q4_K_M 0.76, Q8_0 0.74 (tiled int8), F16
# 0.64 (tiled, converted to f32). The 2-core reference VM's one Q4_1 row reads 0.37. Before,
# 0.5 for every format and 1.25 for Q4_0: held out by device the Q4_0/Q4_1 rows were predicted
# 0.2-0.36 too fast and the Q8_0 / Q4_K_M ones 0.2-0.5 too slow (docs/predictor.md).
_GGML_CPU_TILED_INT = ("q4_0", "q4_k_s", "q4_k_m", "iq4_nl", "mxfp4", "q8_0", "q5_0")
_GGML_CPU_TILED_FLOAT = ("f16", "bf16", "f32", "fp32")


def _ggml_cpu_prompt_eff(quant: str) -> float:
    if quant == "q4_0":
        return 0.8
    if quant in _GGML_CPU_TILED_INT:
        return 0.75
    if quant in _GGML_CPU_TILED_FLOAT:
        return 0.65
    return 0.35


# The lite runtime's prompt kernel by stored format, relative to Q4_0 / Q4_1: float weights are
# multiplied against f32 activations (4 bytes read per multiply-add from cache), the block
# formats against int8 ones with integer dot products. Component measurement (tf_linear alone,
# a 1536 x 576 matrix as in SmolLM2, 128 tokens, best of 5, 2026-12-05 00:58 UTC): 1 thread
# F32 47.1, F16 47.7, Q4_0 69.9, Q4_1 68.3, Q8_0 76.6 GFLOP/s; 2 threads 94.1 / 95.7 / 131.8 /
# 129.3 / 144.7. Without it the lite F16 rows' prompt rate was predicted 1.3-2.1x too fast
# held out by thread count.
_LITE_PROMPT_RATE = {"f16": 0.7, "f32": 0.7, "fp32": 0.7, "q8_0": 1.1}


# How the engines run, whatever the device. llama.cpp and the lite runtime: f16 K/V by default,
# prompts in calls of <= 512 tokens (n_ubatch), each streaming the weights. llama.cpp also
# reserves its compute buffer for a full call at start-up, and keeps the context it is given:
# its `--fit` shrinks only a context left unset (to no less than 4096 tokens, common/fit.cpp),
# and moves layers off a GPU where a context set by the user does not fit. tightfit: prompts in
# chunks of <= 512 (max_num_batched_tokens; the chunks' weight reads are in its efficiency),
# and a second copy of the output head in its compute format.
_GGML_STYLE: dict[str, Any] = dict(kv_dtype="f16", prompt_chunk=512, chunk_reads_weights=True)
# moe_bw_rel: llama.cpp decodes a mixture-of-experts model at ~0.7 of the rate its dense models
# reach on the same device, per byte of active weights (the routed experts are many small
# products, one call per layer gathering them, plus routing). Measured against the analytic
# base, MoE rows minus dense rows of the same device, medians in log space (llmfit table, no
# offloaded row): Apple M4 Pro -0.38 (5 MoE rows), GB10 -0.33 (26), RX 7900 XT -0.36 (9), so
# exp(-0.36) = 0.70 on three backends (Metal, CUDA, ROCm/Vulkan); the one "CPU" (3 small MoE
# rows, since found to be the GTX 1050 Ti on Vulkan and left out) -0.60, left at the same
# value. Held out by device (`tightfit predictor evaluate`, 2026-12-05 09:09 UTC): decode MAPE
# 11.7% -> 11.6%, llmfit 14.8% -> 13.7%; the MoE rows alone (one-off decode folds) 22.5% ->
# 15.1% (max 124% -> 87%) (docs/predictor.md).
# kv_window_extra: llama.cpp's sliding-window layers hold n_swa + n_ubatch cells (512 by
# default; llama_kv_cache_iswa, unless --swa-full).
_LLAMA_CPP: dict[str, Any] = dict(_GGML_STYLE, reserves_chunk=True, moe_bw_rel=0.7,
                                  kv_window_extra=512)
_TIGHTFIT: dict[str, Any] = dict(prompt_chunk=512, head_copy=True)


def _profile(engine: str, device_class: str) -> EngineProfile:
    cpu = device_class == "cpu"
    if engine == "llama.cpp":
        if cpu:
            # attn_rel: decode attention at 0.35 of the matrix rate with flash attention, the
            # tools' default (0.6 without: `_CPU_ATTN_REL_NO_FLASH`), the rate without the
            # weights' format factor (it multiplies the f16 K/V). llama-bench -p 0 -n 64 -r 3
            # on the default model as Q4_0 / Q4_1 / F16 at depth 0, 512 and 1,536, 1 and 2
            # threads (the vendored build, this EPYC VM, 2026-12-07 04:08-04:11 UTC): with
            # flash attention 1,536 positions added 8.9-10.4 ms a token at one thread and
            # 4.2-6.1 ms at two; the base adds 8.8-9.8 / 4.4-6.4 ms at 0.35. Without it 4.5-5.8
            # / 3.4-3.6 ms (F16: 9.6 / 2.5, its runs noisier); the base adds 5.7-5.8 / 3.0-3.8
            # ms at 0.6, 3.4-3.6 / 2.1-2.5 ms at 1 (the value until then, which also took the
            # format's factor). The bench's llama.cpp rows (llama-cpp-python, flash attention off by
            # default) grow as without it (Q4_0, one thread: +6.2 ms from a 16- to a 1,536-token
            # prompt). Decode held out by device (one-off folds, 2026-12-07 04:17-04:24 UTC)
            # with 0.6 for those rows: 10.28% -> 10.21%; this machine's llama.cpp rows 10.6 /
            # 14.9% -> 8.8 / 13.4% (1 / 2 threads), the Xeon's 10.5% -> 9.9%. (0.6 with the
            # format factor, 2026-12-04, against an older base: 16.1% -> 16.4%, the llmfit
            # Xeon's rows 26% -> 33%.)
            # score_buffer: with flash attention a prompt call holds no heads x positions
            # scores (see the GPU profile below).
            # sync_s_per_thread_layer: ggml's CPU threads meet at a barrier after every node of
            # the graph that runs (this was first written with views and reshapes counted, ~25-30
            # a layer; ggml skips those, and a Llama layer's decode step runs 19:
            # architectures.RECURRENT_OPS, 2026-12-07), and a barrier costs more the more
            # threads spin on it: llama.cpp's own
            # test-barrier, 2,000 nodes on an EPYC, reads ~2.0 us a node at 4 threads and
            # ~3.0 us at 8 (its threadpool pull request), ~0.25 us a thread; x ~30 nodes: 10 us a
            # layer per thread (5 us also tried). The barrier pull request's own table agrees:
            # stories260k (5 layers) tg128 on an M3 Max at 4 / 8 / 12 threads, 7296 / 3272 /
            # 2407 tok/s, i.e. 137 / 306 / 415 us a token, 7-8.5 us a layer per added thread.
            # Without it the one many-core CPU in the data then (the llmfit table's GTX 1050 Ti
            # rows relabelled to their 14-core Xeon host) had its sub-1B models at ~0.5-0.6 of
            # the base, which the residual carried to every llama.cpp CPU row (this machine's
            # small-model rows 35-43% too slow held out). Decode folds by device (one-off
            # script, 2026-12-06 05:00 UTC): 10.64% -> 9.56% (5 us: 9.95%); own data 9.72% ->
            # 7.80%, llmfit 11.93% -> 11.34%, Apple 6.23% -> 5.90%, that Xeon 15.7% -> 12.8%
            # (docs/predictor.md). Since 2026-12-07 those rows are known to be the GPU's (their
            # submission states llama.cpp's Vulkan backend, every layer on the card) and are
            # left out; the cost stands on llama.cpp's own figures above.
            # batch_whole_first_step: ggml's CPU products take their matrix-vector path for one
            # column only; from two columns a format's batch kernel runs instead: llamafile's
            # tinyBLAS (F16, Q8_0 on x86), the repacked gemm in groups of four columns with one
            # matrix-vector pass for each column left over (Q4_0, Q4_K, IQ4_NL on AVX2), or the
            # generic dot product per row and column, which computes a whole matrix-vector
            # product again for each (Q4_1 and the other formats). Measured (data/measurements/
            # batch-epyc.jsonl and batch-formats-epyc.jsonl, the 2-core EPYC, llama-server, 1 and
            # 2 threads; docs/predictor.md "llama.cpp's batch kernels by format"): from one
            # sequence in flight to two the step grew by 0.5-1.6x the one-sequence step (Q8_0 at
            # one thread 10.3 -> 26.8 ms, Gemma 3's Q4_K_M 21.1 -> 45.0), where each sequence
            # after the second added 0.3-0.7x. On a GPU llama.cpp's matrix-vector kernels take
            # up to 8 columns (CUDA's mul_mat_vec_q, Metal's mul_mv), and tightfit's and HF's
            # batches did not jump on this CPU.
            return EngineProfile(0.6, 0.5, 0.3, 4e-4, 2e-5, 0.01, 90, 0, False, "layer_split",
                                 tokenizer_bytes_per_token=300, sync_s_per_thread_layer=1e-5,
                                 attn_rel=0.35, score_buffer=False, batch_whole_first_step=True,
                                 **_LLAMA_CPP)
        # device_margin_mb: llama.cpp's `--fit` (on by default since late 2025) places layers so
        # that 1024 MiB stay free on each GPU (`--fit-target`). With it, the llmfit table's
        # 12 GB and 8 GB cards held out by device: 29.7% -> 22.9% and 21.3% -> 18.5% decode MAPE
        # (27 rows offloaded instead of 20; docs/predictor.md).
        # score_buffer: llama.cpp's flash attention defaults to "auto" (llama_context_default_params,
        # common.h: LLAMA_FLASH_ATTN_TYPE_AUTO), on wherever the backend runs the fused op
        # (CUDA, ROCm, Vulkan, Metal), so its GPU compute buffer holds no heads x context scores;
        # what it reserves is a call's logits (memory.buffer_bytes): Qwen2.5 32B at a 4096
        # context 311 MB, not 684 MB. (The llmfit table's 32B rows on a 20 GiB RX 7900 XT still
        # come out 1-5% on the host, 3-7% before, where their rates say all was on the card.)
        # experts_to_host: for a model with experts, `--fit` (common/fit.cpp) first fills the GPU
        # back to front with "dense-only" layers (attention, norms, router, shared parts) while
        # every layer's routed-expert tensors stay in system memory, then moves whole layers'
        # experts onto the GPU while they fit: the host holds experts only, and a token reads
        # the routed ones of them (Qwen3-30B-A3B: 8 of 128).
        # batch_tile: Metal's (METAL_BATCH_TILE) on an Apple chip
        return EngineProfile(0.75, 0.5, 0.5, 6e-4, 2e-5, 0.02, 80, 300, False, "layer_split",
                             device_margin_mb=1024, score_buffer=False, experts_to_host=True,
                             batch_tile=METAL_BATCH_TILE if device_class == "apple" else None,
                             **_LLAMA_CPP)
    if engine == "tightfit-lite":
        # The lite runtime computes as llama.cpp does (the stored blocks against activations
        # rounded to int8 per 32 values, one thread pool, prompts in calls of <= 512 tokens).
        # Decode from a component measurement of its matrix kernel alone (tf_linear, one 8192 x
        # 8192 matrix, 2026-12-04): one token runs ~34 GFLOP/s a thread on Q4_0/Q4_1/Q8_0 (a
        # third of this machine's one-thread GEMM probe: decode_comp_eff 0.33), and two threads
        # stream 20 GB/s of Q4 and 25 GB/s of Q8_0 against the 25.6 GB/s copy rate (0.8 of the
        # copy, bw_eff 0.8 x COPY_OF_PEAK of the rated bandwidth).
        # The learned residual has an engine feature of its own (features.engine_lite).
        # Memory from a component measurement (2026-12-04, default model, 49,152 entries): a
        # process that has imported tightfit.lite and loaded its library holds 40 MiB, 73 MiB
        # once the GGUF header is parsed and the tokenizer built, before any weight page is
        # read: 58 MiB + the torch engine's 315 B a vocab entry (the same tokenizer code).
        # attn_rel: its decode step timed alone at 16 and 1,536 positions after the K prefetch
        # (LiteModel.forward, best of 30, 2026-12-04 19:30): attention ran 23-25 GFLOP/s at one
        # thread and 38-48 at two against the weights' 36 / 60-67 (0.65-0.7).
        return EngineProfile(0.8 * COPY_OF_PEAK, 0.5, 0.33, 4e-4, 2e-5, 0.01, 58, 0, False,
                             "layer_split", tokenizer_bytes_per_token=315, attn_rel=0.65, **_GGML_STYLE)
    if engine == "hf-transformers":
        # its DynamicCache keeps a sliding-window layer's last `sliding_window` tokens only
        if cpu:  # memory: `import torch, transformers` 239 MiB + ~160 MiB kept after loading
            # decode: its fp32 weights stream at ~0.35 of this machine's copy rate
            # score_buffer: its default attention (sdpa) runs torch's blocked CPU kernel, which
            # holds no heads x positions scores: counted, the bench's 4,096 / 6,144-token
            # prompts read 1.43 / 1.54x their peak, without 1.03 / 0.93 (the fit's HF rows, to
            # 1,536, peak while loading and are unchanged; docs/predictor.md)
            return EngineProfile(0.35 * COPY_OF_PEAK, 0.4, 0.4, 4e-3, 6e-4, 0.05, 400, 0, True,
                                 "stream", tokenizer_bytes_per_token=300, kv_window_extra=0,
                                 score_buffer=False)
        return EngineProfile(0.6, 0.5, 0.4, 4e-3, 4e-4, 0.05, 600, 500, True, "stream",
                             kv_window_extra=0)
    # tightfit: torch-based engine with packed quantised weights. Memory from component
    # measurements on this machine (docs/predictor.md): RSS after load minus the model's
    # tensors is 257 MiB (SmolLM2, 49k vocab) and 321 MiB (Gemma 3, 262k) in every format, so
    # 242 MiB + 315 B per vocab entry (`import torch` + tightfit alone is 221 MiB); the
    # loader's worst moment is ~40 MiB + a quarter of the stored embedding above the result.
    # Decode on CPU since the fused kernels (2026-12-04, docs/performance.md): the packed int4 /
    # int8 kernels stream 15-24 GB/s of a 24.8 GB/s copy rate (0.6 of the copy: bw_eff 0.6 x
    # COPY_OF_PEAK of the rated bandwidth; fp32's GEMV reaches less, see `profile`), and what a
    # step spends outside them is ~1.4 ms (interpreter ~0.8 ms, ~120 kernel calls at ~5 us): 0.5 ms + 30 us a layer. The
    # eager engine's 2 ms + 0.2 ms a layer made the base think decode was overhead-bound, so
    # it barely changed with threads where the measured rate moved 1.3-1.8x.
    if cpu:
        return EngineProfile(0.6 * COPY_OF_PEAK, 0.4, 0.3, 5e-4, 3e-5, 0.03, 242, 0, False,
                             "stream", tokenizer_bytes_per_token=315, load_transient_mb=40,
                             load_transient_share=0.25, decode_reads_window=True,
                             batch_one_pass=True, **_TIGHTFIT)
    return EngineProfile(0.6, 0.45, 0.4, 2e-3, 2e-4, 0.03, 450, 400, False, "stream",
                         **_TIGHTFIT)

"""Peak memory per engine, and where it goes (device or host) when a discrete GPU is too small.

peak = max(load peak, serving peak):
- load peak    = runtime + weights as held + the loader's transient (a weight being converted,
                 an fp32 copy an engine makes while dequantising a GGUF file);
- serving peak = runtime + weights as held + KV for the context + a hybrid's recurrent state
                 + compute buffers.
Weights "as held" are what the engine keeps, not the file: tightfit keeps a GGUF token
embedding in its stored blocks and, for a model whose head shares that embedding, builds a
separate head in the compute format (int8 for stored GGUF formats); HF Transformers holds fp32;
the lite runtime reads the file's blocks in place (the weights as stored, K/V in f16).
Runtime = the process baseline (interpreter, torch, the engine) + the tokenizer, which grows
with the vocabulary. Constants come from this project's measurements on CPU (docs/predictor.md).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from tightfit.predictor import formats
from tightfit.predictor.architectures import ModelSpec
from tightfit.predictor.engines import EngineProfile, for_scenario, keeps_quantised
from tightfit.predictor.scenario import Scenario

MB = 2.0 ** 20
GB = 2.0 ** 30  # memory sizes in the contract are GiB, as vendors and operating systems count them
# Share of memory an engine can really use: macOS caps GPU working sets near 3/4 of RAM.
_USABLE = {"apple": 0.75, "unified_soc": 0.9, "cpu": 0.9, "discrete_gpu": 1.0}
# ... but on Apple chips that cap (the GPU's recommended working set) is soft: llama.cpp warns
# and runs past it, up to what RAM holds beside the OS. The llmfit table has three deployments
# predicted at 18.0-18.7 GiB that ran on a 24 GiB M4 Pro (cap 18 GiB). So "fits" allows the
# hard limit; "fits_on_device" keeps the recommended one.
_HARD_USABLE = {"apple": 0.9}
# A placement the run set (Workload.gpu_layers / n_cpu_moe) has no margin: its GPU part over the
# card by no more than this share is within the memory estimate's error (tightfit's own rows,
# held out by device: 5.4% MAPE on peak memory), and `fits` is left undecided (None) there.
SET_PLACEMENT_BAND = 0.05
_HF_LOAD_TRANSIENT = 0.25  # extra copy held while dequantising GGUF tensors at load time
_GGUF_EMBED_BITS = 8.5  # tightfit keeps a GGUF source's token embedding as stored (Q8_0 here)
# HF Transformers reading a GGUF file: fp32 copies while converting, ~a quarter of the weights
# plus two of the (tied) embedding; fitted to this machine's two models (in-sample).
_HF_EMBED_COPIES = 2.0
# ... of which one is not always taken: the peak is the `np.copy` of the dequantised embedding
# (transformers' load_gguf_checkpoint), and whether glibc's malloc hands that copy memory the
# dequantisation freed varies from run to run (docs/predictor.md, "Not done / limits": Gemma 3
# 270M on one machine peaks at 3,202 or 2,564 MiB, one fp32 embedding apart; with glibc's mmap
# threshold fixed, always the upper). The peak predicted is the upper level, what a budget must
# hold; the interval reaches down to the lower (load_reuse_bytes).
_HF_REUSED_COPIES = 1.0
# tightfit fp32: tensors are dequantised one at a time; measured 18 / 59 MiB above the result.
_F32_TRANSIENT_MB, _F32_TRANSIENT_SHARE = 9.0, 0.08


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
    load_transient_bytes: float = 0.0  # held by the loader on top of the finished weights
    peak_phase: str = "serving"  # "load" when loading peaks above serving this workload
    state_bytes: float = 0.0   # a hybrid's recurrent state for the batch's sequences
    # of `host_bytes`, routed-expert weights (an engine that offloads experts first,
    # EngineProfile.experts_to_host); 0 where whole layers go to the host
    host_expert_bytes: float = 0.0
    # a placement the run set (Workload.gpu_layers / n_cpu_moe: `_set_placement`): the share of
    # the repeating layers held in host RAM whole, and whether the output layer is there too;
    # None where the engine placed the layers itself
    host_layer_share: float | None = None
    head_on_host: bool = False
    gpu_bytes: float = 0.0  # ... and what it puts on the GPU(s), buffers and context included
    # the lowest peak a run of this deployment is seen to reach, where it varies from run to run
    # (HF's GGUF load: load_reuse_bytes); equal to peak_bytes elsewhere (0: not set)
    peak_low_bytes: float = 0.0
    # what an offloading deployment needs in host RAM (the layers off the GPU, a set placement's
    # token embedding, the process), which `fits` weighs against `hardware.host_memory_gb`; 0
    # where nothing is offloaded
    host_need_bytes: float = 0.0


def compute_dtype_bytes(s: Scenario) -> float:
    """Bytes of a float weight as the engine computes with it: fp32 on a CPU (tightfit's float
    path, HF reading a GGUF file), fp16 elsewhere, and a half-float checkpoint in HF as stored
    (transformers' default dtype "auto" keeps a bf16 checkpoint bf16, on a CPU too)."""
    if s.engine == "hf-transformers" and s.quant in formats.HALF_FLOATS:
        return 2.0
    if s.quant in ("fp32", "f32") or s.device.device_class == "cpu":
        return 4.0
    return 2.0


def embedding_params(s: Scenario) -> float:
    """vocab x hidden, capped for inconsistent shapes (ModelSpec.table_params)."""
    return s.model.table_params()


def gguf_head_bits(s: Scenario) -> float:
    """Bits of a GGUF preset's output head, or of its tied token embedding (the head too)."""
    if s.head_bits is not None:
        return s.head_bits
    if s.embed_bits is not None:
        return s.embed_bits
    return formats.gguf_head_bits(s.quant, s.bits_per_weight, s.model.hidden_size)


def gguf_token_embd_bits(s: Scenario) -> float:
    """Bits of a GGUF preset's untied token embedding (Q4_K_M: Q4_K)."""
    if s.embed_bits is not None:
        return s.embed_bits
    return formats.gguf_token_embd_bits(s.quant, s.bits_per_weight, s.model.hidden_size)


_MXFP4_REST_BITS = 8.5  # llama.cpp's MXFP4 files: routed experts MXFP4, all else Q8_0


def weight_bytes(s: Scenario, prof: EngineProfile) -> float:
    """Bytes of all weights as stored (GGUF presets: embedding at >= Q6_K, tied at >= Q8_0;
    MXFP4 files: only the routed experts in MXFP4, where the model's expert count is known)."""
    total = s.model.params_b * 1e9
    if keeps_quantised(prof, s.quant):
        # bitsandbytes / GPTQ / AWQ: the decoder's linear layers at the format's bits, the
        # embedding (and an untied head) in the compute dtype
        kept = min(embedding_params(s) * (1 if s.model.ties_embeddings else 2), total)
        return ((total - kept) * s.bits_per_weight + kept * 8 * compute_dtype_bytes(s)) / 8
    if prof.dequantises:
        return total * compute_dtype_bytes(s)
    if s.quant == "mxfp4" and s.model.expert_params_b:
        # gpt-oss-20b: 19.11e9 expert weights x 4.25 bits + 1.79e9 others x 8.5 = 12.05 GB,
        # the published MXFP4 GGUF's 12.1 GB (all at 4.25 bits would say 11.1 GB)
        experts = min(s.model.expert_params_b * 1e9, total)
        return (experts * s.bits_per_weight + (total - experts) * _MXFP4_REST_BITS) / 8
    embed = embedding_params(s)
    if s.model.ties_embeddings or not _is_gguf(s):
        return ((total - embed) * s.bits_per_weight + embed * stored_embed_bits(s, prof)) / 8
    # untied: the token embedding and the output head, each of its own type
    # (embedding_params caps an untied table at half the parameters, so both fit in the total)
    return ((total - 2 * embed) * s.bits_per_weight
            + embed * (stored_embed_bits(s, prof) + stored_head_bits(s, prof))) / 8


def _is_gguf(s: Scenario) -> bool:
    return s.quant.startswith(("q", "iq", "tq"))


def _embed_in_float(s: Scenario, prof: EngineProfile) -> bool:
    """The engine holds the embedding (and head) in its compute dtype: it dequantises the
    file, or keeps only the decoder's linear layers quantised (bitsandbytes, GPTQ, AWQ)."""
    return keeps_quantised(prof, s.quant) or prof.dequantises


def stored_embed_bits(s: Scenario, prof: EngineProfile) -> float:
    """Bits a token-embedding weight takes in `weight_bytes`: the compute dtype where the engine
    holds it in float, Q8_0 beside MXFP4 experts, a GGUF preset's type for it (the head's where
    tied), else the format's."""
    if _embed_in_float(s, prof):
        return 8 * compute_dtype_bytes(s)
    if s.quant == "mxfp4" and s.model.expert_params_b:
        return _MXFP4_REST_BITS
    if not _is_gguf(s):
        return s.bits_per_weight
    return gguf_head_bits(s) if s.model.ties_embeddings else gguf_token_embd_bits(s)


def stored_head_bits(s: Scenario, prof: EngineProfile) -> float:
    """Bits of an untied output head in `weight_bytes` (a tied one is the embedding)."""
    if _is_gguf(s) and not _embed_in_float(s, prof):
        return gguf_head_bits(s)
    return stored_embed_bits(s, prof)


def output_layer_bytes(s: Scenario, prof: EngineProfile) -> float:
    """Bytes of the output layer (the head) as `weight_bytes` stores it; a tied one is the
    token embedding's."""
    return embedding_params(s) * stored_head_bits(s, prof) / 8


def streamed_weight_bytes(s: Scenario, prof: EngineProfile) -> float:
    """Weight bytes a forward pass costs in time. HF's quantised layers are taken at the speed
    of float weights: no measured rows here, and public reports put bitsandbytes 4-bit at batch
    1 at or below fp16 speed (LLM.int8 well below), its kernels dequantising per call."""
    if keeps_quantised(prof, s.quant):
        return s.model.params_b * 1e9 * compute_dtype_bytes(s)
    return weight_bytes(s, prof)


def held_weight_bytes(s: Scenario, prof: EngineProfile) -> float:
    """Bytes of weights the engine holds in memory (see the module docstring)."""
    if not prof.head_copy or s.quant in ("fp32", "f32"):
        return weight_bytes(s, prof)
    m = s.model
    embed = embedding_params(s)
    gguf = _is_gguf(s)
    embed_bits = stored_embed_bits(s, prof) if gguf else _GGUF_EMBED_BITS
    if m.ties_embeddings:  # a second copy: the head, built in the compute format
        head_bits = 8 + 32 / m.hidden_size if gguf else s.bits_per_weight  # + a scale per row
        body = m.params_b * 1e9 - embed
    else:  # the head is a projection of its own, counted in the parameters
        head_bits = stored_head_bits(s, prof) if gguf else s.bits_per_weight
        body = max(m.params_b * 1e9 - 2 * embed, 0.0)
    return (body * s.bits_per_weight + embed * embed_bits + embed * head_bits) / 8


def hf_converts_on_load(s: Scenario, prof: EngineProfile) -> bool:
    """HF Transformers converts the file's tensors to float in the memory it then runs from: a
    GGUF file dequantised (or a checkpoint cast to fp32) on a CPU or a unified-memory chip. Not
    a half-float checkpoint loaded as stored (safetensors are mapped from the file, nothing
    converted: a 0.5B bf16 checkpoint loaded on this machine held 399 MiB of RSS after
    `from_pretrained`, 1,098 MiB of weights mapped), nor on a discrete GPU, where the conversion
    is in host RAM and the card gets the finished tensors."""
    return (prof.dequantises and not keeps_quantised(prof, s.quant)
            and s.quant not in formats.HALF_FLOATS and s.device.device_class != "discrete_gpu")


def load_reuse_bytes(s: Scenario, prof: EngineProfile) -> float:
    """Of `load_transient_bytes`, what the allocator reuses in some runs and not in others
    (HF's GGUF load: _HF_REUSED_COPIES); 0 for every other loader."""
    if not hf_converts_on_load(s, prof):
        return 0.0
    return _HF_REUSED_COPIES * embedding_params(s) * compute_dtype_bytes(s)


def load_transient_bytes(s: Scenario, prof: EngineProfile, weights: float) -> float:
    """Memory the loader holds on top of the finished weights at its worst moment."""
    embed = embedding_params(s)  # the largest tensor
    if keeps_quantised(prof, s.quant):  # quantised as placed: one float tensor at a time
        return embed * compute_dtype_bytes(s)
    if prof.dequantises:
        if not hf_converts_on_load(s, prof):
            return 0.0
        return _HF_LOAD_TRANSIENT * weights + _HF_EMBED_COPIES * embed * compute_dtype_bytes(s)
    if prof.load_transient_mb == 0 and prof.load_transient_share == 0:
        return 0.0
    if s.quant in ("fp32", "f32"):
        return _F32_TRANSIENT_MB * MB + _F32_TRANSIENT_SHARE * embed * 4.0
    return prof.load_transient_mb * MB + prof.load_transient_share * embed * _GGUF_EMBED_BITS / 8


def per_layer_embed_params(s: Scenario) -> float:
    """Per-layer embeddings (Gemma 3n / Gemma 4 "E" models), capped at half the parameters."""
    return min(s.model.per_layer_embed_params_b, 0.5 * s.model.params_b) * 1e9


def lookup_only_params(s: Scenario) -> float:
    """Parameters a forward pass looks up but never multiplies: an untied token embedding and
    per-layer embeddings (one row read a token each). A tied embedding is the output head too,
    and is streamed and multiplied."""
    untied = 0.0 if s.model.ties_embeddings else embedding_params(s)
    return untied + per_layer_embed_params(s)


def lookup_only_bytes(s: Scenario, prof: EngineProfile) -> float:
    """Stored bytes of `lookup_only_params` as `weight_bytes` counts them: the token embedding
    at its bits, per-layer embeddings with the body (in the compute dtype where the engine
    dequantises or streams its quantised layers at float speed, `streamed_weight_bytes`)."""
    untied = 0.0 if s.model.ties_embeddings else embedding_params(s) * stored_embed_bits(s, prof)
    ple_bits = 8 * compute_dtype_bytes(s) if _embed_in_float(s, prof) else s.bits_per_weight
    return (untied + per_layer_embed_params(s) * ple_bits) / 8


def loop_read_factor(s: Scenario) -> float:
    """How many times a forward pass reads the weights it multiplies, against once: a looped
    transformer (`ModelSpec.layer_loops`) runs its stored layers that many times a token and
    its output head once; 1 for every other model."""
    m = s.model
    if m.layer_loops <= 1:
        return 1.0
    head = embedding_params(s)
    layers = max(m.params_b * 1e9 - lookup_only_params(s) - head, 0.0)
    return (layers * m.layer_loops + head) / (layers + head) if layers + head > 0 else 1.0


def params_read_per_token(s: Scenario) -> float:
    """Parameters a token multiplies in one decode step: the active ones but for an untied
    embedding's lookup, a looped model's layers once a pass (`loop_read_factor`)."""
    return (s.model.active_params_b * 1e9 - lookup_only_params(s)) * loop_read_factor(s)


def active_weight_bytes(s: Scenario, prof: EngineProfile) -> float:
    """Weight bytes streamed in one decode step (MoE: the experts the batch touches; a looped
    model's layers once a pass, `loop_read_factor`); an untied token embedding and per-layer
    embeddings are not streamed (`lookup_only_bytes`)."""
    m = s.model
    active = m.params_b
    if m.is_moe:
        # a batch reads the shared weights once and the union of the experts its sequences
        # route to (`batch_expert_share`)
        experts, one = _routed_split(s)
        read = batch_expert_share(one, s.workload.batch)
        active = min(m.params_b, m.active_params_b + experts * (read - one) / 1e9)
    return ((streamed_weight_bytes(s, prof) - lookup_only_bytes(s, prof)) * active / m.params_b
            * loop_read_factor(s))


def routed_experts(s: Scenario) -> tuple[float, float]:
    """(routed-expert parameters, the share of them a decode step of the batch reads) for a
    mixture of experts; (0, 0) for a dense model (`_routed_split`; the share grows with the
    batch as `batch_expert_share` has it)."""
    experts, one = _routed_split(s)
    return experts, batch_expert_share(one, s.workload.batch) if experts else 0.0


def _routed_split(s: Scenario) -> tuple[float, float]:
    """(routed-expert parameters, the share of them one token reads); (0, 0) for a dense model.
    The expert parameters are the table's `expert_params_b` where it has them, else all but the
    attention projections and the embeddings (Qwen3-30B-A3B: 29.0B of 30.5B, of which a token
    reads 1.77B, 6.1%, where 8 of 128 experts are 6.25%)."""
    m = s.model
    if not m.is_moe:
        return 0.0, 0.0
    total = m.params_b * 1e9
    if m.expert_params_b:
        experts = min(m.expert_params_b * 1e9, total)
    else:
        q, kv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
        attention = m.n_layers * m.hidden_size * 2 * (q + kv)
        embed = embedding_params(s) * (1 if m.ties_embeddings else 2)
        experts = max(total - attention - embed, 0.0)
    if experts <= 0:
        return 0.0, 0.0
    return experts, min(1.0, max(m.active_params_b * 1e9 - (total - experts), 0.0) / experts)


def batch_expert_share(read: float, batch: int) -> float:
    """The share of the routed experts a decode step of `batch` sequences reads, where one token
    reads `read` of them (top-k of E experts: k / E): the expected union when each sequence
    routes independently, 1 - (1 - read)^batch. Correlated routing touches fewer. On the
    DGX Spark (GB10) and an M2 Ultra, llama.cpp's public llama-batched-bench tables for
    gpt-oss-20b / -120b and Qwen3-Coder-30B-A3B (docs/predictor.md, "Batched decode on a GPU
    and an Apple chip"): the rule before, read x (1 + (batch - 1) / 2), read 2 sequences as
    1.5x one where the union is 1.9x (4 of 32 experts) to 1.97x (4 of 128)."""
    return read if batch <= 1 else 1.0 - (1.0 - read) ** batch


def host_read_share(s: Scenario, prof: EngineProfile, mem: MemoryEstimate,
                    step_bytes: float, timed: bool = True) -> float:
    """The share of a decode step's bytes not read on the device: the host's share of the
    weights and K/V where whole layers go there (or, for an engine that streams them over the
    link, are not held on the device), the routed experts a token touches among those held there
    where the engine offloads experts first (`MemoryEstimate.host_expert_bytes`). `step_bytes` as the engine's time sees them (an MoE's
    weights over `moe_bw_rel`), or, `timed=False`, as bytes."""
    if mem.device_fraction >= 1.0 or step_bytes <= 0:
        return 0.0
    scale = 1 / prof.moe_bw_rel if timed and s.model.is_moe else 1.0
    if mem.host_layer_share is not None:  # a placement the run set (`_set_placement`)
        head = output_layer_bytes(s, prof) * scale
        _, read = routed_experts(s)
        on_host = mem.host_layer_share * max(step_bytes - head, 0.0) \
            + (head if mem.head_on_host else 0.0) + mem.host_expert_bytes * read * scale
        return min(1.0, on_host / step_bytes)
    if mem.host_expert_bytes > 0:
        _, read = routed_experts(s)
        return min(1.0, mem.host_expert_bytes * read * scale / step_bytes)
    return 1.0 - mem.device_fraction


def kv_tokens(s: Scenario, prof: EngineProfile, ctx: float, read: bool = False) -> float:
    """Context positions of K/V held, averaged over the layers, for `ctx` tokens: a hybrid's
    non-attention layers hold none (`attention_layers`), a sliding-window layer keeps its window
    plus the engine's extra (`kv_window_extra`) where the engine has a window cache, every
    other layer the whole context. `read`: the positions a decode step reads instead, which
    differ where the engine's decode attention reads only the window on a sliding-window layer
    however many are held (`decode_reads_window`)."""
    m = s.model
    attn, local = m.kv_layers, m.window_layers
    if local > 0 and read and prof.decode_reads_window:
        kept = min(ctx, m.sliding_window)
    elif local > 0 and prof.kv_window_extra is not None:
        kept = min(ctx, m.sliding_window + prof.kv_window_extra)
    else:
        kept = ctx
    return (_full_layers(m) * ctx + local * kept) / m.n_layers


def _full_layers(m: ModelSpec) -> float:
    """A model's full-attention layers, in window layers' K/V (`ModelSpec.full_kv_scale`)."""
    full = m.kv_layers - m.window_layers
    return full * m.full_kv_scale if m.window_layers > 0 else float(full)


def kv_bytes(s: Scenario, prof: EngineProfile, ctx: float, read: bool = False) -> float:
    """K/V bytes held for `ctx` tokens of each sequence the engine holds (`Workload.held`: a
    server's slots, else the batch), or, `read`, read by a decode step of the batch
    (`kv_tokens`)."""
    if read:
        return kv_bytes_per_token(s, prof) * kv_tokens(s, prof, ctx, True) * s.workload.batch
    return kv_bytes_per_token(s, prof) * kv_cells_held(s, prof, ctx)


def kv_cells_held(s: Scenario, prof: EngineProfile, ctx: float) -> float:
    """K/V cells held, averaged over the layers, for `ctx` tokens of each of the `Workload.held`
    sequences. A window cache of several sequences is one pool, as llama.cpp's unified cache
    (a server's default with its slots left to auto) sizes it: the window of every sequence,
    the engine's extra once (`llama-kv-cache-iswa.cpp`: min(cells, n_swa x n_seq + n_ubatch)).
    A server of 16 slots and 8,192 cells holds the whole context on Gemma 3's window layers,
    where a sequence alone would hold its 512-position window and a call's 512."""
    n, m = s.workload.held, s.model
    # layers that read an earlier layer's K/V hold none: the rest's share, window and full
    # layers alike (Gemma 3n / Gemma 4 E lay both kinds out evenly)
    own = 1.0 - min(m.kv_shared_layers, m.kv_layers) / max(m.kv_layers, 1)
    if n == 1 or m.window_layers == 0 or prof.kv_window_extra is None:
        return kv_tokens(s, prof, ctx) * n * own
    local = m.window_layers
    kept = min(ctx * n, m.sliding_window * n + prof.kv_window_extra)
    return (_full_layers(m) * ctx * n + local * kept) / m.n_layers * own


def state_bytes(s: Scenario, held: bool = True) -> float:
    """Recurrent state of a hybrid's non-attention layers for the sequences held (a llama.cpp
    server allocates it for every slot), or, not `held`, for the batch's sequences (what a
    decode step reads and writes): a fixed size a sequence whatever the context
    (ModelSpec.recurrent_state_bytes)."""
    w = s.workload
    return s.model.recurrent_state_bytes * (w.held if held else w.batch)


def kv_bytes_per_token(s: Scenario, prof: EngineProfile) -> float:
    dtype = s.workload.kv_dtype or prof.kv_dtype or (
        "fp16" if compute_dtype_bytes(s) == 2.0 else "fp32")
    per = formats.kv_bytes(dtype)
    if s.engine == "tightfit" and formats.normalise(dtype) == "int8":
        # tightfit's int8 cache keeps an fp32 scale a head and token beside the codes
        # (config.CacheConfig.kv_bytes_per_token)
        per += 4.0 / s.model.head_dim
    return s.model.kv_elements_per_token() * per


def buffer_bytes(s: Scenario, prof: EngineProfile) -> float:
    m, w = s.model, s.workload
    # activations of one prompt call: llama.cpp reserves a full call (of the context) at
    # start-up, tightfit and lite hold the chunk they run, HF the whole prompt at once. A batch:
    # llama.cpp's context holds every sequence's cells (a server's `-c`) and its reserved call
    # is n_ubatch tokens in all, whatever the sequences; HF pads the batch's prompts together.
    chunk = prof.prompt_chunk or max(w.prompt_tokens, 1)
    if prof.reserves_chunk:
        cells, calls = w.context_tokens * w.held, 1
        ubatch = min(cells, chunk)
    else:
        cells, calls = w.context_tokens, w.batch
        ubatch = max(min(w.prompt_tokens, chunk), 1)
    per_token = 4 * m.hidden_size + 2 * m.intermediate_size
    if prof.score_buffer:
        per_token += m.n_heads * min(cells, 4096)
    act = 4.0 * calls * ubatch * per_token + 4.0 * w.batch * m.vocab_size
    if prof.reserves_chunk and s.device.device_class == "discrete_gpu":
        # llama.cpp reserves its graph for a full call with every position's logits, vocab x
        # n_ubatch f32 (its log for Gemma 3 270M: "compute buffer size = 514.50 MiB", of which
        # 512 MiB logits). In host memory those pages stay untouched (the measured RSS does not
        # hold them); on a GPU the allocation is device memory.
        act = max(act, 4.0 * ubatch * m.vocab_size)
    return act


def runtime_bytes(s: Scenario, prof: EngineProfile) -> float:
    """The process (or, on a discrete GPU, the device context) without weights, KV or buffers."""
    if s.device.device_class == "discrete_gpu":
        return prof.device_runtime_mb * s.device.device_count * MB
    return prof.host_runtime_mb * MB + prof.tokenizer_bytes_per_token * s.model.vocab_size


def estimate(s: Scenario, prof: EngineProfile) -> MemoryEstimate:
    weights = held_weight_bytes(s, prof)
    kv = kv_bytes(s, prof, s.workload.context_tokens)
    state = state_bytes(s)
    buffers = buffer_bytes(s, prof)
    gpu = s.device.device_class == "discrete_gpu"
    runtime = runtime_bytes(s, prof)
    transient = load_transient_bytes(s, prof, weights)
    placed = weights + kv + state  # what goes to a GPU, or partly to the host when it is too small
    load_peak, serving_peak = weights + runtime + transient, placed + runtime + buffers
    peak = max(load_peak, serving_peak)
    card = s.device.memory_gb * GB * s.device.device_count * _USABLE[s.device.device_class]
    capacity = card
    if gpu:  # what the engine leaves free on each card
        capacity = max(card - prof.device_margin_mb * MB * s.device.device_count, 0.0)
    fits_dev = peak <= capacity
    frac, host, host_experts = 1.0, 0.0, 0.0
    w = s.workload
    if gpu and prof.offload == "layer_split" and (w.gpu_layers is not None or w.n_cpu_moe):
        return _set_placement(s, prof, weights, kv, state, buffers, runtime, transient, peak,
                              load_peak > serving_peak, card)
    if not fits_dev and gpu:  # the context is the one asked for: layers go to the host
        room = max(capacity - buffers - runtime - transient, 0.0)
        frac = min(1.0, room / max(placed, 1.0))
        host = (1 - frac) * placed
        choice = s.workload.moe_offload
        first = prof.offload == "layer_split" and (
            choice == "experts" or (choice is None and prof.experts_to_host))
        experts, _ = routed_experts(s) if first else (0.0, 0.0)
        if experts and host <= weights * experts / (s.model.params_b * 1e9):
            host_experts = host  # experts first; past all of them, whole layers as for a dense model
    need = host + prof.host_runtime_mb * MB if gpu and not fits_dev else 0.0
    fits = _fits(s, fits_dev, gpu, need, peak)
    low = max(load_peak - load_reuse_bytes(s, prof), serving_peak)
    return MemoryEstimate(weights, kv, buffers, runtime, peak, capacity, frac, host, fits_dev, fits,
                          transient, "load" if load_peak > serving_peak else "serving", state,
                          host_experts, peak_low_bytes=low, host_need_bytes=need)


def _set_placement(s: Scenario, prof: EngineProfile, weights: float, kv: float, state: float,
                   buffers: float, runtime: float, transient: float, peak: float,
                   load: bool, capacity: float) -> MemoryEstimate:
    """Where llama.cpp puts a model on a discrete GPU when the run says (`Workload.gpu_layers`,
    its -ngl; `Workload.n_cpu_moe`, its --n-cpu-moe), read in its llama-model.cpp: the token
    embedding stays in host RAM (only looked up); of the model's layers + the output layer,
    the last `gpu_layers` go to the GPU, the output layer first (a tied output layer is loaded
    again there); a layer's K/V and recurrent state sit where the layer does; --n-cpu-moe keeps
    the routed experts of the first N layers in host RAM. Nothing is left free for a margin: a
    GPU part larger than the card (`capacity`, no margin taken off) fails to load (`fits`
    false)."""
    m, w = s.model, s.workload
    layers = m.n_layers
    ngl = layers + 1 if w.gpu_layers is None else min(w.gpu_layers, layers + 1)
    on_gpu = min(max(ngl - 1, 0), layers)  # repeating layers on the GPU: the last ones
    head_on = ngl >= 1
    # the token embedding, as weight_bytes has it
    token = embedding_params(s) * stored_embed_bits(s, prof) / 8
    head = output_layer_bytes(s, prof)
    body = max(weights - token - (0.0 if m.ties_embeddings else head), 0.0)
    per_layer = body + kv + state
    experts, _ = routed_experts(s)
    expert_layer = experts * s.bits_per_weight / 8 / layers if experts else 0.0
    # the first layers - on_gpu layers are on the host whole; --n-cpu-moe's further ones keep
    # only their experts there
    cpu_layers = layers - on_gpu
    host_experts = expert_layer * max(min(w.n_cpu_moe or 0, layers) - cpu_layers, 0)
    share = cpu_layers / layers
    on_device = (1 - share) * per_layer + (head if head_on else 0.0) - host_experts
    # a tied output layer off the GPU is the token embedding itself, no second copy
    total = per_layer + (head if head_on or not m.ties_embeddings else 0.0)
    host = total - on_device
    frac = on_device / total if total > 0 else 1.0
    gpu_part = on_device + buffers + runtime
    fits_dev = host <= 0 and gpu_part <= capacity
    need = host + token + prof.host_runtime_mb * MB
    if gpu_part <= capacity:
        fits = _fits(s, fits_dev, True, need, peak)
    else:  # over the card; by less than the estimate's error, undecided
        fits = None if gpu_part <= capacity * (1 + SET_PLACEMENT_BAND) else False
    return MemoryEstimate(weights, kv, buffers, runtime, peak, capacity, frac, host, fits_dev,
                          fits, transient, "load" if load else "serving", state, host_experts,
                          share, not head_on, gpu_part, host_need_bytes=need)


def max_gpu_layers(s: Scenario, prof: EngineProfile) -> int:
    """The largest llama.cpp -ngl (`Workload.gpu_layers`, with the row's n_cpu_moe) whose GPU
    part fits the card; 0 where even the output layer alone does not."""
    for ngl in range(s.model.n_layers + 1, 0, -1):
        mem = estimate(replace(s, workload=replace(s.workload, gpu_layers=ngl)), prof)
        if mem.gpu_bytes <= mem.capacity_bytes:
            return ngl
    return 0


def max_context_on_device(s: Scenario, prof: EngineProfile) -> int | None:
    """The largest context (a multiple of 256, llama.cpp's rounding) below the scenario's at
    which everything stays on the device; None where even the request's own tokens do not fit."""
    return largest_context(s, lambda m: m.fits_on_device, prof)


def largest_context(s: Scenario, ok: Callable[[MemoryEstimate], bool],
                    prof: EngineProfile | None = None, hi: int | None = None) -> int | None:
    """The largest context up to `hi` (default: below the scenario's), a multiple of 256 where it
    can be, whose memory estimate is `ok`; None where even the request's own tokens are not."""
    w = s.workload
    prof = prof or for_scenario(s)
    need = w.prompt_tokens + w.gen_tokens
    n = largest(need, w.context_tokens - 1 if hi is None else hi, lambda ctx: ok(
        estimate(replace(s, workload=replace(w, context_tokens=ctx)), prof)))
    return None if n is None else max(n - n % 256, need)


def largest_batch(s: Scenario, ok: Callable[[MemoryEstimate], bool],
                  prof: EngineProfile | None = None, hi: int | None = None) -> int | None:
    """The most sequences, up to `hi` (default: below the scenario's batch), held at the
    scenario's context and decoding together, whose memory estimate is `ok`; None where one
    sequence's is not."""
    w = s.workload
    prof = prof or for_scenario(s)
    return largest(1, w.batch - 1 if hi is None else hi, lambda n: ok(
        estimate(replace(s, workload=replace(w, batch=n, slots=None)), prof)))


def largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest n in [lo, hi] with ok(n), where ok holds up to some n and not past it (memory
    grows with a context and a batch); None where ok(lo) does not hold."""
    if lo > hi or not ok(lo):
        return None
    if ok(hi):
        return hi
    while hi - lo > 1:  # ok(lo), not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def host_capacity_bytes(s: Scenario) -> float | None:
    """Host RAM an offloading deployment can use (`hardware.host_memory_gb`); None: unknown."""
    if s.device.host_memory_gb is None:
        return None
    return s.device.host_memory_gb * GB * _USABLE["cpu"]


def device_capacity_bytes(s: Scenario) -> float:
    """Memory a deployment on a CPU or a unified-memory chip can use: past a soft cap (Apple's
    recommended working set), the hard one."""
    share = _HARD_USABLE.get(s.device.device_class, _USABLE[s.device.device_class])
    return s.device.memory_gb * GB * s.device.device_count * share


def _fits(s: Scenario, fits_dev: bool, gpu: bool, host_need: float, peak: float) -> bool | None:
    if fits_dev:
        return True
    if not gpu:  # past a soft cap (Apple's working set), the hard one still holds
        return s.device.device_class in _HARD_USABLE and peak <= device_capacity_bytes(s)
    host = host_capacity_bytes(s)
    return None if host is None else host_need <= host

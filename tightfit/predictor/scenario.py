"""Input rows -> validated, fully specified scenarios (the JSON contract of DESIGN.md).

Missing hardware fields are filled from the catalog or the local device profile and recorded as
uncertainty; a bad field raises RowError naming it. Does no prediction.
"""
from __future__ import annotations

import difflib
import functools
import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tightfit.errors import TightfitError
from tightfit.predictor import architectures, formats, gguf_header, hardware, hf_dir
from tightfit.predictor.architectures import ModelSpec
from tightfit.predictor.engines import (ENGINES, LITE_QUANTS, MLX_ENGINES, MLX_QUANTS,
                                       canonical_engine, keeps_quantised, profile)
from tightfit.predictor.hardware import DeviceSpec

LOCAL_NAMES = ("local", "this")
_KIND_ALIASES = {"gpu": "gpu", "cpu": "cpu", "apple": "apple", "igpu": "igpu", "edge": "edge",
                 "soc": "edge"}


class RowError(TightfitError):
    """One input row is unusable; `field` names the offending field (dotted path)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int = 512
    gen_tokens: int = 128
    batch: int = 1
    context_tokens: int = 2048
    kv_dtype: str | None = None
    # where a mixture of experts too large for the GPU goes: "experts" (routed-expert tensors
    # to host RAM first: llama.cpp's `--fit`, or `--n-cpu-moe` / `-ot exps=CPU`), "layers"
    # (whole layers: an explicit `-ngl`, which turns `--fit` off); None: the engine's default
    moe_offload: str | None = None
    # llama.cpp's flash attention (`-fa on|off|auto`): None = its tools' default, "auto",
    # which turns it on wherever the backend runs the fused operation (CPU, CUDA, ROCm, Vulkan,
    # Metal); llama-cpp-python's `Llama(flash_attn=False)` turns it off
    flash_attn: bool | None = None
    # the sequences the engine holds cache for (a llama.cpp server's `-np` slots, each
    # `context_tokens` of its `-c`), of which `batch` decode together; None: `batch`
    slots: int | None = None
    # llama.cpp's own placement on a discrete GPU, where the run set it (an explicit placement
    # turns `--fit` off): `gpu_layers` is its `-ngl`, the last N of the model's layers + the
    # output layer counted as one more (the output layer goes first: -ngl 1 holds the output
    # layer only; n_layers + 1 or more, all); `n_cpu_moe` its `--n-cpu-moe`, the routed-expert
    # tensors of the first N layers kept in host RAM. None: placed as `--fit` would
    # (memory.estimate)
    gpu_layers: int | None = None
    n_cpu_moe: int | None = None

    @property
    def held(self) -> int:
        """The sequences whose K/V (and recurrent state) the engine holds: `slots`, else
        `batch`."""
        return self.slots or self.batch


MOE_OFFLOAD = ("experts", "layers")  # Workload.moe_offload's choices
FLASH_ATTN = {True: True, False: False, "on": True, "off": False, "auto": None}
# the context from which a llama.cpp CPU prediction says which flash-attention setting it took
# (1,024 positions add ~4 ms a token to the default model's ~7-10 ms step with it on, ~2.5
# without: engines._CPU_ATTN_REL_NO_FLASH)
FLASH_ATTN_NOTE_CONTEXT = 1024


@dataclass(frozen=True)
class Scenario:
    id: str
    device: DeviceSpec
    model: ModelSpec
    quant: str
    bits_per_weight: float
    engine: str
    workload: Workload
    widen: float = 1.0  # >1 when inputs were filled by estimates; multiplies the error band
    notes: tuple[str, ...] = field(default_factory=tuple)
    # bits of the token embedding and output head where the file keeps them in a float type
    # (`Q4_K_M-f16`, formats.split_embed_tag) or a file read says (`model.path`: the token
    # embedding's); None: as the preset stores them
    embed_bits: float | None = None
    head_bits: float | None = None  # the output head's, where a file read says (else embed_bits)
    # the engine as the row named it where that is an alias predicted as `engine` ("mlx",
    # "ollama"); "" otherwise
    alias: str = ""


def device_profile_path() -> Path:
    """`TIGHTFIT_DEVICE_PROFILE`, or device.json in tightfit's cache (`TIGHTFIT_CACHE`, else
    ~/.cache/tightfit), where the kernels and the shipped model's refits live too."""
    from tightfit.buildcache import cache_root

    env = os.environ.get("TIGHTFIT_DEVICE_PROFILE")
    return Path(env) if env else cache_root() / "device.json"


# The input contract's fields (docs/predictor.md), by section. A key outside them that reads as
# one of them (a known other name, or a near spelling) is a row error: left out silently it would
# change the answer (`"device_class": "cpu"` read as nothing left an unnamed device a GPU). Other
# keys are named in a note and ignored; the top level may carry keys of its own (a score file's
# `measured`, `source`).
FIELDS = {
    "": ("id", "hardware", "model", "quant", "engine", "workload", "observed"),
    "hardware": ("name", "kind", "memory_gb", "memory_bandwidth_gbps", "fp16_tflops",
                 "host_memory_gb", "host_bandwidth_gbps", "device_count", "cpu_cores", "dies",
                 "kernel_gflops", "kernel_stream_share"),
    "model": ("name", "path", "params_b", "active_params_b", "n_layers", "hidden_size",
              "intermediate_size", "n_heads", "n_kv_heads", "vocab_size", "head_dim",
              "sliding_window", "sliding_layers", "attention_layers", "kv_shared_layers",
              "per_layer_embed_params_b", "full_kv_scale", "state_mb_per_layer", "mixer",
              "layer_loops"),
    "workload": ("prompt_tokens", "gen_tokens", "batch", "context_tokens", "slots", "kv_dtype",
                 "moe_offload", "flash_attn", "gpu_layers", "n_cpu_moe"),
}
# other names users give these fields (llama.cpp's flags, HF config keys, common spellings)
_OTHER_NAMES = {
    "": {"quantization": "quant", "quantisation": "quant", "weight_format": "quant",
         "format": "quant", "dtype": "quant", "backend": "engine", "runtime": "engine",
         "device": "hardware", "gpu": "hardware", "machine": "hardware"},
    "hardware": {"device_class": "kind", "device_type": "kind", "type": "kind", "class": "kind",
                 "bandwidth_gbps": "memory_bandwidth_gbps", "bandwidth": "memory_bandwidth_gbps",
                 "mem_bandwidth_gbps": "memory_bandwidth_gbps", "vram_gb": "memory_gb",
                 "memory": "memory_gb", "ram_gb": "memory_gb", "vram": "memory_gb",
                 "tflops": "fp16_tflops", "gpus": "device_count", "num_gpus": "device_count",
                 "gpu_count": "device_count", "threads": "cpu_cores", "cores": "cpu_cores",
                 "n_threads": "cpu_cores"},
    "model": {"layers": "n_layers", "num_hidden_layers": "n_layers", "hidden": "hidden_size",
              "num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads",
              "params": "params_b", "size_b": "params_b", "file": "path", "gguf": "path"},
    "workload": {"context": "context_tokens", "ctx": "context_tokens", "n_ctx": "context_tokens",
                 "ctx_size": "context_tokens", "context_length": "context_tokens",
                 "prompt": "prompt_tokens", "n_prompt": "prompt_tokens",
                 "input_tokens": "prompt_tokens", "gen": "gen_tokens", "n_gen": "gen_tokens",
                 "max_tokens": "gen_tokens", "output_tokens": "gen_tokens",
                 "n_predict": "gen_tokens", "batch_size": "batch", "parallel": "slots",
                 "n_gpu_layers": "gpu_layers", "ngl": "gpu_layers",
                 "cache_type_k": "kv_dtype", "kv_cache_dtype": "kv_dtype", "fa": "flash_attn"},
}


def unknown_fields(section: dict[str, Any], name: str) -> list[str]:
    """Keys of `section` (`name`: "" for the row itself) outside the contract, as `section.key`;
    raises RowError for one that reads as a field of it."""
    known = FIELDS[name]
    prefix = f"{name}." if name else ""
    left = []
    for key in section:
        if key in known or not isinstance(key, str):
            continue
        guess = _OTHER_NAMES[name].get(key.lower()) or next(
            iter(difflib.get_close_matches(key.lower(), known, n=1, cutoff=0.8)), None)
        if guess is not None:
            raise RowError(f"{prefix}{key}", f"not a field of the input; did you mean "
                           f"{prefix}{guess}? (the fields are listed in docs/predictor.md)")
        left.append(f"{prefix}{key}")
    return left


def parse_row(row: Any, files: bool = True) -> Scenario:
    """Validate one input object; raises RowError naming the first bad field. `files`: a row
    may name a local GGUF file or Hugging Face directory (`model.path`) to read its shape (and
    a GGUF file's stored sizes) from."""
    if not isinstance(row, dict):
        raise RowError("row", f"expected a JSON object, got {type(row).__name__}")
    if "_parse_error" in row:
        raise RowError("row", str(row["_parse_error"]))
    rid = row.get("id")
    if rid is None or (isinstance(rid, str) and not rid.strip()):
        raise RowError("id", "missing; give each scenario a unique id")
    unknown_fields(row, "")  # a misnamed field raises; other keys of the row are the caller's
    hw_section, model_section = _section(row, "hardware"), _section(row, "model")
    ignored = unknown_fields(hw_section, "hardware") + unknown_fields(model_section, "model")
    if isinstance(row.get("workload"), dict):
        ignored += unknown_fields(row["workload"], "workload")
    device, hw_widen, hw_notes = _device(hw_section)
    if ignored:
        hw_notes = hw_notes + [f"{', '.join(ignored)} ignored: not fields of the input "
                               "(docs/predictor.md lists them)"]
    file = _model_file(model_section, files)
    model, model_widen, model_notes = _model(model_section, file.spec if file else None)
    quant, embed_bits = _quant(_file_quant(row.get("quant"), file))
    head_bits = None
    if file is not None:
        model_notes = model_notes + [_file_note(file)]
    if isinstance(file, gguf_header.GGUFModel):  # its own sizes: the decoder's, the tables'
        bpw, embed_bits, head_bits = file.decoder_bits, file.token_embd_bits, file.head_bits
    else:
        if embed_bits is None:  # a GGUF file name as the model, tagged after the same preset
            embed_bits = _file_embed_bits(model_section.get("name"), quant)
        bpw = stored_bits(quant, model)
    engine = _engine(row.get("engine"))
    if engine == "tightfit-lite":
        _lite_supported(device, quant)
    workload = _workload(row.get("workload", {}))
    notes = hw_notes + model_notes
    given = str(row.get("engine")).strip().lower()
    alias = "mlx" if given in MLX_ENGINES else ("ollama" if given == "ollama" else "")
    if alias == "mlx":
        notes.append(_mlx(device, quant))
    elif alias == "ollama":
        # the llmfit table's ollama rows, predicted as llama.cpp, read 0.14-3.9 of measured
        # (median 1.00, 66 rows; docs/predictor.md): names without their experts, and runs on
        # the CPU beside a GPU ollama does not drive
        notes.append("engine ollama taken as llama.cpp, whose kernels it runs; its own defaults "
                     "are not modelled (its context and GPU placement; on a GPU it does not "
                     "support, e.g. an Intel iGPU, it runs on the CPU: describe the CPU then)")
    notes += _placement_check(engine, device, model, workload)
    widen = hw_widen * model_widen
    prof = profile(engine, device.device_class)
    if keeps_quantised(prof, quant):
        notes.append(f"hf-transformers holds {quant} weights quantised (bitsandbytes, GPTQ, AWQ):"
                     " linear layers as stored, embedding and head in the compute dtype; its"
                     " speed with them is not measured here and is taken as with float weights")
        widen *= 1.5
    elif engine == "hf-transformers" and quant in formats.HALF_FLOATS \
            and device.device_class == "cpu":
        # one 0.55B checkpoint on the EPYC VM at two threads (2026-12-07, docs/predictor.md
        # "HF's half-float checkpoints"): bf16 decode 0.84-0.94 of measured, prefill 0.50-0.60;
        # fp16 decode 26 tok/s (2.3x bf16's), prefill 33 tok/s (0.1x bf16's)
        notes.append(f"hf-transformers with {quant} weights on a CPU: torch's half-float "
                     "products there depend on the CPU's instructions (measured on one CPU: bf16 "
                     "prompts ~2.5x its fp32 ones, fp16 prompts ~10x slower than bf16); the band "
                     "is widened")
        widen *= 1.5
    notes += _kv_notes(model, prof.kv_window_extra, workload.context_tokens,
                       prof.decode_reads_window)
    if 0 < model.trained_context < workload.context_tokens:
        notes.append(f"workload.context_tokens {workload.context_tokens} is past the "
                     f"{model.trained_context} positions the model was trained for "
                     f"({'its file says' if file is not None else 'as published'}): llama.cpp "
                     "warns and runs it, vLLM refuses it, and the output past them is not what "
                     "the model was trained to give unless RoPE scaling (YaRN) is set")
    if embed_bits is not None and not isinstance(file, gguf_header.GGUFModel):
        notes.append(f"token embedding and output head at {embed_bits:g} bits (the format's "
                     "tag), the rest as the preset stores it")
    if engine == "llama.cpp" and device.device_class == "cpu" and workload.flash_attn is None \
            and workload.context_tokens >= FLASH_ATTN_NOTE_CONTEXT:
        notes.append("llama.cpp's flash attention taken as on (its tools' default, -fa auto): "
                     "on a CPU it decodes a long context slower than without it; for "
                     "llama-cpp-python (off by default) or -fa off set workload.flash_attn "
                     "to false")
    return Scenario(str(rid), device, model, quant, bpw, engine, workload, widen, tuple(notes),
                    embed_bits, head_bits, alias)


ModelFile = gguf_header.GGUFModel | hf_dir.HFModel


def _model_file(m: dict[str, Any], files: bool) -> ModelFile | None:
    """The GGUF file or Hugging Face directory `model.path` names, read; None without a
    path."""
    path = m.get("path")
    if path is None:
        return None
    if not files:
        raise RowError("model.path", "this service does not open files a request names; give "
                       "the model by name (and shape), or run `tightfit predict` on the machine "
                       "that holds the file")
    if not isinstance(path, str) or not path.strip():
        raise RowError("model.path", f"expected a GGUF file's or a model directory's path, got "
                       f"{path!r}")
    p = Path(path.strip()).expanduser()
    if p.suffix.lower() != ".gguf" and not (p.is_dir() or p.name == "config.json"):
        raise RowError("model.path", f"{path!r} is neither a .gguf file nor a model directory "
                       "with a config.json")
    try:
        stamp = p.stat() if p.exists() else None
        return _read_model_file(str(p.resolve()), stamp.st_mtime_ns if stamp else None,
                                stamp.st_size if stamp else None)
    except (gguf_header.GGUFHeaderError, hf_dir.HFDirError) as exc:
        raise RowError("model.path", str(exc)) from None


@functools.lru_cache(maxsize=32)
def _read_model_file(path: str, mtime_ns: int | None, size: int | None) -> ModelFile:
    """One read per file while it is unchanged (its modification time and size in the key):
    rows that name the same file share it."""
    return gguf_header.read(path) if path.lower().endswith(".gguf") else hf_dir.read(path)


def _file_quant(value: Any, file: ModelFile | None) -> Any:
    """The row's quant; the file's where the row gives none. A GGUF file is loaded as it is
    stored, so another format is an error; HF quantises a checkpoint on load (`nf4`, `int8`),
    so a directory takes any."""
    if file is None:
        return value
    if value is None:
        if file.quant is None:
            raise RowError("quant", f"{file.path!r} names no weight format tightfit knows; "
                           "give quant")
        return file.quant
    if isinstance(file, gguf_header.GGUFModel) and file.quant is not None and \
            isinstance(value, str) and \
            formats.normalise(formats.split_embed_tag(value)[0]) != file.quant:
        raise RowError("quant", f"{value!r}, but {file.path!r} holds {file.quant.upper()}; leave "
                       "quant out or give the file's")
    return value


def _file_note(file: ModelFile) -> str:
    m = file.spec
    traits = "its family's window and hybrid traits from the table" if file.traits_from_table \
        else "its family is not in the table: window and hybrid traits from what the file says"
    if isinstance(file, hf_dir.HFModel):
        count = "counted in its safetensors" if file.counted else "from its shape"
        return (f"shape read from {Path(file.path).name}/config.json ({file.model_type}): "
                f"{m.params_b:.3g}B language-model weights ({count}), stored as "
                f"{file.quant or 'an unknown format'}; {traits}")
    return (f"shape and stored sizes read from {Path(file.path).name} ({file.arch}): "
            f"{m.params_b:.3g}B weights, {file.decoder_bits:.3g} bits a decoder weight, token "
            f"embedding {file.token_embd_bits:.3g}, output head {file.head_bits:.3g}; {traits}")


def stored_bits(quant: str, model: ModelSpec) -> float:
    """Bits a weight of `model` takes in format `quant`: the preset's average, raised where the
    model's widths are not multiples of 256 and llama.cpp's quantizer stored those tensors in
    a 32-block fallback type (formats.bits_for_shape; shapes known from the table or given)."""
    bits = formats.bits_per_weight(quant)
    mixed = _mixed_preset_bits(quant, model)
    if mixed is not None:
        return mixed
    if not model.shape_known:
        return bits
    share = formats.shape_fallback_share(model.hidden_size, model.n_heads * model.head_dim,
                                         model.n_kv_heads * model.head_dim,
                                         model.intermediate_size)
    return formats.bits_for_shape(quant, bits, share)


def _mixed_preset_bits(quant: str, model: ModelSpec) -> float | None:
    """A K-quant preset (Q2_K ... Q5_K_M): the decoder weights' bits from the model's tensor
    sizes (formats.mixed_preset_bits). The embedding tables (a tied one once, untied two;
    ModelSpec.table_params) and per-layer embeddings are not decoder weights; a hybrid's
    recurrent layer is taken to hold as many mixer weights as an attention layer holds
    attention weights; an estimated shape gets no 32-block fallback."""
    embed = model.table_params() * (1 if model.ties_embeddings else 2)
    body = model.params_b * 1e9 - embed - model.per_layer_embed_params_b * 1e9
    layers = max(model.n_layers // max(model.layer_loops, 1), 1)
    attn_layers = max(model.kv_layers // max(model.layer_loops, 1), 1)
    q_out, kv_out = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    attn_weights = model.hidden_size * 2 * (q_out + kv_out)
    mixers = layers if model.mixer == architectures.PARALLEL_HYBRID else layers - attn_layers
    return formats.mixed_preset_bits(quant, model.hidden_size, q_out, kv_out,
                                     model.intermediate_size, layers, attn_layers, body,
                                     mixers * attn_weights, fallback=model.shape_known,
                                     fused_qkv=model.fused_qkv,
                                     gqa=model.n_heads / max(model.n_kv_heads, 1))


def _kv_notes(m: ModelSpec, window_extra: int | None, context: int,
              reads_window: bool = False) -> list[str]:
    """Say when a model's attention pattern changes the K/V counted (memory.kv_tokens)."""
    notes = []
    if m.kv_layers < m.n_layers:
        state = (f"{m.recurrent_state_bytes / 2**20:.1f} MiB a sequence, counted"
                 if m.recurrent_state_bytes else "not counted")
        notes.append(f"K/V for the {m.kv_layers} attention layers of {m.n_layers} (a hybrid: "
                     f"the others keep a fixed state, {state})")
    if m.kv_shared_layers:
        notes.append(f"K/V held by {m.kv_layers - m.kv_shared_layers} of {m.kv_layers} layers: "
                     f"the last {m.kv_shared_layers} attend to an earlier layer's")
    local = m.window_layers
    if local > 0 and context > m.sliding_window:
        if window_extra is None:
            notes.append(f"this engine keeps every position's K/V on the {local} layers that "
                         f"attend to a {m.sliding_window}-token window" + (
                             " (its decode step reads only the window)" if reads_window else ""))
        else:
            notes.append(f"K/V of {local} of {m.n_layers} layers held for a "
                         f"{m.sliding_window}-token window (+{window_extra} cells), not the "
                         f"{context}-token context")
    return notes


def _file_embed_bits(name: Any, quant: str) -> float | None:
    """The float embedding a model's GGUF file name tags (`...-Q4_K_M-fp16.gguf`), where the
    file's preset is the row's quant."""
    if not isinstance(name, str) or formats.quant_from_filename(name) != quant:
        return None
    return formats.embed_bits_from_filename(name)


def _section(row: dict[str, Any], name: str) -> dict[str, Any]:
    value = row.get(name)
    if value is None:
        raise RowError(name, "missing; see the input contract in docs/predictor.md")
    if isinstance(value, str):
        return {"name": value}
    if not isinstance(value, dict):
        raise RowError(name, f"expected an object or a name, got {type(value).__name__}")
    return value


def _number(section: dict[str, Any], key: str, path: str, lo: float, hi: float) -> float | None:
    value = section.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RowError(f"{path}.{key}", f"expected a number, got {value!r}")
    if not lo < value <= hi:
        raise RowError(f"{path}.{key}", f"{value!r} is outside the plausible range ({lo}, {hi}]")
    return float(value)


def _whole(section: dict[str, Any], key: str, path: str, lo: float, hi: float) -> int | None:
    """`_number`, and a whole one."""
    v = _number(section, key, path, lo, hi)
    if v is not None and v != int(v):
        raise RowError(f"{path}.{key}", f"expected a whole number, got {v!r}")
    return None if v is None else int(v)


def _device(hw: dict[str, Any]) -> tuple[DeviceSpec, float, list[str]]:
    name = str(hw.get("name") or "").strip()
    # lower bounds: a microcontroller's (10 MB of memory, 50 MB/s, 0.1 GFLOP/s); below them a
    # value is a unit slip, and the arithmetic leaves float range
    bw = _number(hw, "memory_bandwidth_gbps", "hardware", 0.05, 50000)
    base, widen, notes = _base_device(name, hw, bw)
    kind = hw.get("kind")
    if kind is not None and str(kind).lower() not in _KIND_ALIASES:
        raise RowError("hardware.kind", f"{kind!r} is not one of gpu, cpu, apple, igpu, edge")
    fields = {
        "memory_gb": _number(hw, "memory_gb", "hardware", 0.01, 4096),
        "bandwidth_gbps": bw,
        "fp16_tflops": _number(hw, "fp16_tflops", "hardware", 1e-4, 100000),
        "host_memory_gb": _number(hw, "host_memory_gb", "hardware", 0.01, 65536),
        "host_bandwidth_gbps": _number(hw, "host_bandwidth_gbps", "hardware", 0.05, 50000),
    }
    count = _whole(hw, "device_count", "hardware", 0, 64)
    cores = _whole(hw, "cpu_cores", "hardware", 0, 4096)
    dies = _whole(hw, "dies", "hardware", 0, 64)
    spec = hardware.with_overrides(
        base, **fields, kind=_KIND_ALIASES[str(kind).lower()] if kind else None,
        device_count=int(count) if count else None, cpu_cores=int(cores) if cores else None,
        dies=int(dies) if dies else None,
    )
    if spec.kind == "cpu" and cores and base.kind == "cpu" and fields["fp16_tflops"] is None:
        spec = replace(spec, fp16_tflops=base.fp16_tflops * cores / max(base.compute_units, 1),
                       compute_units=int(cores))
    if cores and spec.threads_bandwidth_gain != 1.0 and base.cpu_cores and base.cpu_cores > 1:
        # a profile's gain is for all its cores; fewer threads get a share of it (1 at one)
        used = min(int(cores), base.cpu_cores)
        spec = replace(spec, threads_bandwidth_gain=1 + (spec.threads_bandwidth_gain - 1)
                       * (used - 1) / (base.cpu_cores - 1))
    stream = _number(hw, "kernel_stream_share", "hardware", 0, 4)
    if stream is not None:
        spec = replace(spec, kernel_stream_share=stream)
    kernel = _number(hw, "kernel_gflops", "hardware", 0, 1_000_000)  # its share is clipped
    if kernel is not None:
        spec = replace(spec, kernel_gflops=kernel)
    elif spec.kernel_gflops is not None and spec.fp16_tflops != base.fp16_tflops:
        # a measured kernel rate keeps its share of a compute rate given or scaled here
        spec = replace(spec, kernel_gflops=spec.kernel_gflops * spec.fp16_tflops
                       / base.fp16_tflops)
    return spec, widen, notes


def _base_device(name: str, hw: dict[str, Any],
                 bw: float | None) -> tuple[DeviceSpec, float, list[str]]:
    """The catalog's entry (or the local profile) for `name`, else a guess from `bw`, the
    row's validated bandwidth."""
    if name.lower() in LOCAL_NAMES:
        return _local_profile(), 1.0, ["hardware from the local device profile"]
    found = hardware.lookup(name) if name else None
    if found is not None:
        exact = hardware.normalise_name(found.name) == hardware.normalise_name(name)
        note = [] if exact else [f"hardware matched catalog entry {found.name!r}"]
        if not exact and hardware.memory_in_name(name) is not None:
            note[0] += f" with the {found.memory_gb:g} GiB in its name"
        return found, 1.0, note
    if bw is None:
        label = f"hardware.name {name!r} is not in the catalog" if name else "hardware.name missing"
        near = hardware.closest_names(name) if name else []
        hint = f" (closest entries: {', '.join(near)})" if near else ""
        raise RowError("hardware.memory_bandwidth_gbps",
                       f"missing and {label}{hint}; give the bandwidth in GB/s or a known "
                       "device name")
    kind = str(hw.get("kind") or "gpu").lower()
    guess = DeviceSpec(name or "unnamed", _KIND_ALIASES.get(kind, "gpu"), 8.0, float(bw),
                       max(float(bw) / 10.0, 0.05), 16, unified=kind != "gpu")
    widen = 1.0 if hw.get("fp16_tflops") is not None else 1.5
    notes = ["device not in catalog: unspecified fields estimated"]
    if hw.get("kind") is None:
        notes.append("hardware.kind missing: taken as a discrete GPU; give kind (gpu, cpu, "
                     "apple, igpu, edge) for another device")
    return guess, widen, notes


def _local_profile() -> DeviceSpec:
    path = device_profile_path()
    if not path.is_file():
        raise RowError("hardware.name", f"no device profile at {path}; run `tightfit calibrate`")
    try:
        data = json.loads(path.read_text())
        spec = DeviceSpec(**data["device"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RowError("hardware.name",
                       f"device profile {path} is unreadable ({exc}); rerun `tightfit calibrate`")
    method = data.get("method")
    if spec.copy_bandwidth_gbps is None and isinstance(method, dict) and str(
            method.get("bandwidth", "")).startswith("numpy copyto"):
        # a profile written before the copy rate was kept apart: its bandwidth is the copy
        return hardware.measured_cpu(spec.name, spec.memory_gb, spec.bandwidth_gbps,
                                     spec.fp16_tflops * 1000.0, spec.compute_units)
    return spec


_MODEL_INT_FIELDS = {"n_layers": 4096, "hidden_size": 1_000_000, "intermediate_size": 10_000_000,
                     "n_heads": 4096, "n_kv_heads": 4096, "vocab_size": 10_000_000,
                     "head_dim": 4096, "sliding_window": 10_000_000, "sliding_layers": 4096,
                     "attention_layers": 4096, "kv_shared_layers": 4096}


def _model(m: dict[str, Any], read: ModelSpec | None = None) -> tuple[ModelSpec, float, list[str]]:
    """The model section as a ModelSpec: the table's by name, else one estimated from its size;
    `read`: a file's (`model.path`). Shape fields the row gives override either."""
    name = str(m.get("name") or "").strip()
    params = _number(m, "params_b", "model", 1e-4, 20000)  # from 100k parameters
    active = _number(m, "active_params_b", "model", 1e-4, 20000)
    spec = read or (architectures.lookup(name) if name else None)
    if spec is None and params is None:
        raise RowError("model.params_b", f"missing and no size can be derived from name {name!r}; "
                       "give params_b (billions)")
    if spec is None:
        spec = architectures.estimate_shape(name or "unnamed", params or 0.0, active)
    ints = {k: _whole(m, k, "model", 0, hi) for k, hi in _MODEL_INT_FIELDS.items()}
    updates: dict[str, Any] = {k: int(v) for k, v in ints.items() if v is not None}
    if params is not None:
        updates["params_b"] = params
        updates["active_params_b"] = active if active is not None else min(
            params, spec.active_params_b if spec.is_moe else params)
    elif active is not None:
        updates["active_params_b"] = active
    ple = _number(m, "per_layer_embed_params_b", "model", 0, 20000)
    if ple is not None:
        updates["per_layer_embed_params_b"] = ple
    full_kv = _number(m, "full_kv_scale", "model", 0, 16)
    if full_kv is not None:  # a full-attention layer's K/V a token against a window layer's
        updates["full_kv_scale"] = full_kv
    state = _number(m, "state_mb_per_layer", "model", 0, 65536)
    if state is not None:  # MiB a sequence in each non-attention layer of a hybrid
        updates["state_bytes_per_layer"] = state * 2**20
    mixer = m.get("mixer")
    if mixer is not None:  # what a hybrid's non-attention layers run (their graph operations)
        key = mixer.strip().lower() if isinstance(mixer, str) else None
        if key not in architectures.MIXERS:
            raise RowError("model.mixer", f"unknown mixer {mixer!r}; use one of "
                           f"{', '.join(architectures.MIXERS)} (or leave it out for a model "
                           "whose layers all attend)")
        updates["mixer"] = key
    # a looped transformer: `n_layers` as its config counts them (stored), run `layer_loops`
    # times a token; the spec counts the layers a token passes through
    loops = _whole(m, "layer_loops", "model", 0, 16)
    if loops is not None or "n_layers" in updates:
        passes = loops if loops is not None else spec.layer_loops
        stored = updates.get("n_layers", spec.n_layers // spec.layer_loops)
        updates["n_layers"], updates["layer_loops"] = stored * passes, passes
    if "hidden_size" in updates and "n_heads" in updates and "head_dim" not in updates:
        updates["head_dim"] = updates["hidden_size"] // updates["n_heads"]
    known = spec.shape_known or {"n_layers", "hidden_size"} <= set(updates)
    spec = replace(spec, shape_known=known, **updates)
    if spec.n_kv_heads > spec.n_heads:
        raise RowError("model.n_kv_heads", f"{spec.n_kv_heads} exceeds n_heads {spec.n_heads}")
    if "mixer" in updates and spec.mixer in architectures.RECURRENT_OPS and \
            not 0 < spec.attention_layers < spec.n_layers:
        raise RowError("model.attention_layers",
                       f"model.mixer {spec.mixer!r} describes the layers that do not attend; give "
                       f"attention_layers, how many of the {spec.n_layers} layers attend (1 to "
                       f"{spec.n_layers - 1})")
    if spec.kv_shared_layers >= spec.kv_layers:
        raise RowError("model.kv_shared_layers",
                       f"{spec.kv_shared_layers} leaves none of the {spec.kv_layers} attending "
                       "layers holding K/V; give fewer")
    for field in ("sliding_layers", "attention_layers"):
        if getattr(spec, field) > spec.n_layers:
            raise RowError(f"model.{field}",
                           f"{getattr(spec, field)} exceeds n_layers {spec.n_layers}")
    notes = [] if known else ["model shape estimated from its size"]
    if spec.mixer:
        rel = architectures.mixer_ops(spec.mixer)
        which = "every layer runs attention and a Mamba-2 mixer" \
            if spec.mixer == architectures.PARALLEL_HYBRID else \
            f"{spec.n_layers - spec.kv_layers} of its {spec.n_layers} layers run {spec.mixer}"
        if rel != 1.0:
            notes.append(f"a hybrid: {which}, {rel:g}x the graph operations of an attention "
                         f"layer (each layer's fixed per-step cost scaled by it)")
    if spec.layer_loops > 1:
        notes.append(f"a looped transformer: its {spec.n_layers // spec.layer_loops} stored layers "
                     f"run {spec.layer_loops} times a token (their weights read once a pass, "
                     f"K/V for {spec.n_layers} layers)")
    return spec, 1.0 if known else 1.15, notes


def _quant(value: Any) -> tuple[str, float | None]:
    """The format's canonical name and the bits of a float embedding / head it is tagged with
    (`Q4_K_M-f16`); a RowError names an unknown or missing one."""
    if not isinstance(value, str) or not value.strip():
        raise RowError("quant", "missing; give the weight format, e.g. 'Q4_K_M' or 'int4-g128'")
    base, embed_bits = formats.split_embed_tag(value)
    try:
        formats.bits_per_weight(base)
        return formats.normalise(base), embed_bits
    except TightfitError as exc:
        raise RowError("quant", str(exc)) from None


def _mlx(device: DeviceSpec, quant: str) -> str:
    """MLX is taken as llama.cpp on Metal with MLX's storage ("4bit" / "8bit": groups of 64
    weights with an fp16 scale and bias, the embedding and head included, as mlx_lm.convert
    writes them): scored so, the llmfit table's 32 MLX runs on an M4 Pro read 0.86-1.18 of
    measured, 6.3% MAPE (docs/examples/mlx-m4pro.jsonl; nothing fitted to them)."""
    _runs_only(device, quant, "MLX", "apple", "Apple silicon",
               "describe an Apple chip or use engine llama.cpp", MLX_QUANTS,
               "give '4bit' for an mlx-community 4-bit model")
    return ("engine mlx taken as llama.cpp on Metal with MLX's storage (4bit / 8bit: groups of 64 "
            "with an fp16 scale and bias, embedding and head included): the llmfit table's 32 MLX "
            "runs on an M4 Pro read 0.86-1.18 of measured (6.3% MAPE); memory as llama.cpp's")


def _lite_supported(device: DeviceSpec, quant: str) -> None:
    _runs_only(device, quant, "the lite runtime (tightfit-lite)", "cpu", "the CPU",
               "describe its CPU (kind cpu) or use engine llama.cpp or tightfit", LITE_QUANTS,
               "use engine tightfit or llama.cpp")


def _runs_only(device: DeviceSpec, quant: str, engine: str, device_class: str, where: str,
               other_device: str, quants: tuple[str, ...], other_quant: str) -> None:
    """An engine that runs on one device class and reads a few formats: a row error naming the
    field otherwise, and what to give instead."""
    if device.device_class != device_class:
        raise RowError("engine", f"{engine} runs on {where} only; this device is "
                                 f"{device.device_class!r}: {other_device}")
    if quant not in quants:
        raise RowError("quant", f"{engine} runs {', '.join(quants)}, not {quant!r}: "
                                f"{other_quant}")


# Serving engines users ask for that the predictor does not model: each preallocates a share of
# the GPU for its K/V and runs its own kernels, with no measurement here to fit them on
_NOT_MODELLED = ("vllm", "sglang", "tgi", "text-generation-inference", "tensorrt-llm", "trt-llm",
                 "exllamav2", "exllama")


def _engine(value: Any) -> str:
    engine = canonical_engine(str(value)) if isinstance(value, str) else None
    if engine is None:
        known = f"one of {', '.join(ENGINES)} (or ollama / mlx, taken as llama.cpp)"
        if isinstance(value, str) and value.strip().lower() in _NOT_MODELLED:
            raise RowError("engine", f"{value!r} is not modelled (it preallocates GPU memory for "
                                     f"its K/V and runs kernels of its own); give {known}")
        raise RowError("engine", f"{value!r} is not {known}")
    return engine


def _workload(w: Any) -> Workload:
    if not isinstance(w, dict):
        raise RowError("workload", f"expected an object, got {type(w).__name__}")
    ints = {key: _whole(w, key, "workload", lo, hi) for key, lo, hi in (
        ("prompt_tokens", -1, 10_000_000), ("gen_tokens", -1, 10_000_000),
        ("batch", 0, 100_000), ("context_tokens", 0, 10_000_000), ("slots", 0, 100_000))}
    prompt = 512 if ints["prompt_tokens"] is None else ints["prompt_tokens"]
    gen = 128 if ints["gen_tokens"] is None else ints["gen_tokens"]
    ctx = ints["context_tokens"] or max(prompt + gen, 1)
    if ints["context_tokens"] and ctx < prompt + gen:
        # llama.cpp and the servers refuse such a request; enlarging the context silently would
        # answer for a deployment the row does not describe (its KV cache sized by the prompt)
        raise RowError("workload.context_tokens",
                       f"{ctx} is less than prompt_tokens + gen_tokens = {prompt + gen}; raise "
                       f"context_tokens to at least {prompt + gen} or shorten the prompt")
    kv = w.get("kv_dtype")
    if kv is not None:
        try:
            formats.kv_bytes(str(kv))
        except TightfitError as exc:
            raise RowError("workload.kv_dtype", str(exc)) from None
    moe = w.get("moe_offload")
    if moe is not None and moe not in MOE_OFFLOAD:
        raise RowError("workload.moe_offload",
                       f"{moe!r} is not one of {', '.join(repr(m) for m in MOE_OFFLOAD)}: \"experts\" "
                       "puts routed experts in host RAM first (llama.cpp's default --fit), "
                       "\"layers\" whole layers (an explicit -ngl)")
    fa = w.get("flash_attn")
    key = fa.lower() if isinstance(fa, str) else fa
    if fa is not None and (not isinstance(key, (bool, str)) or key not in FLASH_ATTN):
        raise RowError("workload.flash_attn",
                       f"{fa!r} is not true, false, \"on\", \"off\" or \"auto\" (llama.cpp's "
                       "-fa); leave it out for the engine's default (on where the backend has it)")
    batch, slots = ints["batch"] or 1, ints["slots"] or None
    if slots is not None and slots < batch:
        raise RowError("workload.slots",
                       f"{slots} is less than workload.batch = {batch}: an engine decodes at most "
                       f"the sequences it holds; raise slots to at least {batch} (a llama.cpp "
                       "server's -np) or lower batch")
    place = {key: _placement(w, key) for key in ("gpu_layers", "n_cpu_moe")}
    return Workload(prompt, gen, batch, max(ctx, prompt + gen), kv, moe,
                    None if fa is None else FLASH_ATTN[key], slots, place["gpu_layers"],
                    place["n_cpu_moe"])


def _placement_check(engine: str, device: DeviceSpec, model: ModelSpec,
                     w: Workload) -> list[str]:
    """llama.cpp's placement flags belong to llama.cpp (a row error for another engine), and
    count on a discrete GPU only (a note where they are ignored)."""
    given = [k for k in ("gpu_layers", "n_cpu_moe") if getattr(w, k) is not None]
    if not given:
        return []
    if engine != "llama.cpp":
        raise RowError(f"workload.{given[0]}",
                       f"llama.cpp's placement (-ngl / --n-cpu-moe), not {engine}'s: leave it "
                       "out, or set engine to llama.cpp")
    if device.device_class != "discrete_gpu":
        return [f"workload.{given[0]} ignored: it places layers on a discrete GPU, not on "
                f"{device.name}"]
    if w.n_cpu_moe and not model.is_moe:
        return [f"workload.n_cpu_moe ignored: {model.name} has no experts"]
    return []


# llama.cpp's -ngl spellings for every layer, and the count they stand for (past any model's)
_ALL_LAYERS = ("all", "max")
ALL_LAYERS = 1_000_000


def _placement(w: dict[str, Any], key: str) -> int | None:
    """`workload.gpu_layers` (llama.cpp's -ngl: a count, or "all") or `workload.n_cpu_moe`
    (--n-cpu-moe: a count): a whole number >= 0; a count past the model's layers means all."""
    value = w.get(key)
    if value is None:
        return None
    if key == "gpu_layers" and isinstance(value, str) and value.strip().lower() in _ALL_LAYERS:
        return ALL_LAYERS
    flag = "-ngl" if key == "gpu_layers" else "--n-cpu-moe"
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0 or value != int(value):
        extra = ' or "all"' if key == "gpu_layers" else ""
        raise RowError(f"workload.{key}", f"{value!r} is not a whole number >= 0{extra} "
                       f"(llama.cpp's {flag}); leave it out to place layers as --fit does")
    return int(min(value, ALL_LAYERS))


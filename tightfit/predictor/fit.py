"""Why a deployment does not fit, or whether it does is undecided, and what would fit: the
`fits_reason` of a prediction (also among its notes).

`fits` false names the memory needed against the memory there is, then what changes it: the
largest context that fits at the format asked for; the first lighter format of the engine that
fits at the context asked for (the same model, another file or setting), or else at a shorter
one; else the largest batch that fits.
"""
from __future__ import annotations

import math
from dataclasses import replace

from tightfit.predictor import memory
from tightfit.predictor.engines import EngineProfile, for_scenario
from tightfit.predictor.memory import GB, MemoryEstimate
from tightfit.predictor.scenario import Scenario, stored_bits

# Lighter formats tried for a deployment that does not fit, heaviest first, by engine: what the
# engine runs (llama.cpp's common presets; the lite runtime's blocks; tightfit's own integer
# formats; HF's half floats and bitsandbytes).
LIGHTER = {
    "llama.cpp": ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k"),
    "tightfit-lite": ("q8_0", "q4_1", "q4_0"),
    "tightfit": ("int8", "int4-g128"),
    "hf-transformers": ("bf16", "8bit", "nf4"),
    "mlx": ("8bit", "4bit"),  # an alias (Scenario.alias) predicted as llama.cpp
}


# The search's caps: a million tokens (the longest contexts models are offered with), 4,096
# sequences (beyond any single deployment's batch)
MAX_CONTEXT, MAX_BATCH = 1 << 20, 4096


def capacity(s: Scenario) -> dict[str, int | None]:
    """The headroom of a deployment: the largest context (at the row's batch) and the most
    sequences (at the row's context) whose memory stays where the row's does: all of it on the
    device, or, for a placement the row sets (gpu_layers / n_cpu_moe), its GPU part within the
    card. None where not even one request's own tokens do; the caps where the search reaches
    them (MAX_CONTEXT, MAX_BATCH; the model's trained context where a file read says it)."""
    prof = for_scenario(s)

    def ok(e: MemoryEstimate) -> bool:  # a set placement: memory._set_placement's estimate
        return e.gpu_bytes <= e.capacity_bytes if e.host_layer_share is not None \
            else e.fits_on_device
    top = min(MAX_CONTEXT, s.model.trained_context or MAX_CONTEXT)
    return {"max_context_tokens": memory.largest_context(s, ok, prof, top),
            "max_batch": memory.largest_batch(s, ok, prof, MAX_BATCH)}


def reason(s: Scenario, m: MemoryEstimate, prof: EngineProfile) -> str | None:
    """None where the deployment fits; else why not (`fits` false) or why it is undecided
    (`fits` null), with the field or the change that decides it."""
    if m.fits:
        return None
    named_fix = False
    if m.host_layer_share is not None:
        text, named_fix = _set_placement(s, m, prof)
    elif s.device.device_class == "discrete_gpu":
        text = _host(s, m, f"what the card's {m.capacity_bytes / GB:.1f} GiB does not hold, "
                           "and the process")
    else:
        text = _device(s, m)
    if m.fits is None:
        return text
    return "; ".join([text, *_what_fits(s, prof, named_fix)])


def soft_cap_note(s: Scenario, m: MemoryEstimate) -> str | None:
    """A deployment that fits past a soft cap (an Apple chip's recommended GPU working set): what
    it is over, and what holds it."""
    if not m.fits or m.fits_on_device or s.device.device_class != "apple":
        return None
    hard = memory.device_capacity_bytes(s)
    return (f"fits past the GPU's recommended working set: its peak of {m.peak_bytes / GB:.2f} GiB "
            f"is over the {m.capacity_bytes / GB:.2f} GiB macOS recommends for the GPU, within "
            f"the {hard / GB:.2f} GiB it can take; Metal lets it run past (llama.cpp warns), "
            "and other programs then compete for the rest of the memory (fits_on_device false)")


def tightfit_settings_note(s: Scenario) -> str | None:
    """The flags tightfit's engine needs to run a row that its defaults refuse: a context past
    its `max_model_len`, K/V for the sequences held past its KV pool (`kv_cache_bytes`, in
    whole blocks; the pool is mapped lazily, so a larger one costs memory only as it fills)."""
    if s.engine != "tightfit":
        return None
    from tightfit.config import CacheConfig, SchedulerConfig

    cache, sched, w = CacheConfig(), SchedulerConfig(), s.workload
    per_token = memory.kv_bytes_per_token(s, for_scenario(s))
    blocks = -(-w.context_tokens // cache.block_size) * w.held
    pool = blocks * cache.block_size * per_token
    flags = []
    if w.context_tokens > sched.max_model_len:
        flags.append(f"--max-model-len {w.context_tokens}")
    if pool > cache.kv_cache_bytes:
        flags.append(f"--kv-cache-memory {math.ceil(pool / 2**20)}MiB")
    if not flags:
        return None
    held = int(cache.kv_cache_bytes // (cache.block_size * per_token)) * cache.block_size
    return (f"tightfit's engine runs this with {' and '.join(flags)}: its defaults are "
            f"{sched.max_model_len} tokens a sequence and a {cache.kv_cache_bytes / 2**20:.0f} MiB "
            f"K/V pool ({held} tokens of this model's K/V)")


def _set_placement(s: Scenario, m: MemoryEstimate, prof: EngineProfile) -> tuple[str, bool]:
    """A placement the run set (-ngl / --n-cpu-moe): its GPU part against the card (no margin
    kept free), else its host part against the RAM; and whether the text names a fix."""
    if m.gpu_bytes > m.capacity_bytes:
        most = memory.max_gpu_layers(s, prof)
        fix = (f"gpu_layers {most} keeps it under" if most else
               "no gpu_layers keeps it under (raise n_cpu_moe, or leave both out)")
        if m.fits is None:
            return (f"the GPU part ({m.gpu_bytes / GB:.2f} GiB) is over the card's "
                    f"{m.capacity_bytes / GB:.2f} GiB by less than the memory estimate's error "
                    f"({100 * memory.SET_PLACEMENT_BAND:.0f}%): whether llama.cpp loads it is "
                    f"undecided (fits null); {fix}"), bool(most)
        return (f"the GPU part ({m.gpu_bytes / GB:.1f} GiB) is more than the card's "
                f"{m.capacity_bytes / GB:.1f} GiB: llama.cpp would fail to load it; {fix}, or "
                "leave workload.gpu_layers out to place layers as --fit does"), True
    held = "the layers and routed experts" if m.host_expert_bytes > 0 else "the layers"
    return _host(s, m, f"{held} off the GPU, the token embedding and the process"), False


def _host(s: Scenario, m: MemoryEstimate, what: str) -> str:
    """An offloading deployment's host part against the host's RAM."""
    host = memory.host_capacity_bytes(s)
    need = f"{m.host_need_bytes / GB:.1f} GiB on the host ({what})"
    if host is None:
        return (f"fits is null: whether the {need} fit in its RAM is unknown; give "
                "hardware.host_memory_gb to decide")
    return (f"does not fit: {need} is more than the {host / GB:.1f} GiB usable of the host's "
            f"{s.device.host_memory_gb:g} GB RAM")


def _device(s: Scenario, m: MemoryEstimate) -> str:
    """A CPU or a unified-memory chip: the peak against the memory it can use."""
    d = s.device
    size = f"{d.memory_gb:g} GB" + (f" x {d.device_count}" if d.device_count > 1 else "")
    cap = memory.device_capacity_bytes(s)
    name = "the device" if d.name == "unnamed" else d.name
    return (f"does not fit: its {m.peak_phase} peak of {m.peak_bytes / GB:.2f} GiB is more than "
            f"the {cap / GB:.2f} GiB of {name}'s {size} a process can use "
            f"({100 * cap / (d.memory_gb * d.device_count * GB):.0f}%; the OS holds the rest)")


def _what_fits(s: Scenario, prof: EngineProfile, named_fix: bool) -> list[str]:
    """What makes a deployment that does not fit fit: a shorter context at its format; else the
    first lighter format that fits at the context asked for, or at a shorter one."""
    def ok(e: MemoryEstimate) -> bool:
        return e.fits is True
    out = []
    ctx = memory.largest_context(s, ok, prof)
    if ctx is not None:
        out.append(f"a context of up to {ctx} tokens fits (workload.context_tokens)")
    lighter = [q for q in LIGHTER.get(s.alias if s.alias in LIGHTER else s.engine, ())
               if _bits(q, s) < s.bits_per_weight]
    for q in lighter:
        other = replace(s, quant=q, bits_per_weight=_bits(q, s), embed_bits=None, head_bits=None)
        other_prof = for_scenario(other)
        e = memory.estimate(other, other_prof)
        if ok(e):
            out.append(f"at {_name(q, s)} it needs {_need(e)} and fits (quant)")
            break
        shorter = None if ctx is not None else memory.largest_context(other, ok, other_prof)
        if shorter is not None:
            out.append(f"at {_name(q, s)} a context of up to {shorter} tokens fits (quant, "
                       "workload.context_tokens)")
            break
    w = s.workload
    if not out and w.batch > 1 and w.slots is None:
        batch = memory.largest_batch(s, ok, prof)
        if batch:
            out.append(f"a batch of up to {batch} sequences fits (workload.batch)")
    if not out and not named_fix:
        tried = f"a format down to {_name(lighter[-1], s)}" if lighter else "another format"
        out.append(f"neither a shorter context nor {tried} fits: a smaller model, or a device "
                   "with more memory")
    return out


def _need(e: MemoryEstimate) -> str:
    """What a deployment needs: its peak, and where part of it is in host RAM, that part."""
    if e.host_need_bytes > 0:
        return f"{e.peak_bytes / GB:.1f} GiB ({e.host_need_bytes / GB:.1f} GiB of it on the host)"
    return f"{e.peak_bytes / GB:.1f} GiB"


def _name(quant: str, s: Scenario) -> str:
    """A format as the engine's users write it: GGUF types in capitals."""
    return quant.upper() if s.engine in ("llama.cpp", "tightfit-lite") and s.alias != "mlx" \
        else quant


def _bits(quant: str, s: Scenario) -> float:
    return stored_bits(quant, s.model)

"""One scenario + a fitted model -> one prediction (numbers only; api.py formats JSON).

prediction = analytic base x exp(learned log residual), the residual clipped to +-1.5 so that
scenarios far from the training data fall back towards physics instead of extrapolating.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tightfit.predictor import attribution, engines, features, fit, memory, roofline
from tightfit.predictor.memory import GB
from tightfit.predictor.engines import EngineProfile
from tightfit.predictor.models import PredictorModel, ResidualModel
from tightfit.predictor.roofline import Breakdown
from tightfit.predictor.scenario import Scenario

MAX_RESIDUAL = 1.5
MEMORY_BAND = 0.15
# The prompt whose predicted rate a batch's further sequences run at (`batched_step`): long
# enough that the weights' reads and the per-call costs are spread thin, as a llama.cpp call
BATCH_REF_PROMPT = 512


@dataclass(frozen=True)
class Prediction:
    id: str
    fits: bool | None
    fits_on_device: bool
    peak_memory_gb: float
    offload_fraction: float
    prefill_tok_s: float | None
    decode_tok_s: float
    ttft_s: float
    tpot_s: float
    bottleneck: str
    factors: dict[str, float]
    interval: dict[str, tuple[float, float]]
    notes: tuple[str, ...]
    memory: dict[str, float | str] = field(default_factory=dict)  # the peak's parts, GiB
    fits_reason: str | None = None  # why `fits` is false or null (fit.reason), and what would fit


def request_tok_s(p: Prediction, s: Scenario) -> float:
    """Tokens generated over a whole request's predicted wall time: the TTFT (prompt, request
    overhead, first token), then one decode step for each further token."""
    w = s.workload
    return w.batch * w.gen_tokens / (p.ttft_s + max(w.gen_tokens - 1, 0) * p.tpot_s)


def residual(model: ResidualModel, s: Scenario, b: Breakdown, phase: str) -> float:
    r = model.predict_log(features.features(s, b, phase))
    return max(-MAX_RESIDUAL, min(MAX_RESIDUAL, r))


def batched_step(s: Scenario, model: PredictorModel, b: Breakdown) -> float:
    """One decode step of a batch of `workload.batch` sequences: the step of one sequence (base
    x residual, what the fit's single-stream rows describe), and for each further sequence its
    multiply-adds at the rate a prompt runs (base x residual of a BATCH_REF_PROMPT-token
    prompt: a step of B sequences multiplies every weight by B columns, as a prompt call does
    with its tokens, and reads it once) plus its own K/V read at the step's byte rate, plus
    what the batch's larger K/V pushes off the device.

    Measured (data/measurements/batch-epyc.jsonl, docs/predictor.md "Batched decode"): on the
    2-core EPYC, tightfit's Q4_1 step grows by 3.5 ms a further sequence at one thread and 2.0
    ms at two, 78 and 135 GFLOP/s with the output head counted, where its 512-token prompts
    (the head once) run 69 and 130; the base's batch
    model before (every sequence's FLOPs at the single stream's matrix-vector rate) put the
    aggregate rate of 16 sequences at 0.45 of measured."""
    w = s.workload
    one = replace(s, workload=replace(w, batch=1))
    b1 = roofline.analyse(one)
    t1 = b1.decode.total / math.exp(residual(model.decode, one, b1, "decode"))
    ref = replace(s, workload=replace(w, batch=1, prompt_tokens=BATCH_REF_PROMPT, gen_tokens=1,
                                      context_tokens=max(w.context_tokens, BATCH_REF_PROMPT + 1)))
    bref = roofline.analyse(ref)
    t_ref = bref.prefill.total / math.exp(residual(model.prefill, ref, bref, "prefill"))
    # a sequence's decode FLOPs (the output head's included: a prompt runs it once) at the
    # FLOP rate the reference prompt runs at
    per_seq = b1.flops_per_step * t_ref / bref.prefill_flops
    prof = engines.for_scenario(one)
    weights = memory.active_weight_bytes(one, prof)
    # the step's bytes as its time sees them (an MoE's experts stream at moe_bw_rel)
    rel = prof.moe_bw_rel if s.model.is_moe else 1.0
    own_kv_bytes = max(b1.bytes_per_step - weights, 0.0)
    per_byte = b1.decode.mem_s / max(weights / rel + own_kv_bytes, 1.0)
    own_kv = per_byte * own_kv_bytes
    # the first further sequence a whole single-stream step where the engine pays it
    # (llama.cpp on a CPU), the rest at the prompt rate, on whole tiles of columns where the
    # engine computes them so (llama.cpp on Metal): EngineProfile.batch_whole_first_step,
    # batch_tile
    whole = prof.batch_whole_first_step
    first = t1 if whole else per_seq
    # a mixture of experts: the further experts the batch's sequences route to, read once a
    # step (memory.batch_expert_share), beyond those of a whole further step where it is paid
    read = memory.active_weight_bytes(replace(s, workload=replace(w, batch=2)), prof) \
        if whole else weights
    more_experts = per_byte * max(memory.active_weight_bytes(s, prof) - read, 0.0) / rel
    pushed_off = max(b.decode.offload_s - b1.decode.offload_s, 0.0)
    if prof.batch_one_pass and not whole and not roofline.mkl_one_thread(s):
        # one pass over the weights for every sequence: the further sequences' arithmetic and
        # K/V join the single step's own terms (at its residual's scale) under its p-norm
        one_step = replace(b1.decode, offload_s=0.0, overhead_s=0.0)
        scale = b1.decode.total / t1
        more_reads = (w.batch - 1) * own_kv + more_experts
        more_work = (batch_columns(s, prof) - 1) * per_seq
        grown = replace(one_step, mem_s=one_step.mem_s + more_reads * scale,
                        comp_s=one_step.comp_s + more_work * scale)
        return t1 + (grown.roof_s - one_step.roof_s) / scale + pushed_off
    return t1 + first + (batch_columns(s, prof) - 2) * per_seq + (w.batch - 1) * own_kv + \
        more_experts + pushed_off


def batch_columns(s: Scenario, prof: EngineProfile) -> int:
    """The columns a decode step of `workload.batch` sequences multiplies the weights by: the
    batch, but where the engine computes more than its matrix-vector kernels take on whole
    tiles (EngineProfile.batch_tile: llama.cpp on Metal, 9-32 sequences as 32), the batch
    rounded up to whole tiles."""
    b, tile = s.workload.batch, prof.batch_tile
    if tile is None or b <= tile[0]:
        return b
    return math.ceil(b / tile[1]) * tile[1]


def predict_scenario(s: Scenario, model: PredictorModel,
                     observed: dict[str, float] | None = None) -> Prediction:
    b = roofline.analyse(s)
    w = s.workload
    t_step = b.decode.total / math.exp(residual(model.decode, s, b, "decode")) \
        if w.batch == 1 else batched_step(s, model, b)
    t_pre = b.prefill.total / math.exp(residual(model.prefill, s, b, "prefill")) if w.prompt_tokens else 0.0
    ttft = t_pre + b.request_overhead_s + (t_step if w.prompt_tokens == 0 else 0.0)
    prefill = w.batch * w.prompt_tokens / t_pre if t_pre > 0 else None
    factors = attribution.factors(s, b, t_step, t_pre, observed or {})
    why = fit.reason(s, b.memory, engines.for_scenario(s))
    fit_notes = tuple(n for n in (why, fit.soft_cap_note(s, b.memory),
                                  fit.tightfit_settings_note(s)) if n)
    return Prediction(
        id=s.id, fits=b.memory.fits, fits_on_device=b.memory.fits_on_device,
        peak_memory_gb=b.memory.peak_bytes / GB, offload_fraction=1 - b.memory.device_fraction,
        prefill_tok_s=prefill, decode_tok_s=w.batch / t_step, ttft_s=ttft, tpot_s=t_step,
        bottleneck=attribution.bottleneck(b.decode), factors=factors,
        interval=_intervals(s, model, b, t_step, t_pre, ttft),
        notes=s.notes + _placement_notes(s, b) + fit_notes + _peak_notes(b) + _thread_notes(s),
        memory=_memory_parts(b), fits_reason=why,
    )


def _thread_notes(s: Scenario) -> tuple[str, ...]:
    """Where more threads do not speed the decode up (roofline.mkl_one_thread), and what would."""
    if not roofline.mkl_one_thread(s) or (s.device.cpu_cores or 1) < 2:
        return ()
    what = ("; tightfit's int8 and int4 weights use every thread" if s.engine == "tightfit"
            else "")
    return (f"{s.engine}'s fp32 decode runs torch's products through MKL, which keeps a product "
            f"of fewer than {roofline.MKL_ONE_THREAD_ROWS} rows on one thread on an AMD CPU "
            "(pytorch/pytorch#96643): predicted at one core's rate, not the "
            f"{s.device.cpu_cores} cores'{what}",)


def _peak_notes(b: Breakdown) -> tuple[str, ...]:
    """Where the peak varies from run to run (memory.load_reuse_bytes): its lower level."""
    m = b.memory
    if not m.peak_low_bytes or m.peak_bytes - m.peak_low_bytes < 1e-3 * m.peak_bytes:
        return ()
    return (f"the load peak varies from run to run: {m.peak_bytes / GB:.2f} GiB, or "
            f"{m.peak_low_bytes / GB:.2f} GiB where the allocator reuses the memory freed after "
            "converting the largest tensor (HF converting the file to float); a budget must "
            "hold the first",)


def _placement_notes(s: Scenario, b: Breakdown) -> tuple[str, ...]:
    """Where layers leave a GPU: how much goes to the host and what the engine does with it,
    and the largest context that would keep every layer on the GPU (where the context asked for
    is what pushes them off). Whether it all fits is `fit.reason`'s."""
    m = b.memory
    if m.host_layer_share is not None:
        return _set_placement_notes(s, m)
    if m.device_fraction >= 1.0 or s.device.device_class != "discrete_gpu":
        return ()
    prof = engines.for_scenario(s)
    where = ("runs those layers on the CPU from host RAM" if prof.offload == "layer_split"
             else "streams them over the host link every step")
    if m.host_expert_bytes > 0:
        _, read = memory.routed_experts(s)
        where = ("keeps attention, K/V and the dense parts on the GPU and runs the routed "
                 f"experts held in host RAM on the CPU, a token reading {100 * read:.0f}% of them")
    share = (f"{100 * (1 - m.device_fraction):.0f}% of the weights and K/V "
             f"({m.host_bytes / GB:.1f} GiB) on the host at a {s.workload.context_tokens}-token "
             f"context ({s.engine} {where})")
    ctx = memory.max_context_on_device(s, prof)
    return (f"{share}; a context of up to {ctx} tokens keeps every layer on the GPU"
            if ctx is not None else f"{share}; no context keeps every layer on the GPU",)


def _set_placement_notes(s: Scenario, m: memory.MemoryEstimate) -> tuple[str, ...]:
    """What a placement the row set (-ngl / --n-cpu-moe) puts where (whether the GPU part fits
    the card is `fit.reason`'s)."""
    w, layers = s.workload, s.model.n_layers
    on_gpu = round((1 - m.host_layer_share) * layers)
    parts = [f"{on_gpu} of {layers} layers on the GPU"
             + ("" if m.head_on_host else " with the output layer")]
    if m.host_expert_bytes > 0:
        parts.append(f"the routed experts of {w.n_cpu_moe} layers in host RAM "
                     f"({m.host_expert_bytes / GB:.1f} GiB)")
    return (f"llama.cpp placement as set (gpu_layers / n_cpu_moe): {'; '.join(parts)}; "
            f"{m.gpu_bytes / GB:.1f} GiB on the GPU with its buffers and context, "
            f"{m.host_bytes / GB:.1f} GiB of weights and K/V on the host",)


def _memory_parts(b: Breakdown) -> dict[str, float | str]:
    """Where the predicted peak comes from: peak = runtime + weights + max(load transient,
    KV + recurrent state + buffers); `peak_phase` says which side is larger."""
    m = b.memory
    parts: dict[str, float | str] = {
        f"{k}_gb": v / GB for k, v in (
            ("weights", m.weights_bytes), ("kv", m.kv_bytes), ("state", m.state_bytes),
            ("buffers", m.buffers_bytes),
            ("runtime", m.runtime_bytes), ("load_transient", m.load_transient_bytes))}
    parts["peak_phase"] = m.peak_phase
    return parts


def _band(value: float, lo: float, hi: float, widen: float) -> tuple[float, float]:
    return value * math.exp(lo * widen), value * math.exp(hi * widen)


def _intervals(s: Scenario, model: PredictorModel, b: Breakdown, t_step: float, t_pre: float,
               ttft: float) -> dict[str, tuple[float, float]]:
    dlo, dhi = model.decode.band(s.device.device_class)
    plo, phi = model.prefill.band(s.device.device_class)
    wid = s.widen
    mem = b.memory.peak_bytes / GB
    # a peak that varies from run to run (HF's GGUF load: memory.load_reuse_bytes) widens the
    # band down to its lower level
    low = min(mem * (1 - MEMORY_BAND * wid), (b.memory.peak_low_bytes or b.memory.peak_bytes) / GB)
    out = {
        "decode_tok_s": _band(s.workload.batch / t_step, dlo, dhi, wid),
        "tpot_s": _band(t_step, -dhi, -dlo, wid),
        "ttft_s": _band(ttft, -phi, -plo, wid),
        "peak_memory_gb": (low, mem * (1 + MEMORY_BAND * wid)),
    }
    if t_pre > 0:
        out["prefill_tok_s"] = _band(s.workload.batch * s.workload.prompt_tokens / t_pre, plo, phi, wid)
    return out

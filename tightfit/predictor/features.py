"""Features for the learned residual: pure functions of a scenario and its analytic breakdown.

Includes the source brief's decay factors (lambda_mem, lambda_comp, lambda_quant and their product)
so that screening and the held-out evaluation can say whether they help. No I/O, no state.
"""
from __future__ import annotations

import math

from tightfit.predictor.hardware import CLASSES
from tightfit.predictor.roofline import Breakdown, Phase
from tightfit.predictor.scenario import Scenario

# The residual's engine flags and the engine each stands for; llama.cpp, the reference, has none.
ENGINE_FLAGS = {"engine_hf": "hf-transformers", "engine_tightfit": "tightfit",
                "engine_lite": "tightfit-lite"}
ENGINE_FEATURES = tuple(ENGINE_FLAGS)
# Kept in decode whatever screening says: a chip of several dies on one memory system (Apple's
# Ultras) reaches a smaller share of its bandwidth, more so the fewer bits a weight has (the
# llama.cpp table: M1/M2/M3 Ultra decode ~0.96x the base at F16, ~0.83x at Q8_0, ~0.68x at
# Q4_0; the Max chips 0.86-1.14x). Its 16 rows are too few for screening's threshold; forced
# in, Apple decode held out by device went 9.0% -> 5.7% MAPE, max 48.7% -> 18.2% (Ultras
# 37/19/32% -> 9/10/7%), and llmfit 16.8% -> 15.0%: without it the Ultras, at the top of the
# bandwidth range, bent the bandwidth slope for every device (2026-12-05, docs/predictor.md).
DECODE_ALWAYS = ENGINE_FEATURES + ("multi_die",)
BRIEF_FEATURES = ("lambda_mem", "lambda_comp", "lambda_quant", "lambda_all")
# Phases whose default candidates include the brief's factors. Decided by the held-out ablation
# (`tightfit predictor evaluate --split device --brief-factors all|none`, docs/predictor.md):
# for decode they cost 3 points overall (17.7% without vs 20.8% with; tightfit's own data 15.6%
# vs 26.5%, where lambda_comp ~ thread count extrapolates badly) and gain 1.3 on llmfit. For
# prefill they helped a little then (10.6% vs 10.9%), but once the analytic base ran the output
# head once a prompt and llama.cpp's CPU prompt kernels by format (2026-12-05 12:15 UTC, prefill
# folds): held out by device 14.8% with them, 10.4% without (llama.cpp's own rows 31.9% ->
# 8.7%: lambda_comp = tanh(cores x SIMD / 64) again stood for the thread count), by model 14.9%
# vs 15.1%, the Apple table 3.7% vs 4.2%. So no phase takes them by default.
BRIEF_PHASES: tuple[str, ...] = ()
# The device's compute rate as residual features. Decode leaves them out by default: on a CPU
# they move with the thread count a run uses, and with one CPU machine in the data the residual
# then extrapolates the thread effect instead of leaving it to the analytic base (whose compute
# time is the threads' share of the machine's rate). Held-out ablation on the one-sitting
# dataset, 2026-12-04 12:47 (`tightfit predictor evaluate --split device` with and without
# `--decode-rate-features`, docs/predictor.md): decode without them 15.7% vs 20.5% overall,
# tightfit's own data 10.3% vs 20.7%, llmfit 20.0% vs 22.3%; Apple 9.6% vs 9.3% (a little worse).
RATE_FEATURES = ("log_tflops", "log_flops_per_byte", "share_compute")
RATE_PHASES = ("prefill",)
# Left out of a phase's candidates whatever the options. Prefill's compute share is near 1 on
# every training row (0.94-1.0: its rows are prompts of >= 128 tokens; sd 0.006), so its
# standardised slope was a lever on the few rows at the low end (HF at 128 tokens), and a short
# prompt landed far along it: held out by model, tightfit's Gemma 3 TTFT at a 16-token prompt
# came out 6.7x too slow (the residual -2.0 in log space, -0.98 of it from this feature).
# Prefill folds, 2026-12-05 12:40 UTC (one-off script): TTFT by model 27.0% -> 17.8% (max 572% ->
# 85%), by device 16.5% -> 16.6%; prefill by device 10.4% -> 10.4%, by model 15.1% -> 16.4%.
PHASE_EXCLUDED = {"prefill": ("share_compute",)}
# Phases whose residual is not applied to a device class it saw no row of (the analytic base
# answers alone). Prefill rows come from two classes (Apple GPUs, this CPU): held out by model,
# the Apple rows (one model) were left with CPU rows only, and the CPU's llama.cpp residual, by
# format, put them at 67.9% MAPE against the base's 27.9% (`tightfit predictor evaluate`,
# 2026-12-04 evening, docs/predictor.md). Decode is left out: the same rule there took held-out
# -device decode from 15.9% to 17.1% (llmfit 19.6% -> 21.3%, Apple 7.7% -> 9.4%), i.e. its
# residual does carry over to a class it has not seen (an Intel iGPU, GB10).
PHYSICS_FOR_UNSEEN_CLASS = ("prefill",)
# Phases whose residual is not applied to a device of a class the training rows hold fewer than
# MIN_CLASS_DEVICES devices of (models.ResidualModel.known_classes). In decode that class's slopes
# are other classes' (the size slope was mostly the GPUs' and the GTX 1050 Ti rows', then read
# as a many-core Xeon's, since left out): held out by
# device, the GB10 (its class then placed by a 2-row Intel iGPU alone) read 11.9% with the base
# alone against 13.0-14.5% with the residual. Decode folds (one-off script, 2026-12-05 17:45 UTC):
# by device 10.70% -> 10.39% (llmfit 12.93% -> 12.31%; Apple and own rows unchanged), by model
# 12.35% -> 12.23%. Every class of the shipped fit is placed, so its answers do not change.
PHYSICS_FOR_UNPLACED_CLASS = ("decode",)
# Phases whose residual is not applied to an engine it saw no row of (models.ResidualModel.
# known_engines). Held out by model, the lite runtime's rows (all of the default model) had
# llama.cpp's CPU level in decode, 42.1% MAPE, 15.1% with the base alone (own decode 17.8% ->
# 13.8%); in prefill the same rule went 19.5% -> 29.1% (TTFT 20.9% -> 48.3%): its prompt
# kernels are llama.cpp's, whose residual is the better guess there (`tightfit predictor
# evaluate`, 2026-12-05 07:52 UTC, docs/predictor.md).
PHYSICS_FOR_UNSEEN_ENGINE = ("decode",)
# A device-class flag is a candidate only when the training rows hold this many devices of the
# class: fitted on one device it is that device's level, and carries it to every other device
# of the class. Held out by device, the GB10 (the only other integrated-GPU SoC: an Intel Arc
# iGPU, 2 rows, 0.44 too fast in log space) got class_unified_soc from the Arc's rows alone and
# came out 0.41 too slow (its fold's decode MAPE 29.0%, 19.4% without the flag).
MIN_CLASS_DEVICES = 2


def lambda_mem(bandwidth_gbps: float) -> float:
    """Brief: 1 / (1 + log2(BW / 32)), clamped to [0, 1] (BW below 32 GB/s gives 1)."""
    return min(1.0, 1.0 / (1.0 + math.log2(max(bandwidth_gbps, 32.0) / 32.0)))


def lambda_comp(compute_units: int, simd_width: int) -> float:
    """Brief: tanh(CU_eff / 64) with CU_eff = compute units x SIMD width."""
    return math.tanh(compute_units * simd_width / 64.0)


def lambda_quant(bits_per_weight: float) -> float:
    """Brief: weight bits / 16 (linear on purpose), capped at 1 for fp32."""
    return min(1.0, bits_per_weight / 16.0)


def _shares(phase: Phase) -> dict[str, float]:
    sh = phase.shares()
    return {"share_overhead": sh["overhead"], "share_offload": sh["offload_transfer"],
            "share_compute": sh["compute"]}


def features(s: Scenario, b: Breakdown, phase: str) -> dict[str, float]:
    """Feature dict for one scenario and phase ('decode' or 'prefill')."""
    d, m = s.device, s.model
    lm, lc, lq = lambda_mem(d.bandwidth_gbps), lambda_comp(d.compute_units, d.simd_width), \
        lambda_quant(s.bits_per_weight)
    f = {
        "log_bandwidth": math.log(d.bandwidth_gbps),
        "log_tflops": math.log(d.fp16_tflops),
        "log_flops_per_byte": math.log(d.fp16_tflops * 1e3 / d.bandwidth_gbps),
        "lambda_mem": lm, "lambda_comp": lc, "lambda_quant": lq, "lambda_all": lm * lc * lq,
        "bits_per_weight": s.bits_per_weight,
        "log_active_gb": math.log(max(m.active_params_b * s.bits_per_weight / 8, 1e-3)),
        "log_layers": math.log(m.n_layers),
        "moe_active_ratio": m.active_params_b / m.params_b,
        "multi_die": 1.0 if d.dies > 1 else 0.0,
        "k_quant": 1.0 if "_k" in s.quant else 0.0,
        **{flag: 1.0 if s.engine == engine else 0.0 for flag, engine in ENGINE_FLAGS.items()},
    }
    f.update({f"class_{c}": 1.0 if d.device_class == c else 0.0 for c in CLASSES})
    f.update(_shares(b.decode if phase == "decode" else b.prefill))
    if phase == "prefill":
        f["log_prompt"] = math.log(max(s.workload.prompt_tokens, 1))
    return f


def candidate_names(phase: str, brief: str = "default", rates: str = "default") -> list[str]:
    """Candidate features for screening: all of them, less the brief's factors where the
    ablation found they do not help ("default"), or with them forced in ("all") or out
    ("none"); likewise the device compute-rate features (`rates`: "default" = prefill only,
    "all" = every phase)."""
    if brief not in ("default", "all", "none"):
        raise ValueError(f"brief must be default, all or none, not {brief!r}")
    if rates not in ("default", "all"):
        raise ValueError(f"rates must be default or all, not {rates!r}")
    keep = brief == "all" or (brief == "default" and phase in BRIEF_PHASES)
    keep_rates = rates == "all" or phase in RATE_PHASES
    return [n for n in feature_names(phase) if (keep or n not in BRIEF_FEATURES)
            and (keep_rates or n not in RATE_FEATURES)
            and n not in PHASE_EXCLUDED.get(phase, ())]


def feature_names(phase: str) -> list[str]:
    """All candidate features of a phase, in a fixed order."""
    from tightfit.predictor.architectures import estimate_shape
    from tightfit.predictor.hardware import CATALOG
    from tightfit.predictor.roofline import analyse
    from tightfit.predictor.scenario import Workload

    sc = Scenario("x", CATALOG[0], estimate_shape("x", 1.0), "q4_0", 4.5, "llama.cpp",
                  Workload(16, 16, 1, 64))
    return list(features(sc, analyse(sc), phase))

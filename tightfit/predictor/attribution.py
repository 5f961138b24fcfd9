"""Attribution: which cause dominates predicted time, each cause's share, and the source brief's
saturation degrees (bandwidth: max(0, BW_obs/BW_peak - 0.85), alarm above 0.12; compute:
FLOP_obs/FLOP_peak, alarm above 0.93). "Observed" values come from the row when given, else from
the prediction itself.
"""
from __future__ import annotations

from tightfit.predictor import engines, features, memory
from tightfit.predictor.roofline import Breakdown, Phase
from tightfit.predictor.scenario import Scenario

BW_KNEE = 0.85
BW_ALARM = 0.12
COMPUTE_ALARM = 0.93


def bottleneck(phase: Phase) -> str:
    shares = phase.shares()
    return max(shares, key=lambda k: shares[k])


def factors(s: Scenario, b: Breakdown, t_step: float, t_prefill: float,
            observed: dict[str, float]) -> dict[str, float]:
    """Shares of decode and prefill time, saturation degrees and the brief's lambda factors."""
    out = {f"decode_share_{k}": round(v, 4) for k, v in b.decode.shares().items()}
    if t_prefill > 0:
        out.update({f"prefill_share_{k}": round(v, 4) for k, v in b.prefill.shares().items()})
    tok_s = observed.get("decode_tok_s")
    step = s.workload.batch / tok_s if tok_s else t_step
    prof = engines.for_scenario(s)
    on_device = b.bytes_per_step * (
        1 - memory.host_read_share(s, prof, b.memory, b.bytes_per_step, timed=False))
    bw_ratio = on_device / step / (s.device.bandwidth_gbps * 1e9)
    out["bandwidth_utilisation"] = round(bw_ratio, 4)
    out["bandwidth_saturation"] = round(max(0.0, bw_ratio - BW_KNEE), 4)
    out["bandwidth_saturated"] = float(max(0.0, bw_ratio - BW_KNEE) > BW_ALARM)
    pre_tok_s = observed.get("prefill_tok_s")
    if t_prefill > 0 or pre_tok_s:
        t_pre = s.workload.batch * s.workload.prompt_tokens / pre_tok_s if pre_tok_s else t_prefill
        comp = b.prefill_flops / max(t_pre, 1e-12) / (s.device.fp16_tflops * 1e12)
        out["compute_saturation"] = round(comp, 4)
        out["compute_saturated"] = float(comp > COMPUTE_ALARM)
    out["lambda_mem"] = round(features.lambda_mem(s.device.bandwidth_gbps), 4)
    out["lambda_comp"] = round(features.lambda_comp(s.device.compute_units, s.device.simd_width), 4)
    out["lambda_quant"] = round(features.lambda_quant(s.bits_per_weight), 4)
    out["lambda"] = round(out["lambda_mem"] * out["lambda_comp"] * out["lambda_quant"], 4)
    return out

"""Weight quantisation: offline transforms that turn fp32 projections into packed drop-in linears.

formats (names, bytes per weight; no torch import) · reference (plain-torch quantisers, the
numbers the kernels must reproduce) · linear (Int8Linear, Int4Linear, quantize_linear) ·
gguf_native (GGUF Q4_0/Q4_1/Q4_K run as int4 without re-quantising) · awq (activation-aware
scale and clip search) · microbench (`python -m tightfit.engine.quant.microbench`).
Import the submodules directly; this package imports nothing so `formats` stays cheap.
"""

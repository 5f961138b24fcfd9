"""`tightfit quantize`: writes a model in a weight format or precision plan to a `.tfq` file that
the engine loads directly (`tightfit generate --model out.tfq ...`); AWQ calibration, if the plan
asks for it, runs here once instead of at every load. File layout: tightfit/engine/loader/
quantized.py."""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="write a quantised model file (.tfq)",
                       description="Quantise a model (GGUF, HF directory or packaged name) with a "
                                   "weight format or precision plan and write a .tfq file.")
    p.add_argument("--model", "-m", default=None,
                   help="GGUF file, HF-layout directory or packaged model name "
                        "(default: the embedded SmolLM2-135M)")
    p.add_argument("--quant", required=True,
                   help="int8, int4-g32|g64|g128, int4-awq-g32|g64|g128, native, fp32, or a "
                        "precision-plan file (YAML/JSON)")
    p.add_argument("--output", "-o", required=True, help="file to write; must end in .tfq")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.set_defaults(func=run)


def show_awq_progress() -> None:
    """AWQ calibration logs one line per layer; show them on stderr (it can take minutes)."""
    log = logging.getLogger("tightfit.awq")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def run(args: argparse.Namespace) -> int:
    from tightfit.errors import TightfitError

    out = Path(args.output)
    if out.suffix != ".tfq":
        raise TightfitError(f"output {str(out)!r} must end in .tfq (the engine recognises "
                            "quantised files by that suffix)")
    import torch

    from tightfit.config import default_threads
    from tightfit.engine.loader.model_loader import load_model
    from tightfit.engine.loader.quantized import save_quantized

    torch.set_num_threads(args.threads or default_threads())
    show_awq_progress()
    t0 = time.perf_counter()
    loaded = load_model(args.model, args.quant)
    save_quantized(loaded, out)
    size_mb = out.stat().st_size / 1e6
    print(f"wrote {out} ({size_mb:.1f} MB, {loaded.weight_format}, from {loaded.path.name}) "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0
